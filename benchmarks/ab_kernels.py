"""Versions of the verify and write kernels timed against each other in one process (CUDA GPU).

    python3 benchmarks/ab_kernels.py --base REV [--variant NAME:KERNEL:MODE:FIELD=VALUE[,FIELD=VALUE...][:SCOPE]]...
        [--package NAME=FOLDER]... [--kernels verify write] [--modes NONE PARTIAL ALL] [--write-shapes RxT[cC] ...]
        [--verify-sizes N ...] [--floor-grids G ...] [--kv-bytes B] [--quick] [--json OUT.json]

Arms: ``base``, the package at git revision REV (``git archive``), or in the folder REV if it holds a ``tvm_canary``
package (a GPU host without the repository's history: ``git archive REV tvm_canary | tar x -C FOLDER`` where the
history is); ``head``, the working tree's; each ``--variant``, head's package with one launch mode's default
geometry changed (e.g. ``m4:verify:ALL:min_blocks=4``; modes NONE, PARTIAL, ALL): at every size of the mode, or with
SCOPE ``below`` only below the mode's first size class (``schedules.CUDA_SIZE_DEFAULTS``), with ``class`` only from
it on (its other rows then build head's geometry, an A/A of the variant's); and each ``--package``, the package in
FOLDER (as ``--base`` takes one: a changed copy of the kernels, e.g. an ablation). Every arm uses default geometries
(``runtime.targets.default_geometry``, of each row's mode and size: one build per size class of its package's
``schedules.CUDA_SIZE_DEFAULTS``; no tuning database), so the comparison is of the kernel code and defaults.
TVMScript reads a kernel's macros from its package's files, so two versions cannot be built in one process: each arm
is built in a child process from a copy of its package and exported; this process loads the modules and times them
interleaved (``timing.interleaved_us``: 6 rounds, verify 15 replays of 4 plans, write 7; medians) in CUDA graphs, on
``bench_kernels.py``'s inputs (a 2^25-slot pool, or 2^22 with ``--quick``, chains stamped by head's write), verify
beside two floors of one grid (2112 x 32, ``floors.gather``: ``fl-gather``, and ``fl-ordered``, which hashes as SPEC
1 requires, folding the sources one after another, and appends in order; the benchmark also times the order folding
them together), and the gather in each of ``--floor-grids`` (``BLOCKSxTHREADS[mMIN_BLOCKS]``, e.g. ``2112x512m2``, a
grid of ``floors.BOUNDED_GATHER_GRIDS``: ``fl-LABEL``, one lane an entry, and with two sources ``fl-split-LABEL``,
two lanes). The benchmark's floors are the fastest of several grids and orders, so a ratio to these is at most the
benchmark's. Checked before a row is reported (a failing row says so): no verify launch of any arm flagged a
violation, every write arm stamped base's bytes.
Write's rows are ``bench_kernels.WRITE_SHAPES`` (requests x tokens per request), or ``--write-shapes`` (e.g. ``256x4
128x16 128x22 128x23``: the size classes' boundary and shapes between the benchmark's, which it does not time);
``RxTcC`` puts the R requests in a plan of capacity C > R, the rest empty and invalid, as in a CUDA graph captured
at capacity C and replayed with R requests (the grid follows the capacity, the lane mapping the valid requests).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
MODE_NUMBERS = {"NONE": 0, "PARTIAL": 1, "ALL": 2}  # RealKvHashMode: a launch's tuning mode
KERNELS = ("verify", "write")


def launch_builds(row_words: int) -> dict:
    """What each kernel launch of the benchmark compiles, on token rows of ``row_words`` words per source: {kernel:
    {mode: (kernel, specialization axis values by name, mode number)}} for NONE, PARTIAL, ALL; ALL builds in the rows'
    word count where head's kernels have one for it (``specializations.fold_words``), as the benchmark's launches do. By
    name: each arm's child builds its own package's tuple (``specializations.AXES``), leaving out an axis an older
    package lacks (``partial``, ``fold_words``)."""
    from tvm_canary.runtime.specializations import fold_words

    return {kernel: {mode: (kernel, {"num_sources": 0 if mode == "NONE" else 2, "partial": mode == "PARTIAL",
                                     "check_token": False, "input_assert": False,
                                     "fold_words": fold_words(2, False, [row_words] * 2) if mode == "ALL" else 0},
                            number)
                     for mode, number in MODE_NUMBERS.items()}
            for kernel in KERNELS}
FLOOR_GRID = (2112, 32)
ROUNDS = 6

# Run in a child process whose working directory holds the arm's package copy: builds the arm's kernels
# (JSON: {stem: [kernel, axis values, mode, workload points, [geometry overrides, scope]]}): for each
# point the arm's default of that mode and size (packages before size classes: of the mode), overridden
# where the point is in the overrides' scope (``parse_variant``); each distinct geometry built once and
# exported as <stem>-<geometry key>.so. Its last line is the JSON {stem: {point (JSON): geometry key}}.
CHILD = """
import dataclasses, inspect, json, pathlib, sys
import tvm_canary
assert tvm_canary.__file__.startswith(sys.argv[2]), tvm_canary.__file__
from tvm_canary.runtime import compile as C, specializations, targets
sized = "size" in inspect.signature(targets.default_geometry).parameters
chosen = {}
for stem, (kernel, spec, mode, points, (overrides, scope)) in json.loads(sys.argv[3]).items():
    spec = tuple(type(allowed[0])(spec[name]) for name, allowed in specializations.AXES[kernel])
    chosen[stem] = {}
    for point in points:
        size = tuple(point) if isinstance(point, list) else point
        geom = targets.default_geometry(kernel, sys.argv[1], mode, *([size] if sized else []))
        if scope is None or (scope == "class") == (targets.size_class(kernel, sys.argv[1], mode, size) > 0):
            geom = dataclasses.replace(geom, **overrides)
        path = pathlib.Path(sys.argv[2]) / f"{stem}-{geom.key()}.so"
        if not path.exists():
            C.export(C.build(kernel, spec, sys.argv[1], geom), path)
            print(stem, geom.key(), flush=True)
        chosen[stem][json.dumps(point)] = geom.key()
