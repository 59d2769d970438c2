"""End to end: scatter -> plan -> verify -> write over several steps of a synthetic batch.

A few requests share a ReqToTokenPool-style ``req_to_token`` table and a randomly allocated KV slot
pool: prefills (one chunked), decodes, a request that finishes and whose row and slots are reused, and
CUDA-graph padding rows. Each step runs, as the engine does (SPEC 6), the expected-token scatter, the
plan kernels, then the HEAD endpoint (verify + write, no real-KV sources), the "model forward" (fresh
random KV bytes for the step's slots), then the TAIL endpoint (verify + write with two real-KV sources
in PARTIAL or ALL mode). Everything goes through the public API on the tvm backend.

Clean runs must never record a violation, and leave the canary buffers equal to a Python-int oracle.
Injected corruption must be reported with the exact slots and fail-reason bits. Finally the whole
pipeline (with corruption) is byte-identical between the tvm backend and the reference backend.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch
from tree import assert_same_bytes, devices, require, tensors

from helpers import (
    ANCHOR,
    POISON_I64,
    expected_ring,
    get_slot,
    link,
    make_canary,
    make_context,
    py_fold,
    random_source,
    ring_state,
    set_slot,
)
import tvm_canary as tc
from tvm_canary import consts
from tvm_canary.consts import FailReason, RealKvHashMode
from tvm_canary.context import CanaryLaunchTag
from tvm_canary.runtime import use_backend

PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL
HEAD = int(CanaryLaunchTag.HEAD_K_FULL)
TAIL = int(CanaryLaunchTag.TAIL_K_FULL)
V_CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
V_POS = int(FailReason.VERIFY_POSITION_MISMATCH)
V_RKV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
V_TOK = int(FailReason.VERIFY_TOKEN_MISMATCH)
W_POS = int(FailReason.WRITE_POSITION_MISMATCH)

NUM_SLOTS = 256  # KV pool slots; slot 0 is the reserved padding slot
REQ_ROWS, MAX_LEN = 8, 64  # req_to_token shape; row 0 is the padding row
WRITE_CAP, VERIFY_CAP = 8, 3 * NUM_SLOTS
PROMPTS = {"a": 9, "b": 9, "c": 10, "d": 5}
ROWS = {"a": 3, "b": 1, "c": 5, "d": 3}  # d reuses a's row after a finishes
# One entry per step: (request, tokens extended this step); "pad" = CUDA-graph padding rows at the end.
SCHEDULE = [
    dict(batch=[("a", 9), ("b", 9)]),  # prefill
    dict(batch=[("a", 1), ("b", 1), ("c", 4)]),  # decode + first chunk of c's prefill
    dict(batch=[("a", 1), ("b", 1), ("c", 6)]),  # decode + last chunk
    dict(batch=[("a", 1), ("b", 1), ("c", 1)], pad=2),  # decode
    dict(batch=[("c", 1), ("a", 1), ("b", 1)], pad=1),  # decode, other batch order
    dict(batch=[("b", 1), ("c", 1), ("d", 5)], finish=["a"]),  # a finished; d prefills in its row/slots
    dict(batch=[("d", 1), ("b", 1), ("c", 1)], pad=3),  # decode
]


def chain_hashes(tokens: list[int]) -> list[int]:
    """``h[p]`` = the prev_hash a correct write stores at position p of a chain from the anchor."""
    h = [ANCHOR]
    for p, tok in enumerate(tokens):
        h.append(link(h[-1], tok, p))
    return h


def slot_fields(buf: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(token, position, prev_hash, real_kv_hash) of every slot, as signed ints."""
    return [tuple(row) for row in buf[:, :32].cpu().contiguous().view(torch.int64).tolist()]


