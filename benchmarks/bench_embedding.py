"""Canary cost of one decode step through ``CanarySession``, eager vs one replayed CUDA graph (GPU).

Workload: ``bs`` requests (1, 64, 256) with ``CONTEXT`` cached tokens each decode one token per step (one step repeated
after a prefill, each verifying ``bs * CONTEXT`` clean entries per endpoint). Groups: FULL, or FULL + SWA (window
``WINDOW``); K and V halves; ``SOURCES`` real-KV sources per half of ``KV_BYTES`` bytes per token, PARTIAL mode; the
expected-token check on (every step scatters all known tokens, as ``before_forward`` does).

Columns:
* eager wall: µs per step of back-to-back ``before_forward`` + ``after_forward`` (host-bound if the
  host is slower than the kernels); eager stream: CUDA-event time of one step (with the host's
  enqueueing gaps).
* graph wall / graph stream: the same for ``StepGraph.replay`` (inputs refilled from device tensors:
  one concatenation and the scatter offsets' cumsum before the graph, the status snapshot after it);
  graph only: CUDA-event time of the bare graph replay, held (``tvm_canary.timing``: the host's
  submission of the graph is untimed, as in the floors).
* device ops: kernels, copies and memsets of one eager step (profiler); graph ops: those of the work
  the graph holds (its captured work run once under the profiler), and ``graph ops x empty``. A canary
  operator may be several launches (the plan kernel is two).
* empty: one empty kernel in a CUDA graph of 100, replayed held (the launch floor).
* floor sum: the summed floors of the step's canary operators (``operators``: one scatter, per group
  one plan, per endpoint, half and group one verify and one write), each measured here as
  ``benchmarks/bench_kernels.py`` measures a kernel's (``floors.py``: a kernel moving the same bytes
  in the same pattern, computing nothing; the fastest floor grid, in CUDA graphs of FLOOR_REPEATS
  launches) on the step's own tensors: verify a gather through the plan the step's plan kernel filled
  (token vector included), write a store through its write plan into a scratch canary copy, plan and
  scatter a dense copy of their bytes. Each floor runs on data as warm as the step's (same tensors,
  replayed), so the sum bounds the step's operators from below; its other torch operations (the SWA
  slot translation) count zero. (The H200 run of 2026-12-01, 5th session, timed the bare replays
  before the graph's first refill, over an empty batch, and found the step below its floors:
  ``below_floor``. They now follow a refill.) The ratio graph only / floor sum is the issue's "within
  2x" figure; a step faster than its floor sum beyond noise (``BELOW_FLOOR_RATIO``) is flagged
  ``below_floor``: its floors are no lower bounds, the ratio bounds nothing. The JSON's ``floor_ops``
  lists each operator's floor (a floor kernel's with ``device_us``, one launch's device time in its
  fastest grid) beside ``graph_op_times``, each device operation of one graph replay with its device
  time (profiler).
* model floor: the same sum modeled, not measured, per operator one empty launch + bytes / HBM
  bandwidth (a measured device copy), bytes by benchmarks/bench_kernels.py's byte model (verify: 24 B
  plan + 8 B token + 32 B slot + 32 B predecessor + 32 B per PARTIAL source per entry; write: 24 B read
  + 32 B stamped + 32 B per source per token; plan: 32 B per verify entry + 4 B table; scatter: 12 B
  per token). It ignores latency: a verify's dependent loads (plan, slot, predecessor) are three memory
  round trips no byte count shows, so at small batches it is well below the measured floors. Runs
  before 2026-12-01 report only this model, named ``floor_sum``.
Then the host overhead of one eager public launch (verify, nothing to check) and its parts;
``--host-only`` measures only that, on the GPU if there is one, else on the CPU.

    python benchmarks/bench_embedding.py [--quick] [--host-only] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

import tvm_canary as tc
from tvm_canary import checks, ops
from tvm_canary.consts import RealKvHashMode
from tvm_canary.runtime import get_kernel, packing, targets
from tvm_canary.runtime.compile import ensure_cuda_runtime
from tvm_canary.session import CanaryGroup, CanarySession
from tvm_canary.timing import graph_time_us, median_us

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_kernels  # noqa: E402
import floors  # noqa: E402
import verdicts  # noqa: E402

DEV = torch.device("cuda", 0)
CONTEXT, WINDOW, SOURCES, KV_BYTES, PAGE = 512, 128, 2, 256, 16
BATCHES = (1, 64, 256)
FLOOR_REPEATS = 8  # launches per CUDA graph when a floor kernel is timed (as bench_kernels' copy floor)


def wall_us(fn, iters: int) -> float:
    """µs per call of ``iters`` back-to-back calls, synchronised once at the end."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


