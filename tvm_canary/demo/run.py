"""``tvm-canary demo``: serve a simulated workload with the canary on, inject faults, report.

Exit status 0 only if every injected fault was detected and no other row was recorded.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch
from tqdm import tqdm

from ..consts import RealKvHashMode
from ..runtime.backend import current_backend
from ..session import CanaryGroup, CanarySession
from .engine import Engine, EngineConfig
from .faults import KINDS, PER_GROUP_KINDS, Fault, FaultTracker, inject

WARMUP_STEPS = 3  # no fault before this step: requests need some cached KV first
HEALTH_WARMUP_STEPS = 10
HEALTH_CHECK_INTERVAL = 20


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="simulated serving with injected KV faults",
        description="Run a simulated serving engine with the canary on, inject KV faults at random steps and "
                    "report which launch caught each one. Exits 0 only if every fault was detected and nothing "
                    "else was flagged.",
    )
    p.add_argument("--steps", type=int, default=200, help="engine steps (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the faults (default 0)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--swa", action="store_true", help="add an SWA buffer group")
    p.add_argument("--window", type=int, default=16, help="SWA window in tokens (default 16)")
    p.add_argument("--real-kv", choices=("partial", "all"), default="partial", help="real-KV hash mode")
    p.add_argument("--slots", type=int, default=512, help="KV pool slots (default 512)")
    p.add_argument("--max-running", type=int, default=8, help="concurrent requests (default 8)")
    p.add_argument("--faults-per-kind", type=int, default=1, help="faults injected of each kind (default 1)")
    p.add_argument("--sweep-interval", type=int, default=4, help="steps between sweeps (default 4)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="replay the canary step as one captured CUDA graph on even steps (eager on odd ones) and "
                        "report the canary time per step both ways")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _schedule(args: argparse.Namespace, rng: random.Random) -> list[tuple[int, str, str]]:
    """(step, kind, group) of every fault, at distinct random steps leaving time to detect the last one."""
    groups = ("FULL", "SWA") if args.swa else ("FULL",)
    jobs = [(kind, rng.choice(groups) if kind in PER_GROUP_KINDS else "FULL")
            for kind in KINDS for _ in range(args.faults_per_kind)]
    rng.shuffle(jobs)
    last = args.steps - args.sweep_interval - 2
    if last - WARMUP_STEPS < len(jobs):
        raise SystemExit(f"tvm-canary demo: --steps {args.steps} leaves too few steps for {len(jobs)} faults")
    steps = sorted(rng.sample(range(WARMUP_STEPS, last), len(jobs)))
    return [(s, kind, group) for s, (kind, group) in zip(steps, jobs)]


def _session(args: argparse.Namespace, engine: Engine) -> CanarySession:
    """The canary over the engine's pools: FULL (+ SWA) groups, token check on, quiet violation mode."""
    cfg = engine.cfg
    swa = None
    if args.swa:
        swa = CanaryGroup(num_slots=cfg.num_slots, k_sources=engine.swa_kv.sources("K"),
                          v_sources=engine.swa_kv.sources("V"), swa_window_size=cfg.swa_window,
                          full_to_swa_index_mapping=engine.lut)
    session = CanarySession(
        full=CanaryGroup(num_slots=cfg.num_slots, k_sources=engine.full_kv.sources("K"),
                         v_sources=engine.full_kv.sources("V")),
        swa=swa,
        device=engine.req_to_token.device,
        write_req_capacity=cfg.max_running,
        write_entry_capacity=cfg.max_running * cfg.chunk_size,
        real_kv_hash_mode=RealKvHashMode[args.real_kv.upper()],
        expected_token_pool_shape=tuple(engine.req_to_token.shape),
        sweep_interval=args.sweep_interval,
        health_warmup_steps=HEALTH_WARMUP_STEPS,
        health_check_interval=max(HEALTH_CHECK_INTERVAL, args.sweep_interval),
        violation_mode="quiet",
    )
    session.mark_init_finished()
    return session


