"""The tuning driver: one workload (kernel, size bucket) tuned with MetaSchedule into a database.

``tune_workload`` runs MetaSchedule's search over the kernel's design space (``tvm_canary.schedules``) with
``measure``'s builder and runner hooks and commits the measurements to a JSON database; then the default geometry
competes as one more record (built beforehand by ``build_defaults`` if the caller uses it). One builder and one runner
serve a whole tuning run (else starting their worker processes, which import TVM and torch, is most of a workload's
time). The runner decides where candidates run (``local_runner``: this machine's device; ``fleet.Fleet.runner``: RPC
servers) and measures the default too, so nothing else depends on where it runs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pathlib
import re
import sys
import time
import types

from ..geometry import Geometry
from ..runtime import targets
from ..schedules import knobs as design_knobs
from ..schedules.space import knob_values_of, make_space
from . import measure, workloads
from .apply import (
    chosen,
    default_row,
    launch_seconds,
    measured_records,
    previous_pick,
    record_geometry,
    tried_geometries,
)

# Search rounds per workload at most: a round that draws only geometries measured before adds nothing.
SEARCH_ROUNDS = 4


@dataclasses.dataclass
class Result:
    """One workload's outcome. ``candidates``: the distinct geometries the database holds measured for it;
    ``measured``: those this run added (0 if the database held enough); times in µs (NaN if every candidate
    failed); ``seconds``: the workload's wall time in this run, ``build_seconds`` the part spent waiting on
    the builder; ``default_error``: why the default's measurement in this run failed, if it did;
    ``no_knobs``: the design space is one point (nothing to tune)."""

    kernel: str
    bucket: tuple
    candidates: int
    measured: int
    default_us: float
    tuned_us: float
    geometry: str
    seconds: float = 0.0
    build_seconds: float = 0.0
    default_error: str = ""
    no_knobs: bool = False


def local_runner():
    """MetaSchedule's LocalRunner on this machine's device, for a whole tuning run (its worker keeps the
    current workload's case), with the canary's checked timing (``measure``)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.LocalRunner(
        evaluator_config=measure.evaluator_config(),
        timeout_sec=120,  # as fleet.CANDIDATE_TIMEOUT_S
        f_alloc_argument=measure.alloc_bucket,
        f_run_evaluator=measure.run_case,
    )


def workload_module(kernel: str, bucket: tuple, kind: str):
    """The IRModule MetaSchedule tunes for a workload: the kernel's stand-in of the bucket's shapes
    (``workloads.descriptor``) on ``kind`` ("cuda" or "llvm")."""
    import tvm

    return tvm.IRModule({"main": workloads.descriptor(kernel, bucket, kind)})


@dataclasses.dataclass(frozen=True)
class Space:
    """A workload's design space on a target kind: its ``knobs`` (``schedules.knobs``), the number of
    points (``size``), the workload's ``default`` geometry (``workloads.default_of``) and whether that
    default is one of the points (``has_default``: a record of it can be committed)."""

    knobs: dict
    size: int
    default: Geometry
    has_default: bool

    @classmethod
    def of(cls, kernel: str, bucket: tuple, cuda: bool) -> Space:
        knobs = design_knobs(kernel, cuda, workloads.mode_of(kernel, bucket))
        default = workloads.default_of(kernel, bucket, "cuda" if cuda else "llvm")
        size = math.prod(len(choices) for choices in knobs.values())
        return cls(knobs, size, default, knob_values_of(knobs, default))


def build_defaults(jobs: list, tag: str, db, builder, trials: int) -> dict:
    """(kernel, bucket) -> the build (MetaSchedule ``BuilderResult``) of the default geometry of each workload of
    ``jobs`` whose default ``tune_workload`` will measure, as far as ``db`` tells before the search (it lacks it,
    or the search at ``trials`` will add candidates), for target tag ``tag``, in ONE round of ``builder``;
    ``tune_workload`` takes its workload's as ``default_build``. Left out: workloads whose search at ``trials``
    measures their whole design space, default included (CUDA: plan and scatter at 32 trials). A default the
    search draws by chance is built for nothing (a worker's few seconds); one measured again after a previous
    pick is built alone."""
    from tvm.s_tir import meta_schedule as ms

    cuda = tag.startswith("cuda")
    kind = "cuda" if cuda else "llvm"
    target = targets.target_from_tag(tag)
    measured = measured_records(db)

    def measures_default(kernel, bucket):
        space, rows = Space.of(kernel, bucket, cuda), measured.get((kernel, bucket), [])
        searched_whole = 1 < space.size <= trials and space.has_default
        searches = _geometries(rows, cuda) < min(trials, space.size)
        return not searched_whole and (searches or default_row(kernel, bucket, rows, cuda) is None)

    todo = [(k, b) for k, b in jobs if measures_default(k, b)]
    if not todo:
        return {}
    built = builder.build([ms.builder.BuilderInput(workload_module(k, b, kind), target) for k, b in todo])
    return dict(zip(todo, built))


def discard_build(built) -> None:
    """Remove the artifact of a build (``build_defaults``) unless it is gone (``measure_candidate``
    removes what it ran) or there is none (None, a failed build)."""
    from tvm.s_tir import meta_schedule as ms

    if built is not None and built.artifact_path and os.path.exists(built.artifact_path):
        ms.utils.remove_build_dir(built.artifact_path)


def tune_workload(kernel: str, bucket: tuple, tag: str, db, trials: int, log_dir: pathlib.Path, builder, runner,
                  verbose: bool = False, default_build=None) -> Result:
    """Tune one workload for the device of target tag ``tag`` (``targets.tag_for``) into the JSON database ``db`` until
    it holds ``trials`` measured candidates (at most the design space's size); MetaSchedule's logs go to
    ``log_dir/logs`` (its INFO lines to stdout too when ``verbose``). ``builder`` (``measure.CandidateBuilder``) and
    ``runner`` (``local_runner()``, or ``fleet.Fleet.runner()`` for RPC servers on that device) serve the whole run; the
    caller shuts them down. They also build and measure the default (checked against the reference like any candidate);
    ``default_build``: its build from ``build_defaults`` (None: built here if needed), run or removed here."""
    start, built_before = time.monotonic(), builder.build_seconds
    try:
        result = _tune(kernel, bucket, tag, db, trials, log_dir, builder, runner, verbose, default_build)
    finally:
        discard_build(default_build)  # not run: the search drew the default, or the workload failed
    return dataclasses.replace(result, seconds=time.monotonic() - start,
                               build_seconds=builder.build_seconds - built_before)


def _tune(kernel: str, bucket: tuple, tag: str, db, trials: int, log_dir: pathlib.Path, builder, runner,
          verbose: bool, default_build) -> Result:
    """``tune_workload`` without its timing."""
    from tvm.s_tir import meta_schedule as ms

    cuda = tag.startswith("cuda")
    kind = "cuda" if cuda else "llvm"
    target = targets.target_from_tag(tag)
    mod = workload_module(kernel, bucket, kind)
    space = Space.of(kernel, bucket, cuda)
    trials = min(trials, space.size)
    rows = measured_records(db).get((kernel, bucket), [])
    before, defaults_before = _geometries(rows, cuda), _default_records(rows, space, cuda)
    # A space whose one point is the default (no knobs on this target) has nothing to search: the
    # default's measurement below is its record.
    only_default = space.size == 1 and space.has_default
    if before < trials and not only_default:
        generator = ms.space_generator.ScheduleFn(make_space(space.knobs), sch_rules=[], postprocs=[], mutator_probs={})
        # Our spaces never tensorize: skip the 20-30 s import of TVM's tensor intrinsics.
        sys.modules.setdefault("tvm.s_tir.tensor_intrin", types.ModuleType("tvm.s_tir.tensor_intrin"))
        ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
        # MetaSchedule's logging setup lists its logger's handlers by name and fails on an unnamed one
        # ("'NoneType' object has no attribute 'format'"), as pytest's capture handlers on non-propagating
        # loggers: keep those aside while it runs.
        unnamed = [h for h in ms_logger.handlers if h.get_name() is None]
        for handler in unnamed:
            ms_logger.removeHandler(handler)
        try:
            # A resumed workload measures only the candidates it lacks. The search deduplicates within a
            # round but may draw a geometry the database holds (the default, measured apart, or one a
            # shorter run measured): another round, own seed, while fewer than ``trials`` geometries were
            # tried (failed ones count), at most SEARCH_ROUNDS in all.
            missing = trials - before
            for seed in range(SEARCH_ROUNDS):
                # MetaSchedule's console handler takes this level (its log files get everything); set each
                # round: a round's logging setup leaves the logger at DEBUG, so the next printed INFO
                ms_logger.setLevel(logging.INFO if verbose else logging.WARNING)
                ms.tune_tir(
                    mod, target, str(log_dir), max_trials_global=missing, num_trials_per_iter=missing,
                    builder=builder, runner=runner, database=db, cost_model="random", space=generator,
                    # eps_greedy=0 measures a round's candidates in one batch.
                    strategy=ms.search_strategy.EvolutionarySearch(population_size=4 * trials + 16, eps_greedy=0.0),
                    seed=seed,
                )
                missing = trials - len(tried_geometries(db, kernel, bucket, cuda))
                if missing <= 0:
                    break
        finally:
            for handler in unnamed:
                ms_logger.addHandler(handler)
    rows = measured_records(db).get((kernel, bucket), [])
    # The bucket's pick at earlier kernel code competes too (``previous_pick``).
    previous = previous_pick(db, kernel, bucket, cuda)
    if (previous is not None and knob_values_of(space.knobs, previous)
            and all(record_geometry(record, cuda) != previous for _, record in rows)):
        run_secs, _ = measure_candidate(builder, runner, mod, target, geometry=(space.knobs, previous))
        if run_secs:
            commit_measurement(db, mod, space.knobs, previous, run_secs, target)
            rows = measured_records(db).get((kernel, bucket), [])
    # The default competes too, so a bucket's best record is never slower than the default as this run measures it:
    # measured when the database lacks it, and again when this run added candidates and did not draw it (a record
    # from an earlier run, another host start, is no yardstick for them; ``default_row`` takes its fastest record).
    default_secs, default_error = [], ""
    drawn = _default_records(rows, space, cuda) > defaults_before  # the search measured it in this run
    if not drawn and (not defaults_before or _geometries(rows, cuda) > before):
        if default_build is not None and default_build.error_msg:
            default_build = None  # it failed in the shared round (a worker that died fails the rest): build it alone
        default_secs, default_error = measure_candidate(builder, runner, mod, target, default_build)
        if space.has_default and default_secs:
            commit_measurement(db, mod, space.knobs, space.default, default_secs, target)
            rows = measured_records(db).get((kernel, bucket), [])
    # The time the candidates were weighed against (``chosen``): the default's fastest record, else this run's
    # measurement of a default no record can hold (not in the design space), else NaN (it failed).
    measured_default = default_row(kernel, bucket, rows, cuda)
    if measured_default is not None:
        default_us = 1e6 * measured_default[0]
    else:
        default_us = 1e6 * sum(launch_seconds(kernel, default_secs)) if default_secs else math.nan
    candidates = _geometries(rows, cuda)
    measured = candidates - before
    if not rows:
        why = f" (the default's: {default_error})" if default_error else ""
        return Result(kernel, bucket, 0, measured, default_us, float("nan"),
                      f"every candidate failed{why}: the default applies; MetaSchedule logs: {log_dir / 'logs'}")
    cost, geom = chosen(kernel, bucket, rows, cuda)
    return Result(kernel, bucket, candidates, measured, default_us, 1e6 * cost, geom.key(), default_error=default_error,
                  no_knobs=space.size == 1)


def _default_records(rows: list, space: Space, cuda: bool) -> int:
    """How many of a bucket's measured records (``measured_records`` rows) measured its default geometry."""
    return sum(record_geometry(record, cuda) == space.default for _, record in rows)


def _geometries(rows: list, cuda: bool) -> int:
    """The distinct geometries among a bucket's measured records (``measured_records`` rows): a search may
    measure a geometry again."""
    return len({record_geometry(record, cuda) for _, record in rows})


def commit_measurement(db, mod, knobs: dict, geom, run_secs: list, target) -> None:
    """Commit a measurement of ``geom`` on the workload ``mod`` (``run_secs``: seconds per launch of the
    case, a repeat at a time, as from ``measure.run_case``) as a tuning record (trace: ``scheduled``'s);
    ``tune`` does it for the default geometry."""
    from tvm.s_tir import meta_schedule as ms

    sch = scheduled(mod, knobs, geom)
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), [float(t) for t in run_secs],
                                                     target, args_info))