print(json.dumps(chosen))
"""


@dataclasses.dataclass(frozen=True)
class Arm:
    """A version of the kernels: its package folder and per (kernel, mode) geometry overrides (``{field:
    value}``, and ``parse_variant``'s scope); an arm without overrides (base, head, a ``--package``)
    builds every timed kernel and mode, a variant only those it overrides."""

    name: str
    package: pathlib.Path
    overrides: dict


def arm_name(name: str) -> bool:
    """Whether ``name`` can name a ``--variant`` or ``--package`` arm: letters, digits and _, not base or head."""
    return bool(re.fullmatch(r"[A-Za-z0-9_]+", name)) and name not in ("base", "head")


def holds_package(folder: str | pathlib.Path) -> bool:
    """Whether ``folder`` holds a ``tvm_canary`` package (an arm's source, as ``--base`` or ``--package``)."""
    return (pathlib.Path(folder) / "tvm_canary" / "__init__.py").is_file()


def parse_variant(text: str) -> tuple[str, tuple[str, str], tuple[dict, str | None]]:
    """``NAME:KERNEL:MODE:FIELD=VALUE[,FIELD=VALUE...][:SCOPE]`` -> (name, (kernel, mode), ({field: int},
    scope)): scope None (every size), ``below`` or ``class`` (the mode's size classes, which it must have)."""
    from tvm_canary.geometry import Geometry
    from tvm_canary.schedules import CUDA_SIZE_DEFAULTS

    try:
        name, kernel, mode, fields, *scope = text.split(":")
        values = {f: int(v) for f, v in (item.split("=") for item in fields.split(","))}
        (scope,) = scope or [None]
    except ValueError:
        raise ValueError(f"--variant {text!r}: expected "
                         "NAME:KERNEL:MODE:FIELD=VALUE[,FIELD=VALUE...][:SCOPE]") from None
    if kernel not in KERNELS or mode not in MODE_NUMBERS or not arm_name(name):
        raise ValueError(f"--variant {text!r}: kernel verify or write, mode NONE, PARTIAL or ALL, a name of letters, "
                         "digits and _ other than base, head")
    unknown = set(values) - {f.name for f in dataclasses.fields(Geometry)} - {"gpu"}
    if unknown:
        raise ValueError(f"--variant {text!r}: {sorted(unknown)} are not Geometry fields")
    if scope is not None and (scope not in ("below", "class")
                              or (kernel, MODE_NUMBERS[mode]) not in CUDA_SIZE_DEFAULTS):
        raise ValueError(f"--variant {text!r}: SCOPE is below or class, of a mode with a size class")
    return name, (kernel, mode), (values, scope)


def parse_write_shape(text: str) -> tuple[int, int, int]:
    """``--write-shapes``' ``REQUESTSxTOKENS[cCAPACITY]`` (tokens per request; the plan's request capacity,
    at least REQUESTS, default REQUESTS) -> (requests, tokens, capacity), all positive."""
    match = re.fullmatch(r"([1-9][0-9]*)x([1-9][0-9]*)(?:c([1-9][0-9]*))?", text)
    if not match or (match.group(3) and int(match.group(3)) < int(match.group(1))):
        raise ValueError(f"--write-shapes {text!r}: expected REQUESTSxTOKENS[cCAPACITY], e.g. 256x4 or 8x16c256 "
                         "(positive numbers, capacity at least the requests)")
    requests, tokens = int(match.group(1)), int(match.group(2))
    return requests, tokens, int(match.group(3) or requests)


def parse_floor_grid(text: str):
    """``--floor-grids``' ``BLOCKSxTHREADS[mMIN_BLOCKS]`` (THREADS a multiple of 32, as the split form's
    lane pairs need, up to 1024) -> the CUDA Geometry the gather floor is built in (``floors.gather`` declares
    ``__launch_bounds__(THREADS, MIN_BLOCKS)`` when MIN_BLOCKS > 1)."""
    from tvm_canary.geometry import Geometry

    match = re.fullmatch(r"([1-9][0-9]*)x([1-9][0-9]*)(?:m([1-9][0-9]*))?", text)
    if not match or int(match.group(2)) % 32 or int(match.group(2)) > 1024:
        raise ValueError(f"--floor-grids {text!r}: expected BLOCKSxTHREADS[mMIN_BLOCKS], THREADS a multiple of 32 "
                         "up to 1024 (CUDA's most a block), e.g. 2112x512m2")
    return Geometry(gpu=True, blocks=int(match.group(1)), threads=int(match.group(2)),
                    min_blocks=int(match.group(3) or 1))


def point_key(point) -> str:
    """A launch's workload point (``KernelCall.size``: an int, or write's tuple) as the child's JSON key."""
    return json.dumps(list(point) if isinstance(point, tuple) else point)


def parse_package(text: str) -> tuple[str, pathlib.Path]:
    """``--package NAME=FOLDER`` -> (name, folder): FOLDER holds a ``tvm_canary`` package."""
    name, _, folder = text.partition("=")
    if not arm_name(name) or not holds_package(folder):
        raise ValueError(f"--package {text!r}: expected NAME=FOLDER, a name of letters, digits and _ "
                         "other than base, head, and a folder holding a tvm_canary package")
    return name, pathlib.Path(folder)


def resolve_base(text: str) -> pathlib.Path | str:
    """``--base``: a folder holding a ``tvm_canary`` package (its path), else a git revision of this
    repository (the revision, checked)."""
    if holds_package(text):
        return pathlib.Path(text)
    check = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}"],
                           capture_output=True, check=False)
    if check.returncode != 0:
        raise ValueError(f"--base {text!r}: neither a folder holding a tvm_canary package nor a git revision of {ROOT}")
    return text


