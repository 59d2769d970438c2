"""Build a kernel for a device once per process and once per machine.

``get_kernel(name, spec, device)`` returns the compiled ``tvm_ffi.Function``. Lookup order: the
in-process dict, then the disk cache (``$TVM_CANARY_CACHE`` or ``~/.cache/tvm_canary``), then
``tvm.compile``. The disk key holds the kernel, its specialization, the geometry, the target, the TVM
version and a hash of the kernel sources, so a stale module is never loaded.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import pathlib
import tempfile
import threading

import torch
import tvm

from . import targets

KERNELS = ("write", "verify", "plan", "scatter")
_memory: dict[tuple, object] = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """Hash of everything that shapes the generated code (kernels, consts, default schedules)."""
    pkg = pathlib.Path(__file__).resolve().parent.parent
    files = sorted((pkg / "kernels").glob("*.py")) + [pkg / "consts.py"]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> pathlib.Path:
    root = os.environ.get("TVM_CANARY_CACHE") or os.path.join(pathlib.Path.home(), ".cache", "tvm_canary")
    return pathlib.Path(root) / tvm.__version__


def build(name: str, spec: tuple, target: tvm.target.Target, geom):
    """Compile kernel ``name`` for one specialization; returns a ``tvm.runtime.Executable``."""
    factory = importlib.import_module(f"tvm_canary.kernels.{name}").make
    return tvm.compile(factory(*spec, geom), target=target)


def module_key(name: str, spec: tuple, target: tvm.target.Target, geom) -> str:
    spec_s = "-".join(str(int(x)) for x in spec) or "none"
    return f"{name}-{spec_s}-{geom.key()}-{targets.target_tag(target)}-{source_hash()}"


def get_kernel(name: str, spec: tuple, device: torch.device):
    """Compiled function of kernel ``name`` specialised by ``spec`` for ``device`` (cached)."""
    dev_key = (device.type, device.index)
    key = (name, spec, dev_key)
    fn = _memory.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _memory.get(key)
        if fn is None:
            fn = _load_or_build(name, spec, device)
            _memory[key] = fn
    return fn


def _load_or_build(name: str, spec: tuple, device: torch.device):
    target = targets.target_for(device)
    geom = targets.geometry_for(name, target, _sms(device))
    path = cache_dir() / f"{module_key(name, spec, target, geom)}.so"
    if path.exists():
        return tvm.runtime.load_module(str(path))[f"canary_{name}"]
    ex = build(name, spec, target, geom)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".so", delete=False) as tmp:
        tmp_path = tmp.name
    ex.export_library(tmp_path)
    os.replace(tmp_path, path)
    return tvm.runtime.load_module(str(path))[f"canary_{name}"]


def _sms(device: torch.device):
    if device.type != "cuda":
        return None
    return targets.sm_count(device.index if device.index is not None else torch.cuda.current_device())
