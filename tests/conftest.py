"""Shared fixtures. ``impl`` runs the hand cases against every implementation in ``IMPLS``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Makes ``import helpers`` work under every pytest import mode.
sys.path.insert(0, str(Path(__file__).parent))

from tvm_canary import reference  # noqa: E402


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


# name -> implementation object with ``name``, ``device`` and write/verify/plan/scatter methods.
IMPLS = {"reference": ReferenceImpl()}


@pytest.fixture(params=list(IMPLS), ids=list(IMPLS))
def impl(request):
    return IMPLS[request.param]
