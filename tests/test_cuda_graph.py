"""CUDA graphs: plan -> verify -> write captured on a side stream, replayed on a refilled batch: the graph reads the
live inputs, so after refilling them in place and replaying, every output equals the reference run on the new batch."""

from __future__ import annotations

import pytest
import torch

import tvm_canary as tc
from tvm_canary.consts import RealKvHashMode
from tvm_canary.runtime import packing, use_backend

from tree import assert_same_bytes, tensors

pytestmark = pytest.mark.gpu

ROWS, MAX_LEN, SLOTS, BS, TOKENS = 16, 64, 4096, 8, 96


def batch(gen):
    """One step's inputs (CPU): tables, lengths and flat token tensors of TOKENS entries."""
    r2t = torch.randperm(SLOTS - 1, generator=gen)[: ROWS * MAX_LEN].add(1).to(torch.int32).view(ROWS, MAX_LEN)
    rpi = torch.randperm(ROWS - 1, generator=gen)[:BS].add(1)
    rpi[-1] = 0  # a CUDA-graph padding row
    prefix = torch.randint(0, MAX_LEN // 2, (BS,), generator=gen)
    ext = torch.randint(1, TOKENS // BS, (BS,), generator=gen)
    ext[-1] = 0
    n = int(ext.sum())
    tail = [torch.zeros(TOKENS - n, dtype=torch.int64)]
    pos = torch.cat([torch.arange(int(p), int(p) + int(e)) for p, e in zip(prefix, ext)] + tail)
    row = torch.cat([torch.full((int(e),), int(r)) for r, e in zip(rpi, ext)] + tail)
    ocl = r2t[row, pos].to(torch.int64)
    ocl[n:] = -1
    ids = torch.randint(0, 50000, (TOKENS,), generator=gen)
    kv = torch.randint(0, 256, (SLOTS, 64), generator=gen, dtype=torch.uint8)
    return dict(r2t=r2t, rpi=rpi, prefix=prefix, ext=ext, pos=pos, ocl=ocl, ids=ids, kv=kv)


def state(device, inputs):
    ctx_tensors = dict(
        canary=torch.zeros(SLOTS, 32, dtype=torch.uint8),
        ring=torch.full((64, 8), -7777, dtype=torch.int64),
        widx=torch.zeros(1, dtype=torch.int32),
        slot_ctr=torch.zeros(1, dtype=torch.int64),
        kern_ctr=torch.zeros(1, dtype=torch.int64),
        cpa=torch.ones(1, dtype=torch.int32),
    )
    return {k: v.to(device) for k, v in {**ctx_tensors, **inputs}.items()}


def step(s, vp, wp):
    """plan -> verify -> write on the tensors of state ``s``."""
    src = tc.RealKvSource(tensor=s["kv"], page_size=1, num_bytes_per_token=64, read_bytes=64)
    ctx = tc.VerifyOrWriteContext(
        canary_buf=s["canary"], kernel_kind=tc.CanaryLaunchTag.TAIL_K_FULL, violation_ring=s["ring"],
        violation_write_index=s["widx"], slot_run_counter=s["slot_ctr"], kernel_run_counter=s["kern_ctr"],
        real_kv_sources=(src,), real_kv_hash_mode=RealKvHashMode.ALL, enable_chain_position_assert=s["cpa"],
    )
    tc.launch_canary_plan_kernels(
        verify_plan_out=vp, write_plan_out=wp, req_pool_indices=s["rpi"], prefix_lens=s["prefix"],
        extend_seq_lens=s["ext"], req_to_token=s["r2t"], swa_window_size=0, full_to_swa_index_mapping=None,
        verify_capacity=vp.verify_slot_indices.shape[0], req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None, kv_token_id_vs_position_offset=0,
    )
    tc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=False)
    tc.launch_canary_write_kernel(
        context=ctx, plan=wp, input_ids=s["ids"], positions=s["pos"], out_cache_loc=s["ocl"],
        enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None,
    )


def plans(device):
    return (tc.VerifyPlan.allocate(verify_capacity=1024, device=device),
            tc.WritePlan.allocate(write_req_capacity=BS, device=device))


def test_graph_replay_reads_live_inputs():
    gen = torch.Generator().manual_seed(0)
    s = state("cuda", batch(gen))
    vp, wp = plans("cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(s, vp, wp)  # warm-up: compiles and allocates scratch outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        step(s, vp, wp)

    fresh = state("cpu", batch(gen))
    fresh["canary"] = torch.randint(0, 256, (SLOTS, 32), generator=gen, dtype=torch.uint8)
    for k, v in fresh.items():
        s[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()

    want_vp, want_wp = plans("cpu")
    with use_backend("reference"):
        step(fresh, want_vp, want_wp)
    got = [s[k] for k in sorted(s)] + tensors(wp) + [vp.verify_num_valid, vp.enable]
    want = [fresh[k] for k in sorted(fresh)] + tensors(want_wp) + [want_vp.verify_num_valid, want_vp.enable]
    assert_same_bytes(got, want)
    n = int(want_vp.verify_num_valid)
    assert_same_bytes([t[:n] for t in tensors(vp)[:4]], [t[:n] for t in tensors(want_vp)[:4]])
    assert int(s["widx"]) > 0  # the refilled canary is random bytes: verify flagged rows


def test_capture_without_warm_up_keeps_its_scratch():
    """Scratch a launch first needs during a capture is its graph's own (``packing.flags_for``): an eager
    launch on that ring before the graph's first replay must not find it (the capture's pool holds -1
    words first: a kept scratch would hand it nonzero marks and ticket)."""
    gen = torch.Generator().manual_seed(1)
    step(state("cuda", batch(gen)), *plans("cuda"))  # loads the modules outside the capture, on another ring
    s, (vp, wp) = state("cuda", batch(gen)), plans("cuda")
    before = {k: v.cpu() for k, v in s.items()}
    pool, side = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    stale = torch.cuda.CUDAGraph()
    with torch.cuda.graph(stale, pool=pool, stream=side):
        junk = [torch.full((1 << 17,), -1, dtype=torch.int32, device="cuda") for _ in range(4)]  # a 2 MiB segment
    del junk
    stale.replay()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        step(s, vp, wp)
    torch.cuda.synchronize()
    assert not any(bool(f.any()) for f in packing.flags_of(s["ring"]))

    step(s, vp, wp)
    graph.replay()
    torch.cuda.synchronize()
    want_vp, want_wp = plans("cpu")
    with use_backend("reference"):
        step(before, want_vp, want_wp)
        step(before, want_vp, want_wp)
    assert_same_bytes([s[k] for k in sorted(s)] + tensors(wp), [before[k] for k in sorted(before)] + tensors(want_wp))
    assert int(s["widx"]) > 0  # the prefixes were never written: verify flagged rows