class Folder:
    """SPEC 1.4 ``real_kv_fold_sources`` on Python ints (helpers.py_fold with the bytes read once)."""

    def __init__(self, sources, mode: RealKvHashMode):
        self.mode = mode
        self.parts = [(s.tensor.view(torch.uint8).cpu().tolist(), s) for s in sources]

    def __call__(self, slot: int) -> int:
        acc = 0
        for rows, src in self.parts:
            n = 16 if self.mode == PARTIAL else src.read_bytes
            col = (slot % src.page_size) * src.num_bytes_per_token
            strip = bytes(rows[slot // src.page_size][col : col + n])
            one = 0
            for w in range(n // 8):
                one = consts.splitmix64(one ^ int.from_bytes(strip[8 * w : 8 * w + 8], "little"))
            acc = consts.splitmix64(acc ^ one)
        return consts.to_signed_int64(acc)


@dataclasses.dataclass
class Request:
    row: int
    tokens: list[int]
    kv_len: int = 0
    slots: list[int] = dataclasses.field(default_factory=list)


class Pipeline:
    """One model runner's canary state for the FULL group, K half: HEAD and TAIL endpoints."""

    def __init__(self, device: str, mode: RealKvHashMode, seed: int, *, with_pool: bool = True, ring: int = 16):
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.free = (torch.randperm(NUM_SLOTS - 1, generator=self.gen) + 1).tolist()
        self.reqs: dict[str, Request] = {}
        self.steps_run = 0
        self.slot_runs = 0
        self.req_to_token = torch.zeros((REQ_ROWS, MAX_LEN), dtype=torch.int32, device=device)
        self.pool = torch.zeros((REQ_ROWS, MAX_LEN), dtype=torch.int32, device=device) if with_pool else None
        self.sources = (
            # plain rows 80 bytes apart (strided view), 64 bytes per token, ALL folds 48
            random_source(self.gen, rows=NUM_SLOTS, page_size=1, nbpt=64, read_bytes=48, row_stride_bytes=80,
                          device=device),
            # paged (4 slots per row), bfloat16, ALL folds all 32 bytes
            random_source(self.gen, rows=NUM_SLOTS // 4, page_size=4, nbpt=32, read_bytes=32,
                          dtype=torch.bfloat16, device=device),
        )
        self.head = make_context(make_canary(NUM_SLOTS, device=device), kind=CanaryLaunchTag.HEAD_K_FULL,
                                 ring_capacity=ring)
        self.tail = make_context(make_canary(NUM_SLOTS, device=device), kind=CanaryLaunchTag.TAIL_K_FULL,
                                 ring_capacity=ring, sources=self.sources, mode=mode)
        self.vplan = tc.VerifyPlan.allocate(verify_capacity=VERIFY_CAP, device=device)
        self.wplan = tc.WritePlan.allocate(write_req_capacity=WRITE_CAP, device=device)
        for t in tensors(self.vplan) + tensors(self.wplan):  # deterministic stale tails
            t.fill_(POISON_I64)

    # ------------------------------------------------------------ engine side

    def _token(self) -> int:
        return int(torch.randint(0, 32000, (1,), generator=self.gen))

    def _model_writes_kv(self, slots: list[int]) -> None:
        """The forward pass stores fresh K bytes for the step's slots in every source."""
        for src in self.sources:
            u8 = src.tensor.view(torch.uint8)
            for s in slots:
                col = (s % src.page_size) * src.num_bytes_per_token
                fresh = torch.randint(0, 256, (src.num_bytes_per_token,), generator=self.gen, dtype=torch.uint8)
                u8[s // src.page_size, col : col + src.num_bytes_per_token] = fresh.to(self.device)

    def step(self, batch, *, pad: int = 0, finish=(), after_plan: Callable[["Pipeline"], None] | None = None):
        dev = self.device
        for rid in finish:
            self.free += self.reqs.pop(rid).slots  # popped first by the next allocations
        rpi, prefix, extend, ids, pos, locs, flat, lens = [], [], [], [], [], [], [], []
        for rid, n in batch:
            if rid not in self.reqs:
                self.reqs[rid] = Request(ROWS[rid], [self._token() for _ in range(PROMPTS[rid])])
            req = self.reqs[rid]
            while len(req.tokens) < req.kv_len + n:  # decode: the token sampled by the previous step
                req.tokens.append(self._token())
            rpi.append(req.row)
            prefix.append(req.kv_len)
            extend.append(n)
            for p in range(req.kv_len, req.kv_len + n):
                slot = self.free.pop()
                req.slots.append(slot)
                self.req_to_token[req.row, p] = slot
                ids.append(req.tokens[p])
                pos.append(p)
                locs.append(slot)
            flat += req.tokens[: req.kv_len + n]
            lens.append(req.kv_len + n)
        for _ in range(pad):  # padding rows: pool row 0, never planned, their tokens never referenced
            rpi.append(0)
            prefix.append(7)
            extend.append(1)
            ids.append(0)
            pos.append(0)
            locs.append(0)
            lens.append(0)

        def i64(v):
            return torch.tensor(v, dtype=torch.int64, device=dev)

        input_ids, positions, out_cache_loc = i64(ids), i64(pos), i64(locs)
        valid_lens = i64(lens)
        if self.pool is not None:
            offsets = torch.zeros(len(lens) + 1, dtype=torch.int64)
            offsets[1:] = torch.tensor(lens).cumsum(0)
            tc.launch_scatter_req_token_ids_kernel(flat_in=i64(flat), offsets=offsets.to(dev), req_pool_indices=i64(rpi),
                                                   pool_out=self.pool)
        tc.launch_canary_plan_kernels(
            verify_plan_out=self.vplan,
            write_plan_out=self.wplan,
            req_pool_indices=i64(rpi),
            prefix_lens=i64(prefix),
            extend_seq_lens=i64(extend),
            req_to_token=self.req_to_token,
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            verify_capacity=VERIFY_CAP,
            req_to_verify_expected_tokens=self.pool,
            req_to_verify_expected_tokens_valid_lens=valid_lens if self.pool is not None else None,
            kv_token_id_vs_position_offset=0,
        )
        assert int(self.vplan.enable[0]) == 1
        if after_plan is not None:
            after_plan(self)
        for ctx, endpoint in ((self.head, "head"), (self.tail, "tail")):
            if endpoint == "tail":
                self._model_writes_kv(locs)
            tc.launch_canary_verify_kernel(context=ctx, plan=self.vplan, check_verify_expected_token=self.pool is not None)
            tc.launch_canary_write_kernel(
                context=ctx,
                plan=self.wplan,
                input_ids=input_ids,
                positions=positions,
                out_cache_loc=out_cache_loc,
                enable_write_input_assert=True,
                expected_input_tokens=input_ids.clone(),  # the token oracle agrees with the batch
                expected_input_positions=positions.clone(),
            )
        for rid, n in batch:
            self.reqs[rid].kv_len += n
        self.steps_run += 1
        self.slot_runs += sum(prefix[: len(batch)]) + sum(extend[: len(batch)])

    def run(self, steps, hooks=None) -> None:
        """Run the SCHEDULE steps ``steps``; ``hooks`` maps a step to extra ``step`` keywords."""
        for i in steps:
            self.step(**SCHEDULE[i], **(hooks or {}).get(i, {}))

    # ------------------------------------------------------------ test side

    def slot_of(self, rid: str, p: int) -> int:
        return self.reqs[rid].slots[p]

    def expected_row(self, kind, rid, p, bits, *, stored=None, et=None, sh=None, eh=None) -> list[int]:
        """A verify row for request ``rid``'s position ``p`` whose stored fields are the clean ones
        unless overridden (``stored`` = (token, position))."""
        toks = self.reqs[rid].tokens
        h = chain_hashes(toks)
        st, sp = stored or (toks[p], p)
        if et is None:
            et = toks[p] if self.pool is not None else -1
        return [kind, self.slot_of(rid, p), sp, st, et, h[p] if sh is None else sh, h[p] if eh is None else eh, bits]

    def rings(self):
        return ring_state(self.head), ring_state(self.tail)

    def all_tensors(self) -> list[torch.Tensor]:
        return (tensors(self.head) + tensors(self.tail) + tensors(self.vplan) + tensors(self.wplan)
                + [self.req_to_token] + ([self.pool] if self.pool is not None else []))


def clean(ring_capacity=16):
    return (0, expected_ring(ring_capacity, []))


def run_clean(pipe: Pipeline, steps) -> None:
    for i in steps:
        pipe.step(**SCHEDULE[i])
        assert pipe.rings() == (clean(), clean()), f"step {i} recorded a violation"


@pytest.fixture(params=devices())
def device(request):
    require(request.param)
    return request.param


@pytest.fixture(autouse=True)
def _tvm_backend():
    with use_backend("tvm"):
        yield


# ================================================================ clean runs


@pytest.mark.parametrize("with_pool", [True, False], ids=["pool", "no-pool"])
@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
def test_clean_pipeline_records_nothing(device, mode, with_pool):
    pipe = Pipeline(device, mode, seed=1, with_pool=with_pool)
    run_clean(pipe, range(len(SCHEDULE)))
    for ctx in (pipe.head, pipe.tail):
        assert int(ctx.kernel_run_counter[0]) == 2 * len(SCHEDULE)
        assert int(ctx.slot_run_counter[0]) == pipe.slot_runs
    # Both buffers hold every live request's chain from the anchor; TAIL also the KV fingerprints.
    head, tail = slot_fields(pipe.head.canary_buf), slot_fields(pipe.tail.canary_buf)
    fold = Folder(pipe.sources, mode)
    some = pipe.reqs["b"].slots[0]
    assert fold(some) == py_fold(pipe.sources, mode, some)  # the fast oracle is helpers.py's
    for rid, req in pipe.reqs.items():
        h = chain_hashes(req.tokens)
        for p in range(req.kv_len):
            slot = req.slots[p]
            assert head[slot] == (req.tokens[p], p, h[p], 0), (rid, p)
            rk = fold(slot)
            assert rk != 0
            assert tail[slot] == (req.tokens[p], p, h[p], rk), (rid, p)
    if with_pool:
        for req in pipe.reqs.values():
            assert pipe.pool[req.row, : len(req.tokens)].tolist() == req.tokens


# ================================================================ injected corruption

P = 4  # corrupted position of request b (its successor P + 1 is verified too; b has 11 tokens at step 3)


def buf_of(pipe: Pipeline, endpoint: str) -> torch.Tensor:
    return (pipe.head if endpoint == "head" else pipe.tail).canary_buf


def rows_only_in(endpoint: str, rows: list[list[int]]):
    """(head, tail) ring states when only ``endpoint``'s buffer recorded ``rows``."""
    got = (len(rows), expected_ring(16, rows))
    return (got, clean()) if endpoint == "head" else (clean(), got)


@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
@pytest.mark.parametrize("source,byte", [(0, 3), (1, 15), (0, 40), (1, 31)])
def test_flipped_real_kv_byte(device, mode, source, byte):
    """Bytes 0..15 of a strip are folded in both modes, bytes 16..read_bytes-1 only in ALL mode."""
    pipe = Pipeline(device, mode, seed=2)
    run_clean(pipe, range(3))
    slot = pipe.slot_of("b", P)
    src = pipe.sources[source]
    src.tensor.view(torch.uint8)[slot // src.page_size, (slot % src.page_size) * src.num_bytes_per_token + byte] ^= 0x10
    pipe.step(**SCHEDULE[3])
    if byte >= 16 and mode == PARTIAL:
        assert pipe.rings() == (clean(), clean())
        return
    assert pipe.rings() == (clean(), (1, expected_ring(16, [pipe.expected_row(TAIL, "b", P, V_RKV)])))


@pytest.mark.parametrize("endpoint", ["head", "tail"])
@pytest.mark.parametrize("with_pool", [True, False], ids=["pool", "no-pool"])
def test_overwritten_token(device, endpoint, with_pool):
    """With the expected-token pool the slot itself fails VERIFY_TOKEN; without it only the
    successor's chain check sees the change."""
    pipe = Pipeline(device, ALL, seed=3, with_pool=with_pool)
    run_clean(pipe, range(3))
    buf, slot = buf_of(pipe, endpoint), pipe.slot_of("b", P)
    tok, pos, prev, rk = get_slot(buf, slot)
    set_slot(buf, slot, 31999 - tok, pos, prev, rk)
    pipe.step(**SCHEDULE[3])
    kind = HEAD if endpoint == "head" else TAIL
    succ = pipe.expected_row(kind, "b", P + 1, V_CHAIN, eh=link(prev, 31999 - tok, pos))
    rows = [succ] if not with_pool else [pipe.expected_row(kind, "b", P, V_TOK, stored=(31999 - tok, P)), succ]
    assert pipe.rings() == rows_only_in(endpoint, rows)


@pytest.mark.parametrize("endpoint", ["head", "tail"])
def test_overwritten_position(device, endpoint):
    pipe = Pipeline(device, PARTIAL, seed=4)
    run_clean(pipe, range(3))
    buf, slot = buf_of(pipe, endpoint), pipe.slot_of("b", P)
    tok, pos, prev, rk = get_slot(buf, slot)
    set_slot(buf, slot, tok, 77, prev, rk)
    pipe.step(**SCHEDULE[3])
    kind = HEAD if endpoint == "head" else TAIL
    assert pipe.rings() == rows_only_in(endpoint, [
        pipe.expected_row(kind, "b", P, V_POS, stored=(tok, 77)),
        pipe.expected_row(kind, "b", P + 1, V_CHAIN, eh=link(prev, tok, 77)),
    ])


@pytest.mark.parametrize("endpoint", ["head", "tail"])
def test_overwritten_prev_hash(device, endpoint):
    pipe = Pipeline(device, ALL, seed=5)
    run_clean(pipe, range(3))
    buf, slot = buf_of(pipe, endpoint), pipe.slot_of("b", P)
    tok, pos, prev, rk = get_slot(buf, slot)
    bad = prev ^ 0x100
    set_slot(buf, slot, tok, pos, bad, rk)
    pipe.step(**SCHEDULE[3])
    kind = HEAD if endpoint == "head" else TAIL
    assert pipe.rings() == rows_only_in(endpoint, [
        pipe.expected_row(kind, "b", P, V_CHAIN, sh=bad),
        pipe.expected_row(kind, "b", P + 1, V_CHAIN, eh=link(bad, tok, pos)),
    ])


@pytest.mark.parametrize("same_position", [True, False], ids=["same-position", "other-position"])
def test_wrong_seed_slot(device, same_position):
    """Step 3 writes b's token 11 after a wrong seed. A seed at the right position (a's slot of
    position 10) passes the write's chain-position assert, so only the next step's verify sees the
    broken chain; a seed at another position (b's own position 7) also trips WRITE_POSITION at once."""
    pipe = Pipeline(device, PARTIAL, seed=6)
    run_clean(pipe, range(3))
    wrong_rid, wrong_pos = ("a", 10) if same_position else ("b", 7)
    wrong = pipe.slot_of(wrong_rid, wrong_pos)
    b_index = [rid for rid, _ in SCHEDULE[3]["batch"]].index("b")

    def tamper(p: Pipeline) -> None:
        assert int(p.wplan.write_seed_slot_indices[b_index]) == p.slot_of("b", 10)
        p.wplan.write_seed_slot_indices[b_index] = wrong

    pipe.step(**SCHEDULE[3], after_plan=tamper)
    bad_h = chain_hashes(pipe.reqs[wrong_rid].tokens)[wrong_pos + 1]
    b = pipe.reqs["b"]
    write_rows = {}
    for kind, ctx in ((HEAD, pipe.head), (TAIL, pipe.tail)):
        rows = [] if same_position else [[kind, pipe.slot_of("b", 11), 11, b.tokens[11], b.tokens[11], bad_h,
                                          wrong_pos + 1, W_POS]]
        write_rows[kind] = rows
        assert ring_state(ctx) == (len(rows), expected_ring(16, rows))
    assert get_slot(pipe.head.canary_buf, pipe.slot_of("b", 11))[2] == bad_h

    pipe.step(**SCHEDULE[4])
    for kind, ctx in ((HEAD, pipe.head), (TAIL, pipe.tail)):
        rows = write_rows[kind] + [pipe.expected_row(kind, "b", 11, V_CHAIN, sh=bad_h)]
        assert ring_state(ctx) == (len(rows), expected_ring(16, rows))


# ================================================================ tvm == reference


def corrupted_run(device: str, mode: RealKvHashMode, backend: str) -> Pipeline:
    """The whole schedule with a ring of 4 rows (it overflows) and several corruptions."""
    with use_backend(backend):
        pipe = Pipeline(device, mode, seed=7, ring=4)

        def flip_kv(p):
            s = p.slot_of("a", 2)
            p.sources[1].tensor.view(torch.uint8)[s // 4, (s % 4) * 32] ^= 1

        def bad_token(p):
            s = p.slot_of("b", 3)
            tok, pos, prev, rk = get_slot(p.head.canary_buf, s)
            set_slot(p.head.canary_buf, s, tok + 1, pos, prev, rk)

        def bad_seed(p):
            p.wplan.write_seed_slot_indices[0] = p.slot_of("b", 5)

        pipe.run(range(2))
        flip_kv(pipe)
        pipe.run(range(2, 4))
        bad_token(pipe)
        pipe.run(range(4, len(SCHEDULE)), {4: dict(after_plan=bad_seed)})
    return pipe


@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
def test_pipeline_matches_reference_backend(device, mode):
    got = corrupted_run(device, mode, "tvm")
    want = corrupted_run(device, mode, "reference")
    assert int(got.head.violation_write_index[0]) > 4 and int(got.tail.violation_write_index[0]) > 4
    assert_same_bytes(got.all_tensors(), want.all_tensors())
    assert_same_bytes([s.tensor for s in got.sources], [s.tensor for s in want.sources])
