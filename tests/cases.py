"""Seeded random inputs for the differential and memory-safety fuzz tests: the generators live in
``tvm_canary.cases`` (shared with ``tvm-canary conformance`` and ``tvm-canary fuzz``)."""

from tvm_canary.cases import (
    CASES,
    context_for,
    plan_case,
    scatter_case,
    verify_case,
    write_case,
)

<<<<<<< HEAD
__all__ = ["CASES", "context_for", "plan_case", "scatter_case", "verify_case", "write_case"]
=======
from __future__ import annotations

import torch

import tvm_canary as tc
from tvm_canary.consts import RealKvHashMode

from helpers import random_source


def _ints(gen, lo, hi, n, device):
    return torch.randint(lo, hi, (n,), generator=gen).to(device)


def _one(gen, lo, hi):
    return int(torch.randint(lo, hi, (1,), generator=gen))


def context_for(gen, device, num_slots, *, ring_rows=None, write_index=None, sources_max=4):
    mode = RealKvHashMode(_one(gen, 0, 3))
    n_src = _one(gen, 0, sources_max + 1)
    sources = []
    for _ in range(n_src):
        page, nbpt = [1, 4, 16][_one(gen, 0, 3)], 32 * _one(gen, 1, 3)
        sources.append(
            random_source(
                gen,
                rows=num_slots // page + 1,
                page_size=page,
                nbpt=nbpt,
                read_bytes=16 * _one(gen, 1, nbpt // 16 + 1),
                row_stride_bytes=page * nbpt + 16 * _one(gen, 0, 3),
                device=device,
            )
        )
    sources = tuple(sources)
    if not sources and mode == RealKvHashMode.ALL:
        mode = RealKvHashMode.NONE  # ALL needs sources (SPEC D9); PARTIAL without sources folds nothing
    buf = torch.randint(0, 256, (num_slots, 32), generator=gen, dtype=torch.uint8).to(device)
    return tc.VerifyOrWriteContext(
        canary_buf=buf,
        kernel_kind=tc.CanaryLaunchTag(_one(gen, 0, 12)),
        violation_ring=torch.full((ring_rows or _one(gen, 1, 64), 8), -7777, dtype=torch.int64, device=device),
        violation_write_index=torch.tensor([write_index if write_index is not None else _one(gen, 0, 8)],
                                           dtype=torch.int32, device=device),
        slot_run_counter=torch.tensor([_one(gen, 0, 100)], dtype=torch.int64, device=device),
        kernel_run_counter=torch.tensor([_one(gen, 0, 100)], dtype=torch.int64, device=device),
        real_kv_sources=sources,
        real_kv_hash_mode=mode,
        enable_chain_position_assert=torch.tensor([_one(gen, 0, 2)], dtype=torch.int32, device=device),
    )


def verify_case(gen, device, valid=True):
    S = _one(gen, 2, 600)
    ctx = context_for(gen, device, S)
    cap = _one(gen, 1, 3000)
    plan = tc.VerifyPlan.allocate(verify_capacity=cap, device=device)
    lo, hi = (-2, S) if valid else (-(2**40), 2**40)
    plan.verify_slot_indices.copy_(_ints(gen, lo if not valid else 0, hi, cap, device))
    plan.verify_prev_slot_indices.copy_(_ints(gen, lo, hi, cap, device))
    plan.verify_expected_tokens.copy_(_ints(gen, -1, 3, cap, device))
    plan.verify_expected_positions.copy_(_ints(gen, -1, 3, cap, device))
    plan.verify_num_valid.fill_(_one(gen, -3, cap + 5) if not valid else _one(gen, 0, cap + 1))
    plan.enable.fill_(int(_one(gen, 0, 8) != 0))
    return dict(context=ctx, plan=plan, check_verify_expected_token=bool(_one(gen, 0, 2)))


def write_case(gen, device, valid=True):
    S = _one(gen, 90, 600)
    ctx = context_for(gen, device, S)
    cap = _one(gen, 1, 40)
    n = _one(gen, 0, S // 2)
    perm = torch.randperm(S, generator=gen)
    slots, seeds = perm[:n].clone(), perm[n : n + cap].clone()
    seeds[_ints(gen, 0, cap, cap // 3 + 1, "cpu")] = -1
    if valid:
        lens = torch.randint(0, 2 * n // cap + 2, (cap,), generator=gen)
        off = torch.zeros(cap + 1, dtype=torch.int64)
        off[1:] = torch.cumsum(lens, 0).clamp(max=n)
        slots[torch.randint(0, max(n, 1), (n // 8,), generator=gen)] = -1
    else:
        off = torch.randint(-(2**40), 2**40, (cap + 1,), generator=gen)
        off[torch.randint(0, cap + 1, (cap // 2 + 1,), generator=gen)] %= max(n, 1)
        seeds = torch.randint(-(2**40), 2**40, (cap,), generator=gen)
        slots = torch.randint(-(2**40), 2**40, (n,), generator=gen)
    plan = tc.WritePlan.allocate(write_req_capacity=cap, device=device)
    plan.write_offsets.copy_(off.to(device))
    plan.write_seed_slot_indices.copy_(seeds.to(device))
    plan.write_num_valid_reqs.fill_(_one(gen, 0, cap + 1) if valid else _one(gen, -5, cap + 10))
    assert_on = bool(_one(gen, 0, 2))
    ids = _ints(gen, 0, 5, n, device)
    pos = _ints(gen, 0, 40, n, device)
    return dict(
        context=ctx,
        plan=plan,
        input_ids=ids,
        positions=pos,
        out_cache_loc=slots.to(device),
        enable_write_input_assert=assert_on,
        expected_input_tokens=(ids + _ints(gen, 0, 2, n, device)) if assert_on else None,
        expected_input_positions=(pos + _ints(gen, 0, 2, n, device)) if assert_on else None,
    )


def plan_case(gen, device, valid=True):
    rows, L = _one(gen, 2, 20), _one(gen, 1, 50)
    bs = _one(gen, 0, 24)
    has_lut, has_pool = bool(_one(gen, 0, 2)), bool(_one(gen, 0, 2))
    full = 200
    r2t = _ints(gen, 1, full, rows * L, device).to(torch.int32).view(rows, L)
    if valid:
        rpi = _ints(gen, 0, rows, bs, device)
        prefix, ext = _ints(gen, 0, L + 3, bs, device), _ints(gen, -1, 6, bs, device)
    else:
        rpi = _ints(gen, -5, rows + 5, bs, device)
        prefix, ext = _ints(gen, -(2**40), 2**40, bs, device), _ints(gen, -(2**40), 2**40, bs, device)
        r2t = _ints(gen, -(2**31), 2**31 - 1, rows * L, device).to(torch.int32).view(rows, L)
    lut = _ints(gen, -1, 300, full + 1, device) if has_lut else None
    pool_w = _one(gen, 1, 60)
    pool = (_ints(gen, -(2**31), 2**31 - 1, rows * pool_w, device).to(torch.int32).view(rows, pool_w)
            if has_pool else None)
    vlens = _ints(gen, -2, 70, bs, device) if has_pool else None
    vcap = _one(gen, 1, 400)
    vp = tc.VerifyPlan.allocate(verify_capacity=vcap, device=device)
    wp = tc.WritePlan.allocate(write_req_capacity=bs + _one(gen, 1, 5), device=device)
    for t in (vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
              vp.verify_prev_slot_indices, wp.write_offsets, wp.write_seed_slot_indices):
        t.fill_(-7777)
    for t in (vp.verify_num_valid, vp.enable, wp.write_num_valid_reqs):
        t.fill_(-77)
    return dict(
        verify_plan_out=vp,
        write_plan_out=wp,
        req_pool_indices=rpi,
        prefix_lens=prefix,
        extend_seq_lens=ext,
        req_to_token=r2t,
        swa_window_size=_one(gen, 0, 8) if has_lut else 0,
        full_to_swa_index_mapping=lut,
        verify_capacity=vcap,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=vlens,
        kv_token_id_vs_position_offset=_one(gen, 0, 2),
    )


def scatter_case(gen, device, valid=True):
    bs, n = _one(gen, 0, 10), _one(gen, 0, 80)
    if valid:
        lens = torch.randint(0, 20, (bs,), generator=gen)
        off = torch.zeros(bs + 1, dtype=torch.int64)
        off[1:] = lens.cumsum(0)
    else:
        off = torch.randint(-(2**40), 2**40, (bs + 1,), generator=gen)
        off[::2] %= 50
    rows = _one(gen, bs + 1, bs + 10)
    # Valid batches address distinct pool rows (duplicates race on GPUs, as in the original).
    rpi = torch.randperm(rows, generator=gen)[:bs] if valid else torch.randint(-3, rows + 3, (bs,), generator=gen)
    return dict(
        flat_in=_ints(gen, -(2**40), 2**40, n, device),
        offsets=off.to(device),
        req_pool_indices=rpi.to(device),
        pool_out=torch.full((rows, _one(gen, 1, 30)), -5, dtype=torch.int32, device=device),
    )


CASES = {"verify": verify_case, "write": write_case, "plan": plan_case, "scatter": scatter_case}
>>>>>>> 925cd24 (tests: gpu/slow/nvcc markers registered (strict), gpu set on CUDA-parametrized tests in conftest and skipped without a GPU; GPU hosts select -m 'gpu or nvcc' instead of -k 'cuda or graph'; codegen tests build each (kernel, spec, arch) once per run; ruff config (line length 120, TVMScript rules exempt in kernel files) with the tree fixed and a lint step in .ci/run)
