"""Building and measuring candidates: MetaSchedule's builder and runner hooks, alive for a whole tuning run.

* ``CandidateBuilder``: a MetaSchedule builder whose worker processes start once per tuning run (TVM's
  ``LocalBuilder`` starts a new pool, reimporting TVM, torch and the kernels, at every call, and checks
  itself in another new process at construction: most of a workload's time on a GPU). The geometry a
  candidate's trace annotated on the stand-in workload is read here; a worker builds the real kernel
  with it and exports it under its own file name (``_build_exported``).
* ``alloc_bucket`` / ``run_case``: runner hooks for one runner per tuning run (no bucket or kernel bound in: the
  stand-in's shapes and the candidate module give them). ``run_case`` builds the workload's valid case once per
  worker process (random valid plans, a clean canary; ``case_for``), checks the candidate's outputs against the
  torch reference byte for byte (a mismatch is a failed measurement, never winning), then times each of the case's
  launches alone (verify's: a random-order and a chain-order launch): on a GPU as the benchmarks do
  (``tvm_canary.timing``: replays of a CUDA graph of ``GRAPH_LAUNCHES`` copies of the launch, each value the median
  of ``replays_per_value`` replays, after one timed replay), on a CPU with ``time_evaluator``; ``repeat`` values per
  launch, listed a repeat at a time (``apply.launch_seconds`` reads them back), so a tuned geometry can be held to
  every launch of its case, not only their sum (``apply.chosen``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import multiprocessing
import os
import pathlib
import signal
import tempfile
import threading
import time
import uuid
from concurrent.futures.process import BrokenProcessPool

import torch
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from .. import timing
from ..runtime import compile as C
from ..runtime.specializations import KERNELS
from ..schedules.space import geometry_from
from . import workloads

# Per wave of builds (a round of n candidates on w workers is ceil(n / w) waves): a build that hangs fails
# its round instead of the run. A build takes seconds; the first wave also starts the workers.
BUILD_TIMEOUT_S = 120
# copies of a case's launch per CUDA graph timing a candidate on a GPU (the benchmarks' graphs hold 2-4)
GRAPH_LAUNCHES = 4
# A value spans at least this much GPU time (``replays_per_value``): a long graph needs fewer replays
# than the evaluator's ``number`` to be as steady.
VALUE_MIN_US = 20_000.0


def _job(mod, target) -> tuple:
    """What building a candidate needs, as plain values: (kernel, bucket, target tag, geometry, the
    parent's ``source_hash``), the geometry that the stand-in workload ``mod``'s annotations select (the
    bucket's default's fields, ``workloads.default_of``, where it has none)."""
    kernel = str(mod["main"].attrs["canary.kernel"])
    bucket = workloads.bucket_of(mod["main"])
    tag = f"cuda-{target.attrs['arch']}" if target.kind.name == "cuda" else "llvm"
    return kernel, bucket, tag, geometry_from(mod, workloads.default_of(kernel, bucket, tag)), C.source_hash()


def _build_exported(job: tuple) -> tuple[str, float]:
    """Worker side of ``CandidateBuilder``: build one candidate and export it as a tar archive with a file name of its
    own; returns the artifact's path and the worker's seconds on it. The name matters on an RPC server: a session
    measuring many candidates loads each from the artifact's file name, and a library loaded again under a name still
    open would be the earlier candidate's code (``dlopen`` returns the open one)."""
    from tvm.support.tar import tar

    start = time.monotonic()
    kernel, bucket, tag, geom, source_hash = job
    C.require_parents_sources(source_hash, "tuning")
    path = os.path.join(tempfile.mkdtemp(), f"candidate-{uuid.uuid4().hex}.{tar.output_format}")
    C.build(kernel, workloads.tuned_spec(kernel, bucket), tag, geom).mod.export_library(path, fcompile=tar)
    return path, time.monotonic() - start


def exit_with_parent() -> None:
    """A pool worker's initializer: the worker exits once the process that started it is gone (a tune
    killed with SIGKILL left its build workers running, each holding a compiler's memory), and ignores
    Ctrl-C's SIGINT (an idle worker died of it with a traceback; ``tune`` ends them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


@derived_object
class CandidateBuilder(ms.builder.PyBuilder):
    """Builds candidates in ``max_workers`` (default: one per CPU this process may use, ``compile.usable_cpus``)
    spawned processes that live until ``shutdown()``. ``build_seconds``: the wall time callers spent waiting in
    ``build`` (rounds of builds, pool start-ups included); ``built`` and ``worker_seconds``: the candidates built
    and the workers' seconds building them, which tell a slow build from a pool building fewer at once than it
    has workers."""

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__()
        self.max_workers = max_workers or C.usable_cpus()
        self._pool = None
        self.build_seconds = 0.0
        self.built = 0
        self.worker_seconds = 0.0

    def build(self, build_inputs):
        """One round: every candidate built (or failed: timed out, raised, or lost with a dead worker).
        A round leaving a build hanging or the pool broken kills the pool; the next round starts a fresh one."""
        start = time.monotonic()
        if self._pool is None:
            # spawn: the tuning process may hold a CUDA context, which a forked worker could not use
            self._pool = concurrent.futures.ProcessPoolExecutor(self.max_workers,
                                                                mp_context=multiprocessing.get_context("spawn"),
                                                                initializer=exit_with_parent)
        futures = [self._submit(_job(i.mod, i.target)) for i in build_inputs]
        waves = -(-len(futures) // self.max_workers)
        _, pending = concurrent.futures.wait(futures, timeout=BUILD_TIMEOUT_S * max(waves, 1))
        results = [self._result(f) for f in futures]
        broken = any(f.done() and isinstance(f.exception(), BrokenProcessPool) for f in futures)
        if pending or broken:
            self.shutdown(kill=True)
        self.build_seconds += time.monotonic() - start
        return results

    def _submit(self, job) -> concurrent.futures.Future:
        """The pool's future of building ``job``; a failed one if the pool is already broken (a worker died)."""
        try:
            return self._pool.submit(_build_exported, job)
        except BrokenProcessPool as error:
            failed = concurrent.futures.Future()
            failed.set_exception(error)
            return failed

    def shutdown(self, kill: bool = False) -> None:
        if self._pool is None:
            return
        if kill:
            for process in list(self._pool._processes.values()):
                process.kill()
        self._pool.shutdown(wait=not kill, cancel_futures=True)
        self._pool = None

    def _result(self, future) -> ms.builder.BuilderResult:
        """MetaSchedule's result of one build; a finished one counts in ``built`` and ``worker_seconds``."""
        if not future.done():
            return ms.builder.BuilderResult(None, "kv-canary: candidate build timed out")
        error = future.exception()
        if error is not None:
            return ms.builder.BuilderResult(None, f"kv-canary: candidate build failed: {error!r}")
        path, seconds = future.result()
        self.built += 1
        self.worker_seconds += seconds
        return ms.builder.BuilderResult(path, None)


# -- runner hooks (run in the runner's worker processes, or in an RPC server's session)


def alloc_bucket(_device, args_info, alloc_repeat: int):
    """The bucket, from the stand-in's argument shapes (one buffer per dimension, ``workloads.descriptor``);
    ``run_case``, which knows the kernel, builds the case."""
    bucket = tuple(int(info[2][0]) for info in args_info)
    return [[bucket]] * alloc_repeat


def kernel_of(rt_mod) -> str:
    """The kernel a candidate module implements (its one function ``canary_<kernel>``)."""
    for kernel in KERNELS:
        if rt_mod.implements_function(f"canary_{kernel}", query_imports=True):
            return kernel
    raise RuntimeError("kv-canary: the candidate module implements no canary kernel")


_held_case: dict = {}  # (kernel, bucket, device type) -> Case: one workload at a time (16M ALL: ~35 GB)


def case_for(kernel: str, bucket: tuple, device_type: str):
    """The valid case of a workload on this process's device, built once; the previous workload's released first."""
    key = (kernel, bucket, device_type)
    if key not in _held_case:
        _held_case.clear()
        if device_type == "cuda":
            torch.cuda.empty_cache()
        device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        _held_case[key] = workloads.make_case(kernel, bucket, device)
    return _held_case[key]


@functools.lru_cache(maxsize=None)
def protocol() -> str:
    """Hash (``compile.files_hash``) of what shapes a measurement: the kernels' code
    (``compile.source_files``) and the sources of the timing, the cases and this module. An RPC server
    whose protocol differs measures differently from this host (``fleet`` refuses it)."""
    here = pathlib.Path(__file__).resolve().parent
    C.source_hash()  # unreadable: its one-line error
    return C.files_hash(C.source_files() + [here.parent / "timing.py", here / "workloads.py", here / "measure.py"])


def evaluator_config() -> ms.runner.EvaluatorConfig:
    """How ``run_case`` times a candidate, for every runner: 3 values (``repeat``), each of 10 runs
    (``number``: graph replays on a GPU, at most: ``replays_per_value``; calls on a CPU)."""
    return ms.runner.EvaluatorConfig(number=10, repeat=3, min_repeat_ms=0)


def replays_per_value(replay_us: float, most: int) -> int:
    """Graph replays per timed value for a graph whose one replay took ``replay_us``: enough for the value to span
    ``VALUE_MIN_US``, at most ``most`` (the evaluator's ``number``), at least 1. On the H200 a verify ALL 16M launch
    (28 ms a replay) takes 1 replay a value, a write 1 x 32768 bucket (15 ms) 2, launches of a few µs all 10."""
    return max(1, min(most, math.ceil(VALUE_MIN_US / max(replay_us, 1e-3))))


def run_case(rt_mod, device, config, repeated_args):
    """Check the candidate ``rt_mod`` on its workload's case against the reference, then time it."""
    (bucket,) = repeated_args[0]
    kernel = kernel_of(rt_mod)
    case = case_for(kernel, bucket, "cuda" if device.dlpack_device_type() == 2 else "cpu")
    name = f"canary_{kernel}"
    function = rt_mod[name]
    case.reset()
    for args in case.launches:
        function(*args)
    cuda = case.launches[0][0].is_cuda
    if cuda:
        torch.cuda.synchronize()
    if not case.matches():
        raise RuntimeError(f"candidate output of {name} differs from the torch reference")
    if cuda:
        # As the benchmarks time (module docstring), replays held; a value is one launch's time. Timed
        # eagerly a launch at a time, a kernel of a few µs measures the host's launch cost as much as
        # itself, and a geometry that won there lost in the benchmark (docs/TUNING.md).
        graphs = [timing.capture([lambda args=args: function(*args)] * GRAPH_LAUNCHES) for args in case.launches]
        replays = [replays_per_value(timing.median_us(graph.replay, 1), config.number) for graph in graphs]
        return [1e-6 * timing.replay_us(graph, GRAPH_LAUNCHES, n) for _ in range(config.repeat)
                for graph, n in zip(graphs, replays)]
    timer = rt_mod.time_evaluator(name, device, number=config.number, repeat=config.repeat,
                                  min_repeat_ms=config.min_repeat_ms)
    per_launch = [timer(*args).results for args in case.launches]
    return [value for values in zip(*per_launch) for value in values]