def device_ops(fn) -> list[dict]:
    """The kernels, copies and memsets one call of ``fn`` runs on the device, in order, with their device
    time (profiler; also a replayed CUDA graph's kernels where CUPTI traces graphs)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    return [dict(name=e.name[:80], us=e.time_range.elapsed_us()) for e in events]


def kv_pool(slots: int, device: torch.device) -> torch.Tensor:
    """Random KV bytes for SOURCES sources covering ``slots`` slots: ``uint8[SOURCES * pages, PAGE *
    KV_BYTES]``, source ``s`` the ``s``-th block of ``pages`` rows (PAGE slots of KV_BYTES per row)."""
    return torch.randint(0, 256, (SOURCES * (slots // PAGE + 1), PAGE * KV_BYTES), dtype=torch.uint8, device=device)


def sources(kv: torch.Tensor) -> tuple:
    """The SOURCES real-KV sources of a ``kv_pool``: its row blocks."""
    return tuple(tc.RealKvSource(tensor=part, page_size=PAGE, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES)
                 for part in kv.chunk(SOURCES))


@dataclasses.dataclass(frozen=True)
class Operator:
    """One canary operator of the step: what it is, its byte model (module docstring) and its floor, a
    ``bench_kernels.Bench`` floor kernel (``floor``: a ``Bench.floor_makers`` name, or "copy": the dense
    copy of ``nbytes``) with ``args``, the step's own tensors (a scratch canary where the floor stores)."""

    what: str
    nbytes: int
    floor: str
    args: tuple = ()


