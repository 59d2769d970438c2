"""Seeded launch cases shared by the tests, ``tvm-canary conformance`` and ``tvm-canary fuzz``.

* ``CASES[kernel](gen, device, valid=True)`` returns the keyword arguments of one launch (tensors on
  ``device``): valid plans respect the contract (no same-launch aliasing, SPEC D7; LUT indices in
  range), garbage ones (``valid=False``) do not. Outputs start poisoned, so every byte a launch leaves
  is compared.
* ``GOLDEN[kernel]``: hand-built cases whose result is pinned to the SPEC 1.5 hash vectors.
* ``rehome`` moves a case's tensors (not a real-KV source's) between guard bands of random bytes (SPEC D4);
  ``guard_violations`` names what a launch wrote outside its outputs.
* ``LAUNCH`` / ``REFERENCE``: the public launch function and the torch reference of each kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from . import checks, consts, reference
from .consts import RealKvHashMode
from .context import CanaryLaunchTag, RealKvSource, VerifyOrWriteContext
from .launch import (
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_scatter_req_token_ids_kernel,
)
from .plans import VerifyPlan, WritePlan
from .reference import hashing
from .runtime import packing

LAUNCH = {
    "verify": launch_canary_verify_kernel,
    "write": launch_canary_write_kernel,
    "plan": launch_canary_plan_kernels,
    "scatter": launch_scatter_req_token_ids_kernel,
}
KERNELS = tuple(LAUNCH)  # the order campaigns take the kernels in
REFERENCE = reference.REFERENCE
GUARD_BYTES = 4096
GARBAGE_SEED_BASE = 50_000  # garbage cases use seeds away from the differential ones


def tensors(obj) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj`` (dataclasses, dicts, tuples, lists) in a fixed order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors(getattr(obj, f.name))]
    if isinstance(obj, dict):
        return [t for k in obj for t in tensors(obj[k])]
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in tensors(x)]
    return []


# -- seeded random cases


def random_source(
    gen: torch.Generator,
    *,
    rows: int,
    page_size: int,
    nbpt: int,
    read_bytes: int,
    row_bytes: int | None = None,
    row_stride_bytes: int | None = None,
    dtype: torch.dtype = torch.uint8,
    device="cpu",
) -> RealKvSource:
    """A source of random bytes, ``row_bytes`` wide (default ``page_size * nbpt``); with
    ``row_stride_bytes`` it is a column slice of a wider tensor (rows ``stride(0)`` apart)."""
    row_bytes = row_bytes or page_size * nbpt
    row_stride_bytes = row_stride_bytes or row_bytes
    base = torch.randint(0, 256, (rows, row_stride_bytes), generator=gen, dtype=torch.uint8).to(device)
    elem = torch.empty(0, dtype=dtype).element_size()
    tensor = base.view(dtype)[:, : row_bytes // elem]
    return RealKvSource(tensor=tensor, page_size=page_size, num_bytes_per_token=nbpt, read_bytes=read_bytes)


def _ints(gen, lo, hi, n, device):
    return torch.randint(lo, hi, (n,), generator=gen).to(device)


def _one(gen, lo, hi):
    return int(torch.randint(lo, hi, (1,), generator=gen))


# int64 values at and next to the range's ends, and -1: garbage indices, offsets and lengths take them,
# checking a kernel's index arithmetic where it could wrap. (Not 0 or 1: valid slots, so
# garbage write plans whose requests share tokens would alias, SPEC D7.)
INT64_EDGES = (-(2**63), -(2**63) + 1, -1, 2**63 - 2, 2**63 - 1)


def _garbage(gen, n, device, lo=-(2**40), hi=2**40):
    """``n`` garbage int64 values: uniform in ``[lo, hi)``, and about one in eight an ``INT64_EDGES`` value."""
    values = torch.randint(lo, hi, (n,), generator=gen)
    edges = torch.tensor(INT64_EDGES)
    at_edge = torch.randint(0, 8, (n,), generator=gen) == 0
    values[at_edge] = edges[torch.randint(0, len(INT64_EDGES), (n,), generator=gen)][at_edge]
    return values.to(device)


def _near(gen, values: torch.Tensor, kept: int = 4) -> torch.Tensor:
    """``values`` (int64), each one kept (``kept`` in 8), one more (the rest but 1 in 8) or with one bit of its
    high half flipped (1 in 8, bits 32-63: a comparison of the low 32 bits alone, or of int32 casts, misses it)."""
    n = values.shape[0]
    draw = torch.randint(0, 8, (n,), generator=gen).to(values.device)
    high_bit = (torch.ones(n, dtype=torch.int64) << torch.randint(32, 64, (n,), generator=gen)).to(values.device)
    return torch.where(draw == 7, values ^ high_bit, values + (draw >= kept).long())


def context_for(gen, device, num_slots, *, ring_rows=None, write_index=None, sources_max=4, token_units=2):
    """A random launch context; each source has 32 * k bytes per token, k in 1..token_units (2 keeps
    folds within the head and one prefetch batch; wider ones reach the fold's loop). In about one
    context in four with sources, one of them is short: the slots past its rows are unreadable for it
    alone (SPEC D4)."""
    mode = RealKvHashMode(_one(gen, 0, 3))
    n_src = _one(gen, 0, sources_max + 1)
    sources = []
    for _ in range(n_src):
        page, nbpt = [1, 4, 16][_one(gen, 0, 3)], 32 * _one(gen, 1, token_units + 1)
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
    if sources and _one(gen, 0, 4) == 0:
        short = _one(gen, 0, len(sources))
        rows = sources[short].tensor.shape[0]
        if rows > 1:  # a source keeps at least one row (slot 0 stays readable: ``_near_clean``)
            sources[short] = dataclasses.replace(sources[short], tensor=sources[short].tensor[: _one(gen, 1, rows)])
    sources = tuple(sources)
    if not sources and mode == RealKvHashMode.ALL:
        mode = RealKvHashMode.NONE  # ALL needs sources (SPEC D9); PARTIAL without sources folds nothing
    # slots of 32 bytes, or one in four wider (40-64 bytes: the fields are the first 32, SPEC 2.1)
    stride = 32 if _one(gen, 0, 4) else 8 * _one(gen, 5, 9)
    buf = torch.randint(0, 256, (num_slots, stride), generator=gen, dtype=torch.uint8).to(device)
    return VerifyOrWriteContext(
        canary_buf=buf,
        kernel_kind=CanaryLaunchTag(_one(gen, 0, 12)),
        violation_ring=torch.full((ring_rows or _one(gen, 1, 64), 8), -7777, dtype=torch.int64, device=device),
        violation_write_index=torch.tensor([write_index if write_index is not None else _one(gen, 0, 8)],
                                           dtype=torch.int32, device=device),
        slot_run_counter=torch.tensor([_one(gen, 0, 100)], dtype=torch.int64, device=device),
        kernel_run_counter=torch.tensor([_one(gen, 0, 100)], dtype=torch.int64, device=device),
        real_kv_sources=sources,
        real_kv_hash_mode=mode,
        enable_chain_position_assert=torch.tensor([_one(gen, 0, 2)], dtype=torch.int32, device=device),
    )


def verify_case(gen, device, valid=True, token_units=2, capacity=None):
    """A verify launch of a random plan (``capacity`` entries, or 1-2999) over a random canary: most
    entries with a slot record a row; in valid plans some check clean (``_near_clean``)."""
    S = _one(gen, 2, 600)
    ctx = context_for(gen, device, S, token_units=token_units)
    cap = capacity or _one(gen, 1, 3000)
    plan = VerifyPlan.allocate(verify_capacity=cap, device=device)
    if valid:
        plan.verify_slot_indices.copy_(_ints(gen, 0, S, cap, device))
        plan.verify_prev_slot_indices.copy_(_ints(gen, -2, S, cap, device))
    else:
        plan.verify_slot_indices.copy_(_garbage(gen, cap, device))
        plan.verify_prev_slot_indices.copy_(_garbage(gen, cap, device))
    plan.verify_expected_tokens.copy_(_ints(gen, -1, 3, cap, device))
    plan.verify_expected_positions.copy_(_ints(gen, -1, 3, cap, device))
    if valid:
        _near_clean(gen, ctx, plan)
    plan.verify_num_valid.fill_(_one(gen, -3, cap + 5) if not valid else _one(gen, 0, cap + 1))
    plan.enable.fill_(int(_one(gen, 0, 8) != 0))
    return {"context": ctx, "plan": plan, "check_verify_expected_token": bool(_one(gen, 0, 2))}


def _near_clean(gen, ctx, plan) -> None:
    """Three entries in four of a valid verify plan (half of them given the anchor as predecessor) get the
    real-KV hash and the chain link to their predecessor that SPEC 1 computes stamped into their slot, and
    expect the slot's stored token and position or values near them (``_near``). Of the entries sharing a
    slot (about five a slot) only the largest link stays, so about 6% of the entries check clean and record
    no row; the kernel's fold and comparisons show in the rows' fail bits. No masked indexing: the builder
    also runs on ``meta``."""
    device = ctx.canary_buf.device
    words = ctx.canary_buf.view(torch.int64)  # a slot's four fields are its first four words (SPEC 2.1)
    cap = plan.verify_slot_indices.shape[0]
    picked = (torch.rand(cap, generator=gen) < 0.75).to(device)
    to_anchor = picked & (torch.rand(cap, generator=gen) < 0.5).to(device)
    slots, prevs = plan.verify_slot_indices, plan.verify_prev_slot_indices.masked_fill_(to_anchor, -1)
    sources, mode = ctx.real_kv_sources, ctx.real_kv_hash_mode
    readable = picked & hashing.valid_slot_mask(words.shape[0], sources, mode, slots)
    # slot 0 stands in for the others: readable wherever any slot is (a source has at least one row)
    _stamp(words[:, 3], slots, readable, hashing.real_kv_fold_t(sources, mode, torch.where(readable, slots, 0)))
    linked = readable & (prevs != consts.TOKEN_TO_KV_SLOT_PADDING)  # valid plans: prevs < S
    prev_words = words[torch.where(prevs > 0, prevs, 0)]
    link = hashing.mix3_t(prev_words[:, 2], prev_words[:, 0], prev_words[:, 1])
    _stamp(words[:, 2], slots, linked, torch.where(prevs < 0, hashing.ANCHOR_HASH_I64, link))
    for field, expected in enumerate((plan.verify_expected_tokens, plan.verify_expected_positions)):
        expected.copy_(torch.where(picked, _near(gen, words[slots, field], kept=6), expected))


def _stamp(column: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, values: torch.Tensor) -> None:
    """``column[slots[i]] := values[i]`` where ``mask[i]``; where such entries share a slot, the largest of
    their values: the same on every device (an indexed store's pick among duplicates is not)."""
    lowest = torch.full_like(values, torch.iinfo(torch.int64).min)
    column.scatter_reduce_(0, slots, torch.where(mask, lowest, column[slots]), "amin")
    column.scatter_reduce_(0, slots, torch.where(mask, values, lowest), "amax")


def write_case(gen, device, valid=True, token_units=2, long_chains=False, own_seeds=0.25, shape=None):
    """A write launch; valid plans only: ``long_chains``: ``long_write_case``; ``shape`` (requests,
    tokens per request): ``uniform_write_case``. ``own_seeds``: ``_store_own_seeds``'s share."""
    if long_chains:
        return long_write_case(gen, device, token_units)
    if shape is not None:
        return uniform_write_case(gen, device, *shape, token_units=token_units)
    S = _one(gen, 90, 600)
    ctx = context_for(gen, device, S, token_units=token_units)
    cap = _one(gen, 1, 40)
    n = _one(gen, 0, S // 2)
    perm = torch.randperm(S, generator=gen)
    slots, seeds = perm[:n].clone(), perm[n : n + cap].clone()
    seeds[_ints(gen, 0, cap, cap // 3 + 1, "cpu")] = -1
    if valid:
        lens = torch.randint(0, 2 * n // cap + 2, (cap,), generator=gen)
        off = torch.zeros(cap + 1, dtype=torch.int64)
        off[1:] = torch.cumsum(lens, 0).clamp(max=n)
        _store_own_seeds(gen, slots, seeds, off, own_seeds)
        slots[torch.randint(0, max(n, 1), (n // 8,), generator=gen)] = -1
    else:
        off = _garbage(gen, cap + 1, "cpu")
        off[torch.randint(0, cap + 1, (cap // 2 + 1,), generator=gen)] %= max(n, 1)
        seeds = _garbage(gen, cap, "cpu")
        slots = _garbage(gen, n, "cpu")
    num_valid = _one(gen, 0, cap + 1) if valid else _one(gen, -5, cap + 10)
    assert_on = bool(_one(gen, 0, 2))
    ids = _ints(gen, 0, 5, n, device)
    pos = _ints(gen, 0, 40, n, device)
    expected = (_near(gen, ids), _near(gen, pos)) if assert_on else None
    return _write_launch(ctx, off, seeds, num_valid, ids, pos, slots, expected)


def _store_own_seeds(gen, slots, seeds, offsets, share) -> None:
    """Each request with a seed slot and entries, with probability ``share``: one of its entries stores
    its seed slot (SPEC D7: its rows are counted from the seed as it stood before the launch)."""
    for r in (torch.rand(seeds.shape[0], generator=gen) < share).nonzero().flatten().tolist():
        first, end = int(offsets[r]), int(offsets[r + 1])
        if seeds[r] >= 0 and end > first:
            slots[first + _one(gen, 0, end - first)] = seeds[r]


def _write_launch(ctx, offsets, seeds, num_valid, ids, pos, slots, expected) -> dict:
    """A write launch's keyword arguments on the context's device: a plan of ``offsets``, ``seeds`` and ``num_valid``
    requests, the token vectors, and the input assert on iff ``expected`` holds (tokens, positions)."""
    device = ctx.canary_buf.device
    plan = WritePlan.allocate(write_req_capacity=seeds.shape[0], device=device)
    plan.write_offsets.copy_(offsets.to(device))
    plan.write_seed_slot_indices.copy_(seeds.to(device))
    plan.write_num_valid_reqs.fill_(num_valid)
    return {
        "context": ctx,
        "plan": plan,
        "input_ids": ids,
        "positions": pos,
        "out_cache_loc": slots.to(device),
        "enable_write_input_assert": expected is not None,
        "expected_input_tokens": expected[0] if expected is not None else None,
        "expected_input_positions": expected[1] if expected is not None else None,
    }


def long_write_case(gen, device, token_units=2):
    """1-4 requests of 33-100 tokens, all slots valid (distinct but for the repeats below), so on CUDA each request's
    warp stamps its full batches of 32 entries in lockstep (``kernels.write``): positions run on from the seed slot's
    stored position (seeds: 30% anchors) with gaps at a batch's first entry and inside batches; the input assert, when
    on, expects a wrong token or position for 5% of the entries; in half the cases two entries of a request at most 31
    apart store one slot (the later one's fields must stay); a third of the requests with a seed slot store it at one
    of their entries."""
    cap = _one(gen, 1, 5)
    lens = torch.randint(33, 101, (cap,), generator=gen)
    n = int(lens.sum())
    S = n + cap + _one(gen, 1, 200)
    ctx = context_for(gen, device, S, token_units=token_units)
    perm = torch.randperm(S, generator=gen)
    slots, seeds = perm[:n].clone(), perm[n : n + cap].clone()
    seeds[torch.rand(cap, generator=gen) < 0.3] = -1
    off = torch.zeros(cap + 1, dtype=torch.int64)
    off[1:] = torch.cumsum(lens, 0)
    starts = torch.randint(0, 1000, (cap,), generator=gen)
    pos = torch.empty(n, dtype=torch.int64)
    words = ctx.canary_buf.view(torch.int64)
    for r in range(cap):
        first, end = int(off[r]), int(off[r + 1])
        pos[first:end] = starts[r] + 1 + torch.arange(end - first)
        pos[first + 32 : end] += _one(gen, 0, 3)  # a gap (or none) at the second batch's first entry
        if seeds[r] >= 0:
            words[int(seeds[r]), 1] = int(starts[r])
    pos[torch.randint(0, n, (2,), generator=gen)] += 7  # gaps inside batches
    if _one(gen, 0, 2):
        r = _one(gen, 0, cap)
        i = _one(gen, 0, int(lens[r]) // 32 * 32 - 1)  # inside the full batches
        j = min(i + _one(gen, 1, 32), int(lens[r]) - 1)
        slots[int(off[r]) + j] = slots[int(off[r]) + i]
    _store_own_seeds(gen, slots, seeds, off, 1 / 3)
    assert_on = bool(_one(gen, 0, 2))
    ids = _ints(gen, 0, 5, n, device)
    pos = pos.to(device)
    off_by = (torch.rand(n, generator=gen) < 0.05).long().to(device)
    return _write_launch(ctx, off, seeds, cap, ids, pos, slots,
                         (ids + off_by, pos + off_by.flip(0)) if assert_on else None)


def uniform_write_case(gen, device, requests: int, tokens: int, token_units=2):
    """``requests`` requests of ``tokens`` tokens each (a plan of that capacity, all valid): a test picks
    how CUDA's write maps requests to lanes (``kernels.write``: a warp per request, one lane
    per request spread over the blocks, or consecutive lanes): distinct slots, 1 in 16 invalid (-1);
    seeds: 30% anchors, the others slots whose stored position the chain continues; positions run on with
    a gap in 1 of 8 requests, and the input assert, when on, expects another token for 5% of the entries:
    violation rows come from requests spread over the grid."""
    n = requests * tokens
    S = n + requests + _one(gen, 1, 200)
    ctx = context_for(gen, device, S, token_units=token_units)
    perm = torch.randperm(S, generator=gen)
    slots, seeds = perm[:n].clone(), perm[n : n + requests].clone()
    seeds[torch.rand(requests, generator=gen) < 0.3] = -1
    slots[torch.rand(n, generator=gen) < 1 / 16] = -1
    starts = torch.randint(0, 1000, (requests,), generator=gen)
    words = ctx.canary_buf.view(torch.int64)
    seeded = seeds >= 0  # not anchors; a CUDA canary takes its indices and values on its own device
    words[seeds[seeded].to(device), 1] = starts[seeded].to(device)
    pos = (starts[:, None] + 1 + torch.arange(tokens)).flatten()
    gapped = (torch.rand(requests, generator=gen) < 1 / 8).repeat_interleave(tokens)
    pos[gapped & (torch.arange(n) % tokens == tokens // 2)] += 3
    off = torch.arange(requests + 1, dtype=torch.int64) * tokens
    ids = _ints(gen, 0, 5, n, device)
    pos = pos.to(device)
    off_by = (torch.rand(n, generator=gen) < 0.05).long().to(device)
    expected = (ids + off_by, pos) if _one(gen, 0, 2) else None
    return _write_launch(ctx, off, seeds, requests, ids, pos, slots, expected)


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
        prefix, ext = _garbage(gen, bs, device), _garbage(gen, bs, device)
        L = L if _one(gen, 0, 8) else 0  # a table with no columns
        r2t = _ints(gen, -(2**31), 2**31 - 1, rows * L, device).to(torch.int32).view(rows, L)
    lut = _ints(gen, -1, 300, full + 1, device) if has_lut else None
    pool_w = _one(gen, 1, 60) if valid or _one(gen, 0, 8) else 0
    pool = (_ints(gen, -(2**31), 2**31 - 1, rows * pool_w, device).to(torch.int32).view(rows, pool_w) if has_pool
            else None)
    vlens = _ints(gen, -2, 70, bs, device) if has_pool else None
    vcap = _one(gen, 1, 400)
    vp = VerifyPlan.allocate(verify_capacity=vcap, device=device)
    wp = WritePlan.allocate(write_req_capacity=bs + _one(gen, 1, 5), device=device)
    for t in (vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
              vp.verify_prev_slot_indices, wp.write_offsets, wp.write_seed_slot_indices):
        t.fill_(-7777)
    for t in (vp.verify_num_valid, vp.enable, wp.write_num_valid_reqs):
        t.fill_(-77)
    return {
        "verify_plan_out": vp,
        "write_plan_out": wp,
        "req_pool_indices": rpi,
        "prefix_lens": prefix,
        "extend_seq_lens": ext,
        "req_to_token": r2t,
        "swa_window_size": (_one(gen, 0, 8) if valid or _one(gen, 0, 4) else 2**63 - 1) if has_lut else 0,
        "full_to_swa_index_mapping": lut,
        "verify_capacity": vcap,
        "req_to_verify_expected_tokens": pool,
        "req_to_verify_expected_tokens_valid_lens": vlens,
        "kv_token_id_vs_position_offset": _one(gen, 0, 2),
    }


def scatter_case(gen, device, valid=True):
    bs, n = _one(gen, 0, 10), _one(gen, 0, 80)
    if valid:
        lens = torch.randint(0, 20, (bs,), generator=gen)
        off = torch.zeros(bs + 1, dtype=torch.int64)
        off[1:] = lens.cumsum(0)
    else:
        off = _garbage(gen, bs + 1, "cpu")
        off[torch.randint(0, 2, (bs + 1,), generator=gen) == 0] %= 50
    rows = _one(gen, bs + 1, bs + 10)
    # Valid batches address distinct pool rows (duplicates race on GPUs, as in the original).
    rpi = torch.randperm(rows, generator=gen)[:bs] if valid else torch.randint(-3, rows + 3, (bs,), generator=gen)
    return {
        "flat_in": _ints(gen, -(2**40), 2**40, n, device),
        "offsets": off.to(device),
        "req_pool_indices": rpi.to(device),
        "pool_out": torch.full((rows, _one(gen, 1, 30) if valid or _one(gen, 0, 8) else 0), -5, dtype=torch.int32,
                               device=device),
    }


CASES = {"verify": verify_case, "write": write_case, "plan": plan_case, "scatter": scatter_case}


def reference_launch(kernel: str, kw: dict) -> None:
    """``REFERENCE[kernel](**kw)`` with the result SPEC D4 pins for the compiled kernels where the reference is
    stricter: plan's LUT indices past the end clamp to the last entry (the reference raises). Plan
    translates every ``req_to_token`` value it reads through the LUT and writes no table, so the reference reads a
    clamped copy and ``kw`` ends as the launch's would. (``plan_case``'s LUTs are never empty.)"""
    lut = kw.get("full_to_swa_index_mapping") if kernel == "plan" else None
    if lut is None:
        REFERENCE[kernel](**kw)
        return
    REFERENCE[kernel](**{**kw, "req_to_token": kw["req_to_token"].clamp(max=lut.shape[0] - 1)})


# -- golden cases (SPEC 1.5 vectors)

# Written out from the SPEC 1.5 table, not computed: a kernel that hashes differently cannot match it.
SPEC_ANCHOR_HASH = 0xDE7FAE23A9A1B716 - 2**64  # splitmix64(0xC0FFEE1234567890), signed
SPEC_INPUTS = (0x9E3779B97F4A7C15 - 2**64, 1, 0xDEADBEEFCAFEBABE - 2**64, -1, -(2**63), 0)


def clean_context(num_slots: int, device, *, kernel_kind: CanaryLaunchTag = CanaryLaunchTag.HEAD_K_FULL,
                  ring_rows: int = 4, ring_fill: int = -7777) -> VerifyOrWriteContext:
    """A context with a zeroed canary buffer of ``num_slots`` slots, no real-KV sources, zero counters, the
    chain-position assert on, and a ring of ``ring_rows`` rows of ``ring_fill`` (so an unwritten row stands
    out). For the golden cases and the tuning workloads."""
    return VerifyOrWriteContext(
        canary_buf=torch.zeros((num_slots, 32), dtype=torch.uint8, device=device),
        kernel_kind=kernel_kind,
        violation_ring=torch.full((ring_rows, 8), ring_fill, dtype=torch.int64, device=device),
        violation_write_index=torch.zeros(1, dtype=torch.int32, device=device),
        slot_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        kernel_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        real_kv_sources=(),
        real_kv_hash_mode=RealKvHashMode.NONE,
        enable_chain_position_assert=torch.ones(1, dtype=torch.int32, device=device),
    )


def golden_write_anchor(device) -> tuple[dict, Callable[[dict], str | None]]:
    """One request seeded at the anchor writes the SPEC 1.5 inputs as tokens into slots 1..6; slot 1's
    chain link must be the anchor hash of the SPEC table. Returns (launch kwargs, pinned check)."""
    n = len(SPEC_INPUTS)
    ctx = clean_context(n + 1, device)
    plan = WritePlan.allocate(write_req_capacity=1, device=device)
    plan.write_offsets.copy_(torch.tensor([0, n]))
    plan.write_seed_slot_indices.fill_(-1)
    plan.write_num_valid_reqs.fill_(1)
    kw = {"context": ctx, "plan": plan, "input_ids": torch.tensor(SPEC_INPUTS, device=device),
              "positions": torch.arange(n, device=device), "out_cache_loc": torch.arange(1, n + 1, device=device),
              "enable_write_input_assert": False, "expected_input_tokens": None, "expected_input_positions": None}

    def pinned(kw: dict) -> str | None:
        link = int(kw["context"].canary_buf[1].cpu().view(torch.int64)[2])
        return (None if link == SPEC_ANCHOR_HASH
                else f"slot 1 chain link {link % 2**64:#x}, SPEC 1.5 anchor hash {SPEC_ANCHOR_HASH % 2**64:#x}")

    return kw, pinned


def golden_verify_anchor(device) -> tuple[dict, Callable[[dict], str | None]]:
    """Slots 1 and 2 follow the anchor; slot 1 stores the SPEC 1.5 anchor hash as its link (clean), slot 2 that
    hash with its low bit flipped: exactly one violation row, for slot 2, expecting the anchor hash."""
    ctx = clean_context(3, device)
    words = ctx.canary_buf.view(torch.int64)
    words[1] = torch.tensor([7, 0, SPEC_ANCHOR_HASH, 0])
    words[2] = torch.tensor([8, 0, SPEC_ANCHOR_HASH ^ 1, 0])
    plan = VerifyPlan.allocate(verify_capacity=2, device=device)
    plan.verify_slot_indices.copy_(torch.tensor([1, 2]))
    plan.verify_prev_slot_indices.fill_(-1)
    plan.verify_expected_tokens.copy_(torch.tensor([7, 8]))
    plan.verify_expected_positions.fill_(0)
    plan.verify_num_valid.fill_(2)
    plan.enable.fill_(1)
    kw = {"context": ctx, "plan": plan, "check_verify_expected_token": True}

    def pinned(kw: dict) -> str | None:
        count, row = int(kw["context"].violation_write_index[0]), kw["context"].violation_ring[0].tolist()
        slot, expected = row[consts.VIOLATION_FIELD_SLOT_IDX], row[consts.VIOLATION_FIELD_EXPECTED_AUX]
        return (None if (count, slot, expected) == (1, 2, SPEC_ANCHOR_HASH) else
                f"{count} violations (first at slot {slot}, expecting link {expected % 2**64:#x}), expected 1 at "
                f"slot 2 expecting the SPEC 1.5 anchor hash {SPEC_ANCHOR_HASH % 2**64:#x}")

    return kw, pinned


GOLDEN = {"verify": {"verify-anchor": golden_verify_anchor}, "write": {"write-anchor": golden_write_anchor}}


# -- guard bands (SPEC D4)


@dataclasses.dataclass
class Guarded:
    """A tensor re-homed into ``backing[start : start + nbytes]`` (uint8 view), ``start`` at least
    GUARD_BYTES; ``head`` and ``tail`` are the band bytes before and after it."""

    name: str
    view: torch.Tensor
    backing: torch.Tensor
    start: int
    nbytes: int
    head: torch.Tensor
    tail: torch.Tensor


def promised_alignment(t: torch.Tensor) -> int:
    """The least alignment a caller may give ``t``'s data: a uint8 canary buffer 8 bytes (the kernels' int64 view of it;
    docs/SEMANTICS.md), any other tensor its element's size (a view one element into a larger tensor)."""
    return 8 if t.dtype == torch.uint8 else t.element_size()


def _rehome(t: torch.Tensor, name: str, gen: torch.Generator, out: list[Guarded]) -> torch.Tensor:
    """``t``'s copy between guard bands, starting ``promised_alignment`` times a random count (0-63)
    past GUARD_BYTES (the backing is aligned): most starts are not 16-byte aligned, as a view into a
    larger tensor may not be."""
    assert t.is_contiguous(), name
    nbytes = t.numel() * t.element_size()
    step = promised_alignment(t)
    start = GUARD_BYTES + step * int(torch.randint(0, 64 // step, (1,), generator=gen))
    backing = torch.randint(0, 256, (start + nbytes + GUARD_BYTES,), generator=gen, dtype=torch.uint8).to(t.device)
    view = backing[start : start + nbytes].view(t.dtype).view(t.shape)
    view.copy_(t)
    assert view.is_contiguous() and view.data_ptr() % step == 0
    out.append(Guarded(name, view, backing, start, nbytes, backing[:start].clone(), backing[start + nbytes :].clone()))
    return view


def rehome(obj, name: str, gen: torch.Generator, out: list[Guarded]):
    """``obj`` with every tensor inside (dataclasses, dicts, tuples) re-homed between guard bands;
    RealKvSource objects returned as they are."""
    if isinstance(obj, torch.Tensor):
        return _rehome(obj, name, gen, out)
    if isinstance(obj, RealKvSource):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: rehome(getattr(obj, f.name), f"{name}.{f.name}", gen, out) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, dict):
        return {k: rehome(v, f"{name}.{k}" if name else k, gen, out) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(rehome(x, f"{name}[{i}]", gen, out) for i, x in enumerate(obj))
    return obj


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``'s bytes (NaN-safe comparison for float sources)."""
    return t.contiguous().view(torch.uint8).clone()


def outputs(kernel: str, kw: dict) -> list[torch.Tensor]:
    """The tensors the launch may write (SPEC 3); every other tensor argument is an input."""
    return [t for t, _ in checks.launch_tensors(kernel, kw)[0]]


def guarded_case(kernel: str, device, seed: int) -> tuple[dict, list[Guarded], list]:
    """The garbage case of ``seed`` re-homed between guard bands (band bytes from ``seed + 1``), its
    bands, and (name, tensor, bytes before the launch) of every input the launch must leave alone (a
    real-KV source's whole storage: sources are not re-homed)."""
    case = CASES[kernel](torch.Generator().manual_seed(seed), device, valid=False)
    guarded: list[Guarded] = []
    kw = rehome(case, "", torch.Generator().manual_seed(seed + 1), guarded)
    out_ids = {id(t) for t in outputs(kernel, kw)}
    inputs = [(g.name, g.view) for g in guarded if id(g.view) not in out_ids]
    sources = kw["context"].real_kv_sources if "context" in kw else ()
    inputs += [(f"real_kv_sources[{i}].tensor's storage", storage_bytes(s.tensor)) for i, s in enumerate(sources)]
    return kw, guarded, [(name, t, raw_bytes(t)) for name, t in inputs]


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of ``t``'s storage as a uint8 vector (a source that is a column slice of a wider
    tensor: also the bytes between and after its rows, which no kernel may write either)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def guard_violations(guarded: list[Guarded], inputs: list[tuple[str, torch.Tensor, torch.Tensor]]) -> list[str]:
    """What a launch wrote outside its outputs: changed guard bands and modified inputs."""
    bad = []
    for g in guarded:
        if not torch.equal(g.backing[: g.start], g.head):
            bad.append(f"guard band before {g.name} was written")
        if not torch.equal(g.backing[g.start + g.nbytes :], g.tail):
            bad.append(f"guard band after {g.name} was written")
    bad += [f"input {name} was modified" for name, t, old in inputs if not torch.equal(raw_bytes(t), old)]
    return bad


def scratch_left_dirty(kw: dict) -> list[str]:
    """Write and verify leave their ring's scratch ``flags`` (``runtime.packing.flags_for``) zero after every
    launch, as the next launch on the ring reads them as clean; names each left non-zero ([] for kernels
    without a context). On CUDA, call it after synchronizing."""
    if "context" not in kw:
        return []
    return [f"scratch flags [{i}] of the violation ring left non-zero: {int(f.count_nonzero())} words"
            for i, f in enumerate(packing.flags_of(kw["context"].violation_ring)) if bool(f.any())]


def settle_scatter_races(got: dict, want: dict) -> None:
    """Garbage scatter cases may send two batch rows to one pool row. The reference applies them in batch order (last
    writer wins); GPU blocks race, as the original Triton kernel's do (same-launch aliasing is outside the contract,
    cf. SPEC D7). Where writers store different values into one element, a kernel element holding one of them is set
    to the reference's (in ``got``); any other value is left for the byte comparison to report."""
    flat, off, rpi = (want[k].tolist() for k in ("flat_in", "offsets", "req_pool_indices"))
    rows, width = want["pool_out"].shape
    candidates: dict[tuple[int, int], set[int]] = {}
    for r, rp in enumerate(rpi):
        if not 0 <= rp < rows:
            continue
        for col in range(max(0, min(off[r + 1] - off[r], width))):
            if 0 <= off[r] + col < len(flat):
                v = (flat[off[r] + col] + 2**31) % 2**32 - 2**31
                candidates.setdefault((rp, col), set()).add(v)
    pool = got["pool_out"].cpu()
    for (rp, col), values in candidates.items():
        if len(values) > 1 and int(pool[rp, col]) in values:
            got["pool_out"][rp, col] = want["pool_out"][rp, col]
