"""Re-stamp a tuning database's workloads with the current kernel hashes.

    python -m tvm_canary.tuning.restamp tune_logs/<device key> [...]

Only for a kernel change that provably keeps the generated code identical (e.g. ``scripts/cuda_digest.py``
before and after) but changes the kernel hash (``workloads.kernel_hash``); any other change needs a
re-tune, which ignoring the old records forces. The hash also carries the kernel's tuning case version
(``workloads.CASE_VERSIONS``): records timed on an earlier case are stale for a reason the code cannot
show, so never re-stamp across a case change: re-tune. A folder holding a workload stamped with the
current code on an earlier case (``workloads.earlier_case_hashes``) is refused; one stamped with older
code on an earlier case cannot be told from older code on the current case (the hash mixes both), so
that mistake is not caught. Each workload entry of ``database_workload.json`` is regenerated from
``workloads.descriptor`` (carrying the current hash) in the same order, so
``database_tuning_record.json``, whose records refer to workloads by position, stays byte-identical;
the table is written compact (``merge.compact_entry``). The target kind comes from the records.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from . import store
from .apply import open_database
from .merge import compact_entry, write_workload_table


def restamp(work_dir: pathlib.Path) -> int:
    """Rewrite ``work_dir``'s workload table with the current kernel hashes; returns the entries."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from .workloads import bucket_of, descriptor, earlier_case_hashes

    records = [json.loads(line) for line in (work_dir / "database_tuning_record.json").read_text().splitlines()
               if line.strip()]
    kinds = {record[1][2]["kind"] for record in records}
    if len(kinds) != 1:
        raise SystemExit(f"kv-canary: {work_dir} has records for target kinds {sorted(kinds)}; expected one")
    (kind,) = kinds
    table = work_dir / "database_workload.json"
    entries = []
    for line in table.read_text().splitlines():
        func = ms.database.Workload.from_json(json.loads(line)).mod["main"]
        kernel, bucket = str(func.attrs["canary.kernel"]), bucket_of(func)
        if str(func.attrs["canary.kernel_hash"]) in earlier_case_hashes(kernel, bucket, kind):
            raise SystemExit(f"kv-canary: {work_dir} holds records of {kernel} {bucket} timed on an earlier tuning "
                             "case (workloads.CASE_VERSIONS); they cannot be re-stamped: re-tune it "
                             "(tvm-canary tune --stale-only)")
        mod = tvm.IRModule({"main": descriptor(kernel, bucket, kind)})
        shash, encoded = ms.database.Workload(mod).as_json()
        entries.append(compact_entry(str(shash), str(encoded)))
    return write_workload_table(work_dir, entries)


def main(argv: list[str] | None = None) -> int:
    """Re-stamp each database folder named in ``argv`` (default: the process arguments); ``--help`` prints this module's
    docstring. A name not a folder is a usage error (exit status 2), a folder whose database is unreadable or not of its
    device key's target an error (status 1): either way nothing is re-stamped."""
    parser = argparse.ArgumentParser(prog="python -m tvm_canary.tuning.restamp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=pathlib.Path, metavar="FOLDER",
                        help="a database folder, tune_logs/<device key>")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder")
    for folder in args.folders:
        try:
            open_database(folder, folder.resolve().name)
        except ValueError as e:
            parser.exit(1, f"{e}\n")
    for folder in args.folders:
        with store.editable(folder):
            print(f"{folder}: {restamp(folder)} workloads re-stamped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
