"""Shared fixtures and markers. ``impl`` runs the hand cases against every implementation in ``IMPLS``.

Markers (registered in pyproject.toml): ``gpu`` tests need a CUDA GPU and are skipped without one; a
test is marked ``gpu`` automatically when one of its parameter ids names CUDA (``tvm-cuda``, ``cuda``),
or explicitly. The GPU host selects them with ``-m gpu``.
"""

from __future__ import annotations

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
    """The compiled TensorIR kernels through the public launch functions (front-end checks included),
    forced onto the ``tvm`` backend, with the case's tensors on ``device``."""

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


# name -> implementation object with ``name``, ``device`` and write/verify/plan/scatter methods.
IMPLS = {
    "reference": ReferenceImpl(),
    "tvm-cpu": TvmImpl("tvm-cpu", "cpu"),
    "tvm-cuda": TvmImpl("tvm-cuda", "cuda"),
}


def pytest_collection_modifyitems(config, items) -> None:
    """Mark the tests parametrized on CUDA ``gpu``; skip every ``gpu`` test on a machine without a GPU."""
    no_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine (the gpu-marked tests run on GPU hosts)")
    has_gpu = torch.cuda.is_available()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and any("cuda" in part for part in callspec.id.split("-")):
            item.add_marker(pytest.mark.gpu)
        if not has_gpu and item.get_closest_marker("gpu") is not None:
            item.add_marker(no_gpu)


@pytest.fixture(params=list(IMPLS), ids=list(IMPLS))
def impl(request):
    chosen = IMPLS[request.param]
    if chosen.device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    return chosen
