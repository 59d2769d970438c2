"""Kernel benchmarks on a CUDA GPU, each beside its physical floor measured in the same run.

Times are medians of CUDA-graph replays (each replay launches the kernel on several rotating input
sets, so small inputs do not sit in L2 across launches), divided by the launches per replay.
Columns: time, bytes moved (model below), achieved GB/s, floor (what bounds the kernel), ratio
time/floor, and the speedup over the torch reference (``tvm_canary.reference``) on the same GPU.

Byte model, verify: 24 B of plan vectors (+8 with the token check) + the slot's 32 B sector + the
predecessor's 32 B sector + per source one 32 B sector (PARTIAL) or ``read_bytes`` (ALL). Write: 24 B
of token vectors read + 32 B stamped per token. Plan: 32 B written per verify entry + 4 B of table read.
Scatter: 8 B read + 4 B written per token.

    python benchmarks/bench_kernels.py [--quick] [--kernels verify write plan scatter] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import tvm_canary as tc
from tvm_canary import reference
from tvm_canary.consts import RealKvHashMode
from tvm_canary.runtime import targets

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import floors  # noqa: E402

DEV = torch.device("cuda", 0)
KV_BYTES = 256  # bytes per token per source (K and V)


def graph_time_us(calls, iters=15) -> float:
    """Median µs per call of ``calls`` (zero-argument launches) replayed in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for c in calls:
            c()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(calls))
    return statistics.median(times)


def once_us(fn) -> float:
    """µs of one eager call (after one warm-up), for the slow torch reference (NaN if out of memory)."""
    try:
        fn()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return float("nan")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000


