"""Applying tuned schedules at load: the geometry that the nearest tuned bucket's records select (``chosen``).

``tuned_geometry(kernel, device, size, mode)`` reads the MetaSchedule JSON databases in ``<dir>/<device key>/`` of the
tuning log directories (``keys.tune_logs_dirs``; per workload the first selecting a measured geometry, ``_records``) and
returns the geometry (``chosen``) of the kernel's ``mode`` bucket nearest to ``size`` (a bucket without a valid record
of its default keeps it, one warning per database); ``None`` if the device has no database (a one-line notice, once per
device) or no record for the kernel in that mode (once per kernel and mode). No notice for a kernel without knobs on its
target (``schedules.knobs``: e.g. verify on the CPU). Records of a kernel hash other than the current kernels'
(``workloads.kernel_hash``) are ignored, one warning per database naming the kernels to re-tune. Notices go to the
``tvm_canary`` logger (the CLI prints them above its progress bars).
"""

from __future__ import annotations

import functools
import logging
import math
import pathlib

import torch

from ..geometry import Geometry
from . import keys, store

log = logging.getLogger("tvm_canary")
FAILED_RUN_SECS = 1e9  # MetaSchedule records a failed measurement as 1e10 s
# A tuned geometry replaces the default only if the same tuning run measured it at least this much faster in every
# launch of its case: a smaller gain is run-to-run noise, and a pick on noise can be slower between buckets or in the
# other order (docs/TUNING.md, "Applying at load").
TUNED_MARGIN = 0.03


@functools.lru_cache(maxsize=None)
def _records(key: str, cuda: bool) -> dict:
    """{kernel: {bucket: Geometry}} of the databases of ``key`` (``keys.database_dirs``): per workload,
    ``chosen`` in the first whose records select a measured geometry for it, else in the first holding
    it (its default; as ``tune-merge`` ranks an input without a valid default record last). A database
    unreadable or holding another device's records is skipped, with a warning."""
    picks: dict = {}  # (kernel, bucket) -> (seconds or nan, geometry)
    for work_dir in keys.database_dirs(key):
        try:
            found = _chosen_geometries(open_database(work_dir, key), str(work_dir), cuda)
        except ValueError as e:  # open_database's kv-canary errors
            log.warning("tvm_canary: %s; its records are not used", str(e).removeprefix("kv-canary: "))
            _noticed.add(key)  # this warning says it: ``tuned_geometry`` adds no "no tuned schedule" one
            continue
        for workload, (cost, geometry) in found.items():
            if workload not in picks or (math.isnan(picks[workload][0]) and not math.isnan(cost)):
                picks[workload] = cost, geometry
    out: dict = {}
    for (kernel, bucket), (_, geometry) in picks.items():
        out.setdefault(kernel, {})[bucket] = geometry
    return out


def open_database(folder, device_key: str):
    """The MetaSchedule database in ``folder`` (a ``<device key>`` folder, plain or packed: ``store.readable``),
    checked readable and every record measured for the target of ``device_key`` (``keys.expected_target``); else
    ``ValueError`` with a ``kv-canary:`` message naming the folder."""
    from tvm.s_tir import meta_schedule as ms

    from ..runtime.compile import error_line

    try:
        db = ms.database.JSONDatabase(work_dir=str(store.readable(pathlib.Path(folder))), allow_missing=False)
        records = db.get_all_tuning_records()
    except Exception as e:  # TVM's errors of a missing or truncated file, or of a trace that does not replay
        raise ValueError(f"kv-canary: cannot read the tuning database {folder}: {error_line(e)}") from None
    expected = keys.expected_target(device_key)
    for record in records:
        if not _from_tvm_canary(record):
            raise ValueError(f"kv-canary: the tuning database {folder} holds a record tvm_canary did not write "
                             "(its workload is no kernel's stand-in)")
        kind = str(record.target.kind.name)
        arch = record.target.attrs.get("arch") if kind == "cuda" else None
        found = (kind, None if arch is None else str(arch))
        if found != expected:
            raise ValueError(f"kv-canary: the tuning database {folder} holds records for target "
                             f"{found[0]}{' ' + found[1] if found[1] else ''}, not for device key {device_key!r} "
                             "(a database applies only to its own device)")
    return db


