"""Device keys (one tuning database per GPU model or CPU model) and where databases live."""

from __future__ import annotations

import functools
import importlib.resources
import os
import pathlib
import platform
import re

import torch

from ..runtime import targets
from . import store


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_key(device: torch.device) -> str:
    """``nvidia-h200-sm_90`` for a GPU (name and arch), the processor model for the CPU."""
    if device.type == "cuda":
        index = targets.device_index(device)
        return f"{_slug(torch.cuda.get_device_name(index))}-{targets.cuda_arch(index)}"
    return _slug(cpu_model())


def expected_target(device_key: str) -> tuple[str, str | None]:
    """(target kind, CUDA arch or None) of the records a database of ``device_key`` may hold."""
    arch = re.search(r"-(sm_\d+)$", device_key)
    return ("cuda", arch.group(1)) if arch else ("llvm", None)


def tune_logs_dirs() -> list[pathlib.Path]:
    """Where databases are looked up, in order (which one applies per workload: ``database_dirs``):
    ``$TVM_CANARY_TUNE_LOGS`` (``os.pathsep``-separated), the user's folder (``user_tune_logs``: what ``tune``
    writes outside a checkout), then the committed databases (``committed_tune_logs``)."""
    dirs = [pathlib.Path(p) for p in os.environ.get("TVM_CANARY_TUNE_LOGS", "").split(os.pathsep) if p]
    return dirs + [user_tune_logs(), committed_tune_logs()]


def committed_tune_logs() -> pathlib.Path:
    """The databases committed with the code: in a source checkout (also an editable install) the
    repository's top-level ``tune_logs/``, where they are edited; in an installed wheel the package
    resource ``tvm_canary/tune_logs`` the build maps that folder to (setup.py)."""
    checkout = source_checkout()
    if checkout is not None:
        return checkout / "tune_logs"
    return pathlib.Path(str(importlib.resources.files("tvm_canary") / "tune_logs"))


def source_checkout() -> pathlib.Path | None:
    """The repository root if the package runs from a source checkout (holding pyproject.toml and
    tune_logs/ beside the package), else None (an installed copy)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "tune_logs").is_dir() else None


def user_tune_logs() -> pathlib.Path:
    """The user's database folder: ``$XDG_DATA_HOME/tvm_canary/tune_logs`` (default
    ``~/.local/share/tvm_canary/tune_logs``)."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(pathlib.Path.home(), ".local", "share")
    return pathlib.Path(data) / "tvm_canary" / "tune_logs"


def default_out_dir() -> pathlib.Path:
    """Where ``tune`` writes by default: the checkout's ``tune_logs/`` (the databases are edited there
    and committed), else the user's folder; an installed package is never written to."""
    return committed_tune_logs() if source_checkout() is not None else user_tune_logs()


def database_dirs(key: str) -> list[pathlib.Path]:
    """The database folders of device key ``key`` that lookups use, in lookup order (``databases``); at
    load, per workload the first one selecting a measured geometry wins (``apply._records``)."""
    return [folder for found, folder in databases() if found == key]


def databases() -> list[tuple[str, pathlib.Path]]:
    """(device key, folder) of every database found, in lookup order (a key may appear more than once).
    A folder whose records file is empty (a tune measuring nothing) is none; one without a records file
    is listed, to be refused as unreadable."""
    found = []
    for root in tune_logs_dirs():
        if root.is_dir():
            found += [(d.name, d) for d in sorted(root.iterdir()) if store.holds_database(d) and not _empty(d)]
    return found


def _empty(folder: pathlib.Path) -> bool:
    """Whether ``folder``'s records file (plain or packed) holds no record; a missing or unreadable one is not
    empty: listed, and refused as unreadable."""
    if store.records_file(folder) is None:
        return False
    try:
        return not store.record_lines(folder)
    except OSError:  # unreadable, or a damaged packed file
        return False
