"""Seeded differential fuzz: compiled kernels (CPU and, when present, CUDA) vs the torch reference.

Every tensor of a launch (canary buffer, ring, write index, counters, plans, pool) must be
byte-identical after the run; outputs start poisoned by the case builders.
"""

from __future__ import annotations

import pytest
import torch
from cases import CASES
from tree import assert_same_bytes, devices, require, tensors

import tvm_canary as tc
from tvm_canary import reference
from tvm_canary.runtime import use_backend

ITERATIONS = {"cpu": 60, "cuda": 300}
LAUNCH = {
    "verify": tc.launch_canary_verify_kernel,
    "write": tc.launch_canary_write_kernel,
    "plan": tc.launch_canary_plan_kernels,
    "scatter": tc.launch_scatter_req_token_ids_kernel,
}
REFERENCE = {
    "verify": reference.canary_verify_ref,
    "write": reference.canary_write_ref,
    "plan": reference.canary_plan_ref,
    "scatter": reference.scatter_req_token_ids_ref,
}


def run_differential(kernel: str, device: str, seed: int) -> None:
    want = CASES[kernel](torch.Generator().manual_seed(seed), "cpu")
    got = CASES[kernel](torch.Generator().manual_seed(seed), device)
    REFERENCE[kernel](**want)
    with use_backend("tvm"):
        LAUNCH[kernel](**got)
    assert_same_bytes(tensors(got), tensors(want))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kernel", list(CASES))
def test_differential_fuzz(kernel, device):
    require(device)
    for seed in range(ITERATIONS[device]):
        try:
            run_differential(kernel, device, seed)
        except AssertionError as e:
            raise AssertionError(f"{kernel} on {device}, seed {seed}: {e}") from e