class Workload:
    """A session over ``bs`` requests with CONTEXT cached tokens, prefilled, and one decode batch."""

    def __init__(self, bs: int, swa: bool) -> None:
        self.bs = bs
        slots = bs * (CONTEXT + 8) + 1
        rows = torch.arange(1, bs + 1, device=DEV)
        table = torch.zeros(bs + 1, CONTEXT + 8, dtype=torch.int32, device=DEV)
        table[1:] = (torch.randperm(slots - 1, device=DEV)[: bs * (CONTEXT + 8)] + 1).view(bs, -1).int()
        self.table = table
        self.kv = {(group, half): kv_pool(slots, DEV) for group in ("FULL", "SWA")[: 1 + swa] for half in "KV"}

        swa_group = None
        if swa:
            lut = torch.arange(slots, device=DEV)
            swa_group = CanaryGroup(num_slots=slots, k_sources=sources(self.kv["SWA", "K"]),
                                    v_sources=sources(self.kv["SWA", "V"]), swa_window_size=WINDOW,
                                    full_to_swa_index_mapping=lut)
        self.session = CanarySession(
            full=CanaryGroup(num_slots=slots, k_sources=sources(self.kv["FULL", "K"]),
                             v_sources=sources(self.kv["FULL", "V"])),
            swa=swa_group, device=DEV,
            write_req_capacity=bs, write_entry_capacity=bs * CONTEXT, verify_capacity=bs * CONTEXT,
            expected_token_pool_shape=(bs + 1, CONTEXT + 8), health_check_interval=0, violation_mode="raise",
        )
        self.session.mark_init_finished()
        self.session.before_forward(**self.batch(rows, 0, CONTEXT))  # prefill
        self.session.after_forward()
        self.decode = self.batch(rows, CONTEXT, 1)
        self.groups = ("FULL", "SWA") if swa else ("FULL",)

    def batch(self, rows, start: int, extend: int) -> dict:
        bs = self.bs
        pos = (start + torch.arange(extend, device=DEV)).repeat(bs)
        row = rows.repeat_interleave(extend, output_size=bs * extend)
        known = 1000 * rows[:, None] + torch.arange(start + extend, device=DEV)
        return dict(
            req_pool_indices=rows, prefix_lens=torch.full((bs,), start, device=DEV),
            extend_seq_lens=torch.full((bs,), extend, device=DEV), input_ids=1000 * row + pos, positions=pos,
            out_cache_loc=self.table[row, pos].long(), req_to_token=self.table, token_ids=known.flatten(),
            token_lens=torch.full((bs,), start + extend, device=DEV),
        )

    def eager_step(self) -> None:
        self.session.before_forward(**self.decode)
        self.session.after_forward()

    def operators(self) -> list[Operator]:
        """The step's canary operators in launch order (scatter; per group plan, HEAD verify + write per half;
        then TAIL verify + write per group and half), their floors' arguments taken from the session after a
        step: the plans its plan kernel filled, the decode batch, the slots it wrote (translated for SWA), the
        sources' bytes (what each floor reads: module docstring)."""
        bs, decode = self.bs, self.decode
        out = [Operator("scatter", 12 * bs * (CONTEXT + 1), "copy")]
        entries = {"FULL": bs * CONTEXT, "SWA": bs * min(WINDOW, CONTEXT)}
        # the floors' liveness output (gather), ticket flags and launch counter (unused without a ticket)
        scratch = (torch.zeros(1, dtype=torch.int64, device=DEV), torch.zeros(1, dtype=torch.int32, device=DEV),
                   torch.zeros(1, dtype=torch.int64, device=DEV))
        tail = []
        for name in self.groups:
            g = self.session._group(name)
            vp, wp = g.verify_plan, g.write_plan
            out.append(Operator(f"plan {name}", 36 * entries[name], "copy"))
            slots = g.out_cache_loc[:bs] if name == "SWA" else decode["out_cache_loc"]
            kv = {half: self.kv[name, half].view(torch.int64).view(-1, KV_BYTES // 8) for half in "KV"}
            for endpoint, in_order in (("HEAD", out), ("TAIL", tail)):
                src_bytes = 32 * SOURCES if endpoint == "TAIL" else 0
                for half in "KV":
                    ctx = g.contexts[endpoint, half]
                    mode = RealKvHashMode(ctx.real_kv_hash_mode).name
                    canary = ctx.canary_buf.view(torch.int64)
                    in_order.append(Operator(
                        f"verify {endpoint} {half} {name}", (24 + 8 + 64 + src_bytes) * entries[name],
                        f"gather-token-{mode}",
                        (canary, vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
                         vp.verify_prev_slot_indices, vp.verify_num_valid, kv[half], *scratch)))
                    in_order.append(Operator(
                        f"write {endpoint} {half} {name}", (24 + 32 + src_bytes) * bs, f"store-{mode}",
                        (canary.clone(), wp.write_offsets, wp.write_seed_slot_indices, decode["input_ids"],
                         decode["positions"], slots, kv[half], *scratch[1:])))
        return out + tail


def floor_bench(arch: str):
    """A ``bench_kernels.Bench`` for its floors only (compiled for ``arch``), with gather floors that also
    read the token vector (the step checks expected tokens)."""
    bench = bench_kernels.Bench(quick=False, ab=False, baselines=(), candidates=(), arch=arch)
    for mode in ("NONE", "PARTIAL"):
        words, n_src = bench_kernels.fold_words(mode), SOURCES if mode != "NONE" else 0
        bench.floor_makers[f"gather-token-{mode}"] = (
            lambda g, words=words, n_src=n_src: floors.gather(g, words, True, n_src))
    return bench


def floor_of(bench, op: Operator) -> dict:
    """The fastest floor of ``op``: ``floor_us`` (µs per launch) and ``floor`` (which), its floor kernel
    over the floor grids, FLOOR_REPEATS launches per CUDA graph on the step's tensors (a copy:
    ``Bench.copy_floor_us``); for a floor kernel also ``device_us`` (profiler; module docstring)."""
    if op.floor == "copy":
        us, which = bench.copy_floor_us(op.nbytes)
        return dict(what=op.what, floor_us=us, floor=which)
    us, geom = bench.fastest_floor(op.floor, lambda fn: [lambda: fn(*op.args)] * FLOOR_REPEATS)
    fn = bench.floor_kernel(op.floor, geom)
    device_us = sum(e["us"] for e in device_ops(lambda: fn(*op.args)))
    return dict(what=op.what, floor_us=us, floor=f"{op.floor} {bench_kernels.geometry_label(geom)}",
                device_us=device_us)


def hbm_bytes_per_us() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src), 10)
    return 2 * src.numel() / us


