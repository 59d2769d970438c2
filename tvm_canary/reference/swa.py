"""The SWA slot translation (SPEC 3.3): the one definition the reference plan and ``CanarySession`` share."""

from __future__ import annotations

import torch


def to_group_slots(slots: torch.Tensor, lut: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Full-pool slots -> a buffer group's canary slots: ``lut[min(x, len(lut) - 1)]`` for ``x >= 0`` (the
    kernels' clamp, SPEC D4; the reference plan raises on ``x >= len(lut)`` before translating), negative
    slots (skip markers) unchanged; ``slots`` itself without a LUT (the FULL group). With a LUT the result
    is written into ``out`` (same length) when given. Runs on the tensors' device, no sync."""
    if lut is None:
        return slots
    return torch.where(slots < 0, slots, lut[slots.clamp(0, lut.shape[0] - 1)], out=out)
