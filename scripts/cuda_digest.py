"""Dump the generated source of every kernel specialization and compare two dumps by sha256.

Check that a TensorIR refactor leaves the generated code unchanged by dumping before and after it::

    python scripts/cuda_digest.py /tmp/before            # CUDA source per specialization (sm_90)
    ... change the kernels ...
    python scripts/cuda_digest.py /tmp/after --against /tmp/before

Each specialization (``runtime.specializations.all_specs``) is built with each default geometry of its
target (``runtime.targets.distinct_defaults`` of its launch mode; a size class's is dumped as
``<kernel>-<spec>-mode<m>-from<size>``), as ``tvm-canary build`` builds it; no GPU is needed.
``--llvm`` dumps the LLVM IR of the CPU builds instead; its digest leaves out the metadata lines
(``!N = ...``), which hold source line numbers and per-process pointer names, and reads every
metadata reference (``!dbg !450``, ``!tbaa !451``) as ``!N`` (a statement moving to another source
line adds or drops a debug location node, renumbering every node after it): instructions only.

The folder gets one source file per specialization and ``digests.json`` (name -> sha256); with
``--against`` the exit status is 1 when any digest differs or a specialization is missing from either
side (``--kernel`` limits both).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import sys

from tvm_canary.cliargs import Parser, output_folder
from tvm_canary.runtime import compile as C
from tvm_canary.runtime import targets
from tvm_canary.runtime.specializations import KERNELS, all_specs, launch_mode, spec_id


def generated_source(kernel: str, spec: tuple, tag: str, geom) -> str:
    """The device source (CUDA tags) or the LLVM IR (``llvm``) of one specialization."""
    ex = C.build(kernel, spec, tag, geom)
    if tag == "llvm":
        return ex.mod.inspect_source("ll")
    return ex.mod.imports[0].inspect_source("cuda")


def dump(out: pathlib.Path, tag: str, kernels: list[str]) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    suffix = "ll" if tag == "llvm" else "cu"
    digests = {}
    for kernel in kernels:
        for spec in all_specs(kernel):
            for name, geom in default_builds(kernel, spec, tag):
                digests[name] = dump_one(out / f"{name}.{suffix}", kernel, spec, tag, geom)
                print(f"{name}: {digests[name]}", flush=True)
    (out / "digests.json").write_text(json.dumps({"tag": tag, "digests": digests}, indent=1))
    return digests


def default_builds(kernel: str, spec: tuple, tag: str) -> list:
    """(name, geometry) of each distinct default geometry a launch of ``spec`` on ``tag`` can use."""
    builds = []
    for mode, at_least, geom in targets.distinct_defaults(kernel, tag, [launch_mode(kernel, spec)]):
        size = "" if at_least is None else f"-from{targets.size_label(at_least)}"
        suffix = "" if not builds else f"-mode{mode}{size}"
        builds.append((f"{kernel}-{spec_id(spec)}{suffix}", geom))
    return builds


def dump_one(path: pathlib.Path, kernel: str, spec: tuple, tag: str, geom) -> str:
    """Write one build's source to ``path``; returns its digest."""
    source = generated_source(kernel, spec, tag, geom)
    path.write_text(source)
    if tag == "llvm":
        source = "".join(line for line in source.splitlines(keepends=True) if not line.startswith("!"))
        source = re.sub(r"!\d+", "!N", source)
    return hashlib.sha256(source.encode()).hexdigest()


def compare(mine: dict[str, str], theirs: dict[str, str]) -> int:
    """Print one line per specialization; returns the number that differ or are missing."""
    bad = 0
    for name in sorted(set(mine) | set(theirs)):
        same = mine.get(name) is not None and mine.get(name) == theirs.get(name)
        bad += not same
        print(f"{'identical' if same else 'DIFFERENT'}  {name}")
    return bad


def main(argv: list[str]) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=output_folder, help="folder for the sources and digests.json")
    parser.add_argument("--arch", help="CUDA arch of the build (default sm_90; not with --llvm)")
    parser.add_argument("--llvm", action="store_true", help="dump the CPU builds' LLVM IR instead of CUDA")
    parser.add_argument("--against", type=pathlib.Path, help="an earlier dump to compare with")
    parser.add_argument("--kernel", action="append", choices=KERNELS,
                        help="only this kernel (repeatable; default: all)")
    args = parser.parse_args(argv)
    if args.llvm and args.arch:
        parser.error("kv-canary: --arch is for the CUDA builds, not with --llvm")
    tag = "llvm" if args.llvm else f"cuda-{args.arch or 'sm_90'}"
    if args.against is not None:
        try:
            theirs = json.loads((args.against / "digests.json").read_text())
        except (OSError, ValueError) as e:
            parser.error(f"--against: cannot read {args.against / 'digests.json'}: {getattr(e, 'strerror', None) or e}")
        if theirs["tag"] != tag:
            parser.error(f"{args.against} holds a {theirs['tag']} dump, not {tag}")
    kernels = args.kernel or list(KERNELS)
    mine = dump(args.out, tag, kernels)
    if args.against is None:
        return 0
    theirs = {k: v for k, v in theirs["digests"].items() if k.split("-")[0] in kernels}
    bad = compare(mine, theirs)
    print(f"{len(mine) - bad if bad <= len(mine) else 0} identical, {bad} different or missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