def empty_launch_us() -> float:
    ensure_cuda_runtime()
    fn = floors.compile_cuda(floors.empty(), targets.cuda_arch(0))
    x = torch.zeros(1, dtype=torch.int32, device=DEV)
    return graph_time_us([lambda: fn(x)] * 100, iters=20)


def step_row(bs: int, swa: bool, iters: int, empty_us: float, bytes_per_us: float, bench) -> dict:
    w = Workload(bs, swa)
    graph = w.session.capture_step(batch_size=bs, req_to_token=w.table)

    def replay():
        graph.replay(**w.decode)

    ops_per_step = len(device_ops(w.eager_step))
    graph_ops = len(device_ops(graph._work))  # the captured work (a repeat of the decode step)
    # The bare replays below reuse the inputs the last refill left in the graph's static buffers: refill
    # them with the decode batch first (captured, they hold zeros: an empty batch).
    replay()
    graph_only = median_us(graph.graph.replay, iters, hold=True)  # the device's time, as the floors are timed
    verified = int(w.session._group("FULL").verify_plan.verify_num_valid[0])
    assert verified == bs * CONTEXT, f"the replayed step verified {verified} entries, not {bs * CONTEXT}"
    replayed = device_ops(graph.graph.replay)  # per operation, to set beside floor_ops
    row = dict(
        bs=bs, groups="FULL+SWA" if swa else "FULL", eager_wall_us=wall_us(w.eager_step, iters),
        eager_stream_us=median_us(w.eager_step, iters), graph_wall_us=wall_us(replay, iters),
        graph_stream_us=median_us(replay, iters), graph_only_us=graph_only, device_ops=ops_per_step,
        graph_ops=graph_ops, ops_x_empty_us=graph_ops * empty_us, graph_op_times=replayed,
    )
    w.eager_step()  # the plans hold this decode step's
    operators = w.operators()
    floor_ops = [floor_of(bench, op) for op in operators]
    row.update(
        operators=len(operators), floor_sum_us=sum(f["floor_us"] for f in floor_ops),
        model_floor_us=sum(empty_us + op.nbytes / bytes_per_us for op in operators), floor_ops=floor_ops,
    )
    row.update(graph_over_floor=graph_only / row["floor_sum_us"], graph_over_model=graph_only / row["model_floor_us"])
    row["below_floor"] = row["graph_over_floor"] < verdicts.BELOW_FLOOR_RATIO  # the floors are then not lower bounds
    w.session.flush()  # raises if any step recorded a violation (the workload is clean)
    return row


