"""CanarySession on CUDA: no host synchronisation per step, one CUDA graph per decode step.

A small decode workload (a token a row per step after a prefill, FULL + SWA groups, K and V, real-KV
sources, expected-token check, sweeps, health check) runs on device-built inputs, faults injected between
steps (canary fields of HEAD/TAIL/SWA buffers, a real-KV source byte). An eager session and one replaying
its ``StepGraph`` run under ``torch.cuda.set_sync_debug_mode("error")``, equal byte for byte after every
step; both report every fault, rows only of faulted requests.
"""

from __future__ import annotations

import pytest
import torch

from tvm_canary.consts import FailReason
from tvm_canary.context import CanaryLaunchTag as Tag
from tvm_canary.context import RealKvSource
from tvm_canary.session import CanaryGroup, CanarySession
from tvm_canary.violations import Violation

ROWS, MAX_LEN, PROMPT, STEPS, BUCKET = 6, 48, 8, 24, 8  # BUCKET > ROWS: two padding rows per replay
SLOTS = ROWS * MAX_LEN + 1
PAGE, STRIP, LAYERS, WINDOW = 4, 64, 2, 4
# step -> (what, row, position): injected after that step, found by the next one
SWEPT_ROW = 5  # never faulted
FAULTS = {
    5: ("HEAD_K_FULL", 2, 3),
    9: ("KV_K", 4, 5),
    13: ("HEAD_V_SWA", 1, None),  # a position inside the SWA window
    17: ("TAIL_V_FULL", 3, 1),
}
# asserting runs: one row's expected token at one step, another's expected position, off by one
WRONG_TOKEN_STEP, WRONG_TOKEN_ROW, WRONG_POSITION_STEP, WRONG_POSITION_ROW = 11, 2, 15, 4

pytestmark = pytest.mark.gpu  # skipped without a GPU (tests/conftest.py)


