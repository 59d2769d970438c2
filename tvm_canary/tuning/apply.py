"""Applying tuned schedules at load: the geometry of the best record of the nearest tuned bucket.

``tuned_geometry(kernel, device, size, mode)`` looks for ``<dir>/<device key>/`` in the tuning log
directories (``keys.tune_logs_dirs``), reads its MetaSchedule JSON database, and returns the geometry
of the fastest record of the kernel's bucket nearest to ``size`` among its buckets of ``mode``; ``None`` when the device has no
database (a one-line warning, once per device) or no record for the kernel (once per kernel).
"""

from __future__ import annotations

import functools
import logging
import math

import torch

from ..geometry import Geometry
from . import keys

log = logging.getLogger("tvm_canary")
FAILED_RUN_SECS = 1e9  # MetaSchedule records a failed measurement as 1e10 s


@functools.lru_cache(maxsize=None)
def _records(key: str, cuda: bool) -> dict:
    """{kernel: {bucket: Geometry}} of the first database found for ``key`` (best record each)."""
    for root in keys.tune_logs_dirs():
        if (root / key / "database_workload.json").exists():
            return _best_geometries(str(root / key), cuda)
    return {}


def measured_records(db) -> dict:
    """{(kernel, bucket): [(mean seconds, record), ...] fastest first} of a database's valid records."""
    from .workloads import bucket_of

    out: dict = {}
    for record in db.get_all_tuning_records():
        if not record.run_secs or min(float(s) for s in record.run_secs) >= FAILED_RUN_SECS:
            continue  # not measured, or failed (build error, timeout, output differing from the reference)
        func = record.workload.mod["main"]
        key = (str(func.attrs["canary.kernel"]), bucket_of(func))
        cost = sum(float(s) for s in record.run_secs) / len(record.run_secs)
        out.setdefault(key, []).append((cost, record))
    for rows in out.values():
        rows.sort(key=lambda r: r[0])
    return out


def record_geometry(record, cuda: bool) -> Geometry:
    """Replay a record's trace on its workload and read the geometry it selects."""
    import tvm

    from schedules import DEFAULTS
    from schedules.space import geometry_from

    from ..geometry import CPU_GEOMETRY

    kernel = str(record.workload.mod["main"].attrs["canary.kernel"])
    sch = tvm.s_tir.Schedule(record.workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return geometry_from(sch.mod, DEFAULTS[kernel] if cuda else CPU_GEOMETRY)


def _best_geometries(work_dir: str, cuda: bool) -> dict:
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=work_dir, allow_missing=False)
    out: dict = {}
    for (kernel, bucket), rows in measured_records(db).items():
        out.setdefault(kernel, {})[bucket] = record_geometry(rows[0][1], cuda)
    return out


_noticed: set = set()


def nearest(buckets: list[tuple], size: int) -> tuple:
    """The bucket whose leading size (entries, requests or bs) is nearest to ``size`` in log scale."""
    return min(buckets, key=lambda b: abs(math.log2(max(b[0], 1)) - math.log2(max(size, 1))))


def tuned_geometry(kernel: str, device: torch.device, size: int, mode: int = 0) -> Geometry | None:
    """Geometry of the best record of the bucket nearest to ``size`` among the kernel's buckets of
    ``mode`` (``workloads.mode_of``: verify's RealKvHashMode), or None (the default applies)."""
    from .workloads import mode_of

    key = keys.device_key(device)
    records = _records(key, device.type == "cuda")
    buckets = [b for b in records.get(kernel, {}) if mode_of(kernel, b) == mode]
    if not buckets:
        what = (f"{kernel}" + (f" (real-KV mode {mode})" if mode else "") + f" on {key}") if records else key
        if what not in _noticed:
            _noticed.add(what)
            log.warning("tvm_canary: no tuned schedule for %s; using the default schedule", what)
        return None
    return records[kernel][nearest(sorted(buckets), size)]  # sorted: a tie goes to the smaller bucket
