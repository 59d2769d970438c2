"""Seeded differential fuzz: compiled kernels (CPU and, when present, CUDA) vs the torch reference.

Every tensor of a launch (canary buffer, ring, write index, counters, plans, pool) must be
byte-identical after the run; outputs start poisoned by the case builders.
"""

from __future__ import annotations

import pytest
import torch

from tvm_canary.cases import CASES, LAUNCH, REFERENCE
from tvm_canary.runtime import use_backend

from tree import assert_same_bytes, devices, require, tensors

ITERATIONS = {"cpu": 60, "cuda": 300}


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
