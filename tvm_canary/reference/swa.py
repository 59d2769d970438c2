"""The SWA slot translation (SPEC 3.3): the one definition the reference plan and ``CanarySession`` share."""

from __future__ import annotations

import torch


def to_group_slots(slots: torch.Tensor, lut: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Full-pool slots -> a buffer group's canary slots: ``lut[x]`` for ``x >= 0``, negative slots (skip
    markers) unchanged; ``slots`` itself without a LUT (the FULL group). With a LUT the result is written
    into ``out`` (same length) when given. Runs on the tensors' device, no sync; every ``x`` must be below
    ``len(lut)``."""
    if lut is None:
        return slots
    return torch.where(slots < 0, slots, lut[slots.clamp(min=0)], out=out)
