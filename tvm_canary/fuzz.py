"""``tvm-canary fuzz``: a long differential and memory-safety campaign on one device.

Case ``i`` of a campaign has seed ``B + i`` (``B`` = ``--seed-base``, plus ``rank * RANK_SEED_STRIDE`` under torchrun)
and runs kernel ``kernels[i % K]``, alternating between K differential cases (valid plans) and K garbage plans between
guard bands (no byte outside the outputs may change), bytes compared with the torch reference; every other differential
round gives write long all-valid requests instead (``cases.long_write_case``: on CUDA its lockstep batches). Cases are
``tvm-canary conformance``'s (case ids ``diff:SEED`` / ``garbage:SEED`` / ``long:SEED``), so a failing case replays with
one conformance command, written beside it in the failures JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import cases as C
from . import conformance as X
from .cliargs import duration, int_at_least, require_module_builds, seed, summary
from .console import counted, discard

RANK_SEED_STRIDE = 1_000_000_000
PROGRESS_SECONDS = 10.0


def case_of(index: int, kernels: list[str], seed_base: int) -> tuple[str, str]:
    """(kernel, case id) of the campaign's case ``index`` (module docstring)."""
    kernel, turn = kernels[index % len(kernels)], (index // len(kernels)) % 4
    kind = "garbage" if turn % 2 else ("long" if turn == 2 and kernel == "write" else "diff")
    return kernel, f"{kind}:{seed_base + index}"


def check(kernel: str, case: str, device: str, launches: dict | None = None) -> str | None:
    """Why the case fails on ``device`` (None: it passes)."""
    ref, want = X.run_reference(kernel, case)
    got = X.run_device(kernel, case, device, want, launches)
    if got.error:
        return got.error
    if got.digest != ref.digest:
        return X.digest_differs(got.tensors, ref.tensors)
    return None


def campaign(device: str, kernels: list[str], seed_base: int, *, cases: int | None = None,
             seconds: float | None = None, launches: dict | None = None, tag: str = "") -> dict:
    """Run cases until ``cases`` ran or ``seconds`` passed, or until its output's reader went away (``output_closed``);
    returns the counts and failures (each with its replay command). ``launches`` (tests only) replaces
    ``cases.LAUNCH`` to inject faults."""
    start = last = time.monotonic()
    failures, index, output_closed = [], 0, False
    while (cases is None or index < cases) and (seconds is None or time.monotonic() - start < seconds):
        kernel, case = case_of(index, kernels, seed_base)
        why = check(kernel, case, device, launches)
        if why:
            failures.append({"device": device, "kernel": kernel, "case": case, "why": why,
                             "replay": X.replay(device, kernel, case)})
            output_closed = not _say(f"fuzz{tag} {device}: FAIL {kernel} {case}: {why}\n  replay: "
                                     f"{failures[-1]['replay']}", sys.stderr)
        index += 1
        now = time.monotonic()
        if not output_closed and now - last >= PROGRESS_SECONDS:
            last = now
            output_closed = not _say(f"fuzz{tag} {device}: {index} cases, {index / (now - start):.1f}/s, "
                                     f"{len(failures)} failures", sys.stdout)
        if output_closed:  # the reader went away: the campaign stops here, what ran is still reported
            break
    elapsed = time.monotonic() - start
    return {"device": device, **{k: v for k, v in X.describe(device).items() if k != "device"},
            "seed_base": seed_base, "cases": index, "seconds": round(elapsed, 3),
            "cases_per_second": round(index / elapsed, 2) if elapsed else 0.0, "failures": failures,
            "output_closed": output_closed}


def _say(line: str, stream) -> bool:
    """Print ``line`` to ``stream``; False (the stream then discarded) if its reader went away (``fuzz ... 2>&1 |
    head`` closes stderr's too)."""
    try:
        print(line, file=stream, flush=True)
        return True
    except BrokenPipeError:
        discard(stream)
        return False


def one_device(text: str) -> str:
    """``--device``: one of cpu, cuda, cuda:N."""
    found = X.device_list(text)
    if len(found) != 1:
        raise argparse.ArgumentTypeError(f"kv-canary: one device expected, got {text!r}")
    return found[0]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("fuzz", help="differential and guard-band fuzz campaign on one device",
                              description=summary(__doc__))
    p.add_argument("--device", type=one_device, default=None,
                   help="cpu, cuda or cuda:N (default: cuda:LOCAL_RANK under torchrun or when a GPU is visible, "
                        "else cpu)")
    stop = p.add_mutually_exclusive_group(required=True)
    stop.add_argument("--seconds", type=duration(zero=False), help="run for this long")
    stop.add_argument("--cases", type=int_at_least(1), help="run this many cases")
    p.add_argument("--kernels", type=X.kernel_list, default=",".join(C.KERNELS),
                   help="comma-separated subset of " + ",".join(C.KERNELS))
    p.add_argument("--seed-base", type=seed, default=1_000_000, help="first seed (rank r adds r * 1e9)")
    p.add_argument("--out", type=X.rank0_output_file, default="fuzz-failures.json", metavar="FAILS.json",
                   help="JSON of the campaign and its failing cases with replay commands (rank 0)")
    X.add_timeout(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, launches: dict | None = None) -> int:
    """Fuzz this process's device; under torchrun rank 0 gathers every rank's counts and failures."""
    kernels = args.kernels
    device = args.device or X.local_device()
    require_module_builds()
    group = X.init_distributed(args.timeout)
    rank, size, _ = X.world()
    tag = f" rank {rank}" if size > 1 else ""
    mine = campaign(device, kernels, args.seed_base + rank * RANK_SEED_STRIDE, cases=args.cases,
                    seconds=args.seconds, launches=launches, tag=tag)
    ranks = [{"rank": r, **result} for r, result in enumerate(X.gather(mine, group))]
    failures = [f | {"rank": r["rank"]} for r in ranks for f in r["failures"]]
    total = sum(r["cases"] for r in ranks)
    if rank == 0:  # the JSON first: a reader gone by the summary leaves it whole
        with open(args.out, "w") as f:
            json.dump({"kernels": kernels, "cases": total, "failures": failures, "ranks": ranks}, f, indent=1)
        for r in ranks:
            print(f"fuzz rank {r['rank']} {r['device']} ({r['model']}, {r['arch']}): {counted(r['cases'], 'case')} in "
                  f"{r['seconds']:.1f} s ({r['cases_per_second']}/s), {len(r['failures'])} failures")
        print(f"fuzz: {counted(total, 'case')} on {counted(size, 'process')}, {counted(len(failures), 'failure')}"
              + (f" (written to {args.out})" if failures else ""))
    X.finish(group)
    if mine["output_closed"]:
        print(f"fuzz{tag}: the output's reader went away after {counted(mine['cases'], 'case')}: the campaign stopped "
              f"there" + (f"; {args.out} holds what ran" if rank == 0 else ""), file=sys.stderr)
        raise BrokenPipeError  # the command's closed-reader status (cli.main)
    return 1 if failures else 0
