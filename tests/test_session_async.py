"""The session's asynchronous host side, on CPU with stand-in CUDA events that arrive when told.

On CUDA status snapshots and ring rows reach the host by non-blocking copies; held back here, nothing is reported before
they arrive, rows come in two stages (snapshot, rows), ``flush()`` waits for all, the overflow warning for its snapshot.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from test_session import make_session, poke, slot, step, step_inputs

from tvm_canary import session as session_module
from tvm_canary import violations as violations_module


class HeldEvent:
    """A CUDA event stand-in: complete only after ``release`` or ``synchronize``."""

    created: list["HeldEvent"] = []

    def __init__(self) -> None:
        self.done = False
        HeldEvent.created.append(self)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    @classmethod
    def release_all(cls) -> None:
        for event in cls.created:
            event.done = True


@pytest.fixture(autouse=True)
def held_copies(monkeypatch):
    HeldEvent.created = []
    for module in (session_module, violations_module):
        monkeypatch.setattr(module, "record_event", lambda device: HeldEvent())


def test_rows_are_reported_once_their_copies_arrive():
    session, kv = make_session()
    step(session, kv, 0, 4)
    poke(session, "HEAD", "K", slot(1, 2), 1, 100)
    step(session, kv, 4, 1)
    assert not session.violations()  # the status snapshots have not arrived
    HeldEvent.release_all()
    assert not session.violations()  # the snapshot arrived: the rows' copy has only just started
    HeldEvent.release_all()
    rows = session.violations().records
    assert {(r.tag.name, r.slot) for r in rows} >= {("HEAD_K_FULL", slot(1, 2))}
    assert not session.violations()  # each row once
    poke(session, "TAIL", "V", slot(2, 1), 1, 100)
    step(session, kv, 5, 1)
    report = session.flush()  # waits for both stages
    assert {(r.tag.name, r.slot) for r in report.records} >= {("TAIL_V_FULL", slot(2, 1))}


def test_overflow_warning_waits_for_its_snapshot():
    session, kv = make_session(verify_capacity=4)
    step(session, kv, 0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(session, kv, 4, 1)  # overflows, but its snapshot is held
    with pytest.warns(RuntimeWarning, match="per-forward verify skipped this step due to overflow"):
        session.flush()


def test_a_warning_filter_that_raises_cannot_stop_a_step_half_done():
    """An overflow decoded as a step begins is warned at its end, once the step ran whole."""
    session, kv = make_session(verify_capacity=4)
    step(session, kv, 0, 4)
    step(session, kv, 4, 1)  # overflows, its snapshot held
    HeldEvent.release_all()  # it arrives as the next step begins
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session.before_forward(**step_inputs(session, 5, 1))
        with pytest.raises(RuntimeWarning, match=r"overflow \(step 2\)"):
            session.after_forward()
    assert session.kernel_run_counters.tolist()[:4] == [6] * 4  # verify + write, HEAD and TAIL, K and V, 3 steps
    session.before_forward(**step_inputs(session, 6, 1))  # no step pending


def test_a_host_too_far_ahead_waits_for_the_oldest_snapshot():
    session, kv = make_session()
    for p in range(session_module.SNAPSHOT_SLOTS + 2):  # one snapshot per step, none arrives by itself
        step(session, kv, p, 1)
    waited = [e for e in HeldEvent.created if e.done]
    assert waited  # the oldest snapshots were awaited, freeing a pinned slot
    assert len(session._snapshots) == session_module.SNAPSHOT_SLOTS
    assert not session.flush()  # clean steps
    assert not session._snapshots


def stand_in_cuda_graphs(monkeypatch) -> None:
    """``capture_step`` on a CPU session: a stand-in graph records the captured work, replays it by running
    it again; events complete at once."""
    import contextlib

    class StandInGraph:
        def replay(self) -> None:
            self.work()

    capturing: list[StandInGraph] = []

    @contextlib.contextmanager
    def record(graph):
        capturing.append(graph)
        yield
        capturing.pop()

    real_work = session_module.StepGraph._work

    def work(self) -> None:
        if capturing:
            capturing[-1].work = lambda: real_work(self)
        else:
            real_work(self)

    monkeypatch.setattr(session_module.StepGraph, "_work", work)
    monkeypatch.setattr(session_module.torch.cuda, "CUDAGraph", StandInGraph)
    monkeypatch.setattr(session_module.torch.cuda, "graph", record)
    monkeypatch.setattr(session_module.torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(session_module.CanarySession, "capture_step",
                        lambda self, **kw: session_module.StepGraph(self, num_tokens=kw["batch_size"], forward=None,
                                                                    **kw))
    HeldEvent.release_all()
    monkeypatch.setattr(violations_module, "record_event", lambda device: None)
    monkeypatch.setattr(session_module, "record_event", lambda device: None)


@pytest.mark.parametrize("write_input_assert", [None, True, False], ids=["no-assert", "asserting", "step-turns-it-off"])
@pytest.mark.parametrize("staged_on_host", [True, False], ids=["host-staging", "device-concatenation"])
def test_step_graph_refills_and_pads_like_the_eager_session(monkeypatch, staged_on_host, write_input_assert):
    """StepGraph's own logic (static buffers, padding rows and tokens, scatter offsets, step bookkeeping,
    the write input assert's inputs) on CPU, both ways of refilling inputs (CUDA: host / device inputs).
    The real capture: tests/test_session_cuda.py (GPU)."""
    import test_session_cuda as decode

    stand_in_cuda_graphs(monkeypatch)
    monkeypatch.setattr(session_module.StepGraph, "_stage_on_host", staticmethod(lambda values: staged_on_host))
    eager, graphed = (decode.DecodeRun(graph=graph, device="cpu", write_input_assert=write_input_assert)
                      for graph in (False, True))
    decode.check_replay_equals_eager(eager, graphed)


@pytest.mark.parametrize("name, change, error", [
    ("token_ids", lambda t: t.repeat(7), "420 values do not fit the captured buffer of 384"),
    ("positions", lambda t: t[:3], "positions length must be 6, got 3"),
    ("out_cache_loc", lambda t: t.repeat(2), "out_cache_loc length must be 6, got 12"),
    ("prefix_lens", lambda t: t[:3], "prefix_lens length must be 6, got 3"),
    ("extend_seq_lens", lambda t: t * 2, r"extend_seq_lens write \d+ tokens, more than the 6 of input_ids"),
])
def test_a_replay_whose_inputs_do_not_fit_is_not_a_step(monkeypatch, name, change, error):
    """StepGraph.replay rejects inputs too long for its buffers or of lengths before_forward rejects (it
    would pad them) before copying or counting anything."""
    import test_session_cuda as decode

    stand_in_cuda_graphs(monkeypatch)
    run = decode.DecodeRun(graph=True, device="cpu")
    run.step(0)
    run.step(1)
    batch, before = run.inputs(2), [t.clone() for t in run.state() + [run.graph._static]]
    batch[name] = change(batch[name])
    with pytest.raises((RuntimeError, ValueError), match=f"kv-canary: {error}"):
        run.graph.replay(**batch)
    if name != "token_ids":  # before_forward's error, from before_forward too (the buffer is the graph's)
        with pytest.raises(ValueError, match=f"kv-canary: {error}"):
            run.session.before_forward(**batch)
    assert run.session.step == 2
    assert all(torch.equal(a, b) for a, b in zip(before, run.state() + [run.graph._static]))


def test_a_replay_is_refused_while_a_step_awaits_after_forward(monkeypatch):
    """As a second before_forward() is (tests/test_session.py): the pending step goes on."""
    import test_session_cuda as decode

    stand_in_cuda_graphs(monkeypatch)
    run = decode.DecodeRun(graph=True, device="cpu")
    run.session.before_forward(**run.inputs(0))
    with pytest.raises(RuntimeError, match=r"kv-canary: StepGraph.replay\(\) called while a step awaits after_forward"):
        run.graph.replay(**run.inputs(1))
    assert run.session.step == 1
    run.session.after_forward()


def test_eager_steps_with_staged_host_inputs_equal_converted_ones(monkeypatch):
    """``before_forward`` stages all-host inputs on a CUDA session (one copy, scatter offsets included);
    forced on CPU here, such a run equals one converting its inputs one by one."""
    import test_session_cuda as decode

    for module in (session_module, violations_module):
        monkeypatch.setattr(module, "record_event", lambda device: None)
    converted, staged = decode.DecodeRun(graph=False, device="cpu"), decode.DecodeRun(graph=False, device="cpu")
    staged.session._stages = lambda given: True
    decode.check_replay_equals_eager(converted, staged)
    assert staged.session._staging.shape[0] > 0 and converted.session._staging.shape[0] == 0


def test_a_replay_checks_the_expected_inputs_as_before_forward_does(monkeypatch):
    """Expected inputs given a session without the write input assert: replay raises before_forward's
    error before copying or counting."""
    import test_session_cuda as decode

    stand_in_cuda_graphs(monkeypatch)
    run = decode.DecodeRun(graph=True, device="cpu")
    run.step(0)
    batch = dict(run.inputs(1), expected_input_positions=run.inputs(1)["positions"])
    for call in (run.graph.replay, run.session.before_forward):
        with pytest.raises(ValueError, match="^kv-canary: expected input tensors must be None"):
            call(**batch)
    assert run.session.step == 1


def test_capturing_is_refused_while_a_step_awaits_after_forward(monkeypatch):
    """Capturing runs a step's work, re-planning every group: the pending step's TAIL would verify against
    an empty batch's plans (false chain violations). Refused; the pending step goes on."""
    import test_session_cuda as decode

    stand_in_cuda_graphs(monkeypatch)
    run = decode.DecodeRun(graph=False, device="cpu")
    run.session.before_forward(**run.inputs(0))
    with pytest.raises(RuntimeError, match=r"^kv-canary: capture_step\(\) called while a step awaits after_forward"):
        run.session.capture_step(batch_size=decode.BUCKET, req_to_token=run.table)
    run.session.after_forward()
    assert not run.session.flush().records


