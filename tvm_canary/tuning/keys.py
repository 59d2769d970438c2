"""Device keys (one tuning database per GPU model or CPU model) and where databases live."""

from __future__ import annotations

import functools
import os
import pathlib
import platform
import re

import torch


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
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"{_slug(torch.cuda.get_device_name(index))}-sm_{major}{minor}"
    return _slug(cpu_model())


def tune_logs_dirs() -> list[pathlib.Path]:
    """Databases are looked up in ``$TVM_CANARY_TUNE_LOGS`` (``os.pathsep``-separated), then in the
    repository's ``tune_logs/``."""
    dirs = [pathlib.Path(p) for p in os.environ.get("TVM_CANARY_TUNE_LOGS", "").split(os.pathsep) if p]
    return dirs + [pathlib.Path(__file__).resolve().parents[2] / "tune_logs"]
