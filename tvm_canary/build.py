"""``tvm-canary build``: ahead-of-time artifacts of every kernel specialization.

    tvm-canary build --target cuda --arch sm_90 [--arch sm_80 ...] -o DIR
    tvm-canary build --target llvm -o DIR

A host with only torch, apache-tvm-ffi and the TVM runtime loads them when ``TVM_CANARY_MODULES=DIR``.
CUDA device code is compiled for each arch at build time when TVM's CUDA runtime loads on the
building host (it needs the CUDA driver); otherwise the artifacts carry CUDA source, compiled by
NVRTC (cuda-bindings) when first loaded.
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

from .runtime.aot import SPECIALIZATIONS, build_all


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("build", help="write ahead-of-time compiled kernel modules", description=__doc__.splitlines()[0])
    p.add_argument("--target", choices=("cuda", "llvm"), required=True)
    p.add_argument("--arch", action="append", default=[], help="CUDA arch such as sm_90 (repeatable; cuda only)")
    p.add_argument("--kernels", nargs="+", choices=sorted(SPECIALIZATIONS), default=sorted(SPECIALIZATIONS))
    p.add_argument("-o", "--out", required=True, help="output directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.target == "cuda":
        if not args.arch:
            raise SystemExit("tvm-canary build: --target cuda needs at least one --arch (e.g. sm_90)")
        tags = [f"cuda-{arch}" for arch in args.arch]
        try:
            from .runtime.compile import ensure_cuda_runtime

            ensure_cuda_runtime()
        except RuntimeError as e:
            print(f"note: {e}; artifacts will carry CUDA source compiled by NVRTC at load")
    else:
        tags = ["llvm"]
    files = build_all(tags, args.out, kernels=tuple(args.kernels), progress=lambda jobs: tqdm(jobs, desc="build"))
    print(f"wrote {len(files)} modules and manifest.json to {args.out}")
    return 0
