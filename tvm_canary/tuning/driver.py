"""The tuning driver: one workload (kernel, size bucket) tuned with MetaSchedule into a database.

``tune_workload`` runs MetaSchedule's search over the kernel's design space (``tvm_canary.schedules``)
with the builder and runner hooks of ``measure`` and commits the measurements to a JSON database;
then the default geometry competes as one more record. How candidates are run is one argument
(``runner``, default ``local_runner``: this machine's device), so another runner (e.g. MetaSchedule's
RPC runner on a fleet) plugs in without touching the rest.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import sys
import types

import torch

from ..runtime import targets
from ..runtime.targets import default_geometry
from ..schedules import knobs as design_knobs
from ..schedules.space import knob_values_of, make_space
from . import measure, workloads
from .apply import measured_records, record_geometry


@dataclasses.dataclass
class Result:
    """One workload's outcome. ``measured``: candidates measured in this run (0 when the database
    already held enough); times in microseconds (NaN when every candidate failed)."""

    kernel: str
    bucket: tuple
    candidates: int
    measured: int
    default_us: float
    tuned_us: float
    geometry: str


def local_runner(kernel: str, bucket: tuple):
    """MetaSchedule's LocalRunner with the canary's case allocation and checked timing (``measure``)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.LocalRunner(
        evaluator_config=ms.runner.EvaluatorConfig(number=10, repeat=3, min_repeat_ms=0),
        timeout_sec=120,  # the first run of a worker builds the case (16M entries: seconds)
        f_alloc_argument=functools.partial(measure.alloc_case, kernel, bucket),
        f_run_evaluator=functools.partial(measure.run_case, kernel),
    )


def tune_workload(kernel: str, bucket: tuple, device: torch.device, db, trials: int, log_dir: pathlib.Path,
                  verbose: bool = False, runner=None) -> Result:
    """Tune one workload into the JSON database ``db`` until it holds ``trials`` measured candidates (at
    most the size of the design space); MetaSchedule's logs go to ``log_dir/logs`` (and its INFO lines
    to stdout too when ``verbose``). ``runner``: a MetaSchedule runner (default ``local_runner``)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    cuda = device.type == "cuda"
    kind = "cuda" if cuda else "llvm"
    target = targets.target_from_tag(targets.tag_for(device))
    mod = tvm.IRModule({"main": workloads.descriptor(kernel, bucket, kind)})
    knobs = design_knobs(kernel, cuda)
    space_size = 1
    for choices in knobs.values():
        space_size *= len(choices)
    trials = min(trials, space_size)
    before = len(measured_records(db).get((kernel, bucket), []))
    searched = before < trials
    if searched:
        runner = runner or local_runner(kernel, bucket)
        builder = ms.builder.LocalBuilder(f_build=measure.build_candidate, max_workers=os.cpu_count())
        space = ms.space_generator.ScheduleFn(make_space(knobs), sch_rules=[], postprocs=[], mutator_probs={})
        # Our spaces never tensorize: skip the 20-30 s import of TVM's tensor intrinsics.
        sys.modules.setdefault("tvm.s_tir.tensor_intrin", types.ModuleType("tvm.s_tir.tensor_intrin"))
        # MetaSchedule's console handler takes this level; its log files always get everything.
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.INFO if verbose else logging.WARNING)
        ms.tune_tir(
            mod, target, str(log_dir), max_trials_global=trials, num_trials_per_iter=trials, builder=builder,
            runner=runner, database=db, cost_model="random", space=space,
            # Evolutionary search deduplicates candidates; eps_greedy=0 measures them in one round.
            strategy=ms.search_strategy.EvolutionarySearch(population_size=4 * trials + 16, eps_greedy=0.0), seed=0,
        )
        if hasattr(runner, "pool"):
            runner.pool.shutdown()  # a local worker holds this bucket's case (up to ~35 GB of device memory)
    default = default_geometry(kernel, kind, workloads.mode_of(kernel, bucket))
    rows = measured_records(db).get((kernel, bucket), [])
    if not any(record_geometry(r, cuda) == default for _, r in rows) and knob_values_of(knobs, default):
        # The default competes too: a bucket's best record is then never slower than the default.
        commit_measurement(db, mod, knobs, default, default_time_us(kernel, bucket, device, default) / 1e6, target)
        rows = measured_records(db).get((kernel, bucket), [])
    measured = len(rows) - before
    if not rows:
        return Result(kernel, bucket, 0, measured, float("nan"), float("nan"), "every candidate failed: the default applies")
    best_cost, best = rows[0]
    same = [c for c, r in rows if record_geometry(r, cuda) == default]
    default_us = 1e6 * same[0] if same else default_time_us(kernel, bucket, device, default)
    return Result(kernel, bucket, len(rows), measured, default_us, 1e6 * best_cost, record_geometry(best, cuda).key())


def commit_measurement(db, mod, knobs: dict, geom, seconds: float, target) -> None:
    """Commit a measurement of ``geom`` on the workload ``mod`` as a tuning record (its trace decides
    every knob to ``geom``'s value); ``tune`` does it for the default geometry."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    sch = tvm.s_tir.Schedule(mod)
    make_space(knobs, geom)(sch)
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), [seconds], target, args_info))


def default_time_us(kernel: str, bucket: tuple, device: torch.device, default) -> float:
    """The default geometry (when the search did not measure it) timed with the candidates' settings."""
    import tvm

    from ..runtime.compile import build

    ex = build(kernel, workloads.tuned_spec(kernel, bucket), targets.tag_for(device), default)
    case = workloads.make_case(kernel, bucket, device)
    dev = tvm.cuda(0) if device.type == "cuda" else tvm.cpu(0)
    timer = ex.mod.time_evaluator(f"canary_{kernel}", dev, number=10, repeat=3, min_repeat_ms=0)
    res = timer(*case.args).results
    del case
    if device.type == "cuda":
        torch.cuda.empty_cache()  # give the case's memory back before the next bucket's workers need it
    return 1e6 * sum(res) / len(res)
