"""TVM targets and launch geometries for torch devices."""

from __future__ import annotations

import functools

import torch
import tvm

from ..kernels.common import CPU_GEOMETRY, Geometry


@functools.lru_cache(maxsize=None)
def cuda_arch(device_index: int) -> str:
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}"


def target_for(device: torch.device, arch: str | None = None) -> tvm.target.Target:
    """``llvm`` for CPU tensors; ``cuda`` (host llvm) with the device's or the given ``sm_XX`` arch."""
    if device.type == "cpu":
        return tvm.target.Target({"kind": "llvm"})
    if device.type == "cuda":
        arch = arch or cuda_arch(device.index if device.index is not None else torch.cuda.current_device())
        return tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")
    raise ValueError(f"kv-canary: unsupported device type {device.type!r} (expected cpu or cuda)")


def target_tag(target: tvm.target.Target) -> str:
    if target.kind.name == "cuda":
        return f"cuda-{target.attrs['arch']}"
    return target.kind.name


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def geometry_for(kernel: str, target: tvm.target.Target, sms: int | None = None) -> Geometry:
    """The launch geometry of ``kernel`` on ``target``: serial on CPU, the schedule's default on CUDA."""
    if target.kind.name != "cuda":
        return CPU_GEOMETRY
    from schedules import DEFAULTS

    return DEFAULTS[kernel](sms or 132)
