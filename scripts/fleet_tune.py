#!/usr/bin/env python3
"""Fleet-tuning scaling run on one host: wall time of ``tvm-canary tune`` with 1, 2, 4, ... RPC servers.

    python scripts/fleet_tune.py [--target cuda|llvm] [--servers G] [--counts 1 2 4 8] [--trials 32]
                                 [--kernels ...] [--workloads PRESET] [--out DIR] [--timeout S]

Starts an RPC tracker on 127.0.0.1 and G ``tvm-canary rpc-server`` processes (cuda: one per visible GPU,
server i on torch's GPU i, ``server_envs``; llvm: G CPU servers, for a dry run), then for each N in
``--counts`` (default: 1, 2, 4, ... up to G, and G) runs ``tune --rpc-workers N`` from scratch into
``DIR/runs/n<N>`` with the same trials, each under an outer timeout. Writes
``DIR/fleet.json`` (host, GPUs, versions, per N: wall seconds, exit status, best microseconds per
workload), merges the runs' databases into ``DIR/merged/<device key>`` with ``tvm-canary tune-merge``,
and stops every process it started. Exits non-zero when a run failed or timed out. docs/FLEET-TUNING.md
explains it.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RPC_KEY = "fleet-tune"


def default_counts(servers: int) -> list[int]:
    counts, n = [], 1
    while n < servers:
        counts.append(n)
        n *= 2
    return counts + [servers]


def server_envs(target: str, servers: int) -> list[dict]:
    """The extra environment of each server: cuda: server i gets torch's GPU i here, i.e. the i-th entry of
    this process's CUDA_VISIBLE_DEVICES when set, else GPU i; llvm: none."""
    if target != "cuda":
        return [{} for _ in range(servers)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [g.strip() for g in visible.split(",")] if visible is not None else [str(i) for i in range(servers)]
    return [{"CUDA_VISIBLE_DEVICES": gpus[i]} for i in range(servers)]


def canary(args: list[str], timeout_s: float, log: pathlib.Path) -> tuple[int, float]:
    """Run ``python -m tvm_canary ARGS`` (output to ``log``); (exit status, wall seconds); 124 on timeout."""
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tvm_canary", *args], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            from tvm_canary.tuning.fleet import stop_process_group

            stop_process_group(proc)
            status = 124
    return status, time.monotonic() - start


def best_us(database: pathlib.Path) -> dict:
    """{"kernel (bucket)": best microseconds} of a database folder (empty when it does not exist)."""
    from tvm_canary.tuning import store

    if not store.holds_database(database):
        return {}
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.tuning.apply import measured_records

    rows = measured_records(ms.database.JSONDatabase(work_dir=str(store.readable(database))))
    return {f"{k} {b}": round(1e6 * r[0][0], 2) for (k, b), r in sorted(rows.items())}


def main() -> int:
    import torch

    from tvm_canary.cliargs import Parser, int_at_least

    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("cuda", "llvm"), default="cuda")
    parser.add_argument("--servers", type=int_at_least(1), default=None,
                        help="servers to start (cuda: default every visible GPU; llvm: 2)")
    parser.add_argument("--counts", type=int_at_least(1), nargs="+", default=None, help="server counts to time")
    parser.add_argument("--trials", type=int_at_least(1), default=32)
    parser.add_argument("--kernels", nargs="+", default=None)
    parser.add_argument("--workloads", default=None,
                        help="tune's size bucket preset (default: gpu for cuda, cpu for llvm)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "fleet-tune",
                        help="results folder (default: fleet-tune/ in the repository)")
    parser.add_argument("--timeout", type=float, default=1800, help="outer limit of each tune run, seconds")
    args = parser.parse_args()
    args.out = args.out.resolve()  # the tune runs start in the repository, this script where it was called

    from tvm_canary.tuning import fleet

    gpus = torch.cuda.device_count()
    servers = args.servers or (gpus if args.target == "cuda" else 2)
    if args.target == "cuda" and not 1 <= servers <= gpus:
        parser.error(f"--target cuda needs 1 to {gpus} servers (one per visible GPU)" if gpus else
                     "--target cuda needs a visible GPU")
    counts = args.counts or default_counts(servers)
    if not all(1 <= n <= servers for n in counts):
        parser.error(f"--counts must lie in 1..{servers}")
    envs = server_envs(args.target, servers)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "target": args.target, "servers": servers, "trials": args.trials,
        "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "driver": _driver_version(), "torch": torch.__version__, "tvm": _tvm_version(), "runs": [],
    }
    failed = False
    with fleet.local_fleet(RPC_KEY, envs, log_dir=args.out / "server-logs") as tracker:
        device_key = fleet.connect(tracker, RPC_KEY, args.target, 1).device_key
        for n in counts:
            run_dir = args.out / "runs" / f"n{n}"
            tune = ["tune", "--target", args.target, "--trials", str(args.trials), "--out", str(run_dir),
                    "--log-dir", str(run_dir / "ms-logs"), "--rpc-tracker", tracker, "--rpc-key", RPC_KEY,
                    "--rpc-workers", str(n)]
            tune += ["--kernels", *args.kernels] if args.kernels else []
            tune += ["--workloads", args.workloads] if args.workloads else []
            if (run_dir / device_key).exists():
                raise SystemExit(f"{run_dir / device_key} exists: every run starts from an empty database "
                                 "(use a new --out)")
            run_dir.mkdir(parents=True, exist_ok=True)
            status, seconds = canary(tune, args.timeout, run_dir / "tune.log")
            failed |= status != 0
            report["runs"].append({"servers": n, "wall_s": round(seconds, 1), "status": status,
                                   "best_us": best_us(run_dir / device_key)})
            print(f"{n} server(s): {seconds:.1f} s (exit status {status})", flush=True)
            (args.out / "fleet.json").write_text(json.dumps(report, indent=1))
    merged = args.out / "merged" / device_key
    run_databases = [args.out / "runs" / f"n{n}" / device_key for n in counts]
    sources = [str(d) for d in run_databases if d.is_dir()]
    if sources:
        status, _ = canary(["tune-merge", *sources, "--out", str(merged)], 600, args.out / "merge.log")
        report["merged"] = {"status": status, "best_us": best_us(merged)}
        failed |= status != 0
    (args.out / "fleet.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out / 'fleet.json'}")
    return 1 if failed else 0


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=False)
        return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _tvm_version() -> str:
    import tvm

    return tvm.__version__


if __name__ == "__main__":
    sys.exit(main())
