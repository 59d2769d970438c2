"""Ahead-of-time artifacts: every kernel specialization, compiled for the listed targets, in every geometry a
launch can ask for.

``build_all(tags, out_dir, tuning_keys)`` writes one ``<module key>.so`` per (kernel, specialization, tag,
geometry) plus ``manifest.json``. The geometries are the defaults (``targets.default_geometries``) and those
the tuning databases of ``tuning_keys`` select for the specialization's launch modes, so a host whose
launches take their geometry from one of those databases finds every module it asks for. A host of the same
machine (``platform.machine()``, in the keys) with only torch, apache-tvm-ffi and the TVM runtime loads them
through the public API when ``TVM_CANARY_MODULES`` names the directory (with the default geometries:
reading a database needs the TVM compiler). CUDA device code is compiled for each arch at build time where
TVM's CUDA runtime can load (a host with the CUDA driver); elsewhere the artifact keeps CUDA source,
compiled at load by NVRTC (cuda-bindings). Builds go through the disk cache, so modules compiled before
are copied; missing ones compile side by side in ``workers`` processes (the cache's lock compiles each once).
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import platform
import shutil

import tvm

from . import compile as C
from . import targets
from .specializations import KERNELS, all_specs, launch_mode


def geometries(kernel: str, spec: tuple, tag: str, tuning_keys: tuple[str, ...] = ()) -> list:
    """The geometries a launch of ``spec`` on ``tag`` can use: the defaults of the specialization's
    launch mode (``targets.default_geometries``: every size class), then those the databases of
    ``tuning_keys`` select for that mode (no duplicates)."""
    mode = launch_mode(kernel, spec)
    out = list(targets.default_geometries(kernel, tag, mode))
    if tuning_keys:
        from ..tuning.apply import selected_geometries

        for key in tuning_keys:
            out += selected_geometries(kernel, key, tag.startswith("cuda"), mode)
    return list(dict.fromkeys(out))


def build_all(tags: list[str], out_dir: str, kernels=KERNELS, tuning_keys=(), progress=None,
              workers: int = 1) -> list[pathlib.Path]:
    """Compile and export every specialization of ``kernels`` for each tag in each of its geometries
    (``geometries``); returns the files. ``progress(iterable, total)`` wraps the builds as they finish
    (a progress bar); ``workers``: processes compiling the modules the disk cache lacks."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(tag, k, spec, geom) for tag in tags for k in kernels for spec in all_specs(k)
            for geom in geometries(k, spec, tag, tuple(tuning_keys))]
    compile_missing(jobs, workers, progress or (lambda iterable, total: iterable))
    written = []
    for tag, kernel, spec, geom in jobs:
        path = out / f"{C.module_key(kernel, spec, tag, geom)}.so"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # an interrupted build leaves no module cut short
        shutil.copyfile(C.cached_module(kernel, spec, tag, geom), tmp)
        os.replace(tmp, path)
        written.append(path)
    manifest = {"tvm_version": tvm.__version__, "machine": platform.machine(), "source_hash": C.source_hash(),
                "tags": tags, "tuning_databases": list(tuning_keys), "modules": [p.name for p in written]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return written


def compile_missing(jobs: list, workers: int, progress) -> None:
    """Compile into the disk cache the modules of ``jobs`` ((tag, kernel, spec, geometry)) it lacks: here
    one by one if ``workers`` is 1 or at most one is missing, else in up to ``workers`` spawned processes
    side by side (a CUDA module's build compiles device code for its arch: seconds each, minutes for a
    whole target one by one). ``progress(iterable, total)`` wraps the builds as they finish."""
    missing = [job for job in jobs if not C.cache_path(job[1], job[2], job[0], job[3]).exists()]
    if not missing:  # nothing to build: no progress bar either
        return
    if workers <= 1 or len(missing) == 1:
        for tag, kernel, spec, geom in progress(missing, len(missing)):
            C.cached_module(kernel, spec, tag, geom)
        return
    spawn = multiprocessing.get_context("spawn")  # a forked worker could not use a CUDA context of this process
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(missing)), mp_context=spawn) as pool:
        futures = [pool.submit(_compile, job, C.source_hash()) for job in missing]
        try:
            for future in progress(concurrent.futures.as_completed(futures), len(futures)):
                future.result()  # a failed build raises here
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # report it now, not after every queued build
            raise


def _compile(job: tuple, source_hash: str) -> None:
    """Worker side of ``compile_missing``: one module into the disk cache, under the parent's key."""
    C.require_parents_sources(source_hash, "this build")
    tag, kernel, spec, geom = job
    C.cached_module(kernel, spec, tag, geom)