def host_overhead(iters: int, device: torch.device) -> dict:
    """Host µs of one eager verify launch with nothing to check (enable 0: the kernel returns at once) on a TAIL context
    of a session like the workload's (SOURCES PARTIAL sources, token check on), and its parts. The public launch replays
    the memoised checked launch of its context and plan (``tvm_canary.eager``); a new or changed one runs the checks
    and the implementation again. Each part: the best (least disturbed by other host load) of 5 rounds of
    ``iters // 5`` back-to-back calls, after 100 warm-up calls."""
    slots = CONTEXT + 9
    session = CanarySession(full=CanaryGroup(num_slots=slots, k_sources=sources(kv_pool(slots, device)),
                                             v_sources=sources(kv_pool(slots, device))),
                            device=device, write_req_capacity=1, write_entry_capacity=CONTEXT, verify_capacity=64,
                            expected_token_pool_shape=(2, CONTEXT + 8), health_check_interval=0)
    context = session._groups[0].contexts["TAIL", "K"]
    plan = tc.VerifyPlan.allocate(verify_capacity=64, device=device).zero_for_testing_()
    kw = dict(context=context, plan=plan, check_verify_expected_token=True)
    call = packing.verify_call(**kw)
    fn, args = get_kernel(call.kernel, call.spec, call.device, call.size, call.mode), call.args
    op_args = ops.verify_args(**kw)
    parts = {
        "public_launch_us": lambda: tc.launch_canary_verify_kernel(**kw),
        "checks_us": lambda: checks.check_verify(**kw),
        "operator_us": lambda: torch.ops.tvm_canary.verify(*op_args),  # the traced path's dispatch
        "implementation_us": lambda: ops.run("verify", kw),  # what an untraced launch runs after the checks
        "ffi_call_us": lambda: fn(*args),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = {}
    for name, f in parts.items():
        for _ in range(100):
            f()
        rounds = []
        for _ in range(5):
            sync()
            t = time.perf_counter()
            for _ in range(iters // 5):
                f()
            rounds.append((time.perf_counter() - t) / (iters // 5) * 1e6)
        sync()
        out[name] = min(rounds)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--host-only", action="store_true",
                    help="only the host overhead of one eager launch (on the CPU when there is no GPU)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    host_iters = 2000 if args.quick else 20000
    if args.host_only:
        device = DEV if torch.cuda.is_available() else torch.device("cpu")
        host = host_overhead(host_iters, device)
        print(f"host overhead of one eager launch on {device}: " + ", ".join(f"{k} {v:.2f}" for k, v in host.items()))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device=str(device), host_overhead=host), f, indent=1)
        return 0
    if not torch.cuda.is_available():
        return bench_kernels.fail("bench_embedding.py needs a CUDA GPU and torch sees none; "
                                  "--host-only runs on the CPU")
    empty_us, bytes_per_us = empty_launch_us(), hbm_bytes_per_us()
    bench = floor_bench(targets.cuda_arch(0))
    iters = 20 if args.quick else 100
    rows = []
    for bs in BATCHES:
        for swa in (False, True):
            rows.append(step_row(bs, swa, iters, empty_us, bytes_per_us, bench))
            torch.cuda.empty_cache()
    host = host_overhead(host_iters, DEV)
    cols = ["bs", "groups", "eager_wall_us", "eager_stream_us", "graph_wall_us", "graph_stream_us", "graph_only_us",
            "device_ops", "graph_ops", "ops_x_empty_us", "operators", "floor_sum_us", "graph_over_floor",
            "model_floor_us", "graph_over_model", "below_floor"]
    print(f"{torch.cuda.get_device_name(0)}: empty launch {empty_us:.2f} us, HBM copy {bytes_per_us / 1e3:.0f} GB/s")
    print("  ".join(f"{c.removesuffix('_us'):>15}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]:>15.2f}" if isinstance(r[c], float) else f"{r[c]:>15}" for c in cols))
    print("host overhead of one eager launch: " + ", ".join(f"{k} {v:.2f}" for k, v in host.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(0), context=CONTEXT, window=WINDOW, sources=SOURCES,
                           kv_bytes=KV_BYTES, empty_us=empty_us, hbm_bytes_per_us=bytes_per_us, steps=rows,
                           host_overhead=host), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