def _from_tvm_canary(record) -> bool:
    """Whether ``record``'s workload is one of ``tune``'s stand-ins (``workloads.descriptor``: a ``main``
    carrying the ``canary.*`` attributes every reader of a record takes)."""
    mod = record.workload.mod
    attrs = mod["main"].attrs if "main" in mod else None
    return attrs is not None and all(k in attrs for k in ("canary.kernel", "canary.bucket", "canary.kernel_hash"))


def _measured(db):
    """((kernel, bucket), record, current) of each measured, not failed record of ``db``; ``current``:
    tuned for the current kernel (hashed for the record's target kind) and tuning case."""
    from .workloads import CASE_LAUNCHES, bucket_of, kernel_hash, workload_kernel_hash

    for record in db.get_all_tuning_records():
        if not record.run_secs or min(float(s) for s in record.run_secs) >= FAILED_RUN_SECS:
            continue  # not measured, or failed (build error, timeout, output differing from the reference)
        func = record.workload.mod["main"]
        key = (str(func.attrs["canary.kernel"]), bucket_of(func))
        current = (workload_kernel_hash(func) == kernel_hash(*key, str(record.target.kind.name))
                   and len(record.run_secs) % CASE_LAUNCHES.get(key[0], 1) == 0)
        yield key, record, current


def tried_geometries(db, kernel: str, bucket: tuple, cuda: bool) -> set[Geometry]:
    """The distinct geometries of every record of a bucket's workload for the current kernel in ``db``,
    failed ones included: what searches have tried (``driver``'s rounds)."""
    from .workloads import bucket_of, kernel_hash, workload_kernel_hash

    tried = set()
    for record in db.get_all_tuning_records():
        func = record.workload.mod["main"]
        if ((str(func.attrs["canary.kernel"]), bucket_of(func)) == (kernel, bucket)
                and workload_kernel_hash(func) == kernel_hash(kernel, bucket, str(record.target.kind.name))):
            tried.add(record_geometry(record, cuda))
    return tried


def _fastest_first(pairs) -> dict:
    """{key: [(seconds of the case, record), ...] fastest first} of ``(key, record)`` pairs."""
    out: dict = {}
    for key, record in pairs:
        out.setdefault(key, []).append((sum(launch_seconds(key[0], record.run_secs)), record))
    for rows in out.values():
        rows.sort(key=lambda r: r[0])
    return out


def measured_records(db, stale: set | None = None) -> dict:
    """{(kernel, bucket): [(seconds of the case, record), ...] fastest first} of a database's valid records
    for the current kernels (hashed for each record's target kind) and tuning case (a time per launch of
    it, ``launch_seconds``); kernels of records tuned for other kernel code or case are added to ``stale``."""
    current = []
    for key, record, is_current in _measured(db):
        if is_current:
            current.append((key, record))
        elif stale is not None:
            stale.add(key[0])
    return _fastest_first(current)


def previous_pick(db, kernel: str, bucket: tuple, cuda: bool) -> Geometry | None:
    """The geometry ``db``'s stale records of a bucket (earlier kernel code, a case with as many launches
    as the current one) select by ``chosen_row``'s rule, if not the bucket's default; else None. A
    re-tune after a kernel change measures it again (``driver``), so the earlier pick stays in
    contention whatever the new search draws."""
    from .workloads import CASE_LAUNCHES, default_of

    launches = CASE_LAUNCHES.get(kernel, 1)
    stale = [(key, record) for key, record, current in _measured(db)
             if not current and key == (kernel, bucket) and len(record.run_secs) % launches == 0]
    row = chosen_row(kernel, bucket, _fastest_first(stale).get((kernel, bucket), []), cuda)
    pick = None if row is None else record_geometry(row[1], cuda)
    return None if pick == default_of(kernel, bucket, "cuda" if cuda else "llvm") else pick


def launch_seconds(kernel: str, run_secs) -> list[float]:
    """Mean seconds of each launch of the kernel's tuning case (``workloads.CASE_LAUNCHES``) from a
    record's ``run_secs``, which list a time per launch a repeat at a time (``measure.run_case``)."""
    from .workloads import CASE_LAUNCHES

    launches = CASE_LAUNCHES.get(kernel, 1)
    secs = [float(s) for s in run_secs]
    return [sum(secs[i::launches]) / len(secs[i::launches]) for i in range(launches)]


