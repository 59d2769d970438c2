"""Launch geometries as data: the defaults (``defaults.py``) and, in ``<kernel>.py``, the knobs of each
kernel's MetaSchedule design space for CUDA and CPU.

This package imports nothing from the rest of ``tvm_canary``: geometries are plain dicts of
``Geometry`` fields, turned into ``Geometry`` objects by ``tvm_canary.runtime.targets.default_geometry``
(the one place that chooses a default), and ``space.py`` works on any dataclass with those fields.
"""

import importlib

from .defaults import CPU_DEFAULTS, CUDA_DEFAULTS, CUDA_MODE_DEFAULTS


def knobs(kernel: str, cuda: bool) -> dict[str, list[int]]:
    """``{field: choices}`` of the kernel's design space on CUDA or on the CPU."""
    module = importlib.import_module(f"{__name__}.{kernel}")
    return module.CUDA_KNOBS if cuda else module.CPU_KNOBS


__all__ = ["CPU_DEFAULTS", "CUDA_DEFAULTS", "CUDA_MODE_DEFAULTS", "knobs"]
