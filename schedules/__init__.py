"""Launch geometries per kernel: ``DEFAULTS`` (used when nothing is tuned) and, in ``<kernel>.py``,
the knobs of each kernel's MetaSchedule design space for CUDA and CPU."""

import importlib

from .defaults import DEFAULTS


def knobs(kernel: str, cuda: bool) -> dict[str, list[int]]:
    module = importlib.import_module(f"schedules.{kernel}")
    return module.CUDA_KNOBS if cuda else module.CPU_KNOBS


__all__ = ["DEFAULTS", "knobs"]