def record_geometry(record, cuda: bool) -> Geometry:
    """Replay a record's trace on its workload and read the geometry it selects (knobs the trace does
    not decide keep the record's bucket's default: its mode and size)."""
    import tvm

    from ..schedules.space import geometry_from
    from .workloads import bucket_of, default_of

    func = record.workload.mod["main"]
    kernel = str(func.attrs["canary.kernel"])
    sch = tvm.s_tir.Schedule(record.workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return geometry_from(sch.mod, default_of(kernel, bucket_of(func), "cuda" if cuda else "llvm"))


def default_row(kernel: str, bucket: tuple, rows: list, cuda: bool):
    """The fastest of a bucket's measured ``rows`` (``measured_records``, fastest first) whose record is
    the default geometry of the bucket's mode and size, or None if the default was not measured."""
    from .workloads import default_of

    default = default_of(kernel, bucket, "cuda" if cuda else "llvm")
    return next((row for row in rows if record_geometry(row[1], cuda) == default), None)


def database_buckets(db, kernels) -> list:
    """The ``(kernel, bucket)`` of every workload of ``db`` with a measured record, for ``kernels``,
    sorted (also those a database tuned with another size preset holds)."""
    return sorted({key for key, _, _ in _measured(db) if key[0] in kernels})


def stale_buckets(db, jobs: list, cuda: bool) -> list:
    """The ``(kernel, bucket)`` of ``jobs``, in order, whose default geometry has no current valid record
    in ``db`` (``default_row`` of ``measured_records``): never tuned, tuned for other kernel code, tuning
    case or default, or the default's measurement failed. Load cannot apply a tuned geometry to them
    (``chosen``); ``tune --stale-only`` tunes only them."""
    rows = measured_records(db)
    return [(k, b) for k, b in jobs if default_row(k, b, rows.get((k, b), []), cuda) is None]


def chosen_row(kernel: str, bucket: tuple, rows: list, cuda: bool):
    """The row (``(seconds, record)``) a bucket's measured ``rows`` (``measured_records``, fastest first)
    select: ``row_chosen_over`` the default's (``default_row``). None if the default has no valid record
    (its measurement failed, which ``tune`` reports, or the defaults changed since): nothing was measured
    against it, so the bucket keeps it (``chosen``)."""
    default = default_row(kernel, bucket, rows, cuda)
    return None if default is None else row_chosen_over(kernel, bucket, rows, default, cuda)


def row_chosen_over(kernel: str, bucket: tuple, rows: list, default: tuple, cuda: bool) -> tuple:
    """``chosen_row`` for a bucket whose ``default_row`` is ``default`` (not None): the fastest of ``rows``
    at least ``TUNED_MARGIN`` faster than it in every launch of the case (so over the case too) whose
    geometry lies in the bucket's design space (``in_design_space``), else ``default``."""
    default_launches = launch_seconds(kernel, default[1].run_secs)
    for cost, record in rows:
        if cost > (1 - TUNED_MARGIN) * default[0]:
            break  # no record slower over the case is fast enough in every launch
        if (all(t <= (1 - TUNED_MARGIN) * d for t, d in zip(launch_seconds(kernel, record.run_secs), default_launches))
                and in_design_space(kernel, bucket, record_geometry(record, cuda), cuda)):
            return cost, record
    return default


def in_design_space(kernel: str, bucket: tuple, geom: Geometry, cuda: bool) -> bool:
    """Whether the bucket's design space can select ``geom``: each of the kernel's knobs in its mode
    (``schedules.knobs``) at one of its choices, every other field at the bucket's default. A record
    selecting anything else (hand-edited, or another design space's) is never applied: the kernels
    assume their geometry's limits (a zero unroll divides by zero, too many threads cannot launch)."""
    import dataclasses

    from ..schedules import knobs
    from .workloads import default_of, mode_of

    default = default_of(kernel, bucket, "cuda" if cuda else "llvm")
    space = knobs(kernel, cuda, mode_of(kernel, bucket))
    return all(getattr(geom, f.name) in space[f.name] if f.name in space
               else getattr(geom, f.name) == getattr(default, f.name)
               for f in dataclasses.fields(geom))


def chosen(kernel: str, bucket: tuple, rows: list, cuda: bool) -> tuple[float, Geometry]:
    """(seconds, geometry) of ``chosen_row``; (nan, the bucket's default geometry) if it selects none."""
    from .workloads import default_of

    row = chosen_row(kernel, bucket, rows, cuda)
    if row is None:
        return math.nan, default_of(kernel, bucket, "cuda" if cuda else "llvm")
    return row[0], record_geometry(row[1], cuda)


def _chosen_geometries(db, work_dir: str, cuda: bool) -> dict:
    """{(kernel, bucket): ``chosen``} of ``db``'s current records; a warning names the buckets without a
    valid record of their default, one the stale kernels."""
    stale: set = set()
    out: dict = {}
    unmeasured: list = []
    for (kernel, bucket), rows in measured_records(db, stale).items():
        cost, geometry = out[kernel, bucket] = chosen(kernel, bucket, rows, cuda)
        if math.isnan(cost):
            unmeasured.append((kernel, bucket))
    if unmeasured:
        log.warning("tvm_canary: %s holds no valid record of the default geometry of %s; these buckets keep the "
                    "default (its measurement failed, or the defaults changed since the tuning: re-tune with `%s`)",
                    work_dir, ", ".join(f"{k} {b}" for k, b in unmeasured),
                    retune_command({k for k, _ in unmeasured}, work_dir, cuda))
    if stale:
        log.warning("tvm_canary: %s holds records tuned for an older version of %s; they are ignored "
                    "(re-tune with `%s`)", work_dir, ", ".join(sorted(stale)), retune_command(stale, work_dir, cuda))
    return out


def retune_command(kernels, work_dir: str, cuda: bool) -> str:
    """The ``tvm-canary tune`` command that re-tunes ``kernels``' stale buckets of the database in
    ``work_dir`` (a ``<device key>`` folder), in place."""
    import pathlib

    root = pathlib.Path(work_dir).parent
    return (f"tvm-canary tune --target {'cuda' if cuda else 'llvm'} --kernels {' '.join(sorted(kernels))} "
            f"--stale-only --out {root}")


def selected_geometries(kernel: str, key: str, cuda: bool, mode: int) -> list[Geometry]:
    """The geometries the database of device key ``key`` selects for ``kernel`` in launch ``mode``
    (what ahead-of-time builds must cover), in bucket order."""
    from .workloads import mode_of

    buckets = _records(key, cuda).get(kernel, {})
    return [buckets[b] for b in sorted(buckets) if mode_of(kernel, b) == mode]


_noticed: set = set()


def nearest(buckets: list[tuple], point: int | tuple) -> tuple:
    """The bucket nearest in log scale to a launch's workload ``point`` (``packing.KernelCall.size``): the leading size
    (entries, requests or bs), or a tuple of leading sizes (write: requests and tokens per request) against as many of
    each bucket's, log distances summed. So a decode step's write (one token per request) takes the one-token bucket
    whatever its batch, not a long chain's with as many requests. Of equally near buckets the first wins."""
    sizes = point if isinstance(point, tuple) else (point,)

    def distance(bucket: tuple) -> float:
        return sum(abs(math.log2(max(b, 1)) - math.log2(max(s, 1))) for b, s in zip(bucket, sizes))

    return min(buckets, key=distance)


def tuned_geometry(kernel: str, device: torch.device, size: int | tuple, mode: int = 0) -> Geometry | None:
    """The geometry ``chosen`` selects in the bucket ``nearest`` to ``size`` among the kernel's buckets of ``mode``
    (``workloads.mode_of``: verify's or write's RealKvHashMode; maybe the default's) and of the launch's size class
    (``targets.size_class``: a bucket measured in its own class, as its default is), or None: the default applies (no
    record; or no bucket of the launch's class, as another class's pick was measured against another default)."""
    from ..runtime import targets
    from ..schedules import knobs
    from .workloads import mode_of, point_of

    key = keys.device_key(device)
    cuda = device.type == "cuda"
    records = _records(key, cuda)
    buckets = [b for b in records.get(kernel, {}) if mode_of(kernel, b) == mode]
    if not buckets:
        what = (f"{kernel}" + (f" (real-KV mode {mode})" if mode else "") + f" on {key}") if records else key
        if what not in _noticed and knobs(kernel, cuda, mode):  # no knobs: the default is the only schedule
            _noticed.add(what)
            log.warning("tvm_canary: no tuned schedule for %s; using the default schedule", what)
        return None
    target = targets.tag_for(device)
    launch_class = targets.size_class(kernel, target, mode, size)
    same_class = [b for b in buckets if targets.size_class(kernel, target, mode, point_of(kernel, b)) == launch_class]
    if not same_class:
        return None
    return records[kernel][nearest(sorted(same_class), size)]  # sorted: a tie goes to the smaller bucket
