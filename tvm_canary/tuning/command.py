"""``tvm-canary tune``: tune the kernels' geometries on this machine's device with MetaSchedule.

Writes a MetaSchedule JSON database to ``<--out>/<device key>/`` (default: the checkout's ``tune_logs/``, or the user's
folder for an installed package); workloads in it with ``--trials`` measured candidates are skipped (resume). With
``--rpc-tracker``, candidates are built here and measured on the RPC servers of ``--rpc-key`` (docs/FLEET-TUNING.md),
and the database is their device's. Ends with a table per workload (candidates, times, speedup, seconds) and the
run's totals. A workload that measured nothing (every candidate and the default failed) shows its error there and
makes the command exit 1 (that workload runs the default).
``--time-limit``: no workload starts once the run's time (from the defaults' builds on) plus its longest workload so far
would pass the limit; the workloads left are listed, keep their earlier records and make the command exit 3 (a later run
resumes them); none is cut, so database and table stay whole. A fleet going away or refusing a server
(``fleet.ServerRefused``) ends the run likewise, exit 1; Ctrl-C or SIGTERM too (the workload it cuts is left), exit 130
or 143.
``--stale-only``: tune only the workloads (the preset's and the database's other buckets) without a current record of
their default (``apply.stale_buckets``); with none, the command says so and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import signal
import sys
import threading
import time

import torch
from tqdm import tqdm

from ..cliargs import (
    UsageError,
    duration,
    int_at_least,
    output_folder,
    output_root,
    require_compiler,
    summary,
    writable_folder,
)
from ..console import counted
from ..runtime import compile as C
from ..runtime.specializations import KERNELS
from . import fleet, keys, workloads


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("tune", help="autotune kernel geometries with MetaSchedule",
                              description=summary(__doc__))
    p.add_argument("--target", choices=("cuda", "llvm"), required=True, help="cuda: GPU 0; llvm: this CPU")
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS), help="kernels to tune")
    p.add_argument("--trials", type=int_at_least(1), default=32,
                   help="measured candidates per workload (at most the design space's size)")
    p.add_argument("--workloads", choices=sorted(workloads.PRESETS), default=None,
                   help="size bucket preset (see tvm_canary/tuning/workloads.py); default: gpu for cuda, cpu for llvm")
    p.add_argument("--out", type=output_root, default=keys.default_out_dir(),
                   help="database root (one folder per device key)")
    p.add_argument("--time-limit", type=duration(zero=True), default=math.inf, metavar="SECONDS",
                   help="start no workload that would end past SECONDS of the run (judged by its longest workload "
                        "so far); the rest keep their records and the command exits 3")
    p.add_argument("--stale-only", action="store_true",
                   help="tune only the workloads (the preset's and the database's own buckets) whose default "
                        "geometry has no current record in the database (never tuned, or staled by a kernel "
                        "change); the others keep their records")
    p.add_argument("--log-dir", type=output_folder, default=None,
                   help="MetaSchedule's logs go to DIR/logs; DIR by default: a new folder under "
                        "$TVM_CANARY_CACHE/tune-runs/")
    p.add_argument("--verbose", action="store_true", help="also print MetaSchedule's INFO lines (tables per round)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", type=fleet.host_port, default=None,
                   help="measure on the servers registered with this TVM RPC tracker (`tvm-canary rpc-server`), "
                        "not here")
    p.add_argument("--rpc-key", default=None, help="the RPC key of those servers (one key per device model)")
    p.add_argument("--rpc-workers", type=int_at_least(1), default=None,
                   help="servers measuring at once; default: every server of the key")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as unpacked:  # a packed database stays packed (``store.editable``)
        return _run(args, unpacked)


def _run(args: argparse.Namespace, unpacked: contextlib.ExitStack) -> int:
    require_compiler("tune")
    from tvm.s_tir import meta_schedule as ms

    from ..runtime import targets
    from . import apply, fleet
    from .driver import build_defaults, discard_build, local_runner, tune_workload
    from .measure import CandidateBuilder
    from .merge import compact_workload_table, remove_empty_database
    from .store import DATABASE_FILES, PACKED, editable, is_packed

    cuda = args.target == "cuda"
    if (args.rpc_tracker is None) != (args.rpc_key is None) or (args.rpc_workers and not args.rpc_tracker):
        raise UsageError("--rpc-tracker and --rpc-key go together (and --rpc-workers needs them)")
    if args.log_dir is None:  # checked as an explicit --log-dir, before anything is connected or built
        try:
            output_folder(str(C.cache_dir().parent / "tune-runs"))
        except argparse.ArgumentTypeError as e:
            raise UsageError(f"kv-canary: the default --log-dir: {e}") from None
    if args.rpc_tracker:
        remote = fleet.connect(args.rpc_tracker, args.rpc_key, args.target, args.rpc_workers)
        key, tag, make_runner, where = remote.device_key, remote.tag, remote.runner, f"{remote.workers} RPC server(s)"
        servers_left = remote.require_servers
    else:
        if cuda and not torch.cuda.is_available():
            raise UsageError("--target cuda needs a CUDA GPU, and torch sees none (use --target llvm)")
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        key, tag, make_runner, where = keys.device_key(device), targets.tag_for(device), local_runner, "this host"
        servers_left = None
    preset = workloads.PRESETS[args.workloads or ("gpu" if cuda else "cpu")]
    work_dir = args.out / key
    log_dir = args.log_dir or C.cache_dir().parent / "tune-runs" / f"{key}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    files = (*DATABASE_FILES, *(name + PACKED for name in DATABASE_FILES))  # plain and packed (``store``)
    writable_folder(work_dir, files)
    created = not any((work_dir / name).exists() for name in files)
    if is_packed(work_dir):  # refused unless readable, of this target, before it is unpacked in place
        apply.open_database(work_dir, key)
    print(f"database: {work_dir}\nMetaSchedule logs: {log_dir / 'logs'}")
    unpacked.enter_context(editable(work_dir))
    db = ms.database.JSONDatabase(work_dir=str(work_dir)) if created else apply.open_database(work_dir, key)
    jobs = list(dict.fromkeys((k, b) for k in args.kernels for b in preset[k]))  # --kernels may repeat one
    if args.stale_only:  # the preset's buckets, and any other the database holds (tuned with another preset)
        jobs = list(dict.fromkeys(jobs + apply.database_buckets(db, args.kernels)))
        stale = apply.stale_buckets(db, jobs, cuda)
        listed = f": {', '.join(f'{k} {b}' for k, b in stale)}" if stale else "; nothing to tune"
        print(f"--stale-only: {len(stale)} of {len(jobs)} workloads without a current record of their default{listed}")
        if not stale:
            return 0
        jobs = stale
    builder, runner = CandidateBuilder(), make_runner()
    defaults, results, left, defaults_seconds = {}, [], [], 0.0
    fleet_error = None  # a fleet's that went away or refused a server mid-run: raised after the table
    # Ctrl-C or SIGTERM (``timeout``): the signal's number; TVM re-raises a KeyboardInterrupt raised in its callbacks
    # as a bare RuntimeError. Either ends the run as a whole (table, database compacted and packed as it was).
    interrupted = []

    def on_interrupt(signum, _frame):
        interrupted.append(signum)
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()  # the only one that may set it
    stops = (signal.SIGINT, signal.SIGTERM)
    previous_handlers = [signal.signal(s, on_interrupt) for s in stops] if main_thread else []
    try:
        start = time.monotonic()
        if args.time_limit > 0:  # a limit of 0 s starts no workload: nothing to build for one
            defaults = build_defaults(jobs, tag, db, builder, args.trials)
        defaults_seconds = time.monotonic() - start
        for kernel, bucket in tqdm(jobs, desc=f"tune {key}"):
            longest = max((r.seconds for r in results), default=0.0)
            if left or time.monotonic() - start + longest > args.time_limit:
                left.append((kernel, bucket))
                continue
            if servers_left is not None:
                try:
                    servers_left()
                except RuntimeError as e:  # the fleet is gone: the run ends, what was measured is kept
                    fleet_error = e
                    left.append((kernel, bucket))
                    continue
            try:
                results.append(tune_workload(kernel, bucket, tag, db, args.trials, log_dir, builder, runner,
                                             args.verbose, defaults.pop((kernel, bucket), None)))
            except fleet.ServerRefused as e:  # a worker met a server not to measure on: the run ends
                fleet_error = e
                left.append((kernel, bucket))
    except (KeyboardInterrupt, RuntimeError):
        if not interrupted:
            raise
        left += jobs[len(results) + len(left):]  # the workload interrupted and those after it
    finally:
        for stop_signal, handler in zip(stops, previous_handlers):
            signal.signal(stop_signal, handler)
        for built in defaults.values():  # left by a run that stopped early
            discard_build(built)
        builder.shutdown()
        runner.pool.shutdown()  # its worker holds the last workload's case (up to ~35 GB of device memory)
    del db
    # A database this run created and left empty is removed; any other is compacted, as committed databases
    # are kept (the default --out is tune_logs/).
    if not (created and remove_empty_database(work_dir)):
        compact_workload_table(work_dir)
    print(f"\n{'kernel':8} {'workload':14} {'candidates':>10} {'new':>4} {'default us':>11} {'tuned us':>9} "
          f"{'speedup':>8} {'seconds':>8} {'builds s':>8}  tuned geometry")
    for r in results:
        note = "  (no knobs on this target: nothing to tune)" if r.candidates and r.no_knobs else ""
        if r.candidates and math.isnan(r.default_us):
            why = f": {r.default_error}" if r.default_error else ""
            note = (f"  (the default's measurement failed{why}; no record was measured against it, so the default "
                    "applies)")
        elif r.default_error:  # measuring it again failed: the candidates were weighed against an earlier record
            note = (f"  (the default's measurement in this run failed: {r.default_error}; the times are weighed "
                    "against its earlier record)")
        speedup = r.default_us / r.tuned_us if r.candidates else math.nan
        print(f"{r.kernel:8} {r.bucket!s:14} {r.candidates:>10} {r.measured:>4} {r.default_us:11.1f} {r.tuned_us:9.1f} "
              f"{speedup:8.2f} {r.seconds:8.1f} {r.build_seconds:8.1f}  {r.geometry}{note}")
    print(f"\n{counted(len(results), 'workload')} in "
          f"{defaults_seconds + sum(r.seconds for r in results):.1f} s "
          f"(the defaults built first: {defaults_seconds:.1f} s; "
          f"waiting on builds {builder.build_seconds:.1f} s in all; "
          f"the rest measures on {where} and searches)")
    if builder.built:
        print(f"builds: {counted(builder.built, 'candidate')} in {counted(builder.max_workers, 'worker process')}, "
              f"{builder.worker_seconds / builder.built:.2f} s of a worker's time each")
    new = sum(r.measured for r in results)
    stop = "interrupted" if interrupted else (
        "an RPC server was refused" if isinstance(fleet_error, fleet.ServerRefused) else "the fleet went away")
    if new == 0 and not results:
        why = f"{stop} in or before the first workload" if fleet_error or interrupted else (
            f"--time-limit {args.time_limit:g} s left no time for a workload")
        print(f"\nnothing measured: {why}.")
    elif new == 0 and all(r.candidates for r in results):
        print(f"\nnothing measured: every workload already had its candidates in {work_dir}. The times above are the "
              f"database's, measured when it was tuned on a device with key {key} (not necessarily {where}).")
    else:
        print(f"\nmeasured {counted(new, 'candidate')} on {where} ({key}); "
              "rows with fewer new than candidates also show the "
              f"database's earlier measurements. Wrote {work_dir}")
    failed = [f"{r.kernel} {r.bucket}" for r in results if not r.candidates]
    if left:
        why = stop if fleet_error or interrupted else f"at --time-limit {args.time_limit:g} s"
        print(f"tvm-canary tune: stopped ({why}): "
              f"{counted(len(left), 'workload')} "
              "not tuned in this run (their earlier records, if any, are kept): "
              f"{', '.join(f'{k} {b}' for k, b in left)}",
              file=sys.stderr)
    if interrupted:
        return 128 + interrupted[0]  # a shell's status of a command ended by the signal (SIGINT 130, SIGTERM 143)
    if fleet_error is not None:
        raise fleet_error
    if failed:
        # What was recorded is written and usable (those workloads run the default), but the run is not whole.
        print(f"tvm-canary tune: error: nothing measured for {counted(len(failed), 'workload')}: "
              f"{', '.join(failed)} (reasons in the table above)", file=sys.stderr)
        return 1
    return 3 if left else 0
