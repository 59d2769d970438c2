"""Builders and plain-Python oracles shared by the hand and fuzz tests: SPEC section 1 recomputed from
the definitions on Python ints and raw storage bytes, never via ``tvm_canary.reference``."""

from __future__ import annotations

import torch

from tvm_canary import _consts, consts
from tvm_canary.cases import random_source
from tvm_canary.consts import RealKvHashMode
from tvm_canary.context import CanaryLaunchTag, RealKvSource, VerifyOrWriteContext
from tvm_canary.plans import VerifyPlan, WritePlan

I64 = _consts.to_signed_int64
ANCHOR = I64(_consts.ANCHOR_HASH)
POISON_BYTE = 0x5A
POISON_I64 = -7777
INVALID = int(consts.FailReason.INVALID_INDEX)


# -- canary buffer


def make_canary(num_slots: int, *, stride: int = 32, fill: int = 0, device="cpu") -> torch.Tensor:
    """uint8 ``[num_slots, stride]`` filled with byte ``fill``."""
    return torch.full((num_slots, stride), fill, dtype=torch.uint8, device=device)


def set_slot(buf: torch.Tensor, slot: int, token: int, position: int, prev_hash: int, real_kv_hash: int = 0) -> None:
    """Store the four fields (any ints, taken mod 2^64) little-endian into bytes 0..31 of ``slot``."""
    raw = b"".join((v & _consts.U64_MASK).to_bytes(8, "little") for v in (token, position, prev_hash, real_kv_hash))
    buf[slot, :32] = torch.tensor(list(raw), dtype=torch.uint8, device=buf.device)


def get_slot(buf: torch.Tensor, slot: int) -> tuple[int, int, int, int]:
    """(token, position, prev_hash, real_kv_hash) of ``slot`` as signed ints."""
    raw = bytes(buf[slot, :32].cpu().tolist())
    return tuple(int.from_bytes(raw[8 * f : 8 * f + 8], "little", signed=True) for f in range(4))


def py_chain_hash(buf: torch.Tensor, slot: int) -> int:
    """Signed chain-link hash of ``slot`` (anchor hash when negative), from SPEC 1.3."""
    if slot < 0:
        return ANCHOR
    tok, pos, prev, _ = get_slot(buf, slot)
    return I64(_consts.splitmix64_mix3(prev, tok, pos))


def link(h: int, token: int, position: int) -> int:
    """Signed chain hash following an entry: ``mix3(h, token, position)``."""
    return I64(_consts.splitmix64_mix3(h, token, position))


# -- real-KV sources


def four_sources(seed: int, device="cpu") -> tuple[RealKvSource, ...]:
    """Four differently shaped sources of random bytes, each covering slots 0..15: plain, paged and
    strided, float16, paged with a holey row tail (row wider than page_size * nbpt)."""
    gen = torch.Generator().manual_seed(seed)
    return (
        random_source(gen, rows=16, page_size=1, nbpt=32, read_bytes=32, device=device),
        random_source(gen, rows=4, page_size=4, nbpt=64, read_bytes=48, row_stride_bytes=512, device=device),
        random_source(gen, rows=8, page_size=2, nbpt=48, read_bytes=16, dtype=torch.float16, device=device),
        random_source(gen, rows=2, page_size=8, nbpt=32, read_bytes=32, row_bytes=320, dtype=torch.int32,
                      device=device),
    )


