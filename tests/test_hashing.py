"""Hash primitives (SPEC 1.3-1.5): Python ints (``_consts``), vectorized torch, the kernels' TensorIR macros."""

from __future__ import annotations

import random

import pytest
import torch
import tvm
from tvm.script import tirx as T

from tvm_canary import _consts
from tvm_canary.consts import RealKvHashMode
from tvm_canary.context import RealKvSource
from tvm_canary.kernels import common
from tvm_canary.reference import hashing
from tvm_canary.reference.hashing import (
    chain_hash_t,
    le_bytes,
    le_words,
    mix3_t,
    real_kv_fold_t,
    splitmix64_t,
    valid_slot_mask,
)

from helpers import (
    I64,
    four_sources,
    i64,
    make_canary,
    poke_source_byte,
    py_chain_hash,
    py_fold,
    random_source,
    set_slot,
)

SPEC_VECTORS = [
    (0x9E3779B97F4A7C15, 0xE220A8397B1DCDAF),
    (0x0000000000000001, 0x5692161D100B05E5),
    (0xDEADBEEFCAFEBABE, 0x7AD6664F09FFE52C),
    (0xFFFFFFFFFFFFFFFF, 0xB4D055FCF2CBBD7B),
    (0x8000000000000000, 0x25C26EA579CEA98A),
    (0xC0FFEE1234567890, 0xDE7FAE23A9A1B716),
    (0, 0),
]
EDGE_U64 = [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 0x00000000FFFFFFFF, 0xFFFFFFFF00000000]
PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL


