"""The plan kernel on grids of several blocks and lanes, against the reference byte for byte.

Public CPU launches use one block of one lane, missing the CUDA grid's paths: the offsets launch's lane scan, the
entries launch's per-block ranges, steps of ``threads`` entries, row changes inside a step, the galloping row search.
A ``gpu=False`` CPU build of several blocks/lanes runs them here (its loops run the blocks and lanes in order,
``kernels/common.py``); a GPU host runs the same cases on CUDA in the default geometry and a small grid walking many
steps per block.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tvm_canary.cases import GARBAGE_SEED_BASE, plan_case
from tvm_canary.geometry import Geometry
from tvm_canary.plans import VerifyPlan, WritePlan
from tvm_canary.reference import canary_plan_ref
from tvm_canary.runtime import compile as C
from tvm_canary.runtime import packing, targets

from tree import assert_same_bytes, devices, require, tensors

# Few blocks and lanes: blocks own several steps, lanes several rows; scan tiles 4 and 3 (not a power of two).
CPU_GRIDS = [Geometry(gpu=False, blocks=3, threads=8, tile=4), Geometry(gpu=False, blocks=2, threads=5, tile=3)]


def cuda_grids(device):
    default = targets.default_geometry("plan", targets.tag_for(torch.device(device)))
    return [default, Geometry(gpu=True, blocks=3, threads=64, tile=32)]


def wide_case(seed, device, rows_max=40, bs_max=200, L_max=300):
    """Up to ``bs_max`` rows of mixed lengths (all lengths, empty rows, all-or-nothing, inactive rows),
    verify capacity equal to the total, larger or one short (overflow); the seed's low bits choose the
    specialization (LUT, pool) and capacity."""
    gen = torch.Generator().manual_seed(seed)
    has_lut, has_pool, cap_mode = bool(seed & 1), bool(seed & 2), (seed >> 2) % 3

    def draw(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=gen))

    rows, L, bs = draw(2, rows_max), draw(1, L_max), draw(1, bs_max)
    r2t = torch.randint(0, 500, (rows, L), generator=gen, dtype=torch.int32)
    rpi = torch.randint(0, rows, (bs,), generator=gen)
    prefix = [
        torch.randint(0, L + 3, (bs,), generator=gen),
        torch.randint(0, 3, (bs,), generator=gen),
        torch.where(torch.rand(bs, generator=gen) < 0.5, 0, L),
    ][draw(0, 3)]
    window = draw(0, 50) if has_lut else 0
    active = (rpi >= 1) & (rpi < rows)
    start = (prefix - window).clamp(min=0) if window > 0 else torch.zeros_like(prefix)
    total = int(torch.where(active, (prefix.clamp(max=L) - start).clamp(min=0), 0).sum())
    vcap = max(1, [total, total + 1000, total - 1][cap_mode])
    vp = VerifyPlan.allocate(verify_capacity=vcap, device=device)
    wp = WritePlan.allocate(write_req_capacity=bs + draw(0, 50), device=device)
    for t in (vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
              vp.verify_prev_slot_indices, wp.write_offsets, wp.write_seed_slot_indices):
        t.fill_(-7777)
    pool = torch.randint(-100, 100, (rows, draw(1, 400)), generator=gen, dtype=torch.int32) if has_pool else None
    valid_lens = torch.randint(-2, 400, (bs,), generator=gen) if has_pool else None
    return {
        "verify_plan_out": vp,
        "write_plan_out": wp,
        "req_pool_indices": rpi.to(device),
        "prefix_lens": prefix.to(device),
        "extend_seq_lens": torch.randint(-1, 4, (bs,), generator=gen).to(device),
        "req_to_token": r2t.to(device),
        "swa_window_size": window,
        "full_to_swa_index_mapping": torch.randint(-1, 600, (500,), generator=gen).to(device) if has_lut else None,
        "verify_capacity": vcap,
        "req_to_verify_expected_tokens": None if pool is None else pool.to(device),
        "req_to_verify_expected_tokens_valid_lens": None if valid_lens is None else valid_lens.to(device),
        "kv_token_id_vs_position_offset": draw(-1, 2),
    }


def small_case(seed, device, valid):
    """The shared plan case of ``seed`` (tvm_canary/cases.py: valid, or garbage tables)."""
    return plan_case(torch.Generator().manual_seed(seed), device, valid=valid)


def check(make, device, grids):
    """``make(device)`` -> plan arguments; the kernel under each grid gives the reference's bytes.
    False if the reference rejects the case (a LUT index past the end, SPEC D4)."""
    want = make("cpu")
    try:
        canary_plan_ref(**want)
    except ValueError as e:
        assert "is outside full_to_swa_index_mapping length" in str(e), e
        return False
    for geom in grids:
        got = make(device)
        call = packing.plan_call(**got)
        C._load_or_build("plan", call.spec, torch.device(device), geom)(*call.args)
        try:
            assert_same_bytes(tensors(got), tensors(want))
        except AssertionError as e:
            raise AssertionError(f"{geom}: {e}") from e
    return True


@pytest.mark.parametrize("device", devices())
def test_grids_match_reference(device):
    require(device)
    grids = CPU_GRIDS if device == "cpu" else cuda_grids(device)
    compared = 0
    for seed in range(48):
        compared += check(functools.partial(wide_case, seed), device, grids)
    for seed in range(24):
        for case_seed, valid in ((seed, True), (GARBAGE_SEED_BASE + seed, False)):
            compared += check(functools.partial(small_case, case_seed, valid=valid), device, grids)
    assert compared >= 80


@pytest.mark.parametrize("device", devices())
def test_long_rows_match_reference(device):
    """Rows of up to 2048 verify entries, hundreds of rows: many steps per block on CUDA."""
    require(device)
    if device == "cpu":
        pytest.skip("the CPU grids walk the same paths in test_grids_match_reference; this size is for CUDA")
    for seed in range(4):  # capacity = total, every specialization
        make = functools.partial(wide_case, seed, rows_max=600, bs_max=512, L_max=4096)
        assert check(make, device, cuda_grids(device))
