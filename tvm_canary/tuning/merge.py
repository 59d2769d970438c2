"""``tvm-canary tune-merge``: merge databases tuned on several hosts of one device model into one.

    tvm-canary tune-merge DIR... --out tune_logs/<device key>

Load applies a database only to the device key naming its folder (``keys.database_dirs``), so every
input folder must carry the output's device key and hold records for that key's target (``...-sm_XY``:
CUDA ``sm_XY``; a CPU key: llvm); anything else is refused before anything is written. The output (its
earlier records included) gets, per workload, the fastest of the inputs' chosen records
(``apply.chosen_row`` of each input's ``apply.measured_records``) and the default geometry's record
from the same input, which ``apply.chosen`` weighs it against: a tuned record replaces the default only
when one tuning run measured it clearly faster (a default measured in another run, host or time can
differ by more than the margin). So only inputs that measured the default compete when any did; else
the fastest record is kept, so the workload stays in the output (``apply`` keeps its default). Stale
records are dropped; the buckets they leave without a current record are named to re-tune. The
output's workload table is compact (``compact_workload_table``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pathlib
import struct
import tempfile

from ..cliargs import output_folder, summary
from ..console import counted
from ..runtime import compile as C
from . import store
from .apply import database_buckets, default_row, measured_records, open_database, row_chosen_over
from .store import DATABASE_FILES


@dataclasses.dataclass
class Merged:
    """What a merge kept: workloads (the chosen record and its run's default record each) and the records
    read, per input."""

    workloads: int
    records_read: dict
    stale_kernels: set  # kernels some input held records of for other kernel code or another case (dropped)
    retune: set  # their (kernel, bucket)s left without a current record in the output


def _check_database(folder: pathlib.Path, device_key: str):
    """Open ``folder``'s database after checking its device key (folder name) and its records' target."""
    if not store.holds_database(folder):
        raise ValueError(f"kv-canary: {folder} is not a tuning database (no {DATABASE_FILES[0]}, plain or packed; "
                         "pass the <device key> folder that `tvm-canary tune` wrote)")
    if folder.name != device_key:
        raise ValueError(f"kv-canary: refusing to merge {folder}: it is the database of device key {folder.name!r}, "
                         f"the output is for {device_key!r} (a database applies only to its own device)")
    try:
        return open_database(folder, device_key)
    except ValueError as e:
        raise ValueError(f"kv-canary: refusing to merge {folder}: {str(e).removeprefix('kv-canary: ')}") from None


def merge(sources: list[pathlib.Path], out: pathlib.Path) -> Merged:
    """Merge the databases ``sources`` (and ``out``'s own, if any) into ``out``, keeping per workload the
    records the module docstring names. Every input is checked before ``out`` is touched; ``out``'s two
    files are replaced so they never disagree (``_install``)."""
    from tvm.s_tir import meta_schedule as ms

    device_key = out.resolve().name
    inputs = list(dict.fromkeys(p.resolve() for p in sources))
    if store.holds_database(out) and out.resolve() not in inputs:
        inputs.append(out.resolve())
    databases = [(folder, _check_database(folder, device_key)) for folder in inputs]
    # workload -> (the fastest chosen row, its input's default row or None), among the inputs that
    # measured the default when any did (a choice is weighed against its own run's default)
    best: dict = {}
    read = {}
    stale: set = set()
    for folder, db in databases:
        read[str(folder)] = len(db.get_all_tuning_records())
        for workload, rows in measured_records(db, stale).items():
            cuda = rows[0][1].target.kind.name == "cuda"
            own_default = default_row(*workload, rows, cuda)
            # without a default record an input selects nothing; its fastest record stands in for it
            own_choice = rows[0] if own_default is None else row_chosen_over(*workload, rows, own_default, cuda)
            held = best.get(workload)
            if held is None or (own_default is not None, -own_choice[0]) > (held[1] is not None, -held[0][0]):
                best[workload] = own_choice, own_default
    retune = {w for _, db in databases for w in database_buckets(db, stale) if w not in best}
    kept = [row for best_row, own_default in best.values() for row in (best_row, own_default) if row is not None]
    kept = list({id(row[1]): row for row in kept}.values())  # the best row may be the default's
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        merged = ms.database.JSONDatabase(work_dir=tmp)
        for _, record in sorted(kept, key=lambda row: str(row[1].workload.mod["main"].attrs["canary.kernel"])):
            workload = merged.commit_workload(record.workload.mod)
            merged.commit_tuning_record(ms.database.TuningRecord(record.trace, workload, record.run_secs, record.target,
                                                                 record.args_info))
        del merged
        compact_workload_table(pathlib.Path(tmp))
        out.mkdir(exist_ok=True)
        packed = store.is_packed(out)
        _install(pathlib.Path(tmp), out)
        if packed:  # a packed output (a committed database) stays packed
            store.pack(out)
    return Merged(len(best), read, stale, retune)


def _install(staged: pathlib.Path, out: pathlib.Path) -> None:
    """Replace ``out``'s database with ``staged``'s (same filesystem). Records refer to workloads by position, so the
    two files must never be one old and one new: an empty records file is renamed in first (over the old one, if any),
    then the table and the records. Stopped anywhere (disk full, a kill), ``out`` holds the old database (or none), a
    table with empty records (selecting nothing, read as empty by the next merge or tune), or the new one."""
    (staged / "empty.json").write_text("")
    os.replace(staged / "empty.json", out / DATABASE_FILES[1])
    for name in DATABASE_FILES:
        os.chmod(staged / name, C.new_file_mode())
        os.replace(staged / name, out / name)


def compact_entry(shash: str, encoded: str) -> str:
    """One workload table line with its module JSON free of whitespace. MetaSchedule writes an entry as
    ``[structural hash, base64(uint64 length + the module's JSON, indented)]``, about half indentation;
    the compact entry loads as the same module (``tvm.ir.load_json`` ignores whitespace) and keeps the
    hash, halving the committed databases (the tracked tree's budget)."""
    raw = base64.b64decode(encoded)
    (length,) = struct.unpack("<Q", raw[:8])
    module_json = json.dumps(json.loads(raw[8 : 8 + length]), separators=(",", ":")).encode()
    compact = base64.b64encode(struct.pack("<Q", len(module_json)) + module_json).decode()
    return json.dumps([shash, compact], separators=(",", ":"))


def write_workload_table(folder: pathlib.Path, lines: list[str]) -> int:
    """Replace ``folder``'s workload table with ``lines`` as a whole (a temporary file renamed over it);
    returns their number. Order matters: records refer to workloads by position."""
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".json", delete=False) as tmp:
        tmp.write("".join(line + "\n" for line in lines))
    os.chmod(tmp.name, C.new_file_mode())
    os.replace(tmp.name, folder / DATABASE_FILES[0])
    return len(lines)


def compact_workload_table(folder: pathlib.Path) -> int:
    """Rewrite ``folder``'s workload table with every entry compact (``compact_entry``), in order;
    returns the entries."""
    lines = (folder / DATABASE_FILES[0]).read_text().splitlines()
    return write_workload_table(folder, [compact_entry(*json.loads(line)) for line in lines if line.strip()])


def remove_empty_database(folder: pathlib.Path) -> bool:
    """Remove ``folder``'s database files if both are empty, and the folder if nothing else is left in
    it; returns whether they were removed."""
    if any((folder / name).stat().st_size for name in DATABASE_FILES):
        return False
    for name in DATABASE_FILES:
        (folder / name).unlink()
    if not any(folder.iterdir()):
        folder.rmdir()
    return True


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("tune-merge", help="merge tuning databases of one device model (e.g. from several hosts)",
                              description=summary(__doc__))
    p.add_argument("sources", nargs="+", type=pathlib.Path, metavar="DIR", help="database folders (<...>/<device key>)")
    p.add_argument("--out", type=output_folder, required=True, help="the merged database: <root>/<device key>")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        result = merge(args.sources, args.out)
    except OSError as e:  # the output's folder or files (the inputs were read before anything was written)
        raise RuntimeError(f"kv-canary: cannot write the merged database to {args.out}: {e.strerror or e}") from None
    for folder, count in result.records_read.items():
        print(f"read {count:5} records from {folder}")
    print(f"wrote {counted(result.workloads, 'workload')} (the chosen record and the default's, each) to {args.out}")
    if result.stale_kernels:
        retune = ", ".join(f"{k} {b}" for k, b in sorted(result.retune))
        advice = (f"re-tune {retune} with `tvm-canary tune --stale-only`; a kernel change that keeps the generated "
                  "code and the tuning case: `python -m tvm_canary.tuning.restamp` before merging" if retune
                  else "superseded: each of their buckets has a current record")
        print(f"dropped the records of {', '.join(sorted(result.stale_kernels))} tuned for older kernel code or "
              f"another tuning case ({advice})")
    return 0
