"""Shared fixtures and markers. ``impl`` runs the hand cases against every implementation in ``IMPLS``.

Markers (registered in pyproject.toml): ``gpu`` tests need a CUDA GPU, skipped without one; marked
explicitly or when a parameter id names CUDA (``tvm-cuda``, ``cuda``); the GPU host runs ``-m gpu``.
``slow`` tests take tens of seconds (a module fixture's cost counts for every test using it).

Order: under the README's ``-n 2 --dist loadscope`` each test class, else module, is one unit of work, handed out in
collection order (pyproject.toml turns off xdist's reordering by test count). Units with most ``slow`` tests come first:
long ones start at once, short ones fill in, none starts last alone.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

# Makes ``import helpers`` work under every pytest import mode.
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

import tvm_canary as tc  # noqa: E402
from tvm_canary import reference  # noqa: E402
from tvm_canary.runtime import use_backend  # noqa: E402


class ReferenceImpl:
    """The torch reference on CPU tensors; methods take the launch functions' keyword arguments."""

    name = "reference"
    device = "cpu"

    def write(self, **kw) -> None:
        reference.canary_write_ref(**kw)

    def verify(self, **kw) -> None:
        reference.canary_verify_ref(**kw)

    def plan(self, **kw) -> None:
        reference.canary_plan_ref(**kw)

    def scatter(self, **kw) -> None:
        reference.scatter_req_token_ids_ref(**kw)


class TvmImpl:
    """The TensorIR kernels via the public launch functions (checks included) on the ``tvm`` backend,
    the case's tensors on ``device``."""

    def __init__(self, name: str, device: str) -> None:
        self.name = name
        self.device = device

    def write(self, **kw) -> None:
        with use_backend("tvm"):
            tc.launch_canary_write_kernel(**kw)

    def verify(self, **kw) -> None:
        with use_backend("tvm"):
            tc.launch_canary_verify_kernel(**kw)

    def plan(self, **kw) -> None:
        with use_backend("tvm"):
            tc.launch_canary_plan_kernels(**kw)

    def scatter(self, **kw) -> None:
        with use_backend("tvm"):
            tc.launch_scatter_req_token_ids_kernel(**kw)


# name -> object with ``name``, ``device`` and write/verify/plan/scatter methods.
IMPLS = {
    "reference": ReferenceImpl(),
    "tvm-cpu": TvmImpl("tvm-cpu", "cpu"),
    "tvm-cuda": TvmImpl("tvm-cuda", "cuda"),
}


def pytest_collection_modifyitems(config, items) -> None:
    """Mark tests parametrized on CUDA ``gpu``; skip ``gpu`` tests without a GPU; units of work with the
    most ``slow`` tests first (module docstring)."""
    no_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine (the gpu-marked tests run on GPU hosts)")
    has_gpu = torch.cuda.is_available()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and any("cuda" in part for part in callspec.id.split("-")):
            item.add_marker(pytest.mark.gpu)
        if not has_gpu and item.get_closest_marker("gpu") is not None:
            item.add_marker(no_gpu)
    slow = collections.Counter(_work_unit(item) for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[_work_unit(item)])  # stable: each unit stays whole and in order


def _work_unit(item) -> str:
    """``--dist loadscope``'s unit of work: class, else module (xdist cuts the node id at its last ``::``)."""
    return item.nodeid.rsplit("::", 1)[0]


@pytest.fixture(params=list(IMPLS), ids=list(IMPLS))
def impl(request):
    chosen = IMPLS[request.param]
    if chosen.device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    return chosen


@pytest.fixture
def committed_cpu_key(monkeypatch) -> str:
    """A processor with a committed CPU database, posed as this CPU (tests run on any): its
    ``keys.device_key`` names a folder of ``keys.committed_tune_logs()``."""
    from tvm_canary.tuning import keys

    committed = min(p.name for p in keys.committed_tune_logs().iterdir() if p.is_dir() and "-sm_" not in p.name)
    monkeypatch.setattr(keys, "cpu_model", lambda: committed)
    assert keys.device_key(torch.device("cpu")) == committed
    return committed
