"""``tvm-canary build``: ahead-of-time artifacts of every kernel specialization.

    tvm-canary build --target cuda --arch sm_90 [--arch sm_80 ...] -o DIR [--jobs N]
    tvm-canary build --target llvm -o DIR [--jobs N]

Each specialization is built in its default geometries (each launch mode's, each size class's) and in every geometry the
target's tuning databases select (by default ``default_tuning_keys``'s), so a host loading with those databases compiles
nothing. Loading (``TVM_CANARY_MODULES=DIR``, TVM runtime only) and CUDA device code: ``runtime.aot``.
"""

from __future__ import annotations

import argparse

import torch
from tqdm import tqdm

from .cliargs import UsageError, cuda_arch, int_at_least, output_folder, require_compiler, summary, writable_folder
from .console import counted
from .runtime import compile as C
from .runtime.aot import build_all
from .runtime.specializations import KERNELS
from .tuning import keys


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("build", help="write ahead-of-time compiled kernel modules",
                              description=summary(__doc__))
    p.add_argument("--target", choices=("cuda", "llvm"), required=True, help="cuda: GPU code per --arch; llvm: the CPU")
    p.add_argument("--arch", type=cuda_arch, action="append", default=[],
                   help="CUDA arch such as sm_90 (repeatable; cuda only)")
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS), help="kernels to build")
    p.add_argument("--tuning", action="append", default=None, metavar="DEVICE_KEY",
                   help="also build the geometries of this device key's tuning database (repeatable); default: the "
                        "databases found for the target (see `tvm-canary info`); `--tuning none` builds defaults only")
    p.add_argument("-o", "--out", type=output_folder, required=True, help="output directory")
    p.add_argument("--jobs", type=int_at_least(1), default=C.usable_cpus(),
                   help="processes compiling modules side by side (default: one per CPU this process may use)")
    p.set_defaults(func=run)


def default_tuning_keys(tag: str) -> list[str]:
    """The device keys whose databases a build for ``tag`` covers by default: for ``cuda-sm_XX`` every
    database key ending in ``-sm_XX``; for ``llvm`` this CPU's key (if it has a database)."""
    if not C.tuning_enabled():
        return []
    found = dict(keys.databases())
    if tag == "llvm":
        key = keys.device_key(torch.device("cpu"))
        return [key] if key in found else []
    arch = tag.split("-", 1)[1]
    return [key for key in found if key.endswith(f"-{arch}")]


def run(args: argparse.Namespace) -> int:
    require_compiler("build")
    if args.target == "cuda":
        if not args.arch:
            raise UsageError("--target cuda needs at least one --arch (e.g. sm_90)")
        specific = [arch for arch in args.arch if not arch[-1].isdigit()]  # sm_90a, sm_100f
        if specific:
            raise UsageError(f"--arch {specific[0]}: a GPU loads the modules of its compute capability "
                             f"({specific[0][:-1]}), never {specific[0]}'s")
        tags = [f"cuda-{arch}" for arch in dict.fromkeys(args.arch)]
    elif args.arch:
        raise UsageError("--arch is for --target cuda")
    else:
        tags = ["llvm"]
    if args.tuning is None:
        tuning = sorted({key for tag in tags for key in default_tuning_keys(tag)})
    else:
        tuning = [key for key in dict.fromkeys(args.tuning) if key != "none"]
    missing = [key for key in tuning if not keys.database_dirs(key)]
    if missing:
        raise UsageError(f"no tuning database for {', '.join(missing)} (`tvm-canary info` lists them)")
    foreign = [key for key in tuning if "-".join(filter(None, keys.expected_target(key))) not in tags]
    if foreign:
        raise UsageError(f"kv-canary: --tuning {', '.join(foreign)}: not a database of {', '.join(tags)} "
                         "(a database applies only to its own device)")
    writable_folder(args.out)
    if args.target == "cuda":
        try:
            C.ensure_cuda_runtime()
        except RuntimeError as e:
            print(f"note: {e}; artifacts will carry CUDA source compiled by NVRTC at load")
    print(f"geometries: defaults + tuning databases {', '.join(tuning)}" if tuning
          else "geometries: defaults (no tuning database)")
    files = build_all(tags, args.out, kernels=tuple(dict.fromkeys(args.kernels)), tuning_keys=tuple(tuning),
                      progress=lambda builds, total: tqdm(builds, total=total, desc="build"), workers=args.jobs)
    print(f"wrote {counted(len(files), 'module')} and manifest.json to {args.out}")
    return 0
