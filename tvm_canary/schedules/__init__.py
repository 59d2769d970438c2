"""Launch geometries as data: the defaults (``defaults.py``) and, in ``<kernel>.py``, the knobs of each
kernel's MetaSchedule design space for CUDA and CPU.

This package imports nothing from the rest of ``tvm_canary``: geometries are plain dicts of ``Geometry`` fields, turned
into ``Geometry`` objects by ``tvm_canary.runtime.targets.default_geometry`` (the one place that chooses a default), and
``space.py`` works on any dataclass with those fields.
"""

import importlib

from .defaults import CPU_DEFAULTS, CUDA_DEFAULTS, CUDA_MODE_DEFAULTS, CUDA_SIZE_DEFAULTS


def knobs(kernel: str, cuda: bool, mode: int = 0) -> dict[str, list[int]]:
    """``{field: choices}`` of the kernel's design space on CUDA or the CPU for a launch ``mode``
    (``targets.default_geometry``'s): ``pairs`` only where real-KV sources are folded (mode > 0); in mode
    0 its choices would build the same kernel twice."""
    module = importlib.import_module(f"{__name__}.{kernel}")
    space = module.CUDA_KNOBS if cuda else module.CPU_KNOBS
    return space if mode else {name: choices for name, choices in space.items() if name != "pairs"}


__all__ = ["CPU_DEFAULTS", "CUDA_DEFAULTS", "CUDA_MODE_DEFAULTS", "CUDA_SIZE_DEFAULTS", "knobs"]