def run(args: argparse.Namespace) -> int:
    if args.sweep_interval < 1:
        raise SystemExit("tvm-canary demo: --sweep-interval must be >= 1 (stale chains are found by the sweep)")
    if args.swa and args.window < 1:
        raise SystemExit("tvm-canary demo: --window must be >= 1")
    device = torch.device(args.device)
    cfg = EngineConfig(num_slots=args.slots, max_running=args.max_running, swa_window=args.window if args.swa else 0)
    engine = Engine(cfg, seed=args.seed, device=device)
    session = _session(args, engine)
    if args.cuda_graph and device.type != "cuda":
        raise SystemExit("tvm-canary demo: --cuda-graph needs --device cuda")
    graph = None
    if args.cuda_graph:
        graph = session.capture_step(batch_size=cfg.max_running, num_tokens=cfg.max_running * cfg.chunk_size,
                                     req_to_token=engine.req_to_token)
    rng = random.Random(args.seed + 1)
    pending = _schedule(args, rng)
    tracker = FaultTracker()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    canary_seconds: dict[str, list[float]] = {"eager": []} | ({"CUDA graph": []} if graph else {})  # per step
    for step in tqdm(range(1, args.steps + 1), desc="demo", unit="step", disable=args.no_progress, file=sys.stderr):
        batch = engine.schedule()
        inputs = engine.canary_inputs(batch)
        if graph is not None and step % 2 == 0:
            engine.forward(batch)  # before the graph: its HEAD launches read no KV
            engine.commit(batch)
            sync()
            t0 = t1 = t2 = time.perf_counter()  # canary time = from here to the end of the step
            graph.replay(**inputs)
            way = "CUDA graph"
        else:
            t0 = time.perf_counter()
            session.before_forward(**inputs)
            sync()
            t1 = time.perf_counter()
            engine.forward(batch)
            engine.commit(batch)
            sync()
            t2 = time.perf_counter()
            session.after_forward()
            way = "eager"
        if session.sweep_due:
            session.sweep(engine.live_chains())
        report = session.flush()  # waits for the device: faults are attributed in the step that found them
        canary_seconds[way].append(t1 - t0 + time.perf_counter() - t2)
        for fault in tracker.attribute(report, engine, step):
            for victim in fault.victims:
                engine.abort(victim)
        engine.end_step()
        if pending and pending[0][0] <= step:
            fault = inject(pending[0][1], pending[0][2], engine, session, rng)
            if fault is not None:
                tracker.faults.append(fault)
                pending.pop(0)
    print(_report(args, tracker, pending, canary_seconds))
    ok = not pending and not tracker.false_positives and all(f.detected_at is not None for f in tracker.faults)
    return 0 if ok else 1


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _fault_row(i: int, f: Fault) -> list[str]:
    detected = "MISSED" if f.detected_at is None else str(f.detected_at)
    return [str(i), f.kind, f.group, str(f.injected_at), f.target, detected,
            ",".join(sorted(f.tags)) or "-", ",".join(sorted(f.reasons)) or "-"]


def _report(
    args: argparse.Namespace, tracker: FaultTracker, pending: list, canary_seconds: dict[str, list[float]]
) -> str:
    header = ["#", "fault", "group", "after step", "target", "detected at", "launch tags", "fail reasons"]
    rows = [_fault_row(i, f) for i, f in enumerate(tracker.faults, 1)]
    rows += [[str(len(rows) + i), kind, group, "-", "never injected (no target)", "MISSED", "-", "-"]
             for i, (_, kind, group) in enumerate(pending, 1)]
    detected = sum(1 for f in tracker.faults if f.detected_at is not None)
    out = [
        f"tvm-canary demo: {args.steps} steps, seed {args.seed}, device {args.device}, backend {current_backend()}, "
        f"real-KV {args.real_kv}, SWA {'window ' + str(args.window) if args.swa else 'off'}",
        "",
        _table(header, rows),
        "",
        f"faults detected: {detected}/{len(rows)}",
        f"false positives: {len(tracker.false_positives)}",
        *(f"  step {step}: {line}" for step, line in tracker.false_positives),
        *(f"canary time per step{'' if len(canary_seconds) == 1 else f' ({way}, {len(times)} steps)'}: "
          f"median {1e3 * statistics.median(times):.3f} ms, mean {1e3 * statistics.fmean(times):.3f} ms "
          "(kernel compile/load counted in the first steps)"
          for way, times in canary_seconds.items()),
    ]
    return "\n".join(out)
