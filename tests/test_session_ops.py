"""The device operations of one session step, counted on CPU (no timing).

On CUDA each operation is a launch or more (kernel, copy, memset) and the graph-replayed decode step is launch-bound at
small batches, so a step issues only the canary kernels and the torch operations listed here. A ``TorchDispatchMode``
logs them; on CPU the session runs CUDA's Python path (under a dispatch mode the launch functions call the
``torch.ops.tvm_canary`` operators, one operation each). Views and allocations launch nothing, uncounted. A new
operation fails here: remove it, or pin it below, with the reason.

Workload: one step of tests/test_session_cuda.py's decode run, inputs already on the session device.
"""

from __future__ import annotations

import collections

import pytest
import test_session_cuda as decode
import torch
from test_session_async import stand_in_cuda_graphs
from torch.utils._python_dispatch import TorchDispatchMode

CANARY = "tvm_canary."
NO_LAUNCH = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
             "aten.detach.default", "aten.alias.default", "aten.lift_fresh.default"}


class DeviceOps(TorchDispatchMode):
    """Names, in order, of the device operations dispatched in the ``with`` block (no views, allocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not (getattr(func, "is_view", False) or name in NO_LAUNCH):
            self.names.append(name)
        return func(*args, **(kwargs or {}))

    def counted(self) -> tuple[collections.Counter, collections.Counter]:
        """(canary operators, other operations), each name -> count."""
        canary = collections.Counter(n.removeprefix(CANARY) for n in self.names if n.startswith(CANARY))
        return canary, collections.Counter(n for n in self.names if not n.startswith(CANARY))


def canary_ops(groups: int) -> collections.Counter:
    """Per step one scatter; per group one plan, per endpoint (HEAD, TAIL) and half (K, V) a verify, a write."""
    return collections.Counter({"scatter.default": 1, "plan.default": groups, "verify.default": 4 * groups,
                                "write.default": 4 * groups})


# A step's other operations.
SCATTER_OFFSETS = {"aten.cumsum.out": 1}  # eager steps: the scatter's offsets (StepGraph: an input)
SWA_TRANSLATION = {"aten.lt.Scalar": 1, "aten.clamp.default": 1, "aten.index.Tensor": 1,
                   "aten.where.self_out": 1}  # the step's slots through the LUT, once per step (HEAD)
STATUS_SNAPSHOT = {"aten.copy_.default": 1}  # the one status copy to pinned memory, after the step
# On a CPU session alone, whose inputs are host data: before_forward's token totals (session._check_token_totals);
# inputs on a CUDA device are not read.
HOST_TOKEN_TOTALS = {"aten.clamp.default": 1, "aten.ne.Scalar": 1, "aten.mul.Tensor": 1, "aten.min.default": 1,
                     "aten._to_copy.default": 2, "aten.sum.default": 2, "aten._local_scalar_dense.default": 3}


@pytest.fixture(params=[False, True], ids=["FULL", "FULL+SWA"])
def run(request, monkeypatch):
    """A CPU decode run whose ``graph`` (stand-in CUDA graph) replays the captured work, after prefill and
    one decode step (kernels loaded, scratch allocated)."""
    stand_in_cuda_graphs(monkeypatch)
    run = decode.DecodeRun(graph=True, device="cpu", swa=request.param)
    run.step(0)
    run.step(1)
    return run


def test_the_captured_step_issues_only_the_canary_kernels_and_the_listed_ops(run):
    """What ``StepGraph`` records, replayed on the static inputs of step 1."""
    with DeviceOps() as ops:
        run.graph.graph.replay()
    groups = len(run.session._groups)
    assert ops.counted() == (canary_ops(groups), collections.Counter(SWA_TRANSLATION if groups == 2 else {}))


def test_an_eager_step_adds_only_the_status_copy(run):
    """``before_forward`` + ``after_forward``, inputs on the device: the captured work + status snapshot."""
    session, batch = run.session, run.inputs(2)
    with DeviceOps() as ops:
        session.before_forward(**batch)
        session.after_forward()
    swa = len(session._groups) == 2
    others = [SCATTER_OFFSETS, SWA_TRANSLATION if swa else {}, STATUS_SNAPSHOT, HOST_TOKEN_TOTALS]
    assert ops.counted() == (canary_ops(len(session._groups)), sum(map(collections.Counter, others),
                                                                   collections.Counter()))
    assert not session.flush()  # a clean step


def test_the_counter_sees_launching_ops():
    """A fill and a copy count, a view does not."""
    x, ones = torch.zeros(4, dtype=torch.int64), torch.ones(2, 2, dtype=torch.int64)
    with DeviceOps() as ops:
        x[1:].fill_(3)
        x.view(2, 2).copy_(ones)
    assert ops.names == ["aten.fill_.Scalar", "aten.copy_.default"]
