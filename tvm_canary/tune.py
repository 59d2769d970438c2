"""``tvm-canary tune``: tune the kernels' geometries on this machine's device with MetaSchedule.

    tvm-canary tune --target cuda|llvm [--kernels ...] [--trials N] [--workloads PRESET] [--out DIR]

Writes a MetaSchedule JSON database to ``DIR/<device key>/`` (default ``tune_logs/``); workloads
already in it with at least N measured candidates are skipped (resume). Ends with a table: kernel,
workload, default time, tuned time, speedup.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys
import tempfile
import types

import torch
from tqdm import tqdm

from .runtime import targets
from .tuning import keys, workloads


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("tune", help="autotune kernel geometries with MetaSchedule", description=__doc__.splitlines()[0])
    p.add_argument("--target", choices=("cuda", "llvm"), required=True)
    p.add_argument("--kernels", nargs="+", choices=workloads.KERNELS, default=workloads.KERNELS)
    p.add_argument("--trials", type=int, default=32, help="candidates per workload")
    p.add_argument("--workloads", choices=sorted(workloads.PRESETS), default=None, help="bucket preset (default: gpu or cpu)")
    p.add_argument("--out", default=str(keys.tune_logs_dirs()[-1]), help="database root (a folder per device key)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cuda = args.target == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    preset = workloads.PRESETS[args.workloads or ("gpu" if cuda else "cpu")]
    work_dir = pathlib.Path(args.out) / keys.device_key(device)
    jobs = [(k, b) for k in args.kernels for b in preset[k]]
    rows = []
    for kernel, bucket in tqdm(jobs, desc=f"tune {keys.device_key(device)}"):
        rows.append(tune_workload(kernel, bucket, device, work_dir, args.trials))
    print(f"\n{'kernel':8} {'workload':14} {'candidates':>10} {'default us':>11} {'tuned us':>9} {'speedup':>8}  tuned geometry")
    for r in rows:
        note = "  (no knobs on this target: nothing to tune)" if r["candidates"] == 1 else ""
        print(f"{r['kernel']:8} {str(r['bucket']):14} {r['candidates']:>10} {r['default_us']:11.1f} {r['tuned_us']:9.1f} "
              f"{r['default_us'] / r['tuned_us']:8.2f}  {r['geometry']}{note}")
    return 0


def tune_workload(kernel: str, bucket: tuple, device: torch.device, work_dir: pathlib.Path, trials: int) -> dict:
    """Tune one workload (resuming from ``work_dir``); returns its table row."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    import schedules
    from schedules.space import knob_values_of, make_space

    from .tuning import measure
    from .tuning.apply import measured_records, record_geometry

    cuda = device.type == "cuda"
    target = _target(device)
    mod = tvm.IRModule({"main": workloads.descriptor(kernel, bucket)})
    work_dir.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    knobs = schedules.knobs(kernel, cuda)
    space_size = 1
    for choices in knobs.values():
        space_size *= len(choices)
    trials = min(trials, space_size)
    if len(measured_records(db).get((kernel, bucket), [])) < trials:
        runner = ms.runner.LocalRunner(
            evaluator_config=ms.runner.EvaluatorConfig(number=10, repeat=3, min_repeat_ms=0),
            timeout_sec=120,  # the first run of a worker builds the case (16M entries: seconds)
            f_alloc_argument=functools.partial(measure.alloc_case, kernel, bucket),
            f_run_evaluator=functools.partial(measure.run_case, kernel),
        )
        builder = ms.builder.LocalBuilder(f_build=measure.build_candidate, max_workers=os.cpu_count())
        space = ms.space_generator.ScheduleFn(make_space(knobs), sch_rules=[], postprocs=[], mutator_probs={})
        # Our spaces never tensorize: skip the 20-30 s import of TVM's tensor intrinsics.
        sys.modules.setdefault("tvm.s_tir.tensor_intrin", types.ModuleType("tvm.s_tir.tensor_intrin"))
        with tempfile.TemporaryDirectory(prefix="tvm-canary-tune-") as scratch:
            ms.tune_tir(
                mod, target, scratch, max_trials_global=trials, num_trials_per_iter=trials, builder=builder,
                runner=runner, database=db, cost_model="random", space=space,
                # Evolutionary search deduplicates candidates; eps_greedy=0 measures them in one round.
                strategy=ms.search_strategy.EvolutionarySearch(population_size=4 * trials + 16, eps_greedy=0.0), seed=0,
            )
        runner.pool.shutdown()  # its worker holds this bucket's case (up to ~35 GB of device memory)
    default = targets.geometry_for(kernel, targets.tag_for(device))
    rows = measured_records(db).get((kernel, bucket), [])
    if not any(record_geometry(r, cuda) == default for _, r in rows) and knob_values_of(knobs, default):
        # The default competes too: a bucket's best record is then never slower than the default.
        commit_measurement(db, mod, knobs, default, default_time_us(kernel, bucket, device, default) / 1e6, target)
        rows = measured_records(db).get((kernel, bucket), [])
    if not rows:
        return dict(kernel=kernel, bucket=bucket, candidates=0, default_us=float("nan"), tuned_us=float("nan"),
                    geometry="every candidate failed: the default applies")
    best_cost, best = rows[0]
    geom = record_geometry(best, cuda)
    tuned_us = 1e6 * best_cost
    same = [c for c, r in rows if record_geometry(r, cuda) == default]
    default_us = 1e6 * same[0] if same else default_time_us(kernel, bucket, device, default)
    return dict(kernel=kernel, bucket=bucket, candidates=len(rows), default_us=default_us, tuned_us=tuned_us, geometry=geom.key())


def commit_measurement(db, mod, knobs: dict, geom, seconds: float, target) -> None:
    """Commit a measurement of ``geom`` on the workload ``mod`` as a tuning record (its trace decides
    every knob to ``geom``'s value); ``tune`` does it for the default geometry."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from schedules.space import make_space

    sch = tvm.s_tir.Schedule(mod)
    make_space(knobs, geom)(sch)
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), [seconds], target, args_info))


def default_time_us(kernel: str, bucket: tuple, device: torch.device, default) -> float:
    """The default geometry (when the search did not measure it) timed with the candidates' settings."""
    import tvm

    from .runtime.compile import build

    ex = build(kernel, workloads.tuned_spec(kernel, bucket), targets.tag_for(device), default)
    case = workloads.make_case(kernel, bucket, device)
    dev = tvm.cuda(0) if device.type == "cuda" else tvm.cpu(0)
    timer = ex.mod.time_evaluator(f"canary_{kernel}", dev, number=10, repeat=3, min_repeat_ms=0)
    res = timer(*case.args).results
    del case
    if device.type == "cuda":
        torch.cuda.empty_cache()  # give the case's memory back before the next bucket's workers need it
    return 1e6 * sum(res) / len(res)


def _target(device: torch.device):
    return targets.target_from_tag(targets.tag_for(device))
