"""Render a ``bench_kernels.py --json`` run as PNG plots and markdown tables (for docs/PERFORMANCE.md).

    python benchmarks/plot.py RUN.json [--out docs] [--markdown TABLES.md]

PNGs (needs matplotlib, the ``bench`` extra):
* ``perf-verify.png``: time vs active entries, one column per real-KV mode; the kernel (default and,
  if measured, tuned geometry), its gather floor (for rows timed against their bounds also the ordered
  floor as x) and the baselines, random (solid) and chain (dashed) order; below, each time over the
  floor (x: the ordered floor), with the targets;
* ``perf-write.png``: ns per written token for each shape and mode, beside the floor and baselines;
* ``perf-plan-scatter.png``: plan and scatter times beside their copy floors and baselines.
The markdown holds one table per kernel with the same numbers, the targets and PASS/FAIL, and the run's
environment. Without ``--markdown`` it is printed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import pathlib
import sys

import verdicts  # benchmarks/, the script's folder

BASELINES = ("original", "triton", "torch")
STYLE = {"original": ("tab:red", "s"), "triton": ("tab:purple", "^"), "torch": ("tab:gray", "x")}
DEFAULT_DPI = 60  # plot.py --dpi: the PNGs' resolution, the docs' (small files: the tree's budget)
# Colours of the PNGs' palette: the plots draw a dozen line colours (anti-aliased); 32 keep them apart at
# about 0.9x the size of 64 (the tree must stay under 2 MiB, docs/ PNGs included).
PALETTE_COLOURS = 32


INCOMPLETE = ("**Incomplete run**: it holds only the kernels and sizes below (cut short, made a part at a time "
              "and not yet resumed, or verify timed at some sizes alone); the other rows' targets are missing.")
QUICK = "**Quick run** (`--quick`, a smoke run): smaller sizes and pool than the targets are set for."


def caveats(run) -> list[str]:
    """What a reader must know before a run's tables: an incomplete run (as stored, or lacking a kernel's rows: older
    benches stored one kernel's part as complete), a quick run, and the bench's warnings (a baseline whose stamped
    bytes differ from ours among them)."""
    kernels = {r["kernel"] for r in run["rows"]}
    return ([INCOMPLETE] * (not run.get("complete", True) or not set(verdicts.FLOOR_OF) <= kernels)
            + [QUICK] * bool(run.get("quick")) + [f"Warning from the run: {w}" for w in run.get("warnings", [])])


def read_run(path) -> dict:
    """A run's JSON as stored: ``RUN.json``, or ``RUN.json.gz`` (the older runs in benchmarks/results)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def load(path: str, reader: str) -> dict | None:
    """A bench_kernels.py run, or None after a one-line error naming ``reader`` if unreadable or a run of
    the earlier bench (no baselines, targets or environment)."""
    try:
        run = read_run(path)
    except (OSError, ValueError) as e:
        print(f"kv-canary: {reader}: cannot read {path}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return None
    rows = run.get("rows") if isinstance(run, dict) else None
    # (ab_kernels.py's runs have an env too, and rows of times per arm)
    if (not isinstance(run, dict) or "env" not in run or not isinstance(rows, list)
            or not all(isinstance(r, dict) and isinstance(r.get("us"), (int, float)) for r in rows)):
        print(f"kv-canary: {reader} needs a run of the current bench_kernels.py (with 'env' and targets)",
              file=sys.stderr)
        return None
    return run


def _tokens(row) -> int:
    reqs, length = (int(x) for x in row["shape"].split("x"))
    return reqs * length


def _save(fig, path: pathlib.Path, dpi: int) -> None:
    """Write ``fig`` as a palette PNG of ``PALETTE_COLOURS`` colours (Pillow comes with matplotlib)."""
    from PIL import Image

    fig.savefig(path, dpi=dpi)
    with Image.open(path) as image:
        palette = image.convert("RGB").quantize(PALETTE_COLOURS)
    palette.save(path, optimize=True)

def plot_verify(run, out: pathlib.Path, plt, dpi: int = DEFAULT_DPI) -> pathlib.Path:
    rows = [r for r in run["rows"] if r["kernel"] == "verify"]
    modes = [m for m in ("NONE", "PARTIAL", "ALL") if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(2, len(modes), figsize=(6 * len(modes), 9), squeeze=False, height_ratios=(3, 2))
    for ax, ratio_ax, mode in zip(axes[0], axes[1], modes):
        for order, dash in (("random", "-"), ("chain", "--")):
            sel = sorted((r for r in rows if r["mode"] == mode and r["order"] == order), key=lambda r: r["n"])
            if not sel:
                continue
            n = [r["n"] for r in sel]
            ax.plot(n, [r["us"] for r in sel], dash, color="tab:blue", marker="o", label=f"tvm_canary default, {order}")
            if all(r.get("tuned_us") for r in sel):
                ax.plot(n, [r["tuned_us"] for r in sel], dash, color="tab:cyan", marker=".",
                        label=f"tvm_canary tuned, {order}")
            ax.plot(n, [r["floor_us"] for r in sel], dash, color="black", linewidth=1, label=f"gather floor, {order}")
            bounded = [r for r in sel if "ordered_floor_us" in r]  # what bounds them beyond their bytes
            if bounded:
                ax.plot([r["n"] for r in bounded], [r["ordered_floor_us"] for r in bounded], "x", color="black",
                        label=f"ordered floor (hashing + ordered append), {order}")
                ratio_ax.plot([r["n"] for r in bounded], [r["us"] / r["ordered_floor_us"] for r in bounded], "x",
                              color="tab:blue")
            ratio_ax.plot(n, [r["us"] / r["floor_us"] for r in sel], dash, color="tab:blue", marker="o")
            if all(r.get("tuned_us") for r in sel):
                ratio_ax.plot(n, [r["tuned_us"] / r["floor_us"] for r in sel], dash, color="tab:cyan", marker=".")
            for name in BASELINES:
                ys = [r.get("baselines", {}).get(name, math.nan) for r in sel]
                if not all(math.isnan(y) for y in ys):
                    color, marker = STYLE[name]
                    ax.plot(n, ys, dash, color=color, marker=marker, alpha=0.8, label=f"{name}, {order}")
                    if name != "torch":
                        ratio_ax.plot(n, [y / r["floor_us"] for y, r in zip(ys, sel)], dash, color=color, marker=marker,
                                      alpha=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("active entries")
        ax.set_ylabel("µs per launch")
        ax.set_title(f"verify, real-KV {mode}")
        ax.grid(True, which="both", alpha=0.3)
        ratio_ax.axhline(1.0, color="black", linewidth=1)
        ratio_ax.axhline(1.10, color="tab:green", linestyle=":", linewidth=1)
        ratio_ax.axhline(1.25, color="tab:olive", linestyle=":", linewidth=1)
        ratio_ax.set_xscale("log", base=2)
        ratio_ax.set_xlabel("active entries")
        ratio_ax.set_ylabel("time / gather floor (x: / ordered)")  # the targets: dotted lines
        ratio_ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(_title(run))
    fig.tight_layout()
    path = out / "perf-verify.png"
    _save(fig, path, dpi)
    plt.close(fig)
    return path


def _bars(ax, labels, series, ylabel, title):
    """Grouped bars: ``series`` = [(name, values, color)]."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values, color) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, values, width, label=name, color=color)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _series(rows, scale):
    series = [("tvm_canary default", [r["us"] * scale(r) for r in rows], "tab:blue")]
    if all(r.get("tuned_us") for r in rows):
        series.append(("tvm_canary tuned", [r["tuned_us"] * scale(r) for r in rows], "tab:cyan"))
    series.append(("floor", [r["floor_us"] * scale(r) for r in rows], "black"))
    for name in BASELINES:
        values = [r.get("baselines", {}).get(name, math.nan) * scale(r) for r in rows]
        if not all(math.isnan(v) for v in values):
            series.append((name, values, STYLE[name][0]))
    return series


def plot_write(run, out: pathlib.Path, plt, dpi: int = DEFAULT_DPI) -> pathlib.Path:
    rows = [r for r in run["rows"] if r["kernel"] == "write"]
    fig, ax = plt.subplots(figsize=(11, 5))
    _bars(ax, [r["case"] for r in rows], _series(rows, lambda r: 1000.0 / _tokens(r)), "ns per written token", "write")
    ax.axhline(run["chain_ns"], color="black", linestyle=":", linewidth=1)
    fig.suptitle(_title(run))
    fig.tight_layout()
    path = out / "perf-write.png"
    _save(fig, path, dpi)
    plt.close(fig)
    return path


def plot_plan_scatter(run, out: pathlib.Path, plt, dpi: int = DEFAULT_DPI) -> pathlib.Path:
    kernels = [k for k in ("plan", "scatter") if any(r["kernel"] == k for r in run["rows"])]
    fig, axes = plt.subplots(1, len(kernels), figsize=(6 * len(kernels), 5), squeeze=False)
    for ax, kernel in zip(axes[0], kernels):
        rows = [r for r in run["rows"] if r["kernel"] == kernel]
        _bars(ax, [r["case"] for r in rows], _series(rows, lambda r: 1.0), "µs per launch", kernel)
    fig.suptitle(_title(run))
    fig.tight_layout()
    path = out / "perf-plan-scatter.png"
    _save(fig, path, dpi)
    plt.close(fig)
    return path


def _title(run) -> str:
    env = run.get("env", {})
    return (f"{env.get('gpu', run.get('gpu', '?'))} ({run.get('arch', '?')}), driver {env.get('driver')}, "
            f"torch {env.get('torch')}, TVM {env.get('tvm')}, tvm-ffi {env.get('tvm_ffi')}, Triton {env.get('triton')}")


def part_kernels(kernels, verify_sizes=None, verify_modes=None, verify_cases=None) -> str:
    """The kernels of a run's part (``parts``: those it timed, or those whose rows a later one replaced),
    verify with its rows when the part had only those: its modes and sizes (``verify_modes``,
    ``verify_sizes``), or the sizes and single rows a later part replaced (``replaced_verify_sizes``,
    ``replaced_verify_rows``), e.g. "verify (ALL; 65536, 1048576 entries)"."""
    chosen = "; ".join(filter(None, (", ".join(verify_modes or ()),
                                     verify_sizes and f"{', '.join(map(str, verify_sizes))} entries",
                                     ", ".join(verify_cases or ()))))
    names = list(kernels) if not chosen or "verify" in kernels else ["verify", *kernels]
    return ", ".join(f"verify ({chosen})" if k == "verify" and chosen else k for k in names) or "nothing"


def grouped_cases(cases) -> str:
    """Verify cases ("MODE ORDER ENTRIES") as text naming each mode and order once, in their order:
    ["ALL random 65536", "ALL random 1048576", "ALL chain 65536"] -> "ALL random 65536, 1048576; ALL chain
    65536"."""
    sizes: dict = {}
    for case in cases:
        mode, order, n = case.split()
        sizes.setdefault(f"{mode} {order}", []).append(n)
    return "; ".join(f"{key} {', '.join(ns)}" for key, ns in sizes.items())


def part_text(part) -> str:
    """One invocation of a run made in parts: what it timed, its wall time, empty launch and register-only
    chain, the code timing it (``bench_kernels.code_digest``) and which of its rows a later one replaced."""
    replaced = part_kernels(part.get("replaced", []), part.get("replaced_verify_sizes"), None,
                            part.get("replaced_verify_rows"))
    cut = f", cut short in its {part['cut']} sweep" if "cut" in part else ""
    timed = (part_kernels(part["kernels"], verify_cases=[grouped_cases(part["verify_rows"])]) if "verify_rows" in part
             else part_kernels(part["kernels"], part.get("verify_sizes"), part.get("verify_modes")))
    code = f", code {part['code']}" if "code" in part else ""
    return (f"{timed} in "
            f"{part['wall_s']:.0f} s{cut} (empty launch {part['empty_us']:.2f} µs, register-only chain "
            f"{part['chain_ns']:.1f} ns/step{code}" + (f"; its {replaced} rows replaced by a later invocation's"
                                                       if replaced != "nothing" else "") + ")")


def _fmt(x, digits=1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ratio(r, floor_us: float) -> str:
    """The row's time over ``floor_us`` to two decimals, more where two would put it across the row's
    floor target (1.255 against 1.25 prints 1.255)."""
    limit = next((t["limit"] for t in r.get("targets", []) if t["what"] == "floor"), None)
    return _fmt(r["us"] / floor_us, 2) if limit is None else verdicts.ratio_text(r["us"] / floor_us, limit)


def markdown(run) -> str:
    """Tables per kernel: time, floor, ratio, target and status, each baseline (µs and its time / ours),
    tuned (interleaved A/B) when measured."""
    env = run.get("env", {})
    lines = [
        (f"Run: {env.get('gpu')} ({run.get('arch')}, {env.get('sms')} SMs), driver {env.get('driver')}, "
        f"torch {env.get('torch')} "
        f"(CUDA {env.get('cuda')}), TVM {env.get('tvm')}, tvm-ffi {env.get('tvm_ffi')}, Triton {env.get('triton')}; "
        f"empty launch {_fmt(run.get('empty_us'), 2)} µs, register-only chain {_fmt(run.get('chain_ns'))} ns/step; "
        f"default geometries {run.get('default_geometries')}; wall time {_fmt(run.get('wall_s'), 0)} s."),
        "",
    ]
    parts = run.get("parts", [])
    if len(parts) > 1:
        lines += [f"The run was made in {len(parts)} invocations (`bench_kernels.py --resume`), each timing its rows' "
                  "floors in its own process: " + "; ".join(part_text(p) for p in parts) + ".", ""]
    lines += [line for caveat in caveats(run) for line in (caveat, "")]
    baselines = [b for b in BASELINES if any(b in r.get("baselines", {}) for r in run["rows"])]
    tuned = any(r.get("tuned_us") for r in run["rows"])
    for kernel in ("verify", "write", "plan", "scatter"):
        rows = [r for r in run["rows"] if r["kernel"] == kernel]
        if not rows:
            continue
        head = ["case", "µs", "floor", "floor µs", "ratio", "target", ""]
        head += [f"{b} µs (x)" for b in baselines]
        head += ["tuned µs", "tuned/default", "tuned geometry"] if tuned else []
        lines += [f"### {kernel}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for r in rows:
            target = ", ".join(f"{t['what']} {verdicts.ratio_text(t['ratio'], t['limit'])} <= {t['limit']:.2f}"
                               for t in r.get("targets", []))
            cells = [r["case"], _fmt(r["us"]), r["floor"], _fmt(r["floor_us"]), _ratio(r, r["floor_us"]),
                     target, r.get("status", "") + (" BELOW FLOOR" if verdicts.below_floor(r) else "")]
            for b in baselines:
                t = r.get("baselines", {}).get(b)
                cells.append("bytes differ" if b in r.get("byte_mismatch", ()) else
                             f"{_fmt(t)} ({_fmt(t / r['us'] if t else None, 2)})")
            if tuned:
                t = r.get("tuned_us")
                same = " (= default)" if r.get("tuned_same_geometry") else ""
                cells += [_fmt(t), _fmt(t / r["us"] if t else None, 3), r.get("tuned_geometry", "-") + same]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    for kernel, title, which in (
            ("verify", "verify, small plans and ALL",
             "`bench_kernels.bounded_row`: small plans, which launch latency bounds, and ALL's at every size"),
            ("write", "write, one-token requests", "one-token requests, which launch latency bounds")):
        floor = verdicts.FLOOR_OF[kernel]
        bounded = [r for r in run["rows"] if r["kernel"] == kernel and "ordered_floor_us" in r]
        if not bounded:
            continue
        lines += [f"### {title}: what bounds it beyond its bytes", "",
                  f"Rows timed against what bounds them beyond their bytes (`bench_kernels.Bench.bounds`; {which}): "
                  f"the {floor} floor; "
                  f"`hash`, the {floor} that also "
                  "hashes as SPEC 1 requires; `ordered`, the least on top of that for rows appended in order "
                  "(one launch with the clean protocol, or one more launch). Ratios are the kernel's time over each.",
                  "", f"| case | µs | {floor} µs (ratio) | hash µs (ratio) | ordered | ordered µs (ratio) |",
                  "|" + " --- |" * 6]
        for r in bounded:
            lines.append(f"| {r['case']} | {_fmt(r['us'])} | "
                         f"{_fmt(r['floor_us'])} ({_ratio(r, r['floor_us'])}) | "
                         f"{_fmt(r['hash_floor_us'])} ({_ratio(r, r['hash_floor_us'])}) | "
                         f"{r['ordered_floor']} | "
                         f"{_fmt(r['ordered_floor_us'])} ({_ratio(r, r['ordered_floor_us'])}) |")
        lines.append("")
    if any("candidates" in r for r in run["rows"]):
        cands = run.get("candidates", [])
        lines += ["### verify: candidate default geometries (µs)", "",
                  "| case | default | " + " | ".join(cands) + " |", "|" + " --- |" * (2 + len(cands))]
        for r in run["rows"]:
            if "candidates" in r:
                lines.append(f"| {r['case']} | {_fmt(r['us'])} | "
                             + " | ".join(_fmt(r["candidates"].get(c)) for c in cands) + " |")
        lines.append("")
    passed = sum(r.get("status") == "PASS" for r in run["rows"])
    failed = [f"{r['kernel']} {r['case']}" for r in run["rows"] if r.get("status") == "FAIL"]
    lines.append(f"Targets: {passed} PASS, {len(failed)} FAIL" + (f" ({', '.join(failed)})" if failed else "") + ".")
    if tuned:
        slower = verdicts.tuned_slower_labels(run["rows"])
        lines.append(f"Tuned more than {verdicts.TUNED_SLOWER_PERCENT} slower than default (A/B interleaved): "
                     f"{', '.join(slower) if slower else 'none'}." + verdicts.aa_note(run["rows"]))
    below = [label for r in run["rows"] if (label := verdicts.below_floor_label(r))]
    lines.append(f"Rows faster than a floor by more than {verdicts.BELOW_FLOOR_PERCENT} (default or tuned arm): "
                 f"{', '.join(below) if below else 'none'}.")
    if run.get("agreement"):
        lines += ["", "Agreement with the reference before timing: "
                  + "; ".join(f"{k}: {v}" for k, v in run["agreement"].items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a bench_kernels.py --json file")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent / "docs"),
                    help="folder for the PNGs (default: the repository's docs/, whose PNGs it replaces)")
    ap.add_argument("--markdown", help="write the tables here (default: print them)")
    ap.add_argument("--no-png", action="store_true", help="tables only")
    ap.add_argument("--dpi", type=int, default=DEFAULT_DPI,
                    help="PNG resolution (lower: smaller files for the repository)")
    args = ap.parse_args(argv)
    run = load(args.run, "plot.py")
    if run is None:
        return 2
    text = markdown(run)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text)
    else:
        print(text)
    if not args.no_png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("kv-canary: matplotlib is not installed (pip install '.[bench]'); tables only", file=sys.stderr)
            return 1
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        plots = {plot_verify: ("verify",), plot_write: ("write",), plot_plan_scatter: ("plan", "scatter")}
        for fn, kernels in plots.items():
            if any(r["kernel"] in kernels for r in run["rows"]):
                print(f"wrote {fn(run, out, plt, args.dpi)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