class DecodeRun:
    """One session over its own KV tensors; ``step(k)`` runs step k (0 = prefill of PROMPT tokens).
    ``swa=False`` leaves the SWA group out (the faults and ``state()`` need it). ``write_input_assert``:
    None, no assert; True, every step given the expected inputs (a token and a position wrong:
    ``WRONG_TOKEN_STEP``, ``WRONG_POSITION_STEP``); False, the session's assert turned off by every step
    (and captured graph), as an EAGLE draft-decode step does."""

    def __init__(self, graph: bool, device: str = "cuda", swa: bool = True,
                 write_input_assert: bool | None = None) -> None:
        dev = self.device = torch.device(device)
        self.write_input_assert = write_input_assert
        self.reported: list[Violation] = []  # rows returned by violations() and flush(), in order
        gen = torch.Generator().manual_seed(0)
        slots = torch.randperm(SLOTS - 1, generator=gen)[: ROWS * MAX_LEN] + 1
        self.table_host = torch.cat([torch.zeros(1, MAX_LEN, dtype=torch.int32),  # row 0 = padding
                                     slots.to(torch.int32).view(ROWS, MAX_LEN)])
        self.table = self.table_host.to(dev)
        self.kv_gen = torch.Generator(device=dev).manual_seed(1)
        self.kv = {
            h: [torch.zeros(SLOTS // PAGE + 1, PAGE * STRIP, dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
            for h in "KV"
        }
        lut = torch.arange(SLOTS, dtype=torch.int64, device=dev) + SLOTS  # SWA slot = full slot + SLOTS
        lut[0] = 0
        swa_group = CanaryGroup(num_slots=2 * SLOTS, swa_window_size=WINDOW, full_to_swa_index_mapping=lut)
        self.session = CanarySession(
            full=CanaryGroup(num_slots=SLOTS, k_sources=self.sources("K"), v_sources=self.sources("V")),
            swa=swa_group if swa else None,
            device=dev, write_req_capacity=BUCKET, write_entry_capacity=ROWS * PROMPT,
            expected_token_pool_shape=(ROWS + 1, MAX_LEN), sweep_interval=4, health_warmup_steps=4,
            health_check_interval=4, violation_mode="quiet", enable_write_input_assert=write_input_assert is not None,
        )
        self.session.mark_init_finished()
        self.rows = torch.arange(1, ROWS + 1, device=dev)
        self.step_flags = {"write_input_assert": False} if write_input_assert is False else {}
        self.graph = (self.session.capture_step(batch_size=BUCKET, req_to_token=self.table, **self.step_flags)
                      if graph else None)

    def sources(self, half: str) -> tuple[RealKvSource, ...]:
        return tuple(RealKvSource(tensor=t, page_size=PAGE, num_bytes_per_token=STRIP, read_bytes=STRIP)
                     for t in self.kv[half])

    def inputs(self, k: int) -> dict:
        """Step k's batch, built on the device: row r writes positions [start, start + extend)."""
        start, extend = (0, PROMPT) if k == 0 else (PROMPT + k - 1, 1)
        dev, rows = self.device, self.rows
        pos = (start + torch.arange(extend, device=dev)).repeat(ROWS)
        row_of_token = rows.repeat_interleave(extend, output_size=ROWS * extend)
        known = 1000 * rows[:, None] + torch.arange(start + extend, device=dev)
        input_ids = 1000 * row_of_token + pos
        batch = dict(
            req_pool_indices=rows, prefix_lens=torch.full((ROWS,), start, device=dev),
            extend_seq_lens=torch.full((ROWS,), extend, device=dev), input_ids=input_ids,
            positions=pos, out_cache_loc=self.table[row_of_token, pos].long(), req_to_token=self.table,
            token_ids=known.flatten(), token_lens=torch.full((ROWS,), start + extend, device=dev),
        )
        if self.write_input_assert:
            wrong_token = (row_of_token == WRONG_TOKEN_ROW) & (k == WRONG_TOKEN_STEP)
            wrong_position = (row_of_token == WRONG_POSITION_ROW) & (k == WRONG_POSITION_STEP)
            batch.update(expected_input_tokens=input_ids + wrong_token, expected_input_positions=pos + wrong_position)
        return batch

    def forward(self, out_cache_loc: torch.Tensor) -> None:
        """The model: fresh K/V bytes for the step's slots."""
        for half in "KV":
            for t in self.kv[half]:
                data = torch.randint(0, 256, (out_cache_loc.shape[0], STRIP), dtype=torch.uint8, device=self.device,
                                     generator=self.kv_gen)
                t.view(-1, STRIP)[out_cache_loc] = data

    def step(self, k: int) -> None:
        batch = self.inputs(k)
        if self.graph is None or k == 0:  # the prefill runs eagerly in both runs
            self.session.before_forward(**batch, **self.step_flags)
            self.forward(batch["out_cache_loc"])
            self.session.after_forward()
        else:
            self.forward(batch["out_cache_loc"])  # HEAD reads no KV, so the model may run first
            self.graph.replay(**batch)
        if self.session.sweep_due:
            length = PROMPT + k
            slots = self.table[SWEPT_ROW, :length].long()
            prev = torch.cat([torch.full((1,), -1, device=self.device), slots[:-1]])
            self.session.sweep(torch.stack([slots, torch.arange(length, device=self.device), prev], 1))
        self.reported += self.session.violations().records
        if k in FAULTS:
            self.inject(k, *FAULTS[k])

    def slot(self, row: int, pos: int) -> int:
        return int(self.table_host[row, pos])  # the host copy: the device table's would synchronise

    def fault_slot(self, k: int) -> tuple[str, int]:
        """(group, canary slot) of the fault injected after step k."""
        what, row, pos = FAULTS[k]
        if what.endswith("SWA"):
            return "SWA", self.slot(row, PROMPT + k - 2) + SLOTS
        return "FULL", self.slot(row, pos)

    def inject(self, k: int, what: str, row: int, pos: int | None) -> None:
        group, slot = self.fault_slot(k)
        if what == "KV_K":
            self.kv["K"][0].view(-1, STRIP)[slot, 0] ^= 0x40
            return
        endpoint, half, _ = what.split("_")
        self.session.canary_buffer(endpoint, half, group).view(torch.int64)[slot, 1] += 7

    def state(self) -> list[torch.Tensor]:
        s = self.session
        bufs = [s.canary_buffer(e, h, g) for g in ("FULL", "SWA") for e in ("HEAD", "TAIL") for h in "KV"]
        return bufs + [s.violation_log.violation_ring, s.violation_log.violation_write_index,
                       s.kernel_run_counters, s.slot_run_counters, s.expected_token_pool]


    def flush(self) -> list[Violation]:
        """Everything reported, after the final flush; checked against the ring read synchronously."""
        self.reported += self.session.flush().records
        log = self.session.violation_log
        stored = min(int(log.violation_write_index[0]), log.violation_ring.shape[0])
        assert self.reported == [Violation.from_row(r) for r in log.violation_ring[:stored].cpu().tolist()]
        return self.reported


def full_slot(row: Violation) -> int:
    """The full-pool slot of a row (an SWA endpoint's slot is the full slot + SLOTS)."""
    return row.slot - SLOTS if row.tag.name.endswith("SWA") else row.slot


def check_detection(run: DecodeRun, rows: list[Violation]) -> None:
    """Every fault has a row at its slot; every row belongs to a faulted request (its row of the table)."""
    found = {(r.tag.name.split("_")[2], r.slot) for r in rows}
    for k in FAULTS:
        assert run.fault_slot(k) in found, f"fault after step {k} ({FAULTS[k]}) not reported"
    owner = {run.slot(r, p): r for r in range(1, ROWS + 1) for p in range(MAX_LEN)}
    faulted = {row for _, row, _ in FAULTS.values()}
    for r in rows:
        assert owner.get(full_slot(r)) in faulted, f"row of an unfaulted request: {r.line()}"
    assert {Tag.HEAD_K_FULL, Tag.TAIL_K_FULL, Tag.HEAD_V_SWA, Tag.TAIL_V_FULL} <= {r.tag for r in rows}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph-replay"])
def test_session_steps_never_synchronise_and_report_one_step_late(graph):
    run = DecodeRun(graph=graph)
    run.step(0)
    run.step(1)  # kernels are loaded by now (and the graph replayed once)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for k in range(2, STEPS):
            run.step(k)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert run.reported, "no row reached the host before flush()"
    check_detection(run, run.flush())
    assert not run.session.flush()  # nothing new


def check_replay_equals_eager(eager: DecodeRun, graphed: DecodeRun) -> None:
    """Step both runs: state tensors equal after every step, the same rows reported, detecting every fault,
    with write rows iff the steps assert their inputs (at the wrong expected token's and position's slots
    alone)."""
    for k in range(STEPS):
        eager.step(k)
        graphed.step(k)
        for i, (a, b) in enumerate(zip(eager.state(), graphed.state())):
            assert torch.equal(a, b), f"state tensor {i} differs after step {k}"
    rows = graphed.flush()
    assert eager.flush() == rows
    check_detection(graphed, rows)
    wrong = {(graphed.slot(WRONG_TOKEN_ROW, PROMPT + WRONG_TOKEN_STEP - 1), FailReason.WRITE_TOKEN_MISMATCH),
             (graphed.slot(WRONG_POSITION_ROW, PROMPT + WRONG_POSITION_STEP - 1), FailReason.WRITE_POSITION_MISMATCH)}
    write_rows = {(full_slot(r), r.reasons) for r in rows if r.is_write}
    assert write_rows == (wrong if graphed.write_input_assert else set())


@pytest.mark.parametrize("write_input_assert", [None, True, False], ids=["no-assert", "asserting", "step-turns-it-off"])
def test_step_graph_replay_equals_the_eager_session(write_input_assert):
    check_replay_equals_eager(DecodeRun(graph=False, write_input_assert=write_input_assert),
                              DecodeRun(graph=True, write_input_assert=write_input_assert))


def test_host_inputs_are_copied_without_waiting_for_the_device():
    """Prefill chunks of 128K tokens (6-8 MiB of host data, past what a driver copies from pageable memory
    without waiting), all on the host or all but ``token_ids`` on the device, replayed and eager, a host
    ``req_to_token`` (5 MiB) and host sweep chains (7 MiB) are enqueued while a long kernel still runs once
    each path has run, and arrive intact (no violation)."""
    rows, tokens, chunks = 8, 16384, 9
    width = chunks * tokens
    table_host = torch.cat([torch.zeros(1, width, dtype=torch.int32),
                            torch.arange(1, rows * width + 1, dtype=torch.int32).view(rows, width)])
    table = table_host.cuda()
    session = CanarySession(full=CanaryGroup(num_slots=rows * width + 1), device="cuda", write_req_capacity=rows,
                            write_entry_capacity=rows * tokens, expected_token_pool_shape=(rows + 1, width),
                            violation_mode="quiet")
    session.mark_init_finished()

    def chunk(c: int, on_host: bool = True) -> dict:
        """Chunk c of every row (positions [c * tokens, (c + 1) * tokens)); ``token_ids`` on the host, the
        rest too when ``on_host``, else on the device."""
        row = torch.arange(1, rows + 1)
        pos = (c * tokens + torch.arange(tokens)).repeat(rows)
        row_of_token = row.repeat_interleave(tokens)
        batch = dict(req_pool_indices=row, prefix_lens=torch.full((rows,), c * tokens),
                     extend_seq_lens=torch.full((rows,), tokens), input_ids=100_000 * row_of_token + pos,
                     positions=pos, out_cache_loc=table_host[row_of_token, pos].long(),
                     token_lens=torch.full((rows,), (c + 1) * tokens))
        batch = {name: v if on_host else v.cuda() for name, v in batch.items()}
        known = 100_000 * row[:, None] + torch.arange((c + 1) * tokens)
        return dict(batch, req_to_token=table, token_ids=known.flatten())

    def eager(**batch) -> None:
        session.before_forward(**batch)
        session.after_forward()

    def chains(first_row: int) -> torch.Tensor:
        """Rows ``first_row`` and the next, whole: (slot, position, prev_slot), -1 before each head."""
        slots = table_host[first_row : first_row + 2].long()
        prev = torch.cat([torch.full((2, 1), -1), slots[:, :-1]], dim=1)
        return torch.stack([slots, torch.arange(width).expand(2, width), prev], dim=2).reshape(-1, 3)

    def enqueued_without_waiting(step: str, run, *args, **kwargs) -> None:
        torch.cuda.synchronize()
        torch.cuda._sleep(1 << 30)  # about 0.5 s
        slept = torch.cuda.Event()
        slept.record()
        run(*args, **kwargs)
        assert not slept.query(), f"the {step} step waited for the device"

    eager(**chunk(0))  # loads the kernels
    graph = session.capture_step(batch_size=rows, num_tokens=rows * tokens, req_to_token=table)
    graph.replay(**chunk(1, on_host=False))  # and the mixed paths' torch kernels
    eager(**chunk(2, on_host=False))
    eager(**dict(chunk(3), req_to_token=table_host))
    for step, run, batch in (("host replay", graph.replay, chunk(4)), ("host eager", eager, chunk(5)),
                             ("mixed replay", graph.replay, chunk(6, on_host=False)),  # token_ids: 6 and 7 MiB
                             ("mixed eager", eager, chunk(7, on_host=False)),
                             ("host table", eager, dict(chunk(8), req_to_token=table_host))):
        enqueued_without_waiting(step, run, **batch)
    session.sweep(chains(1))  # grows the sweep plans
    enqueued_without_waiting("host sweep", session.sweep, chains(3))
    assert not session.flush().records


def test_demo_with_cuda_graph_detects_every_fault(capsys):
    from tvm_canary.cli import main

    assert main(["demo", "--steps", "60", "--swa", "--cuda-graph", "--device", "cuda", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "canary time per step (eager," in out and "canary time per step (CUDA graph," in out
