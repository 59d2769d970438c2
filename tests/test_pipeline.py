"""End to end: scatter -> plan -> verify -> write over several steps of a synthetic batch.

Requests share a ReqToTokenPool-style ``req_to_token`` table and a randomly allocated KV slot pool:
prefills (one chunked), decodes, a finished request's row and slots reused, CUDA-graph padding rows.
Steps run as the engine's (SPEC 6): scatter, plan, HEAD (no real-KV sources), "model forward" (random KV bytes for the
step's slots), TAIL (two real-KV sources, PARTIAL or ALL). Public API, tvm backend.

Clean runs record nothing and leave canary buffers equal to a Python-int oracle; injected corruption is reported with
the exact slots and fail-reason bits; the whole corrupted run is byte-identical on tvm and reference backends.
"""

from __future__ import annotations

import dataclasses
from typing import Callable
from unittest import mock

import pytest
import torch

import tvm_canary as tc
from tvm_canary import session as session_module
from tvm_canary.consts import FailReason, RealKvHashMode
from tvm_canary.context import CanaryLaunchTag
from tvm_canary.runtime import use_backend
from tvm_canary.session import CanaryGroup, CanarySession
from tvm_canary.testing import KvPool

from helpers import (
    ANCHOR,
    POISON_I64,
    expected_ring,
    fold_bytes,
    fold_strips,
    get_slot,
    link,
    py_fold,
    random_source,
    set_slot,
)
from tree import assert_same_bytes, devices, require, tensors

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
        strips = []
        for rows, src in self.parts:
            col = (slot % src.page_size) * src.num_bytes_per_token
            strips.append(bytes(rows[slot // src.page_size][col : col + fold_bytes(src, self.mode)]))
        return fold_strips(strips)


@dataclasses.dataclass
class Request:
    row: int
    tokens: list[int]
    kv_len: int = 0
    slots: list[int] = dataclasses.field(default_factory=list)


class Pipeline:
    """A scripted engine (SCHEDULE) feeding a ``CanarySession`` (FULL group, K half, HEAD and TAIL):
    builds the batches, plays the model (``KvPool.write`` between ``before_forward`` and
    ``after_forward``), exposes the state."""

    def __init__(self, device: str, mode: RealKvHashMode, seed: int, *, with_pool: bool = True, ring: int = 16):
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.free = (torch.randperm(NUM_SLOTS - 1, generator=self.gen) + 1).tolist()
        self.reqs: dict[str, Request] = {}
        self.steps_run = 0
        self.slot_runs = 0
        self.req_to_token = torch.zeros((REQ_ROWS, MAX_LEN), dtype=torch.int32, device=device)
        self.sources = (
            # plain rows 80 bytes apart (strided view), 64 bytes per token, ALL folds 48
            random_source(self.gen, rows=NUM_SLOTS, page_size=1, nbpt=64, read_bytes=48, row_stride_bytes=80,
                          device=device),
            # paged (4 slots per row), bfloat16, ALL folds all 32 bytes
            random_source(self.gen, rows=NUM_SLOTS // 4, page_size=4, nbpt=32, read_bytes=32,
                          dtype=torch.bfloat16, device=device),
        )
        self.kv = KvPool({"K": self.sources}, self.gen)
        self.session = CanarySession(
            full=CanaryGroup(num_slots=NUM_SLOTS, k_sources=self.sources),
            device=device,
            write_req_capacity=WRITE_CAP,
            write_entry_capacity=WRITE_CAP * MAX_LEN,
            verify_capacity=VERIFY_CAP,
            ring_capacity=ring,
            real_kv_hash_mode=mode,
            enable_v=False,
            expected_token_pool_shape=(REQ_ROWS, MAX_LEN) if with_pool else None,
            enable_write_input_assert=True,
            health_check_interval=0,
            violation_mode="quiet",
        )
        self.session.mark_init_finished()
        self.session.violation_log.violation_ring.fill_(POISON_I64)  # rows never written stay recognisable
        self.pool = self.session.expected_token_pool
        self.vplan: tc.VerifyPlan | None = None  # the session's plans, seen at its first plan launch
        self.wplan: tc.WritePlan | None = None

    # -- engine side

    def _token(self) -> int:
        return int(torch.randint(0, 32000, (1,), generator=self.gen))

    def _plan(self, after_plan: Callable[["Pipeline"], None] | None):
        """The session's plan/scatter dispatch, wrapped at the plan: remembers (first poisoning) the plans,
        checks the verify plan did not overflow, runs ``after_plan`` before HEAD's verify and write."""
        dispatch = session_module.dispatch

        def plan(kernel, kw):
            if kernel != "plan":
                return dispatch(kernel, kw)
            if self.vplan is None:
                self.vplan, self.wplan = kw["verify_plan_out"], kw["write_plan_out"]
                for t in tensors(self.vplan) + tensors(self.wplan):  # deterministic stale tails
                    t.fill_(POISON_I64)
            dispatch(kernel, kw)
            assert int(self.vplan.enable[0]) == 1
            if after_plan is not None:
                after_plan(self)

        return plan

    def step(self, batch, *, pad: int = 0, finish=(), after_plan: Callable[["Pipeline"], None] | None = None):
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
        tokens = dict(token_ids=flat, token_lens=lens) if self.pool is not None else {}
        with mock.patch.object(session_module, "dispatch", self._plan(after_plan)):
            self.session.before_forward(
                req_pool_indices=rpi, prefix_lens=prefix, extend_seq_lens=extend, input_ids=ids, positions=pos,
                out_cache_loc=locs, req_to_token=self.req_to_token,
                expected_input_tokens=ids, expected_input_positions=pos,  # the token oracle agrees
                **tokens,
            )
        self.kv.write(locs)  # the model's forward
        self.session.after_forward()
        for rid, n in batch:
            self.reqs[rid].kv_len += n
        self.steps_run += 1
        self.slot_runs += sum(prefix[: len(batch)]) + sum(extend[: len(batch)])

    def run(self, steps, hooks=None) -> None:
        """Run the SCHEDULE steps ``steps``; ``hooks`` maps a step to extra ``step`` keywords."""
        for i in steps:
            self.step(**SCHEDULE[i], **(hooks or {}).get(i, {}))

    # -- test side

    def slot_of(self, rid: str, p: int) -> int:
        return self.reqs[rid].slots[p]

    def buffer(self, endpoint: str) -> torch.Tensor:
        """The K canary buffer of ``endpoint`` ("head" or "tail")."""
        return self.session.canary_buffer(endpoint.upper(), "K")

    def counters(self, tag: int) -> tuple[int, int]:
        """(kernel_run_counter, slot_run_counter) of launch tag ``tag``."""
        return int(self.session.kernel_run_counters[tag]), int(self.session.slot_run_counters[tag])

    def expected_row(self, kind, rid, p, bits, *, stored=None, et=None, sh=None, eh=None) -> list[int]:
        """A verify row for ``rid``'s position ``p``, stored fields clean unless overridden (``stored`` =
        (token, position))."""
        toks = self.reqs[rid].tokens
        h = chain_hashes(toks)
        st, sp = stored or (toks[p], p)
        if et is None:
            et = toks[p] if self.pool is not None else -1
        return [kind, self.slot_of(rid, p), sp, st, et, h[p] if sh is None else sh, h[p] if eh is None else eh, bits]

    def ring(self) -> tuple[int, list[list[int]]]:
        """(write index, every ring row): the session's one ring, HEAD rows of a step before its TAIL rows."""
        log = self.session.violation_log
        return int(log.violation_write_index[0]), log.violation_ring.cpu().tolist()

    def all_tensors(self) -> list[torch.Tensor]:
        s = self.session
        return ([s.canary_buffer(e, "K") for e in ("HEAD", "TAIL")]
                + [s.violation_log.violation_ring, s.violation_log.violation_write_index, s.kernel_run_counters,
                   s.slot_run_counters]
                + tensors(self.vplan) + tensors(self.wplan)
                + [self.req_to_token] + ([self.pool] if self.pool is not None else []))


def clean(ring_capacity=16):
    return (0, expected_ring(ring_capacity, []))


def run_clean(pipe: Pipeline, steps) -> None:
    for i in steps:
        pipe.step(**SCHEDULE[i])
        assert pipe.ring() == clean(), f"step {i} recorded a violation"


@pytest.fixture(params=devices())
def device(request):
    require(request.param)
    return request.param


@pytest.fixture(autouse=True)
def _tvm_backend():
    with use_backend("tvm"):
        yield


# ===== clean runs


@pytest.mark.parametrize("with_pool", [True, False], ids=["pool", "no-pool"])
@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
def test_clean_pipeline_records_nothing(device, mode, with_pool):
    pipe = Pipeline(device, mode, seed=1, with_pool=with_pool)
    run_clean(pipe, range(len(SCHEDULE)))
    for tag in (HEAD, TAIL):
        assert pipe.counters(tag) == (2 * len(SCHEDULE), pipe.slot_runs)
    # Both buffers hold every live request's chain from the anchor; TAIL also the KV fingerprints.
    head, tail = slot_fields(pipe.buffer("head")), slot_fields(pipe.buffer("tail"))
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


# ===== injected corruption

P = 4  # corrupted position of request b (its successor P + 1 is verified too; b has 11 tokens at step 3)


def recorded(rows: list[list[int]]):
    """The ring state after exactly ``rows`` were recorded."""
    return (len(rows), expected_ring(16, rows))


@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
@pytest.mark.parametrize("source,byte", [(0, 3), (1, 15), (0, 40), (1, 31)])
def test_flipped_real_kv_byte(device, mode, source, byte):
    """Bytes 0..15 of a strip are folded in both modes, bytes 16..read_bytes-1 only in ALL mode."""
    pipe = Pipeline(device, mode, seed=2)
    run_clean(pipe, range(3))
    pipe.kv.flip("K", source, pipe.slot_of("b", P), byte, 0x10)
    pipe.step(**SCHEDULE[3])
    if byte >= 16 and mode == PARTIAL:
        assert pipe.ring() == clean()
        return
    assert pipe.ring() == recorded([pipe.expected_row(TAIL, "b", P, V_RKV)])


@pytest.mark.parametrize("endpoint", ["head", "tail"])
@pytest.mark.parametrize("with_pool", [True, False], ids=["pool", "no-pool"])
def test_overwritten_token(device, endpoint, with_pool):
    """With the expected-token pool the slot fails VERIFY_TOKEN; without, only its successor's chain check."""
    pipe = Pipeline(device, ALL, seed=3, with_pool=with_pool)
    run_clean(pipe, range(3))
    buf, slot = pipe.buffer(endpoint), pipe.slot_of("b", P)
    tok, pos, prev, rk = get_slot(buf, slot)
    set_slot(buf, slot, 31999 - tok, pos, prev, rk)
    pipe.step(**SCHEDULE[3])
    kind = HEAD if endpoint == "head" else TAIL
    succ = pipe.expected_row(kind, "b", P + 1, V_CHAIN, eh=link(prev, 31999 - tok, pos))
    rows = [succ] if not with_pool else [pipe.expected_row(kind, "b", P, V_TOK, stored=(31999 - tok, P)), succ]
    assert pipe.ring() == recorded(rows)


@pytest.mark.parametrize("endpoint", ["head", "tail"])
def test_overwritten_position(device, endpoint):
    pipe = Pipeline(device, PARTIAL, seed=4)
    run_clean(pipe, range(3))
    buf, slot = pipe.buffer(endpoint), pipe.slot_of("b", P)
    tok, pos, prev, rk = get_slot(buf, slot)
    set_slot(buf, slot, tok, 77, prev, rk)
    pipe.step(**SCHEDULE[3])
    kind = HEAD if endpoint == "head" else TAIL
    assert pipe.ring() == recorded([
        pipe.expected_row(kind, "b", P, V_POS, stored=(tok, 77)),
        pipe.expected_row(kind, "b", P + 1, V_CHAIN, eh=link(prev, tok, 77)),
    ])


@pytest.mark.parametrize("endpoint", ["head", "tail"])
def test_overwritten_prev_hash(device, endpoint):
    pipe = Pipeline(device, ALL, seed=5)
    run_clean(pipe, range(3))
    buf, slot = pipe.buffer(endpoint), pipe.slot_of("b", P)
    tok, pos, prev, rk = get_slot(buf, slot)
    bad = prev ^ 0x100
    set_slot(buf, slot, tok, pos, bad, rk)
    pipe.step(**SCHEDULE[3])
    kind = HEAD if endpoint == "head" else TAIL
    assert pipe.ring() == recorded([
        pipe.expected_row(kind, "b", P, V_CHAIN, sh=bad),
        pipe.expected_row(kind, "b", P + 1, V_CHAIN, eh=link(bad, tok, pos)),
    ])


@pytest.mark.parametrize("same_position", [True, False], ids=["same-position", "other-position"])
def test_wrong_seed_slot(device, same_position):
    """Step 3 writes b's token 11 after a wrong seed. One at the right position (a's slot of position 10)
    passes the write's chain-position assert: only the next verify sees the broken chain; one elsewhere
    (b's position 7) also trips WRITE_POSITION at once."""
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
    write_rows = [] if same_position else [
        [kind, pipe.slot_of("b", 11), 11, b.tokens[11], b.tokens[11], bad_h, wrong_pos + 1, W_POS]
        for kind in (HEAD, TAIL)
    ]
    assert pipe.ring() == recorded(write_rows)
    assert get_slot(pipe.buffer("head"), pipe.slot_of("b", 11))[2] == bad_h

    pipe.step(**SCHEDULE[4])
    verify_rows = [pipe.expected_row(kind, "b", 11, V_CHAIN, sh=bad_h) for kind in (HEAD, TAIL)]
    assert pipe.ring() == recorded(write_rows + verify_rows)


# ===== tvm == reference


def corrupted_run(device: str, mode: RealKvHashMode, backend: str) -> Pipeline:
    """The whole schedule with a ring of 4 rows (it overflows) and several corruptions."""
    with use_backend(backend):
        pipe = Pipeline(device, mode, seed=7, ring=4)

        def flip_kv(p):
            p.kv.flip("K", 1, p.slot_of("a", 2), 0, 1)

        def bad_token(p):
            s = p.slot_of("b", 3)
            tok, pos, prev, rk = get_slot(p.buffer("head"), s)
            set_slot(p.buffer("head"), s, tok + 1, pos, prev, rk)

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
    assert got.ring()[0] > 8  # the ring of 4 overflowed
    assert_same_bytes(got.all_tensors(), want.all_tensors())
    assert_same_bytes([s.tensor for s in got.sources], [s.tensor for s in want.sources])