def scheduled(mod, knobs: dict, geom):
    """A schedule of the workload ``mod`` whose trace decides every knob to ``geom``'s value (what the
    design space samples for that candidate)."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    make_space(knobs, geom)(sch)
    return sch


def measure_candidate(builder, runner, mod, target, built=None, geometry=None) -> tuple[list, str]:
    """(run_secs, "") of the workload ``mod`` in the kernel's default geometry (the stand-in without knob
    annotations, built with the defaults; ``built``: that build, made earlier by ``build_defaults``) or, with
    ``geometry`` (``(knobs, Geometry)``), in that geometry (the stand-in annotated as its candidate would be),
    measured and checked against the reference by ``runner`` like a candidate (as ``commit_measurement`` takes
    them); ([], the error's ``error_summary``) if that failed. The build's artifact is removed."""
    from tvm.s_tir import meta_schedule as ms

    if geometry is not None:
        mod = scheduled(mod, *geometry).mod
    if built is None:
        (built,) = builder.build([ms.builder.BuilderInput(mod, target)])
    if built.error_msg:
        return [], error_summary(built.error_msg)
    artifact = built.artifact_path
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    device_type = "cuda" if target.kind.name == "cuda" else "cpu"  # a device name, as MetaSchedule's runners take
    try:
        (future,) = runner.run([ms.runner.RunnerInput(artifact, device_type, args_info)])
        result = future.result()
    finally:
        ms.utils.remove_build_dir(artifact)  # MetaSchedule removes its candidates' artifacts; this one is ours
    if result.error_msg or not result.run_secs:
        return [], error_summary(result.error_msg or "no times returned")
    return [float(s) for s in result.run_secs], ""


def error_summary(message: str, width: int = 240) -> str:
    """The line of a build or run error (a worker's traceback) saying what failed: its last line starting
    with an exception's name (``torch.OutOfMemoryError: CUDA out of memory. ...``), else its last
    non-empty line, cut to ``width`` characters."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
    line = (named or lines or ["(no message)"])[-1]
    return line if len(line) <= width else line[: width - 3] + "..."