def source_strip(src: RealKvSource, slot: int, nbytes: int) -> bytes:
    """``nbytes`` of ``slot``'s strip addressed from the storage as
    ``row * stride(0) * elsize + (slot % page_size) * nbpt + k`` (SPEC D5)."""
    t = src.tensor
    es = t.element_size()
    storage = bytes(t.untyped_storage().cpu().tolist())
    addr = t.storage_offset() * es + (slot // src.page_size) * t.stride(0) * es
    addr += (slot % src.page_size) * src.num_bytes_per_token
    return storage[addr : addr + nbytes]


def poke_source_byte(src: RealKvSource, slot: int, k: int, value: int) -> None:
    """Set byte ``k`` of ``slot``'s strip to ``value`` in place."""
    u8 = src.tensor.view(torch.uint8)
    u8[slot // src.page_size, (slot % src.page_size) * src.num_bytes_per_token + k] = value


def py_fold(sources: tuple[RealKvSource, ...], mode: RealKvHashMode, slot: int) -> int:
    """Signed ``real_kv_fold_sources`` of SPEC 1.4 on Python ints."""
    if mode == RealKvHashMode.NONE:
        return 0
    return fold_strips([source_strip(src, slot, fold_bytes(src, mode)) for src in sources])


def fold_bytes(src: RealKvSource, mode: RealKvHashMode) -> int:
    """Bytes of a slot's strip that ``mode`` folds (SPEC 1.4): the first 16 in PARTIAL, ``read_bytes`` in ALL."""
    return _consts.PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else src.read_bytes


def fold_strips(strips: list[bytes]) -> int:
    """Signed SPEC 1.4 fold of one slot's strips, one per source, on Python ints."""
    acc = 0
    for strip in strips:
        one = 0
        for w in range(len(strip) // 8):
            one = _consts.splitmix64(one ^ int.from_bytes(strip[8 * w : 8 * w + 8], "little"))
        acc = _consts.splitmix64(acc ^ one)
    return I64(acc)


def stamp_chain(
    buf: torch.Tensor,
    entries: list[tuple[int, int, int]],
    *,
    seed: int = -1,
    sources: tuple[RealKvSource, ...] = (),
    mode: RealKvHashMode = RealKvHashMode.NONE,
) -> None:
    """Store a consistent chain of (slot, token, position) after ``seed`` (negative: anchor), as a
    correct write would (SPEC 3.1), with each slot's real-KV fold."""
    h = py_chain_hash(buf, seed)
    for slot, tok, pos in entries:
        set_slot(buf, slot, tok, pos, h, py_fold(sources, mode, slot))
        h = link(h, tok, pos)


# -- context and plans


def make_context(
    canary_buf: torch.Tensor,
    *,
    kind: CanaryLaunchTag = CanaryLaunchTag.HEAD_K_FULL,
    ring_capacity: int = 8,
    write_index: int = 0,
    sources: tuple[RealKvSource, ...] = (),
    mode: RealKvHashMode = RealKvHashMode.NONE,
    chain_assert: int = 1,
) -> VerifyOrWriteContext:
    """Context on ``canary_buf``'s device with a poisoned ring and zero counters."""
    dev = canary_buf.device
    return VerifyOrWriteContext(
        canary_buf=canary_buf,
        kernel_kind=kind,
        violation_ring=torch.full((ring_capacity, 8), POISON_I64, dtype=torch.int64, device=dev),
        violation_write_index=torch.tensor([write_index], dtype=torch.int32, device=dev),
        slot_run_counter=torch.zeros(1, dtype=torch.int64, device=dev),
        kernel_run_counter=torch.zeros(1, dtype=torch.int64, device=dev),
        real_kv_sources=sources,
        real_kv_hash_mode=mode,
        enable_chain_position_assert=torch.tensor([chain_assert], dtype=torch.int32, device=dev),
    )


def ring_state(ctx: VerifyOrWriteContext) -> tuple[int, list[list[int]]]:
    """(write_index, every ring row including poisoned ones)."""
    return int(ctx.violation_write_index[0]), ctx.violation_ring.cpu().tolist()


def expected_ring(capacity: int, rows: list[list[int]], *, prefix: list[list[int]] = ()) -> list[list[int]]:
    """Ring contents after ``rows`` were appended behind the ``prefix`` rows of an untouched ring."""
    stored = (list(prefix) + list(rows))[:capacity]
    return stored + [[POISON_I64] * 8] * (capacity - len(stored))


def counters(ctx: VerifyOrWriteContext) -> tuple[int, int]:
    """(kernel_run_counter, slot_run_counter)."""
    return int(ctx.kernel_run_counter[0]), int(ctx.slot_run_counter[0])


def make_verify_plan(
    slots: list[int],
    tokens: list[int],
    positions: list[int],
    prevs: list[int],
    *,
    capacity: int | None = None,
    num_valid: int | None = None,
    enable: int = 1,
    device="cpu",
) -> VerifyPlan:
    """VerifyPlan of the given entries, the tail past them poisoned (``POISON_I64``)."""
    capacity = capacity or len(slots)
    plan = VerifyPlan.allocate(verify_capacity=capacity, device=device)
    for vec, vals in (
        (plan.verify_slot_indices, slots),
        (plan.verify_expected_tokens, tokens),
        (plan.verify_expected_positions, positions),
        (plan.verify_prev_slot_indices, prevs),
    ):
        vec.fill_(POISON_I64)
        vec[: len(vals)] = torch.tensor(vals, dtype=torch.int64)
    plan.verify_num_valid.fill_(len(slots) if num_valid is None else num_valid)
    plan.enable.fill_(enable)
    return plan


def make_write_plan(
    offsets: list[int], seeds: list[int], *, capacity: int | None = None, num_valid: int | None = None, device="cpu"
) -> WritePlan:
    """WritePlan with ``offsets``/``seeds`` at the front, the tail poisoned (``POISON_I64``)."""
    capacity = capacity or len(seeds)
    plan = WritePlan.allocate(write_req_capacity=capacity, device=device)
    plan.write_offsets.fill_(POISON_I64)
    plan.write_offsets[: len(offsets)] = torch.tensor(offsets, dtype=torch.int64)
    plan.write_seed_slot_indices.fill_(POISON_I64)
    plan.write_seed_slot_indices[: len(seeds)] = torch.tensor(seeds, dtype=torch.int64)
    plan.write_num_valid_reqs.fill_(len(seeds) if num_valid is None else num_valid)
    return plan


def i64(vals, device="cpu") -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.int64, device=device)


def i32(vals, device="cpu") -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.int32, device=device)