def copy_floor_us(nbytes: int) -> float:
    """Dense device-to-device copy moving ``nbytes`` (half read, half written)."""
    src = torch.empty(max(nbytes // 2, 16), dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return graph_time_us([lambda: dst.copy_(src)])


class Pool:
    """A canary buffer of ``slots`` slots and a K/V pool (two sources, page size 1)."""

    def __init__(self, slots: int):
        self.slots = slots
        self.canary = torch.zeros(slots, 32, dtype=torch.uint8, device=DEV)
        self.kv = torch.randint(-(2**62), 2**62, (2 * slots, KV_BYTES // 8), dtype=torch.int64, device=DEV)
        self.ring = torch.zeros(1024, 8, dtype=torch.int64, device=DEV)
        self.widx = torch.zeros(1, dtype=torch.int32, device=DEV)
        self.counters = torch.zeros(2, dtype=torch.int64, device=DEV)
        self.cpa = torch.zeros(1, dtype=torch.int32, device=DEV)

    def context(self, mode: RealKvHashMode):
        sources = ()
        if mode != RealKvHashMode.NONE:
            sources = tuple(
                tc.RealKvSource(tensor=half, page_size=1, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES)
                for half in (self.kv[: self.slots], self.kv[self.slots :])
            )
        return tc.VerifyOrWriteContext(
            canary_buf=self.canary, kernel_kind=tc.CanaryLaunchTag.TAIL_K_FULL, violation_ring=self.ring,
            violation_write_index=self.widx, slot_run_counter=self.counters[0:1], kernel_run_counter=self.counters[1:2],
            real_kv_sources=sources, real_kv_hash_mode=mode, enable_chain_position_assert=self.cpa,
        )


def write_args(pool, mode, slots_2d, ids):
    """Write launch arguments for requests = rows of ``slots_2d`` (positions 0.., anchor seeds)."""
    reqs, length = slots_2d.shape
    plan = tc.WritePlan.allocate(write_req_capacity=reqs, device=DEV)
    plan.write_offsets.copy_(torch.arange(reqs + 1, device=DEV) * length)
    plan.write_seed_slot_indices.fill_(-1)
    plan.write_num_valid_reqs.fill_(reqs)
    pos = torch.arange(length, device=DEV).repeat(reqs)
    return dict(
        context=pool.context(mode), plan=plan, input_ids=ids.reshape(-1), positions=pos,
        out_cache_loc=slots_2d.reshape(-1).contiguous(), enable_write_input_assert=False,
        expected_input_tokens=None, expected_input_positions=None,
    )


def stamp_chains(pool, mode, order):
    """Stamp every slot as chains of 4096 tokens; returns (slots [chains, L], ids) in chain order."""
    n = pool.slots - 1
    perm = (torch.randperm(n, device=DEV) if order == "random" else torch.arange(n, device=DEV)) + 1
    length = 4096
    slots_2d = perm[: n // length * length].view(-1, length)
    ids = torch.randint(0, 150000, slots_2d.shape, device=DEV)
    tc.launch_canary_write_kernel(**write_args(pool, mode, slots_2d, ids))
    torch.cuda.synchronize()
    if int(pool.widx) != 0:
        print(f"WARNING: stamping flagged {int(pool.widx)} violations", flush=True)
        pool.widx.zero_()
    return slots_2d, ids


def verify_plans(slots_2d, ids, n, order, sets, check):
    chains, length = slots_2d.shape
    plans = []
    for _ in range(sets):
        if order == "random":
            flat = torch.randperm(chains * length, device=DEV)[:n]
        else:
            flat = torch.arange(n, device=DEV) + torch.randint(0, chains * length - n + 1, (1,), device=DEV)
        r, p = flat // length, flat % length
        plan = tc.VerifyPlan.allocate(verify_capacity=n, device=DEV)
        plan.verify_slot_indices.copy_(slots_2d[r, p])
        plan.verify_prev_slot_indices.copy_(torch.where(p > 0, slots_2d[r, (p - 1).clamp(min=0)], -1))
        plan.verify_expected_positions.copy_(p)
        plan.verify_expected_tokens.copy_(ids[r, p] if check else torch.full_like(p, -1))
        plan.verify_num_valid.fill_(n)
        plans.append(plan)
    return plans


def verify_rows(pool, quick):
    rows = []
    sizes = [1 << 10, 1 << 12, 1 << 16, 1 << 20] + ([] if quick else [1 << 22, 1 << 24])
    geom = targets.default_geometry("verify", targets.tag_for(DEV))
    arch = targets.cuda_arch(0)
    for mode in (RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL):
        for order in ("random", "chain"):
            slots_2d, ids = stamp_chains(pool, mode, order)
            ctx = pool.context(mode)
            fold_words = 0 if mode == RealKvHashMode.NONE else (2 if mode == RealKvHashMode.PARTIAL else KV_BYTES // 8)
            n_src = len(ctx.real_kv_sources)
            gather = floors.compile_cuda(floors.gather(geom, fold_words, False, n_src), arch)
            out = torch.empty(geom.blocks * geom.threads, dtype=torch.int64, device=DEV)
            for n in sizes:
                plans = verify_plans(slots_2d, ids, n, order, 4 if n <= (1 << 20) else 2, False)
                t = graph_time_us([lambda p=p: tc.launch_canary_verify_kernel(context=ctx, plan=p, check_verify_expected_token=False) for p in plans])
                if int(pool.widx) != 0:
                    print(f"WARNING: verify {mode.name} {order} {n} flagged {int(pool.widx)} violations", flush=True)
                    pool.widx.zero_()
                g = graph_time_us([lambda p=p: gather(tc.runtime.packing.canary_words(pool.canary), p.verify_slot_indices, p.verify_expected_tokens,
                                                      p.verify_expected_positions, p.verify_prev_slot_indices, p.verify_num_valid, pool.kv, out) for p in plans])
                src_bytes = n_src * (32 if mode == RealKvHashMode.PARTIAL else KV_BYTES) if n_src else 0
                nbytes = n * (24 + 32 + 32 + src_bytes)
                ref = once_us(lambda: reference.canary_verify_ref(context=ctx, plan=plans[0], check_verify_expected_token=False)) if n <= (1 << 24) else float("nan")
                rows.append(dict(kernel="verify", case=f"{mode.name} {order} {n}", us=t, bytes=nbytes, floor="gather", floor_us=g, ref_us=ref))
                del plans
    return rows


def write_rows(pool, chain_ns, empty_us):
    rows = []
    n = pool.slots - 1
    for reqs, length in ((4096, 1), (64, 512), (1, 32768)):
        for mode in (RealKvHashMode.NONE, RealKvHashMode.PARTIAL):
            sets = [write_args(pool, mode, (torch.randperm(n, device=DEV)[: reqs * length] + 1).view(reqs, length),
                               torch.randint(0, 150000, (reqs, length), device=DEV)) for _ in range(4)]
            t = graph_time_us([lambda a=a: tc.launch_canary_write_kernel(**a) for a in sets], iters=7)
            floor = chain_ns * length / 1000 + empty_us
            ref = once_us(lambda: reference.canary_write_ref(**sets[0]))
            rows.append(dict(kernel="write", case=f"{mode.name} {reqs}x{length}", us=t, bytes=reqs * length * 56,
                             floor=f"chain {chain_ns:.1f}ns/step", floor_us=floor, ref_us=ref))
    return rows


def plan_rows():
    rows = []
    for bs, prefix in ((64, 2048), (1024, 2048), (4096, 2048)):
        r2t = torch.randint(1, 1 << 24, (bs + 1, 4096), dtype=torch.int32, device=DEV)
        total = bs * prefix
        kw = dict(
            req_pool_indices=torch.arange(1, bs + 1, device=DEV), prefix_lens=torch.full((bs,), prefix, device=DEV),
            extend_seq_lens=torch.ones(bs, dtype=torch.int64, device=DEV), req_to_token=r2t, swa_window_size=0,
            full_to_swa_index_mapping=None, verify_capacity=total, req_to_verify_expected_tokens=None,
            req_to_verify_expected_tokens_valid_lens=None, kv_token_id_vs_position_offset=0,
        )
        sets = [dict(kw, verify_plan_out=tc.VerifyPlan.allocate(verify_capacity=total, device=DEV),
                     write_plan_out=tc.WritePlan.allocate(write_req_capacity=bs, device=DEV)) for _ in range(2)]
        t = graph_time_us([lambda a=a: tc.launch_canary_plan_kernels(**a) for a in sets])
        nbytes = total * 36
        ref = once_us(lambda: reference.canary_plan_ref(**sets[0]))
        rows.append(dict(kernel="plan", case=f"bs{bs} prefix{prefix}", us=t, bytes=nbytes, floor="copy", floor_us=copy_floor_us(nbytes), ref_us=ref))
    return rows


def scatter_rows():
    rows = []
    for bs, length in ((256, 1024), (4096, 1024)):
        flat = torch.randint(0, 150000, (bs * length,), device=DEV)
        offsets = torch.arange(bs + 1, device=DEV) * length
        rpi = torch.randperm(bs, device=DEV) + 1
        pools = [torch.zeros(bs + 1, length, dtype=torch.int32, device=DEV) for _ in range(2)]
        t = graph_time_us([lambda p=p: tc.launch_scatter_req_token_ids_kernel(flat_in=flat, offsets=offsets, req_pool_indices=rpi, pool_out=p) for p in pools])
        nbytes = bs * length * 12
        ref = once_us(lambda: reference.scatter_req_token_ids_ref(flat_in=flat, offsets=offsets, req_pool_indices=rpi, pool_out=pools[0]))
        rows.append(dict(kernel="scatter", case=f"bs{bs}x{length}", us=t, bytes=nbytes, floor="copy", floor_us=copy_floor_us(nbytes), ref_us=ref))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    ap.add_argument("--kernels", nargs="+", choices=("verify", "write", "plan", "scatter"), default=("verify", "write", "plan", "scatter"))
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    arch = targets.cuda_arch(0)
    flag = torch.zeros(1, dtype=torch.int32, device=DEV)
    empty = floors.compile_cuda(floors.empty(), arch)
    empty_us = graph_time_us([lambda: empty(flag)] * 8)
    chain = floors.compile_cuda(floors.chain(), arch)
    acc = torch.zeros(1, dtype=torch.int64, device=DEV)
    chain_ns = (graph_time_us([lambda: chain(acc, 32768)]) - empty_us) * 1000 / 32768
    pool = Pool(1 << 22 if args.quick else 1 << 25)
    sweeps = {"verify": lambda: verify_rows(pool, args.quick), "write": lambda: write_rows(pool, chain_ns, empty_us),
              "plan": plan_rows, "scatter": scatter_rows}
    rows = [row for kernel in args.kernels for row in sweeps[kernel]()]
    print(f"\n{torch.cuda.get_device_name(0)} ({arch}); empty launch {empty_us:.2f} us; register-only chain {chain_ns:.1f} ns/step")
    print(f"{'kernel':8} {'case':24} {'time us':>10} {'MB':>9} {'GB/s':>7} {'floor':>22} {'floor us':>10} {'ratio':>6} {'ref us':>12} {'speedup':>8}")
    for r in rows:
        r["gbps"] = r["bytes"] / r["us"] / 1e3
        r["ratio"] = r["us"] / r["floor_us"]
        r["speedup"] = r["ref_us"] / r["us"]
        print(f"{r['kernel']:8} {r['case']:24} {r['us']:10.1f} {r['bytes'] / 1e6:9.2f} {r['gbps']:7.0f} {r['floor']:>22} "
              f"{r['floor_us']:10.1f} {r['ratio']:6.2f} {r['ref_us']:12.0f} {r['speedup']:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(0), arch=arch, empty_us=empty_us, chain_ns=chain_ns, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
