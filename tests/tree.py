"""Walking the tensors inside launch arguments (dataclasses, tuples) and the devices under test."""

from __future__ import annotations

import torch

from tvm_canary.cases import tensors

__all__ = ["assert_same_bytes", "devices", "require", "tensors"]


def devices() -> list[str]:
    """``cpu`` always; ``cuda`` when a GPU is visible (CUDA cases are skipped with a reason otherwise)."""
    return ["cpu", "cuda"]


def require(device: str) -> None:
    import pytest

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine (the CUDA suite runs on GPU hosts)")


def assert_same_bytes(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = g.cpu(), w.cpu()
        assert g.dtype == w.dtype and g.shape == w.shape, i
        if not torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)):
            diff = (g != w).nonzero()[:5].tolist()
            raise AssertionError(f"tensor #{i} {tuple(g.shape)} differs at {diff}")