def build_arms(arms: list[Arm], kernels, modes, tag: str, work: pathlib.Path, points: dict,
               builds: dict) -> tuple[dict, dict]:
    """({(arm, kernel, mode, point key): the exported function}, {(arm, kernel, mode, point key): its
    geometry key}) for the workload points ``points[kernel]`` of the rows (``point_key``) in launch
    modes ``modes``, each arm's default geometry of a row's mode and size, of the specializations
    ``builds`` (``launch_builds``); each arm built in its own child process, all at once."""
    import tvm

    children = {}
    for arm in arms:
        folder = work / arm.name
        shutil.copytree(arm.package, folder / "tvm_canary", ignore=shutil.ignore_patterns("__pycache__"))
        wanted = {(k, m) for k in kernels for m in modes if not arm.overrides or (k, m) in arm.overrides}
        jobs = {f"{k}-{m}": [*builds[k][m], [list(p) if isinstance(p, tuple) else p for p in points[k]],
                             arm.overrides.get((k, m), ({}, None))] for k, m in sorted(wanted)}
        # The copy first: the rest of PYTHONPATH is how a GPU host finds TVM (scripts/gpu-env.sh).
        path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path, TVM_CANARY_CACHE=str(folder / "cache"), TVM_CANARY_TUNE_LOGS="none")
        children[arm.name] = subprocess.Popen([sys.executable, "-c", CHILD, tag, str(folder), json.dumps(jobs)],
                                              cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True)
    functions, geometries = {}, {}
    for name, child in children.items():
        out, _ = child.communicate()
        if child.returncode != 0:
            for other in children.values():
                other.kill()
            raise RuntimeError(f"building arm {name} failed:\n{out[-3000:]}")
        *log, chosen = out.strip().splitlines()
        for stem, by_point in json.loads(chosen).items():
            kernel, mode = stem.split("-")
            for point, key in by_point.items():
                path = work / name / f"{stem}-{key}.so"
                functions[(name, kernel, mode, point)] = tvm.runtime.load_module(str(path))[f"canary_{kernel}"]
                geometries[(name, kernel, mode, point)] = key
        print("\n".join(log), flush=True)
    return functions, geometries


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True,
                    help="the base arm: a git revision (e.g. HEAD, a commit), or a folder holding a tvm_canary package")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:KERNEL:MODE:FIELD=VALUE[,...][:SCOPE], e.g. m4:verify:ALL:min_blocks=4 or "
                         "t32:verify:PARTIAL:threads=32:below (SCOPE: below or in the mode's size class; "
                         "default every size)")
    ap.add_argument("--package", action="append", default=[], metavar="NAME=FOLDER",
                    help="one more arm: the tvm_canary package in FOLDER (a changed copy of the kernels), every row")
    ap.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    ap.add_argument("--modes", nargs="+", choices=tuple(MODE_NUMBERS), default=list(MODE_NUMBERS),
                    help="the launch modes whose rows are timed (default: all)")
    ap.add_argument("--write-shapes", nargs="+", metavar="RxT[cC]",
                    help="write's rows, requests x tokens per request [in a plan of capacity C] "
                         "(default: the benchmark's, bench_kernels.WRITE_SHAPES)")
    ap.add_argument("--verify-sizes", nargs="+", type=int, metavar="N",
                    help="verify's rows, entries per plan, each at most the largest of bench_kernels.VERIFY_SIZES "
                         "(e.g. a size class's bound, which the benchmark does not time; default: all of them)")
    ap.add_argument("--floor-grids", nargs="+", default=[], metavar="G",
                    help="verify's gather floor also in these grids, BLOCKSxTHREADS[mMIN_BLOCKS] (e.g. 2112x512m2: "
                         "declared __launch_bounds__(512, 2)), one lane an entry and split")
    ap.add_argument("--kv-bytes", type=int, metavar="B",
                    help="bytes per token of each of the pool's two sources (default bench_kernels.KV_BYTES, 256; "
                         "a multiple of 8): ALL folds B / 8 words per source")
    ap.add_argument("--quick", action="store_true", help="a smaller pool and sizes (smoke run)")
    ap.add_argument("--json", help="write the rows and the run's environment here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from bench_kernels import VERIFY_SIZES, WRITE_SHAPES, fail

    try:
        variants = [parse_variant(v) for v in args.variant]
        packages = [parse_package(p) for p in args.package]
        package_names = [name for name, _ in packages]
        if len(set(package_names)) != len(package_names) or set(package_names) & {name for name, _, _ in variants}:
            raise ValueError("each --package needs a name of its own (no other --package or --variant has it)")
        for name, (kernel, mode), _ in variants:
            if kernel not in args.kernels or mode not in args.modes:
                raise ValueError(f"--variant {name}: {kernel} {mode} is not timed (--kernels {' '.join(args.kernels)}, "
                                 f"--modes {' '.join(args.modes)})")
        known_sizes = VERIFY_SIZES["quick" if args.quick else "full"]
        if any(not 1 <= n <= max(known_sizes) for n in args.verify_sizes or ()):
            raise ValueError(f"--verify-sizes: each from 1 to {max(known_sizes)} (the benchmark's largest size)")
        if args.kv_bytes is not None and (args.kv_bytes < 16 or args.kv_bytes % 8):
            raise ValueError(f"--kv-bytes {args.kv_bytes}: a multiple of 8, at least 16")
        write_shapes = ([parse_write_shape(t) for t in args.write_shapes] if args.write_shapes
                        else [(reqs, length, reqs) for reqs, length in WRITE_SHAPES])
        floor_grids = [parse_floor_grid(text) for text in args.floor_grids]
        base = resolve_base(args.base)
    except ValueError as e:
        return fail(str(e))
    if not torch.cuda.is_available():
        return fail("ab_kernels.py needs a CUDA GPU and torch sees none; run it on a GPU host")
    import bench_kernels as B
    import floors

    if args.kv_bytes is not None:
        B.KV_BYTES = args.kv_bytes  # the pool's rows, the ALL folds' word count and the floors' (module global)

    from tvm_canary.geometry import Geometry
    from tvm_canary.runtime import packing
    from tvm_canary.timing import interleaved_us

    with tempfile.TemporaryDirectory(prefix="ab-kernels-") as tmp:
        work = pathlib.Path(tmp)
        if isinstance(base, str):  # a revision: its package, extracted
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", base, "tvm_canary"], capture_output=True,
                                     check=True)
            base = work / "base-src"
            base.mkdir()
            subprocess.run(["tar", "x", "-C", str(base)], input=archive.stdout, check=True)
        named: dict = {}
        for name, key, values in variants:
            named.setdefault(name, {})[key] = values
        arms = [Arm("base", base / "tvm_canary", {}), Arm("head", ROOT / "tvm_canary", {})]
        arms += [Arm(name, folder / "tvm_canary", {}) for name, folder in packages]
        arms += [Arm(name, ROOT / "tvm_canary", overrides) for name, overrides in named.items()]
        launchers = B.Launchers()
        sizes = sorted(set(args.verify_sizes or known_sizes))
        points = {"verify": list(sizes),  # KernelCall.size of the rows
                  "write": [packing.write_point(capacity, reqs * length) for reqs, length, capacity in write_shapes]}
        try:
            functions, geometries = build_arms(arms, args.kernels, args.modes, launchers.tag, work, points,
                                               launch_builds(B.KV_BYTES // 8))
        except RuntimeError as e:
            return fail(str(e))

        arch = launchers.tag.split("-", 1)[1]
        grid = Geometry(gpu=True, blocks=FLOOR_GRID[0], threads=FLOOR_GRID[1])
        floor_fns = ({mode: {"fl-gather": floors.compile_cuda(floors.gather(grid, B.fold_words(mode), False, n), arch),
                             "fl-ordered": floors.compile_cuda(floors.gather(grid, B.fold_words(mode), False, n,
                                                                             hashing=True, ticket=True,
                                                                             fold_order="in turn"), arch)}
                      | {f"fl-{'split-' if order else ''}{B.geometry_label(geom)}":  # memory forms: one lane, split
                         floors.compile_cuda(floors.gather(geom, B.fold_words(mode), False, n,
                                                           fold_order=order or "together"), arch)
                         for geom in floor_grids for order in B.memory_floors(mode, "gather").values()}
                      for mode, n in (("NONE", 0), ("PARTIAL", 2), ("ALL", 2)) if mode in args.modes}
                     if "verify" in args.kernels else {})
        pool = B.Pool(B.POOL_SLOTS["quick" if args.quick else "full"])
        words = pool.canary.view(torch.int64)

        class Stamper:  # bench_kernels.stamp_chains' bench: head's write, default geometry
            warn = staticmethod(print)

            @staticmethod
            def ours(kernel, choice):
                return launchers.launch(kernel, choice)

        rows = []

        def time_row(kernel, mode, case, calls, extra_arms, check):
            key = (kernel, mode, point_key(calls[0].size))
            arms_calls = {arm.name: [lambda c=c, f=functions[(arm.name, *key)]: f(*c.args) for c in calls]
                          for arm in arms if (arm.name, *key) in functions}
            arms_calls.update(extra_arms)
            times = interleaved_us(arms_calls, iters=15 if kernel == "verify" else 7, rounds=ROUNDS)
            row = {"kernel": kernel, "case": case, "us": {k: statistics.median(v) for k, v in times.items()},
                   "rounds": times, "problem": check(),
                   "geometries": {arm.name: geometries[(arm.name, *key)] for arm in arms
                                  if (arm.name, *key) in geometries}}
            rows.append(row)
            print(case, {k: round(v, 2) for k, v in row["us"].items()}, row["problem"] or "", flush=True)

        def flagged():
            count = pool.flagged()
            return f"{count} violation rows recorded (the launches must be clean)" if count else None

        for mode in args.modes if "verify" in args.kernels else ():
            for order in B.ORDERS:
                slots_2d, _ = B.stamp_chains(Stamper, pool, mode, order)
                context = pool.context(mode)
                for n in sizes:
                    plans = B.verify_plans(slots_2d, n, order, 4)
                    calls = [launchers.call("verify", {"context": context, "plan": p,
                                                       "check_verify_expected_token": False})
                             for p in plans]
                    extra = {name: [lambda c=c, f=f: f(words, *c.args[1:6], pool.kv, pool.counters, pool.floor_flags,
                                                       pool.floor_counter) for c in calls]
                             for name, f in floor_fns[mode].items()}
                    time_row("verify", mode, f"verify {mode} {order} {n}", calls, extra, flagged)
        for reqs, length, capacity in write_shapes if "write" in args.kernels else ():
            for mode in args.modes:
                sets = [B.write_args(pool, mode, (torch.randperm(pool.slots - 1, device=B.DEV)[: reqs * length] + 1)
                                     .view(reqs, length),
                                     torch.randint(0, 150000, (reqs, length), device=B.DEV), capacity)
                        for _ in range(4)]
                calls = [launchers.call("write", a) for a in sets]
                slots = torch.cat([a["out_cache_loc"] for a in sets])

                def stamped_differently(calls=calls, slots=slots, mode=mode):
                    stamped = {}
                    key = ("write", mode, point_key(calls[0].size))
                    for arm in arms:
                        if (arm.name, *key) in functions:
                            pool.canary[slots] = 0
                            for c in calls:
                                functions[(arm.name, *key)](*c.args)
                            stamped[arm.name] = pool.canary[slots].clone()
                    differ = [name for name, t in stamped.items() if not torch.equal(t, stamped["base"])]
                    return f"stamped bytes differ from base: {differ}" if differ else None

                problem = stamped_differently()
                shape = f"{reqs}x{length}" + (f"c{capacity}" if capacity != reqs else "")
                time_row("write", mode, f"write {mode} {shape}", calls, {}, lambda problem=problem: problem)

    names = [arm.name for arm in arms] + list(dict.fromkeys(name for fns in floor_fns.values() for name in fns))
    width = max(11, *(len(n) + 1 for n in names))
    print(f"\n{'case':28}" + "".join(f"{n:>{width}}" for n in names) + f"{'head/base':>10}")
    for r in rows:
        print(f"{r['case']:28}" + "".join(f"{r['us'].get(n, float('nan')):{width}.2f}" for n in names)
              + f"{r['us']['head'] / r['us']['base']:10.3f}" + (f"  {r['problem']}" if r["problem"] else ""))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"env": B.environment(), "base": args.base,
                                                       "variants": args.variant, "packages": args.package,
                                                       "modes": args.modes, "write_shapes": write_shapes,
                                                       "floor_grid": FLOOR_GRID, "floor_grids": args.floor_grids,
                                                       "rounds": ROUNDS,
                                                       "rows": rows}, indent=1))
    return 1 if any(r["problem"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
