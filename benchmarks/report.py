"""PASS/FAIL summary of a bench_kernels.py run per target group (markdown, for docs/PERFORMANCE.md).

    python benchmarks/report.py bench.json [--markdown out.md]

A group is one target of issue 13 as ``bench_kernels.targets_for`` states it (kernel, what the time is compared with,
limit; verify split by size range): how many rows meet it, and each row that does not, with its ratio; for the rows
timed against their bounds (verify: ``bench_kernels.bounded_row``, up to 64K entries and ALL at every size; write:
one-token requests) also the same limit against their ordered floor, and their hash floor against the target's limit
(for reference: neither is the target; they say what the floor really is: a row whose hash floor alone is over the limit
is past the hardware for a kernel hashing as SPEC requires). Then the tuning check (no row tuned to a geometry of its
own over 3% slower than default, A/B interleaved; rows tuned to their default, an A/A, shown as the method's noise) and
the rows faster than a floor by over 5% in either arm (a floor that is no lower bound): both checks are ``verdicts``',
computed from the rows' times. Reads the targets the run stored; needs no GPU.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import verdicts  # benchmarks/, the script's folder


def size_range(row) -> str:
    """The size range of a verify row's target."""
    return ">= 1M entries" if row["n"] >= 1 << 20 else "<= 64K entries"


def group_of(row, target) -> str:
    """The target group of one of a row's targets, as a reader of docs/PERFORMANCE.md names it."""
    what, limit = target["what"], target["limit"]
    if row["kernel"] == "verify":
        return f"verify, {size_range(row)}: <= {limit:.2f} x floor"
    if row["kernel"] == "write":
        return {
            "chain": f"write, one long chain (NONE): <= {limit:.2f} x register-only chain",
            "floor": f"write, many requests: <= {limit:.2f} x floor",
            "NONE": f"write, real-KV modes: <= {limit:.2f} x NONE",
        }[what]
    return f"{row['kernel']} {row['case']}: <= {limit:.2f} x {what}"


def summary(run) -> str:
    from plot import caveats

    groups: dict[str, list] = {}
    for row in run["rows"]:
        for target in row.get("targets", []):
            groups.setdefault(group_of(row, target), []).append((row, target))
    lines = [line for caveat in caveats(run) for line in (caveat, "")]
    lines += ["| target | PASS | FAIL | failing rows (ratio) |", "| --- | --- | --- | --- |"]
    for name, entries in groups.items():
        failed = [f"{r['case']} ({verdicts.ratio_text(t['ratio'], t['limit'])})" for r, t in entries
                  if t["ratio"] > t["limit"]]
        lines.append(f"| {name} | {len(entries) - len(failed)} | {len(failed)} | {', '.join(failed) or '-'} |")
    # the module docstring's rows timed against their bounds (Bench.bounds), per group of rows with one limit
    references: dict[tuple, list] = {}
    for r in run["rows"]:
        target = next((t for t in r.get("targets", []) if t["what"] == "floor"), None)
        if "ordered_floor_us" in r and target:
            rows_of = size_range(r) if r["kernel"] == "verify" else "one-token requests"
            references.setdefault((r["kernel"], rows_of, target["limit"]), []).append(r)
    for (kernel, rows_of, limit), bounded in sorted(references.items(), key=lambda kv: (kv[0][0] != "verify", kv[0])):
        floor = verdicts.FLOOR_OF[kernel]
        # the ratio compared as the targets do (ratio > limit), not a product, which differs at the limit
        over = [f"{r['case']} ({verdicts.ratio_text(ratio, limit)})" for r in bounded
                if (ratio := r["us"] / r["ordered_floor_us"]) > limit]
        lines.append(f"| (for reference) {kernel}, {rows_of}: <= {limit:.2f} x ordered floor ({floor} + SPEC hashing + "
                     f"ordered append) | {len(bounded) - len(over)} | {len(over)} | {', '.join(over) or '-'} |")
        past = [f"{r['case']} ({verdicts.ratio_text(ratio, limit, 3)})" for r in bounded
                if (ratio := r["hash_floor_us"] / r["floor_us"]) > limit]
        lines.append(f"| (for reference) {kernel}, {rows_of}: hash floor ({floor} + SPEC hashing) "
                     f"<= {limit:.2f} x floor; over it the target is past the hardware | "
                     f"{len(bounded) - len(past)} | {len(past)} | {', '.join(past) or '-'} |")
    rows_failed = sum(r.get("status") == "FAIL" for r in run["rows"])
    rows_passed = sum(r.get("status") == "PASS" for r in run["rows"])
    lines += ["", f"Rows with targets: {rows_passed} PASS, {rows_failed} FAIL."]
    tuned = [r for r in run["rows"] if r.get("tuned_us")]
    if tuned:
        slower = verdicts.tuned_slower_labels(tuned)
        slower_than = f"more than {verdicts.TUNED_SLOWER_PERCENT} slower"
        own = sum(not r.get("tuned_same_geometry") for r in tuned)
        lines.append(f"Tuned vs default (A/B interleaved, {len(tuned)} rows, {own} of them tuned to a geometry of "
                     f"their own): "
                     + (f"FAIL, {slower_than}: {', '.join(slower)}." if slower else f"PASS, none {slower_than}.")
                     + verdicts.aa_note(tuned))
    below = [label for r in run["rows"] if (label := verdicts.below_floor_label(r))]
    faster_than = f"faster than a floor by more than {verdicts.BELOW_FLOOR_PERCENT} (default or tuned arm)"
    lines.append("Floors as lower bounds: " + (f"FAIL, rows {faster_than}: {', '.join(below)}." if below
                                                else f"PASS, no row {faster_than}."))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a bench_kernels.py --json file")
    ap.add_argument("--markdown", help="write the summary here (default: print it)")
    args = ap.parse_args(argv)
    import plot

    run = plot.load(args.run, "report.py")
    if run is None:
        return 2
    text = summary(run)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