def rand_u64(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return EDGE_U64 + [rng.getrandbits(64) for _ in range(n)]


@pytest.mark.parametrize("x,want", SPEC_VECTORS, ids=[hex(x) for x, _ in SPEC_VECTORS])
def test_splitmix64_python_spec_vectors(x, want):
    assert _consts.splitmix64(x) == want


def test_splitmix64_tensor_spec_vectors():
    got = splitmix64_t(i64([I64(x) for x, _ in SPEC_VECTORS]))
    assert got.tolist() == [I64(w) for _, w in SPEC_VECTORS]


def test_anchor_hash_value():
    assert _consts.ANCHOR_HASH == 0xDE7FAE23A9A1B716
    assert I64(_consts.ANCHOR_HASH) == -2414019407054260458


def test_splitmix64_tensor_matches_python():
    xs = rand_u64(500, seed=1)
    assert splitmix64_t(i64([I64(x) for x in xs])).tolist() == [I64(_consts.splitmix64(x)) for x in xs]


def test_mix3_tensor_matches_python_and_is_ordered():
    a, b, c = rand_u64(300, 2), rand_u64(300, 3), rand_u64(300, 4)
    got = mix3_t(*(i64([I64(v) for v in vs]) for vs in (a, b, c))).tolist()
    assert got == [I64(_consts.splitmix64_mix3(*abc)) for abc in zip(a, b, c)]
    assert _consts.splitmix64_mix3(1, 2, 3) != _consts.splitmix64_mix3(2, 1, 3)
    assert _consts.splitmix64_mix3(0, 0, 0) == 0


def test_le_words_and_bytes_round_trip():
    gen = torch.Generator().manual_seed(5)
    u8 = torch.randint(0, 256, (3, 24), generator=gen, dtype=torch.uint8)
    words = le_words(u8)
    raw = [bytes(row) for row in u8.tolist()]
    assert words.tolist() == [
        [int.from_bytes(r[8 * w : 8 * w + 8], "little", signed=True) for w in range(3)] for r in raw
    ]
    assert torch.equal(le_bytes(words), u8)


def test_chain_hash_of_slots():
    buf = make_canary(8, stride=48)
    set_slot(buf, 3, token=-5, position=7, prev_hash=0xFEDCBA9876543210, real_kv_hash=1)
    set_slot(buf, 5, token=1 << 40, position=0, prev_hash=1, real_kv_hash=2)
    slots = [-1, -9, 3, 5, 0]
    want = [
        I64(_consts.ANCHOR_HASH),
        I64(_consts.ANCHOR_HASH),
        I64(_consts.splitmix64_mix3(0xFEDCBA9876543210, (-5) & _consts.U64_MASK, 7)),
        I64(_consts.splitmix64_mix3(1, 1 << 40, 0)),
        0,  # all-zero slot: mix3(0, 0, 0) == 0
    ]
    assert chain_hash_t(buf, i64(slots)).tolist() == want
    assert [py_chain_hash(buf, s) for s in slots] == want


def test_chain_hash_ignores_real_kv_field():
    buf = make_canary(4)
    set_slot(buf, 1, 10, 20, 30, real_kv_hash=0)
    before = chain_hash_t(buf, i64([1])).tolist()
    set_slot(buf, 1, 10, 20, 30, real_kv_hash=12345)
    assert chain_hash_t(buf, i64([1])).tolist() == before


def test_fold_known_strip_value():
    """One source, page_size 4: slot 6 is row 1, byte 2*32; bytes 0x01..0x40 there."""
    t = torch.zeros(3, 4 * 32, dtype=torch.uint8)
    t[1, 64:96] = torch.arange(1, 33, dtype=torch.uint8)
    src = RealKvSource(tensor=t, page_size=4, num_bytes_per_token=32, read_bytes=32)
    words = [int.from_bytes(bytes(range(1 + 8 * w, 9 + 8 * w)), "little") for w in range(4)]

    def fold(ws):
        one = 0
        for w in ws:
            one = _consts.splitmix64(one ^ w)
        return I64(_consts.splitmix64(0 ^ one))  # outer fold over the single source

    assert real_kv_fold_t((src,), PARTIAL, i64([6])).tolist() == [fold(words[:2])]
    assert real_kv_fold_t((src,), ALL, i64([6])).tolist() == [fold(words)]
    assert real_kv_fold_t((src,), ALL, i64([5, 7, 0])).tolist() == [0, 0, 0]  # all-zero strips fold to 0


@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
@pytest.mark.parametrize("num_sources", [1, 2, 3, 4])
def test_fold_matches_definition(mode, num_sources):
    sources = four_sources(10 + num_sources)[:num_sources]
    slots = list(range(16))
    assert real_kv_fold_t(sources, mode, i64(slots)).tolist() == [py_fold(sources, mode, s) for s in slots]


@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
def test_fold_in_chunks_matches_definition(mode, monkeypatch):
    """Plans over FOLD_CHUNK fold a chunk at a time (bounded temporaries): chunk edges inside and at the
    end of the slots, and no slots, give the definition's values."""
    monkeypatch.setattr(hashing, "FOLD_CHUNK", 3)
    sources = four_sources(21)[:2]
    slots = [15, 0, 7, 7, 3, 12, 1]
    assert real_kv_fold_t(sources, mode, i64(slots)).tolist() == [py_fold(sources, mode, s) for s in slots]
    assert real_kv_fold_t(sources, mode, i64(slots[:6])).tolist() == [py_fold(sources, mode, s) for s in slots[:6]]
    assert real_kv_fold_t(sources, mode, i64([])).tolist() == []


def test_fold_none_mode_and_no_sources_give_zero():
    sources = four_sources(1)
    assert real_kv_fold_t(sources, RealKvHashMode.NONE, i64([1, 2])).tolist() == [0, 0]
    assert real_kv_fold_t((), ALL, i64([1, 2])).tolist() == [0, 0]


def test_fold_source_order_matters():
    a, b = four_sources(2)[:2]
    slots = i64([1, 2, 3])
    assert (real_kv_fold_t((a, b), ALL, slots) != real_kv_fold_t((b, a), ALL, slots)).all()


def test_fold_strided_view_equals_contiguous_copy():
    src = random_source(torch.Generator().manual_seed(3), rows=4, page_size=2, nbpt=32, read_bytes=32,
                        row_stride_bytes=96)
    assert not src.tensor.is_contiguous()
    dense = RealKvSource(tensor=src.tensor.contiguous(), page_size=2, num_bytes_per_token=32, read_bytes=32)
    slots = i64(list(range(8)))
    assert torch.equal(real_kv_fold_t((src,), ALL, slots), real_kv_fold_t((dense,), ALL, slots))


def test_fold_reads_only_the_folded_bytes():
    """PARTIAL folds bytes 0..15, ALL 0..read_bytes-1; trailing row bytes never read."""
    src = random_source(torch.Generator().manual_seed(4), rows=2, page_size=2, nbpt=64, read_bytes=32,
                        row_bytes=160)
    slot = i64([3])
    base = {m: real_kv_fold_t((src,), m, slot).item() for m in (PARTIAL, ALL)}

    def changed(k):
        old = int(src.tensor.view(torch.uint8)[1, 64 + k])
        poke_source_byte(src, 3, k, old ^ 0xFF)
        out = {m: real_kv_fold_t((src,), m, slot).item() != base[m] for m in (PARTIAL, ALL)}
        poke_source_byte(src, 3, k, old)
        return out

    assert changed(15) == {PARTIAL: True, ALL: True}
    assert changed(16) == {PARTIAL: False, ALL: True}
    assert changed(32) == {PARTIAL: False, ALL: False}  # past read_bytes, inside the strip
    assert changed(64 + 8) == {PARTIAL: False, ALL: False}  # trailing bytes past page_size * nbpt


def test_valid_slot_mask():
    src = random_source(torch.Generator().manual_seed(6), rows=2, page_size=2, nbpt=16, read_bytes=16)
    slots = i64([-1, 0, 3, 4, 7, 8])
    assert valid_slot_mask(8, (src,), RealKvHashMode.NONE, slots).tolist() == [False, True, True, True, True, False]
    assert valid_slot_mask(8, (src,), PARTIAL, slots).tolist() == [False, True, True, False, False, False]
    assert valid_slot_mask(8, (), ALL, slots).tolist() == [False, True, True, True, True, False]


def tir_hashes(xs, bs, cs, slots, fields):
    """The kernels' TensorIR ``splitmix64`` / ``mix3`` / ``slot_hash`` macros in one tiny llvm prim_func,
    on u64 ``xs, bs, cs`` and slots of int64 ``fields [2, 4]``: u64 lists of ``splitmix64(x)``,
    ``mix3(x, b, c)`` and each slot's chain-link hash (anchor when negative)."""
    n = len(xs)

    @T.prim_func(private=False)
    def hashes(x: T.Buffer((n,), "int64"), b: T.Buffer((n,), "int64"), c: T.Buffer((n,), "int64"),
               s: T.Buffer((n,), "int64"), buf: T.Buffer((2, 4), "int64"), sm: T.Buffer((n,), "int64"),
               m3: T.Buffer((n,), "int64"), link: T.Buffer((n,), "int64")):
        for i in T.serial(n):
            h = T.alloc_buffer((1,), "uint64", scope="local")
            h[0] = T.reinterpret("uint64", x[i])
            common.splitmix64(h)
            sm[i] = T.reinterpret("int64", h[0])
            h[0] = T.reinterpret("uint64", x[i])
            common.mix3(h, b[i], c[i])
            m3[i] = T.reinterpret("int64", h[0])
            common.slot_hash(h, buf, s[i])
            link[i] = T.reinterpret("int64", h[0])

    outs = [torch.zeros(n, dtype=torch.int64) for _ in range(3)]
    inputs = [i64([I64(v) for v in vs]) for vs in (xs, bs, cs, slots)]
    tvm.compile(hashes, target="llvm")["hashes"](*inputs, torch.tensor(fields, dtype=torch.int64), *outs)
    return [[v & _consts.U64_MASK for v in out.tolist()] for out in outs]


def test_tir_splitmix64_mix3_and_slot_hash_match_spec():
    """The TensorIR macros give the published splitmix64 vectors (SPEC 1.5), mix3 on Python ints, and
    SPEC 1.3's chain-link hash (anchor for a negative slot)."""
    xs = [x for x, _ in SPEC_VECTORS] + rand_u64(40, seed=7)
    bs, cs = rand_u64(len(xs) - len(EDGE_U64), seed=8), rand_u64(len(xs) - len(EDGE_U64), seed=9)
    fields = [[0, 0, 0, 0], [-5, 7, I64(0xFEDCBA9876543210), 1]]  # (token, position, prev_hash, real_kv_hash)
    slots = [(-1, 0, 1)[k % 3] for k in range(len(xs))]
    sm, m3, link = tir_hashes(xs, bs, cs, slots, fields)
    assert sm[: len(SPEC_VECTORS)] == [want for _, want in SPEC_VECTORS]
    assert sm == [_consts.splitmix64(x) for x in xs]
    assert m3 == [_consts.splitmix64_mix3(x, b, c) for x, b, c in zip(xs, bs, cs)]
    chain = {-1: _consts.ANCHOR_HASH, 0: 0}  # an all-zero slot links to mix3(0, 0, 0) == 0
    chain[1] = _consts.splitmix64_mix3(0xFEDCBA9876543210, -5, 7)
    assert link == [chain[s] for s in slots]
