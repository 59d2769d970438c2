"""Targets, target tags and the default launch geometry for torch devices.

Tags (``llvm``, ``cuda-sm_90``) name a build in cache keys and ahead-of-time artifacts; they are
computed without the TVM compiler so that a runtime-only host can find prebuilt modules.
"""

from __future__ import annotations

import functools

import torch

from ..checks import require_supported_device
from ..geometry import Geometry
from ..schedules import CPU_DEFAULTS, CUDA_DEFAULTS, CUDA_MODE_DEFAULTS, CUDA_SIZE_DEFAULTS


@functools.lru_cache(maxsize=None)
def cuda_arch(device_index: int) -> str:
    """``sm_XY`` of the GPU of that index."""
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}"


def device_index(device: torch.device) -> int:
    """A CUDA device's index; torch's current device for ``cuda`` with none."""
    return device.index if device.index is not None else torch.cuda.current_device()


def tag_for(device: torch.device) -> str:
    require_supported_device(device)
    if device.type == "cpu":
        return "llvm"
    return f"cuda-{cuda_arch(device_index(device))}"


def target_from_tag(tag: str):
    """The ``tvm.target.Target`` of a tag (needs the TVM compiler)."""
    import tvm

    if tag == "llvm":
        return tvm.target.Target({"kind": "llvm"})
    kind, arch = tag.split("-", 1)
    return tvm.target.Target({"kind": kind, "arch": arch}, host="llvm")


def default_geometry(kernel: str, target: str, mode: int = 0, size: int | tuple | None = None) -> Geometry:
    """The untuned geometry of ``kernel`` (``tvm_canary/schedules/defaults.py``) for a target tag
    (``llvm``, ``cuda-sm_90``) or target kind (``llvm``, ``cuda``), launch ``mode`` (verify's or
    write's real-KV hash mode when it folds sources, else 0: ``runtime.packing``'s ``KernelCall.mode``, the
    tuning bucket's ``workloads.mode_of``) and workload point ``size`` (``KernelCall.size``, the tuning
    bucket's ``workloads.point_of``; the mode's size classes it reaches, ``size_class``, override the
    mode's default in order; None: the default below any size class). Every default in the package (at
    launch, in tuning and in ahead-of-time builds) comes from here."""
    if not target.startswith("cuda"):
        return Geometry(gpu=False, **CPU_DEFAULTS[kernel])
    fields = {**CUDA_DEFAULTS[kernel], **CUDA_MODE_DEFAULTS.get((kernel, mode), {})}
    for _, overrides in _classes(kernel, target, mode)[:size_class(kernel, target, mode, size)]:
        fields.update(overrides)
    return Geometry(gpu=True, **fields)


def _classes(kernel: str, target: str, mode: int) -> tuple:
    """The mode's size classes, ``((at_least, {field: value}), ...)`` by increasing bound (CUDA only)."""
    return CUDA_SIZE_DEFAULTS.get((kernel, mode), ()) if target.startswith("cuda") else ()


def size_class(kernel: str, target: str, mode: int, size: int | tuple | None) -> int:
    """How many of its mode's size classes (``CUDA_SIZE_DEFAULTS``, CUDA only) a launch of workload point
    ``size`` (None: below any class) in ``mode`` on ``target`` reaches: 0 below the first, the class's
    number from it on. The one test of both the default (``default_geometry``) and the tuning buckets
    a launch may take (``tuning.apply.tuned_geometry``)."""
    if size is None:
        return 0
    return sum(reaches(size, at_least) for at_least, _ in _classes(kernel, target, mode))


def reaches(size: int | tuple, at_least: int | tuple) -> bool:
    """Whether a workload point ``size`` is in the size class from ``at_least`` (``CUDA_SIZE_DEFAULTS``): a
    number bounds the point's leading size, a tuple each of its coordinates (a point with fewer
    coordinates than the bound, e.g. a write's request count alone, is not in the class)."""
    sizes = size if isinstance(size, tuple) else (size,)
    bounds = at_least if isinstance(at_least, tuple) else (at_least,)
    return len(sizes) >= len(bounds) and all(s >= b for s, b in zip(sizes, bounds))


def size_label(at_least: int | tuple) -> str:
    """A size class's bound as text: ``16385`` (entries), ``1x23`` (write: requests x tokens per request)."""
    return "x".join(map(str, at_least)) if isinstance(at_least, tuple) else str(at_least)


def size_classes(kernel: str, target: str, mode: int = 0) -> list[tuple[int | tuple | None, Geometry]]:
    """``(at_least, default)`` of each size class of ``kernel`` in launch ``mode`` on ``target``: the mode's
    default first (``at_least`` None: below any class), then each of its size classes' (``CUDA_SIZE_DEFAULTS``)."""
    return [(None, default_geometry(kernel, target, mode))] + [
        (at_least, default_geometry(kernel, target, mode, at_least)) for at_least, _ in _classes(kernel, target, mode)]


def distinct_defaults(kernel: str, target: str, modes) -> list[tuple[int, int | tuple | None, Geometry]]:
    """``(mode, at_least, default)`` of the defaults a launch of ``kernel`` in any of ``modes`` can take:
    the first mode's default (``at_least`` None), each other mode's default that differs from it, and
    every size class (``size_classes``); what a listing of a kernel's defaults names."""
    first = default_geometry(kernel, target, modes[0])
    out = [(modes[0], None, first)]
    for mode in modes:
        out += [(mode, at_least, geom) for at_least, geom in size_classes(kernel, target, mode)
                if at_least is not None or geom != first]
    return out


def default_geometries(kernel: str, target: str, mode: int = 0) -> list[Geometry]:
    """Every default ``default_geometry`` gives ``kernel`` in launch ``mode`` on ``target``, whatever the
    launch's size (``size_classes``; what ahead-of-time builds must cover)."""
    return list(dict.fromkeys(geom for _, geom in size_classes(kernel, target, mode)))
