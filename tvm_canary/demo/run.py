"""``tvm-canary demo``: serve a simulated workload with the canary on, inject faults, report.

Exit status 0 only if every fault that took effect in time to be checked was detected, no other row was recorded, and
(if faults were asked for) at least one took effect: a run checking no fault shows nothing. A fault that found no
target, or whose slot was never handed out again (or only too late to be checked), is listed with the reason and not
counted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch
from tqdm import tqdm

from ..cliargs import UsageError, default_device, int_at_least, seed, torch_device
from ..consts import RealKvHashMode
from ..runtime.backend import current_backend
from ..session import CanaryGroup, CanarySession
from ..testing import KINDS, PER_GROUP_KINDS, Engine, EngineConfig, Fault, FaultTracker, inject
from ..testing.faults import NoTarget

WARMUP_STEPS = 3  # no fault before this step: requests need some cached KV first
HEALTH_WARMUP_STEPS = 10
HEALTH_CHECK_INTERVAL = 20
DEFAULT_WINDOW = 16  # --window


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="simulated serving with injected KV faults",
        description="Run a simulated serving engine with the canary on, inject KV faults at random steps and "
                    "report which launch caught each one. Exits 0 only if every fault that took effect was "
                    "detected, at least one took effect (when faults were asked for) and nothing else was "
                    "flagged.",
    )
    p.add_argument("--steps", type=int_at_least(1), default=200, help="engine steps")
    p.add_argument("--seed", type=seed, default=0, help="seed of the workload and the faults")
    p.add_argument("--device", type=torch_device, choices=("cpu", "cuda"), default=default_device(),
                   help="device of the KV pool and the canary (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--swa", action="store_true", help="add an SWA buffer group")
    p.add_argument("--window", type=int_at_least(1), default=None,
                   help=f"SWA window in tokens, with --swa (default: {DEFAULT_WINDOW})")
    p.add_argument("--real-kv", choices=("partial", "all"), default="partial", help="real-KV hash mode")
    p.add_argument("--slots", type=int_at_least(2), default=512, help="KV pool slots (slot 0 is reserved)")
    p.add_argument("--max-running", type=int_at_least(1), default=8, help="concurrent requests")
    p.add_argument("--faults-per-kind", type=int_at_least(0), default=1,
                   help=f"faults injected of each kind ({', '.join(KINDS)})")
    p.add_argument("--sweep-interval", type=int_at_least(1), default=4,
                   help="steps between sweeps of the live chains (stale chains are found by the sweep)")
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
    if jobs and last - WARMUP_STEPS < len(jobs):
        needed = len(jobs) + WARMUP_STEPS + args.sweep_interval + 2
        raise UsageError(f"--steps {args.steps} leaves too few steps for {len(jobs)} faults with --sweep-interval "
                         f"{args.sweep_interval}: give at least {needed} steps (or fewer faults, a shorter interval)")
    steps = sorted(rng.sample(range(WARMUP_STEPS, last), len(jobs)))
    return [(s, kind, group) for s, (kind, group) in zip(steps, jobs)]


def _last_checked_step(args: argparse.Namespace) -> int:
    """The last step a fault may take effect at and still be checked by a per-forward verify and a sweep."""
    return args.steps - args.sweep_interval - 1


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
    device = torch.device(args.device)
    if args.cuda_graph and device.type != "cuda":
        raise UsageError("--cuda-graph needs --device cuda")
    if args.window is not None and not args.swa:
        raise UsageError("--window needs --swa (the window of the SWA group)")
    args.window = args.window or DEFAULT_WINDOW  # unset means the default; refused above without --swa
    cfg = EngineConfig(num_slots=args.slots, max_running=args.max_running, swa_window=args.window if args.swa else 0)
    engine = Engine(cfg, seed=args.seed, device=device)
    session = _session(args, engine)
    graph = None
    if args.cuda_graph:
        graph = session.capture_step(batch_size=cfg.max_running, num_tokens=cfg.max_running * cfg.chunk_size,
                                     req_to_token=engine.req_to_token)
    rng = random.Random(args.seed + 1)
    pending = _schedule(args, rng)
    not_injected: list[tuple[str, str, str]] = []  # (kind, group, why)
    tracker = FaultTracker()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    canary_seconds: dict[str, list[float]] = {"eager": []} | ({"CUDA graph": []} if graph else {})  # per step
    last_injection = _last_checked_step(args) - 1
    for step in tqdm(range(1, args.steps + 1), desc="demo", unit="step", disable=args.no_progress,
                     file=sys.stderr):
        batch = engine.schedule()
        tracker.after_schedule(engine)
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
        report = session.flush()  # waits for the device: faults are attributed in the step finding them
        canary_seconds[way].append(t1 - t0 + time.perf_counter() - t2)
        for fault in tracker.attribute(report, engine, step):
            for victim in fault.victims:
                engine.abort(victim)
        engine.end_step()
        while pending and pending[0][0] <= step:
            _, kind, group = pending[0]
            try:
                tracker.faults.append(inject(kind, group, engine, session, rng))
            except NoTarget as why:
                if step < last_injection:
                    break  # try again after the next step
                not_injected.append((kind, group, f"not injected: {why} (tried until step {step})"))
            pending.pop(0)
            if step < last_injection:
                break  # one fault per step while steps are left; at the last one, every fault still due
    counted = [f for f in tracker.faults if _counted(f, args)]
    print(_report(args, tracker, counted, not_injected, canary_seconds))
    ok = not tracker.false_positives and all(f.detected_at is not None for f in counted)
    if args.faults_per_kind and not counted:
        print("tvm-canary demo: no injected fault took effect in time to be checked, so the run checked none "
              "(more --steps or --slots)", file=sys.stderr)
        ok = False
    return 0 if ok else 1


def _counted(fault: Fault, args: argparse.Namespace) -> bool:
    """Detected, or in place early enough that the run checked it."""
    return fault.detected_at is not None or (
        fault.active_from is not None and fault.active_from <= _last_checked_step(args)
    )


def _why_not_counted(fault: Fault) -> str:
    if fault.active_from is None:
        return f"not counted: slot {fault.slot} was never handed out again"
    return f"not counted: took effect at step {fault.active_from}, too late to be checked"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _fault_row(i: int, f: Fault, counted: bool) -> list[str]:
    if f.detected_at is not None:
        detected = str(f.detected_at)
    else:
        detected = "MISSED" if counted else _why_not_counted(f)
    return [str(i), f.kind, f.group, str(f.injected_at), f.target, detected,
            ",".join(sorted(f.tags)) or "-", ",".join(sorted(f.reasons)) or "-"]


def _report(args: argparse.Namespace, tracker: FaultTracker, counted: list[Fault],
            not_injected: list[tuple[str, str, str]], canary_seconds: dict[str, list[float]]) -> str:
    header = ["#", "fault", "group", "after step", "target", "detected at", "launch tags", "fail reasons"]
    rows = [_fault_row(i, f, f in counted) for i, f in enumerate(tracker.faults, 1)]
    rows += [[str(len(rows) + i), kind, group, "-", why, "-", "-", "-"]
             for i, (kind, group, why) in enumerate(not_injected, 1)]
    detected = sum(1 for f in counted if f.detected_at is not None)
    skipped = len(rows) - len(counted)
    out = [
        f"tvm-canary demo: {args.steps} steps, seed {args.seed}, device {args.device}, backend {current_backend()}, "
        f"real-KV {args.real_kv}, SWA {'window ' + str(args.window) if args.swa else 'off'}",
        "",
        _table(header, rows),
        "",
        f"faults detected: {detected}/{len(counted)}" + (f" ({skipped} not counted, see the table)" if skipped else ""),
        f"false positives: {len(tracker.false_positives)}",
        *(f"  step {step}: {line}" for step, line in tracker.false_positives),
        *(f"canary time per step{'' if len(canary_seconds) == 1 else f' ({way}, {len(times)} steps)'}: "
          f"median {1e3 * statistics.median(times):.3f} ms, mean {1e3 * statistics.fmean(times):.3f} ms "
          "(kernel compile/load counted in the first steps)"
          for way, times in canary_seconds.items()),
    ]
    return "\n".join(out)
