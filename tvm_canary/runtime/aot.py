"""Ahead-of-time artifacts: every kernel specialization, compiled for the listed targets.

``build_all(tags, out_dir)`` writes one ``<module key>.so`` per (kernel, specialization, tag) plus
``manifest.json``. A host with only torch, apache-tvm-ffi and the TVM runtime library loads them
through the normal public API when ``TVM_CANARY_MODULES`` names the directory. CUDA device code is
compiled for each arch at build time where TVM's CUDA runtime can load (a host with the CUDA driver);
elsewhere the artifact keeps CUDA source, compiled at load by NVRTC (cuda-bindings).
"""

from __future__ import annotations

import itertools
import json
import pathlib

import tvm

from . import compile as C
from . import targets

SPECIALIZATIONS = {
    "verify": list(itertools.product(range(5), (False, True))),  # folded sources, token check
    "write": list(itertools.product(range(5), (False, True))),  # folded sources, input assert
    "plan": list(itertools.product((False, True), (False, True))),  # LUT, expected-token pool
    "scatter": [()],
}


def build_all(tags: list[str], out_dir: str, kernels=tuple(SPECIALIZATIONS), progress=None) -> list[pathlib.Path]:
    """Compile and export every specialization of ``kernels`` for each tag; returns the files."""
    out = pathlib.Path(out_dir)
    jobs = [(tag, k, spec) for tag in tags for k in kernels for spec in SPECIALIZATIONS[k]]
    written = []
    for tag, kernel, spec in progress(jobs) if progress else jobs:
        geom = targets.geometry_for(kernel, tag)
        path = out / f"{C.module_key(kernel, spec, tag, geom)}.so"
        C.export(C.build(kernel, spec, tag, geom), path)
        written.append(path)
    manifest = dict(tvm_version=tvm.__version__, source_hash=C.source_hash(), tags=tags, modules=[p.name for p in written])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return written
