"""Compare two ``bench_kernels.py --json`` runs row by row, the default arm of each.

For example two runs of the same kernels, or of two versions.

    python benchmarks/compare.py FIRST.json SECOND.json

Prints, per case, both times, second/first, and each run's ratio to its own floor; ends with the cases where the second
run is slower by over the tuning check's margin (``verdicts.TUNED_SLOWER``) and the rows of either run faster than one
of their floors by over the noise (``verdicts.below_floor``).
"""

from __future__ import annotations

import argparse
import sys

import verdicts
from plot import load


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("first", help="a bench_kernels.py --json file")
    ap.add_argument("second", help="another")
    args = ap.parse_args(argv)
    a_path, b_path = args.first, args.second
    a, b = (load(p, "compare.py") for p in (a_path, b_path))
    if a is None or b is None:
        return 2
    rows_b = {(r["kernel"], r["case"]): r for r in b["rows"]}
    slower = []
    print(f"{a['env']['gpu']}: {a_path} vs {b_path}")
    print(f"{'kernel':8} {'case':24} {'first us':>11} {'second us':>10} {'2nd/1st':>9} "
          f"{'1st/floor':>9} {'2nd/floor':>11}")
    for ra in a["rows"]:
        rb = rows_b.get((ra["kernel"], ra["case"]))
        if rb is None:
            continue
        rel = rb["us"] / ra["us"]
        print(f"{ra['kernel']:8} {ra['case']:24} {ra['us']:11.1f} {rb['us']:10.1f} {rel:9.3f} "
              f"{ra['us'] / ra['floor_us']:9.2f} {rb['us'] / rb['floor_us']:11.2f}")
        if rel > verdicts.TUNED_SLOWER:
            slower.append(f"{ra['kernel']} {ra['case']} ({verdicts.ratio_text(rel, verdicts.TUNED_SLOWER, 3)}x)")
    print(f"second run more than {verdicts.TUNED_SLOWER_PERCENT} slower: {', '.join(slower) if slower else 'none'}")
    rows_a = {(r["kernel"], r["case"]) for r in a["rows"]}
    for path, only in ((a_path, rows_a - set(rows_b)), (b_path, set(rows_b) - rows_a)):
        if only:
            print(f"only in {path}: {', '.join(f'{k} {c}' for k, c in sorted(only))}")
    below = [f"{path}: {label}" for path, run in ((a_path, a), (b_path, b)) for r in run["rows"]
             if (label := verdicts.below_floor_label(r))]
    print(f"rows faster than a floor by more than {verdicts.BELOW_FLOOR_PERCENT}: "
          f"{'; '.join(below) if below else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