def test_a_step_graph_captured_without_the_write_input_assert(monkeypatch):
    """``capture_step(write_input_assert=False)`` (an EAGLE draft-decode graph) on an asserting session:
    replays take no expected inputs (refused as by ``before_forward``); one captured with it needs them."""
    from test_session import TABLE, make_session, step_inputs

    stand_in_cuda_graphs(monkeypatch)
    session, _ = make_session(enable_write_input_assert=True)
    draft = session.capture_step(batch_size=2, req_to_token=TABLE, write_input_assert=False)
    draft.replay(**step_inputs(session, 0, 1))
    assert session.step == 1 and not session.violations()
    given = dict(expected_input_tokens=[0, 0], expected_input_positions=[0, 0])
    with pytest.raises(ValueError, match="^kv-canary: expected input tensors must be None in a step with "
                                         "write_input_assert=False$"):
        draft.replay(**step_inputs(session, 1, 1, **given))
    with pytest.raises(TypeError, match="^kv-canary: write_input_assert must be a bool, got NoneType$"):
        session.capture_step(batch_size=2, req_to_token=TABLE, write_input_assert=None)
    target = session.capture_step(batch_size=2, req_to_token=TABLE)
    with pytest.raises(ValueError, match="^kv-canary: expected input tensors are required"):
        target.replay(**step_inputs(session, 1, 1))
    assert session.step == 1
