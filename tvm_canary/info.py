"""``tvm-canary info``: versions, devices, tuning databases and module folders this installation uses.

Shows the package, TVM, tvm-ffi and torch versions, the devices seen with their device keys and whether
each has a tuning database, every database (device key, records, folder) in lookup order, the kernel
cache folder and the ahead-of-time module folders (``$TVM_CANARY_MODULES``)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib

import torch

from .cliargs import summary
from .runtime import compile as C
from .tuning import keys, store


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("info", help="show versions, devices, tuning databases and module folders",
                              description=summary(__doc__))
    p.set_defaults(func=run)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _records(folder: pathlib.Path) -> str:
    """``N records`` and, where the TVM compiler can read the database, how many are usable (measured
    for the current kernels, on the folder's device, in the design space) and which kernels' records are
    stale; why none is if the database is unreadable or holds another device's records."""
    try:
        text = f"{len(store.record_lines(folder)):5} records"
    except OSError as e:  # also a damaged packed file (``store``)
        return f"unreadable: {e}"
    if not C.compiler_available():
        return text
    from .tuning.apply import in_design_space, measured_records, open_database, record_geometry

    stale: set = set()
    try:
        rows = measured_records(open_database(folder, folder.name), stale)
        usable = sum(in_design_space(*workload, record_geometry(record, cuda), cuda)
                     for workload, kept in rows.items() for _, record in kept
                     for cuda in [record.target.kind.name == "cuda"])
    except ValueError as e:
        return f"{text}, none usable: {str(e).removeprefix('kv-canary: ')}"
    text += f", {usable:4} usable"
    return text + (f" (stale, re-tune: {' '.join(sorted(stale))})" if stale else "")


def lines() -> list[str]:
    """The report, line by line."""
    import tvm

    package = pathlib.Path(__file__).resolve().parent
    compiler = "with compiler" if C.compiler_available() else "runtime only"
    out = [
        f"tvm_canary {_version('tvm_canary')} ({package}{', source checkout' if keys.source_checkout() else ''})",
        f"TVM {tvm.__version__} ({compiler}), tvm-ffi {_version('apache-tvm-ffi')}, torch {torch.__version__}",
    ]
    found = keys.databases()
    used: dict = {}
    for key, folder in found:
        used.setdefault(key, []).append(str(folder))
    devices = [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    out.append("devices:")
    for device in devices:
        key = keys.device_key(device)
        db = os.pathsep.join(used.get(key, [])) or "none (default geometries)"
        out.append(f"  {device!s:8} key {key:24} tuning database: {db}")
    if not C.tuning_enabled():
        why = "TVM_CANARY_TUNED=0" if os.environ.get("TVM_CANARY_TUNED") == "0" else "runtime-only TVM cannot read them"
        out.append(f"  (tuned geometries are not used: {why})")
    out.append("tuning databases (lookup order: $TVM_CANARY_TUNE_LOGS, user folder, committed; per workload the "
               "first selecting a measured geometry wins):")
    for key, folder in found:
        note = "" if used[key][0] == str(folder) else "  (for workloads none above selects a measured geometry for)"
        out.append(f"  {key:24} {_records(folder)}  {folder}{note}")
    if not found:
        out.append("  none")
    out.append(f"  searched: {os.pathsep.join(str(d) for d in keys.tune_logs_dirs())}")
    out.append(f"kernel cache: {C.cache_dir()}")
    modules = C.prebuilt_dirs()
    out.append(f"AOT module folders ($TVM_CANARY_MODULES): {os.pathsep.join(map(str, modules)) if modules else 'none'}")
    return out


def run(args: argparse.Namespace) -> int:
    print("\n".join(lines()))
    return 0
