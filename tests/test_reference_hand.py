"""Hand cases for every behaviour of SPEC section 3 and docs/SEMANTICS.md.

Cases build tensors on ``impl.device`` (tests/conftest.py), so they run on the reference and every compiled backend.
Expected values come from Python ints (tests/helpers.py), never the reference; outputs are poisoned before each launch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tvm_canary import reference
from tvm_canary.consts import FailReason, RealKvHashMode
from tvm_canary.context import CanaryLaunchTag
from tvm_canary.plans import VerifyPlan, WritePlan

from helpers import (
    ANCHOR,
    INVALID,
    POISON_BYTE,
    POISON_I64,
    counters,
    expected_ring,
    four_sources,
    get_slot,
    i32,
    i64,
    link,
    make_canary,
    make_context,
    make_verify_plan,
    make_write_plan,
    py_chain_hash,
    py_fold,
    ring_state,
    set_slot,
    stamp_chain,
)

NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL
KIND = int(CanaryLaunchTag.HEAD_K_FULL)
W_TOK = int(FailReason.WRITE_TOKEN_MISMATCH)
W_POS = int(FailReason.WRITE_POSITION_MISMATCH)
V_CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
V_POS = int(FailReason.VERIFY_POSITION_MISMATCH)
V_RKV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
V_TOK = int(FailReason.VERIFY_TOKEN_MISMATCH)


# ===== write (SPEC 3.1)


def run_write(impl, ctx, plan, toks, poss, locs, exp_toks=None, exp_poss=None):
    dev = impl.device
    impl.write(
        context=ctx,
        plan=plan,
        input_ids=i64(toks, dev),
        positions=i64(poss, dev),
        out_cache_loc=i64(locs, dev),
        enable_write_input_assert=exp_toks is not None,
        expected_input_tokens=None if exp_toks is None else i64(exp_toks, dev),
        expected_input_positions=None if exp_poss is None else i64(exp_poss, dev),
    )


def test_write_anchor_chain_touches_only_bytes_0_to_31(impl):
    buf = make_canary(10, stride=48, fill=POISON_BYTE, device=impl.device)
    want = buf.clone()
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 3], [-1], device=impl.device), [11, 12, 13], [0, 1, 2], [5, 6, 7])
    h1 = link(ANCHOR, 11, 0)
    set_slot(want, 5, 11, 0, ANCHOR)
    set_slot(want, 6, 12, 1, h1)
    set_slot(want, 7, 13, 2, link(h1, 12, 1))
    assert torch.equal(buf, want)
    assert counters(ctx) == (1, 3)
    assert ring_state(ctx) == (0, expected_ring(8, []))


def test_write_seed_slot_starts_chain(impl):
    buf = make_canary(16, device=impl.device)
    set_slot(buf, 3, 7, 4, 0x1234, 99)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 2], [3], device=impl.device), [21, 22], [5, 6], [8, 9])
    h = link(0x1234, 7, 4)
    assert get_slot(buf, 8) == (21, 5, h, 0)
    assert get_slot(buf, 9) == (22, 6, link(h, 21, 5), 0)
    assert get_slot(buf, 3) == (7, 4, 0x1234, 99)
    assert counters(ctx) == (1, 2)
    assert ring_state(ctx) == (0, expected_ring(8, []))


def test_write_skips_negative_slots(impl):
    """Skipped entries: not written or counted, no chain step, no input or position assert."""
    buf = make_canary(16, device=impl.device)
    set_slot(buf, 2, 1, 9, 0)
    ctx = make_context(buf)
    plan = make_write_plan([0, 4], [2], device=impl.device)
    run_write(impl, ctx, plan, [30, 31, 32, 33], [10, 99, 98, 11], [4, -1, -9, 5],
              exp_toks=[30, 0, 0, 33], exp_poss=[10, 0, 0, 11])
    h = link(0, 1, 9)
    assert get_slot(buf, 4) == (30, 10, h, 0)
    assert get_slot(buf, 5) == (33, 11, link(h, 30, 10), 0)
    assert counters(ctx) == (1, 2)
    assert ring_state(ctx) == (0, expected_ring(8, []))


def test_write_slot_zero_is_written(impl):
    buf = make_canary(4, fill=POISON_BYTE, device=impl.device)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 1], [-1], device=impl.device), [5], [0], [0])
    assert get_slot(buf, 0) == (5, 0, ANCHOR, 0)
    assert counters(ctx) == (1, 1)


def test_write_input_assert_rows(impl):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf, kind=CanaryLaunchTag.HEAD_V_SWA)
    kind = int(CanaryLaunchTag.HEAD_V_SWA)
    run_write(impl, ctx, make_write_plan([0, 4], [-1], device=impl.device),
              [5, 6, 7, 8], [0, 1, 2, 3], [1, 2, 3, 4], exp_toks=[5, 60, 7, 80], exp_poss=[0, 1, 20, 30])
    h1 = link(ANCHOR, 5, 0)
    h2 = link(h1, 6, 1)
    h3 = link(h2, 7, 2)
    assert ring_state(ctx) == (3, expected_ring(8, [
        [kind, 2, 1, 6, 60, h1, 1, W_TOK],
        [kind, 3, 2, 7, 7, h2, 20, W_POS],
        [kind, 4, 3, 8, 80, h3, 30, W_TOK | W_POS],
    ]))
    assert get_slot(buf, 4) == (8, 3, h3, 0)  # mismatching entries are still written
    assert counters(ctx) == (1, 4)


@pytest.mark.parametrize("flag", [1, 0])
def test_write_input_assert_row_precedes_chain_position_row(impl, flag):
    buf = make_canary(8, device=impl.device)
    set_slot(buf, 1, 100, 10, 0)
    ctx = make_context(buf, chain_assert=flag)
    run_write(impl, ctx, make_write_plan([0, 3], [1], device=impl.device),
              [1, 2, 3], [11, 13, 14], [2, 3, 4], exp_toks=[1, 22, 3], exp_poss=[11, 12, 14])
    h0 = link(0, 100, 10)
    h1 = link(h0, 1, 11)
    rows = [[KIND, 3, 13, 2, 22, h1, 12, W_TOK | W_POS]]
    if flag:
        rows.append([KIND, 3, 13, 2, 2, h1, 12, W_POS])  # then 14 follows the actual 13: no row
    assert ring_state(ctx) == (len(rows), expected_ring(8, rows))


def test_write_asserts_compare_all_64_bits(impl):
    """Expected tokens and positions, and a seed slot's stored position, that differ from the actual ones in
    the high 32 bits alone (or in the sign bit) are mismatches."""
    buf = make_canary(8, device=impl.device)
    seed_pos = 3 + (1 << 32)
    set_slot(buf, 1, 100, seed_pos, 0)
    ctx = make_context(buf, chain_assert=1)
    run_write(impl, ctx, make_write_plan([0, 3], [1], device=impl.device), [1, 2, 3], [4, 5, 6], [2, 3, 4],
              exp_toks=[1 + (1 << 32), 2, 3 - (1 << 63)], exp_poss=[4, 5 + (1 << 40), 6])
    h0 = link(0, 100, seed_pos)
    h1 = link(h0, 1, 4)
    h2 = link(h1, 2, 5)
    assert ring_state(ctx) == (4, expected_ring(8, [
        [KIND, 2, 4, 1, 1 + (1 << 32), h0, 4, W_TOK],
        [KIND, 2, 4, 1, 1, h0, seed_pos + 1, W_POS],
        [KIND, 3, 5, 2, 2, h1, 5 + (1 << 40), W_POS],
        [KIND, 4, 6, 3, 3 - (1 << 63), h2, 6, W_TOK],
    ]))


@pytest.mark.parametrize("seed,flag", [(1, 1), (1, 2), (1, 0), (-1, 1)])
def test_write_chain_position_assert_needs_seed_and_flag(impl, seed, flag):
    buf = make_canary(8, device=impl.device)
    set_slot(buf, 1, 100, 3, 0)
    ctx = make_context(buf, chain_assert=flag)
    run_write(impl, ctx, make_write_plan([0, 2], [seed], device=impl.device), [1, 2], [5, 7], [2, 3])
    h0 = ANCHOR if seed < 0 else link(0, 100, 3)
    rows = []
    if seed >= 0 and flag:
        rows = [[KIND, 2, 5, 1, 1, h0, 4, W_POS], [KIND, 3, 7, 2, 2, link(h0, 1, 5), 6, W_POS]]
    assert ring_state(ctx) == (len(rows), expected_ring(8, rows))
    assert counters(ctx) == (1, 2)


@pytest.mark.parametrize("num_valid", [-3, 0])
def test_write_nonpositive_count_does_nothing(impl, num_valid):
    buf = make_canary(8, fill=POISON_BYTE, device=impl.device)
    want = buf.clone()
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 1], [-1], num_valid=num_valid, device=impl.device), [1], [0], [3])
    assert torch.equal(buf, want)
    assert counters(ctx) == (1, 0)
    assert ring_state(ctx) == (0, expected_ring(8, []))


def test_write_count_above_capacity_is_clamped(impl):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 1, 2], [-1, -1], num_valid=5, device=impl.device), [1, 2], [0, 0], [3, 4])
    assert get_slot(buf, 3) == (1, 0, ANCHOR, 0)
    assert get_slot(buf, 4) == (2, 0, ANCHOR, 0)
    assert counters(ctx) == (1, 2)


def test_write_requests_past_count_are_ignored(impl):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 1, 2], [-1, -1], num_valid=1, device=impl.device), [1, 2], [0, 0], [3, 4])
    assert get_slot(buf, 4) == (0, 0, 0, 0)
    assert counters(ctx) == (1, 1)


def test_write_offsets_are_clamped(impl):
    """r0 [-5,-1) -> empty; r1 [-1,3) -> [0,3); r2 [3,9) -> [3,5) with N = 5."""
    buf = make_canary(16, device=impl.device)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([-5, -1, 3, 9], [10**9, -1, -1], device=impl.device),
              [1, 2, 3, 4, 5], [0, 1, 2, 0, 1], [1, 2, 3, 4, 5])
    h1 = link(ANCHOR, 1, 0)
    assert [get_slot(buf, s) for s in (1, 2, 3)] == [(1, 0, ANCHOR, 0), (2, 1, h1, 0), (3, 2, link(h1, 2, 1), 0)]
    assert [get_slot(buf, s) for s in (4, 5)] == [(4, 0, ANCHOR, 0), (5, 1, link(ANCHOR, 4, 0), 0)]
    assert counters(ctx) == (1, 5)
    assert ring_state(ctx) == (0, expected_ring(8, []))  # r0's invalid seed is never looked at


def test_write_decreasing_offsets_skip_the_request(impl):
    """r0 [4,5); r1 [5,2) is empty; r2 [2,4); entries 0, 1, 5 belong to no request."""
    buf = make_canary(16, device=impl.device)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([4, 5, 2, 4], [-1, -1, -1], device=impl.device),
              [1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 0, 0], [1, 2, 3, 4, 5, 6])
    assert [get_slot(buf, s) for s in (1, 2, 6)] == [(0, 0, 0, 0)] * 3
    assert get_slot(buf, 5) == (5, 0, ANCHOR, 0)
    assert [get_slot(buf, s) for s in (3, 4)] == [(3, 0, ANCHOR, 0), (4, 1, link(ANCHOR, 3, 0), 0)]
    assert counters(ctx) == (1, 3)


def test_write_nonpositive_last_offset_does_not_stop_earlier_requests(impl):
    """No early exit on ``write_offsets[A] <= 0``: requests are clamped one by one (SEMANTICS)."""
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 2, -1], [-1, -1], device=impl.device), [1, 2], [0, 1], [3, 4])
    assert get_slot(buf, 4) == (2, 1, link(ANCHOR, 1, 0), 0)
    assert counters(ctx) == (1, 2)


def test_write_empty_request_does_not_read_its_seed(impl):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 0, 1], [10**9, -1], device=impl.device), [1], [0], [3])
    assert get_slot(buf, 3) == (1, 0, ANCHOR, 0)
    assert ring_state(ctx) == (0, expected_ring(8, []))


def test_write_invalid_seed(impl):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 2, 3], [8, -1], device=impl.device), [1, 2, 3], [0, 1, 0], [1, 2, 3])
    assert [get_slot(buf, s) for s in (1, 2)] == [(0, 0, 0, 0)] * 2
    assert get_slot(buf, 3) == (3, 0, ANCHOR, 0)
    assert counters(ctx) == (1, 1)
    assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 8, 0, 0, 0, 0, 0, INVALID]]))


def test_write_invalid_slot(impl):
    """Out-of-range slot: one INVALID row, nothing written or counted, chain and prev_pos kept."""
    buf = make_canary(8, device=impl.device)
    set_slot(buf, 1, 9, 0, 0)
    ctx = make_context(buf)
    run_write(impl, ctx, make_write_plan([0, 3], [1], device=impl.device), [10, 11, 12], [1, 50, 2], [2, 8, 3],
              exp_toks=[10, 0, 12], exp_poss=[1, 0, 2])
    h0 = link(0, 9, 0)
    h1 = link(h0, 10, 1)
    assert get_slot(buf, 2) == (10, 1, h0, 0)
    assert get_slot(buf, 3) == (12, 2, h1, 0)
    assert counters(ctx) == (1, 2)
    assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 8, 50, 11, 11, h1, 50, INVALID]]))


def one_source_short(short: int, device) -> tuple:
    """``four_sources`` (slots 0..15 each), the ``short``-th cut to the rows of slots 0..7: slots 8..15 are
    unreadable for it alone (SPEC D4 checks each source)."""
    sources = list(four_sources(3, device))
    sources[short] = dataclasses.replace(sources[short], tensor=sources[short].tensor[: 8 // sources[short].page_size])
    return tuple(sources)


@pytest.mark.parametrize("short", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
def test_write_slot_unreadable_for_one_source(impl, mode, short):
    """Slot 9, valid for the canary, is unreadable for one of four sources: folding modes refuse it."""
    sources = one_source_short(short, impl.device)
    buf = make_canary(16, device=impl.device)
    ctx = make_context(buf, sources=sources, mode=mode)
    run_write(impl, ctx, make_write_plan([0, 2], [-1], device=impl.device), [1, 2], [0, 1], [3, 9])
    assert get_slot(buf, 3) == (1, 0, ANCHOR, py_fold(sources, mode, 3))
    if mode == NONE:
        assert get_slot(buf, 9) == (2, 1, link(ANCHOR, 1, 0), 0)
        assert ring_state(ctx) == (0, expected_ring(8, []))
    else:
        assert get_slot(buf, 9) == (0, 0, 0, 0)
        assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 9, 1, 2, 2, link(ANCHOR, 1, 0), 1, INVALID]]))


@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
@pytest.mark.parametrize("num_sources", [1, 2, 3, 4])
def test_write_real_kv_hash_field(impl, mode, num_sources):
    sources = four_sources(num_sources, impl.device)[:num_sources]
    buf = make_canary(16, device=impl.device)
    ctx = make_context(buf, sources=sources, mode=mode)
    slots = [1, 6, 11, 15]
    run_write(impl, ctx, make_write_plan([0, 4], [-1], device=impl.device), [1, 2, 3, 4], [0, 1, 2, 3], slots)
    assert [get_slot(buf, s)[3] for s in slots] == [py_fold(sources, mode, s) for s in slots]
    assert all(get_slot(buf, s)[3] != 0 for s in slots)


def test_write_ring_fill_once_and_overflow(impl):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf, kind=CanaryLaunchTag.TAIL_V_SWA, ring_capacity=2)
    kind = int(CanaryLaunchTag.TAIL_V_SWA)
    plan = make_write_plan([0, 3], [-1], device=impl.device)
    run_write(impl, ctx, plan, [1, 2, 3], [0, 1, 2], [1, 2, 3], exp_toks=[0, 0, 0], exp_poss=[0, 1, 2])
    h1 = link(ANCHOR, 1, 0)
    rows = [[kind, 1, 0, 1, 0, ANCHOR, 0, W_TOK], [kind, 2, 1, 2, 0, h1, 1, W_TOK]]
    assert ring_state(ctx) == (3, rows)
    run_write(impl, ctx, plan, [1, 2, 3], [0, 1, 2], [1, 2, 3], exp_toks=[0, 2, 3], exp_poss=[0, 1, 2])
    assert ring_state(ctx) == (4, rows)
    assert counters(ctx) == (2, 6)


def test_write_ring_appends_behind_existing_rows(impl):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf, ring_capacity=3, write_index=1)
    run_write(impl, ctx, make_write_plan([0, 3], [-1], device=impl.device), [1, 2, 3], [0, 1, 2], [1, 2, 3],
              exp_toks=[0, 0, 0], exp_poss=[0, 1, 2])
    h1 = link(ANCHOR, 1, 0)
    rows = [[KIND, 1, 0, 1, 0, ANCHOR, 0, W_TOK], [KIND, 2, 1, 2, 0, h1, 1, W_TOK]]
    assert ring_state(ctx) == (4, expected_ring(3, rows, prefix=[[POISON_I64] * 8]))


def test_write_updates_per_tag_counter_views(impl):
    dev = impl.device
    kernel_runs = torch.zeros(12, dtype=torch.int64, device=dev)
    slot_runs = torch.zeros(12, dtype=torch.int64, device=dev)
    tag = CanaryLaunchTag.TAIL_K_SWA
    base = make_context(make_canary(8, device=dev), kind=tag)
    ctx = dataclasses.replace(base, kernel_run_counter=kernel_runs[tag : tag + 1],
                              slot_run_counter=slot_runs[tag : tag + 1])
    run_write(impl, ctx, make_write_plan([0, 2], [-1], device=dev), [1, 2], [0, 1], [1, 2])
    assert kernel_runs.tolist() == [1 if t == tag else 0 for t in range(12)]
    assert slot_runs.tolist() == [2 if t == tag else 0 for t in range(12)]


# ===== verify (SPEC 3.2)


def chain_buf(device, sources=(), mode=NONE):
    """16 slots of 48 bytes; chain [3, 4, 5] (tokens 10..12, positions 0..2) from the anchor; slot 0 zero."""
    buf = make_canary(16, stride=48, device=device)
    stamp_chain(buf, [(3, 10, 0), (4, 11, 1), (5, 12, 2)], sources=sources, mode=mode)
    return buf


def run_verify(impl, ctx, plan, check=True):
    impl.verify(context=ctx, plan=plan, check_verify_expected_token=check)


def clean_plan(device, **kw):
    return make_verify_plan([3, 4, 5], [10, 11, 12], [0, 1, 2], [-1, 3, 4], device=device, **kw)


def test_verify_clean_chain(impl):
    buf = chain_buf(impl.device)
    want = buf.clone()
    ctx = make_context(buf)
    run_verify(impl, ctx, clean_plan(impl.device))
    assert counters(ctx) == (1, 3)
    assert ring_state(ctx) == (0, expected_ring(8, []))
    assert torch.equal(buf, want)


def test_verify_chain_hash_mismatch(impl):
    buf = chain_buf(impl.device)
    tok, pos, _, rk = get_slot(buf, 4)
    set_slot(buf, 4, tok, pos, 0x77, rk)
    ctx = make_context(buf)
    run_verify(impl, ctx, clean_plan(impl.device))
    eh = py_chain_hash(buf, 3)
    # slot 5's expected hash comes from slot 4's stored (corrupted) fields.
    assert py_chain_hash(buf, 4) != get_slot(buf, 5)[2]
    assert ring_state(ctx) == (2, expected_ring(8, [
        [KIND, 4, 1, 11, 11, 0x77, eh, V_CHAIN],
        [KIND, 5, 2, 12, 12, get_slot(buf, 5)[2], py_chain_hash(buf, 4), V_CHAIN],
    ]))


def test_verify_position_mismatch_records_stored_position(impl):
    buf = chain_buf(impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([3, 4, 5], [10, 11, 12], [0, 7, 2], [-1, 3, 4], device=impl.device))
    sh = get_slot(buf, 4)[2]
    assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 4, 1, 11, 11, sh, sh, V_POS]]))


@pytest.mark.parametrize("check", [True, False])
def test_verify_expected_token_check_and_sentinel(impl, check):
    """Entry 0 expects a wrong token, entry 1 has the -1 sentinel, entry 2 also a bad position."""
    buf = chain_buf(impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([3, 4, 5], [99, -1, 98], [0, 1, 9], [-1, 3, 4], device=impl.device),
               check=check)
    sh3, sh5 = get_slot(buf, 3)[2], get_slot(buf, 5)[2]
    if check:
        rows = [[KIND, 3, 0, 10, 99, sh3, sh3, V_TOK], [KIND, 5, 2, 12, 98, sh5, sh5, V_TOK | V_POS]]
    else:
        rows = [[KIND, 5, 2, 12, -1, sh5, sh5, V_POS]]
    assert ring_state(ctx) == (len(rows), expected_ring(8, rows))


def test_verify_compares_all_64_bits(impl):
    """Expected tokens and positions that differ from the stored ones in the high 32 bits alone (or in the
    sign bit) are mismatches."""
    buf = chain_buf(impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([3, 4, 5], [10 + (1 << 32), 11, 12 - (1 << 63)],
                                           [-(1 << 63), 1 + (1 << 40), 2], [-1, 3, 4], device=impl.device))
    sh3, sh4, sh5 = (get_slot(buf, s)[2] for s in (3, 4, 5))
    assert ring_state(ctx) == (3, expected_ring(8, [
        [KIND, 3, 0, 10, 10 + (1 << 32), sh3, sh3, V_TOK | V_POS],
        [KIND, 4, 1, 11, 11, sh4, sh4, V_POS],
        [KIND, 5, 2, 12, 12 - (1 << 63), sh5, sh5, V_TOK],
    ]))


def test_verify_skips_slot_zero_but_counts_it(impl):
    buf = chain_buf(impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([0, 3, 0], [55, 10, 56], [9, 0, 9], [7, -1, 7], device=impl.device))
    assert counters(ctx) == (1, 3)
    assert ring_state(ctx) == (0, expected_ring(8, []))


def test_verify_predecessor_zero_disables_only_the_chain_check(impl):
    buf = chain_buf(impl.device)
    tok, pos, _, rk = get_slot(buf, 4)
    set_slot(buf, 4, tok, pos, 0x77, rk)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([4, 4], [11, 11], [1, 5], [0, 0], device=impl.device))
    assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 4, 1, 11, 11, 0x77, 0x77, V_POS]]))


def test_verify_negative_predecessor_is_the_anchor(impl):
    buf = chain_buf(impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([3, 3, 4], [10, 10, 11], [0, 0, 1], [-1, -7, -1], device=impl.device))
    sh4 = get_slot(buf, 4)[2]
    assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 4, 1, 11, 11, sh4, ANCHOR, V_CHAIN]]))


def test_verify_all_zero_slots_are_chain_consistent(impl):
    """mix3(0, 0, 0) == 0: a zero slot after a zero predecessor fails only on position."""
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([2, 3], [-1, -1], [0, 4], [1, 2], device=impl.device))
    assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 3, 0, 0, -1, 0, 0, V_POS]]))


@pytest.mark.parametrize("mode,sources", [(NONE, 1), (PARTIAL, 0)], ids=["none", "partial-no-src"])
def test_verify_nonzero_real_kv_without_folding(impl, mode, sources):
    """NONE, or PARTIAL without sources, expects real_kv_hash 0 (ALL without sources is rejected at
    context construction, SPEC D9)."""
    buf = chain_buf(impl.device)
    tok, pos, sh, _ = get_slot(buf, 4)
    set_slot(buf, 4, tok, pos, sh, 5)
    ctx = make_context(buf, sources=four_sources(0, impl.device)[:sources], mode=mode)
    run_verify(impl, ctx, clean_plan(impl.device))
    eh = py_chain_hash(buf, 3)
    assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 4, 1, 11, 11, sh, eh, V_RKV]]))


@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
@pytest.mark.parametrize("num_sources", [1, 2, 3, 4])
def test_verify_real_kv_sources(impl, mode, num_sources):
    """Slot 6 is in row 1 of the paged sources. Both modes fold byte 3, ALL only byte 20 (if
    read_bytes > 16), neither byte read_bytes nor the holey row tail."""
    sources = four_sources(7 + num_sources, impl.device)[:num_sources]
    buf = make_canary(16, device=impl.device)
    stamp_chain(buf, [(5, 1, 0), (6, 2, 1)], sources=sources, mode=mode)
    plan = make_verify_plan([5, 6], [1, 2], [0, 1], [-1, 5], device=impl.device)
    last = sources[-1]
    sh6 = get_slot(buf, 6)[2]
    bad_row = [KIND, 6, 1, 2, 2, sh6, sh6, V_RKV]

    u8 = last.tensor.view(torch.uint8)
    row, col0 = 6 // last.page_size, (6 % last.page_size) * last.num_bytes_per_token
    clean = (0, expected_ring(8, []))
    flagged = (1, expected_ring(8, [bad_row]))

    def ring_after_flip(col):
        """Verify with byte ``col`` of slot 6's source row flipped, then restore it."""
        u8[row, col] ^= 0xFF
        ctx = make_context(buf, sources=sources, mode=mode)
        run_verify(impl, ctx, plan)
        u8[row, col] ^= 0xFF
        return ring_state(ctx)

    ctx = make_context(buf, sources=sources, mode=mode)
    run_verify(impl, ctx, plan)
    assert ring_state(ctx) == clean
    assert ring_after_flip(col0 + 3) == flagged
    if last.read_bytes > 16:
        assert ring_after_flip(col0 + 20) == (flagged if mode == ALL else clean)
    if last.read_bytes < last.num_bytes_per_token:
        assert ring_after_flip(col0 + last.read_bytes) == clean
    if u8.shape[1] > last.page_size * last.num_bytes_per_token:
        assert ring_after_flip(u8.shape[1] - 1) == clean


def test_verify_enable_zero_skips_everything(impl):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([1, 2], [5, 5], [3, 3], [9, 9], enable=0, device=impl.device))
    assert counters(ctx) == (1, 0)
    assert ring_state(ctx) == (0, expected_ring(8, []))


@pytest.mark.parametrize("num_valid", [-2, 0])
def test_verify_nonpositive_count(impl, num_valid):
    buf = make_canary(8, device=impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([1], [5], [3], [9], num_valid=num_valid, device=impl.device))
    assert counters(ctx) == (1, 0)
    assert ring_state(ctx) == (0, expected_ring(8, []))


def test_verify_count_clamped_to_capacity_and_tail_ignored(impl):
    buf = chain_buf(impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([3, 4, 5], [10, 11, 12], [0, 1, 2], [-1, 3, 4], num_valid=99,
                                           device=impl.device))
    assert counters(ctx) == (1, 3)
    assert ring_state(ctx) == (0, expected_ring(8, []))
    ctx = make_context(buf)
    # Poisoned entries (slot -7777) past num_valid would be INVALID rows if read.
    run_verify(impl, ctx, make_verify_plan([3, 4], [10, 11], [0, 1], [-1, 3], capacity=6, device=impl.device))
    assert counters(ctx) == (1, 2)
    assert ring_state(ctx) == (0, expected_ring(8, []))


@pytest.mark.parametrize("check", [True, False])
def test_verify_invalid_slot(impl, check):
    buf = chain_buf(impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([16, -3, 3], [77, 78, 10], [0, 0, 0], [-1, 3, -1], device=impl.device),
               check=check)
    et = (77, 78) if check else (-1, -1)
    assert ring_state(ctx) == (2, expected_ring(8, [
        [KIND, 16, 0, 0, et[0], 0, 0, INVALID],
        [KIND, -3, 0, 0, et[1], 0, 0, INVALID],
    ]))
    assert counters(ctx) == (1, 3)


@pytest.mark.parametrize("short", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", [PARTIAL, ALL], ids=["partial", "all"])
def test_verify_slot_unreadable_for_one_source(impl, mode, short):
    """Slot 9 is unreadable for one of four sources: an INVALID row of zeros; slot 3 checks clean."""
    buf = chain_buf(impl.device, sources=four_sources(3, impl.device), mode=mode)
    ctx = make_context(buf, sources=one_source_short(short, impl.device), mode=mode)
    run_verify(impl, ctx, make_verify_plan([3, 9], [10, 11], [0, 1], [-1, 3], device=impl.device))
    assert ring_state(ctx) == (1, expected_ring(8, [[KIND, 9, 0, 0, 11, 0, 0, INVALID]]))


def test_verify_invalid_predecessor(impl):
    """prev >= S: chain check skipped as for prev == 0, other checks run, INVALID always set."""
    buf = chain_buf(impl.device)
    ctx = make_context(buf)
    run_verify(impl, ctx, make_verify_plan([4, 5], [11, 12], [1, 9], [16, 1 << 40], device=impl.device))
    sh4, sh5 = get_slot(buf, 4)[2], get_slot(buf, 5)[2]
    assert ring_state(ctx) == (2, expected_ring(8, [
        [KIND, 4, 1, 11, 11, sh4, sh4, INVALID],
        [KIND, 5, 2, 12, 12, sh5, sh5, INVALID | V_POS],
    ]))


def test_verify_ring_overflow_and_kernel_kind(impl):
    buf = chain_buf(impl.device)
    kind = int(CanaryLaunchTag.SWEEP_V_SWA)
    ctx = make_context(buf, kind=CanaryLaunchTag.SWEEP_V_SWA, ring_capacity=2)
    plan = make_verify_plan([3, 4, 5], [10, 11, 12], [1, 2, 3], [-1, 3, 4], device=impl.device)
    run_verify(impl, ctx, plan)
    sh = [get_slot(buf, s)[2] for s in (3, 4)]
    rows = [[kind, 3, 0, 10, 10, sh[0], sh[0], V_POS], [kind, 4, 1, 11, 11, sh[1], sh[1], V_POS]]
    assert ring_state(ctx) == (3, rows)
    run_verify(impl, ctx, plan)
    assert ring_state(ctx) == (6, rows)
    assert counters(ctx) == (2, 6)


def test_verify_ring_after_a_wrapped_write_index(impl):
    """A write index wrapped past 2**31 - 1 (here -1): the first row would land before the ring and is
    dropped, the next land at 0, 1, ...; the index counts every row (-1 + 3 = 2)."""
    buf = chain_buf(impl.device)
    kind = int(CanaryLaunchTag.SWEEP_V_SWA)
    ctx = make_context(buf, kind=CanaryLaunchTag.SWEEP_V_SWA, ring_capacity=3, write_index=-1)
    plan = make_verify_plan([3, 4, 5], [10, 11, 12], [1, 2, 3], [-1, 3, 4], device=impl.device)
    run_verify(impl, ctx, plan)
    sh = [get_slot(buf, s)[2] for s in (3, 4, 5)]
    rows = [[kind, s, p, 10 + p, 10 + p, h, h, V_POS] for s, p, h in zip((3, 4, 5), (0, 1, 2), sh)]
    assert ring_state(ctx) == (2, expected_ring(3, rows[1:]))


# ===== plan (SPEC 3.3)


def poisoned_plans(device, vcap: int, wcap: int) -> tuple[VerifyPlan, WritePlan]:
    vplan = VerifyPlan.allocate(verify_capacity=vcap, device=device)
    wplan = WritePlan.allocate(write_req_capacity=wcap, device=device)
    for t in (vplan.verify_slot_indices, vplan.verify_expected_tokens, vplan.verify_expected_positions,
              vplan.verify_prev_slot_indices, vplan.verify_num_valid, vplan.enable,
              wplan.write_offsets, wplan.write_seed_slot_indices, wplan.write_num_valid_reqs):
        t.fill_(POISON_I64)
    return vplan, wplan


def run_plan(impl, vplan, wplan, *, rpi, prefix, extend, rtt, window=0, lut=None, pool=None, valid_lens=None,
             offset=0):
    dev = impl.device
    impl.plan(
        verify_plan_out=vplan,
        write_plan_out=wplan,
        req_pool_indices=i64(rpi, dev),
        prefix_lens=i64(prefix, dev),
        extend_seq_lens=i64(extend, dev),
        req_to_token=i32(rtt, dev),
        swa_window_size=window,
        full_to_swa_index_mapping=None if lut is None else i64(lut, dev),
        verify_capacity=vplan.verify_slot_indices.shape[0],
        req_to_verify_expected_tokens=None if pool is None else i32(pool, dev),
        req_to_verify_expected_tokens_valid_lens=None if valid_lens is None else i64(valid_lens, dev),
        kv_token_id_vs_position_offset=offset,
    )


def verify_state(vplan: VerifyPlan) -> dict:
    return {
        "slots": vplan.verify_slot_indices.tolist(),
        "tokens": vplan.verify_expected_tokens.tolist(),
        "positions": vplan.verify_expected_positions.tolist(),
        "prevs": vplan.verify_prev_slot_indices.tolist(),
        "num_valid": int(vplan.verify_num_valid[0]),
        "enable": int(vplan.enable[0]),
    }


def write_state(wplan: WritePlan) -> dict:
    return {
        "offsets": wplan.write_offsets.tolist(),
        "seeds": wplan.write_seed_slot_indices.tolist(),
        "num_reqs": int(wplan.write_num_valid_reqs[0]),
    }


def padded(vals: list[int], n: int) -> list[int]:
    return vals + [POISON_I64] * (n - len(vals))


# req_to_token with 4 request rows of 8 positions: row r holds full slots 10*r + pos.
RTT = [[10 * r + p for p in range(8)] for r in range(4)]


def test_plan_full_group(impl):
    vplan, wplan = poisoned_plans(impl.device, 8, 4)
    run_plan(impl, vplan, wplan, rpi=[1, 2], prefix=[3, 2], extend=[1, 4], rtt=RTT)
    assert verify_state(vplan) == {
        "slots": padded([10, 11, 12, 20, 21], 8),
        "tokens": padded([-1] * 5, 8),
        "positions": padded([0, 1, 2, 0, 1], 8),
        "prevs": padded([-1, 10, 11, -1, 20], 8),
        "num_valid": 5,
        "enable": 1,
    }
    assert write_state(wplan) == {"offsets": [0, 1, 5, 0, 0], "seeds": padded([12, 21], 4), "num_reqs": 2}


def test_plan_padding_and_out_of_range_rows(impl):
    """Only 1 <= req_pool_indices[r] < 4 is active; other rows are padding everywhere."""
    vplan, wplan = poisoned_plans(impl.device, 4, 5)
    run_plan(impl, vplan, wplan, rpi=[0, 3, -2, 4], prefix=[2, 2, 2, 2], extend=[3, 3, 3, 3], rtt=RTT)
    assert verify_state(vplan) == {
        "slots": [30, 31, POISON_I64, POISON_I64],
        "tokens": [-1, -1, POISON_I64, POISON_I64],
        "positions": [0, 1, POISON_I64, POISON_I64],
        "prevs": [-1, 30, POISON_I64, POISON_I64],
        "num_valid": 2,
        "enable": 1,
    }
    assert write_state(wplan) == {"offsets": [0, 0, 3, 3, 3, 0], "seeds": [-1, 31, -1, -1, POISON_I64], "num_reqs": 4}


def test_plan_write_lengths_and_seeds(impl):
    """extend <= 0: no write, seed -1; prefix 0 or negative: seed -1; prefix past the table: clamped."""
    vplan, wplan = poisoned_plans(impl.device, 16, 5)
    run_plan(impl, vplan, wplan, rpi=[1, 1, 2, 3, 2], prefix=[2, 2, 0, 11, -3], extend=[0, -1, 2, 1, 2], rtt=RTT)
    assert write_state(wplan) == {"offsets": [0, 0, 0, 2, 3, 5], "seeds": [-1, -1, -1, 37, -1], "num_reqs": 5}
    v = verify_state(vplan)
    assert v["num_valid"] == 12 and v["enable"] == 1
    assert v["slots"][:12] == [10, 11, 10, 11] + [30 + p for p in range(8)]
    assert v["positions"][:12] == [0, 1, 0, 1] + list(range(8))
    assert v["prevs"][:12] == [-1, 10, -1, 10, -1] + [30 + p for p in range(7)]


def test_plan_swa_window_and_lut(impl):
    """Window 2: positions max(0, P-2)..P-1; the window head keeps its real (translated) predecessor.
    LUT: x -> 100 + x, full slot 12 evicted (-> 0), negative req_to_token values pass through."""
    rtt = [row[:] for row in RTT]
    rtt[1][4] = -1
    lut = [100 + x for x in range(40)]
    lut[12] = 0
    vplan, wplan = poisoned_plans(impl.device, 8, 3)
    run_plan(impl, vplan, wplan, rpi=[1, 2, 3], prefix=[5, 1, 2], extend=[1, 1, 0], rtt=rtt, window=2, lut=lut)
    assert verify_state(vplan) == {
        "slots": padded([113, -1, 120, 130, 131], 8),
        "tokens": padded([-1] * 5, 8),
        "positions": padded([3, 4, 0, 0, 1], 8),
        "prevs": padded([0, 113, -1, -1, 130], 8),
        "num_valid": 5,
        "enable": 1,
    }
    assert write_state(wplan) == {"offsets": [0, 1, 2, 2], "seeds": [-1, 120, -1], "num_reqs": 3}


def test_plan_lut_translates_slot_zero(impl):
    """A req_to_token value 0 goes through the LUT as any other slot: lut[0]."""
    rtt = [row[:] for row in RTT]
    rtt[1][1] = 0
    lut = [100 + x for x in range(40)]
    vplan, wplan = poisoned_plans(impl.device, 4, 1)
    run_plan(impl, vplan, wplan, rpi=[1], prefix=[3], extend=[0], rtt=rtt, window=2, lut=lut)
    assert verify_state(vplan) == {
        "slots": padded([100, 112], 4),
        "tokens": padded([-1] * 2, 4),
        "positions": padded([1, 2], 4),
        "prevs": padded([110, 100], 4),
        "num_valid": 2,
        "enable": 1,
    }


@pytest.mark.parametrize("prefix", [0, 1, 2, 3, 4])
def test_plan_swa_window_boundary(impl, prefix):
    """Window 2 at every prefix near its length: positions max(0, P-2)..P-1, the first chained to the
    slot of position P-3 when P > 2 (boundary P = 3: the window starts at 1, not 0), else to -1."""
    window, lut = 2, list(range(40))
    vplan, wplan = poisoned_plans(impl.device, 8, 2)
    run_plan(impl, vplan, wplan, rpi=[1], prefix=[prefix], extend=[0], rtt=RTT, window=window, lut=lut)
    positions = list(range(max(0, prefix - window), prefix))
    prevs = [RTT[1][p - 1] if p > 0 else -1 for p in positions]
    state = verify_state(vplan)
    assert (state["num_valid"], state["positions"][:len(positions)]) == (len(positions), positions)
    assert state["slots"][:len(positions)] == [RTT[1][p] for p in positions]
    assert state["prevs"][:len(positions)] == prevs


def test_plan_lut_index_past_end(impl):
    """Reference raises (SPEC D4); kernels clamp the LUT index to the last entry."""
    vplan, wplan = poisoned_plans(impl.device, 8, 2)
    lut = [100 + x for x in range(12)]  # covers full slots 0..11; row 1 holds 10..17
    kw = dict(rpi=[1], prefix=[3], extend=[1], rtt=RTT, lut=lut)
    if impl.name == "reference":
        message = r"^kv-canary: SWA slot 12 is outside full_to_swa_index_mapping length 12$"
        with pytest.raises(ValueError, match=message):
            run_plan(impl, vplan, wplan, **kw)
        return
    run_plan(impl, vplan, wplan, **kw)
    assert verify_state(vplan)["slots"][:3] == [110, 111, 111]
    assert write_state(wplan)["seeds"] == [111, POISON_I64]


def test_plan_lut_checked_only_where_stored(impl):
    """The reference checks the LUT range of what it stores (docs/SEMANTICS.md "Plan"): an overflowing
    plan stores no verify entry, so a slot past the table there raises nothing and all backends leave the
    same bytes; a seed past the table still raises in the reference."""
    lut = list(range(10))
    rtt = [[0, 0], [5, 99]]  # row 1: position 1's slot is past the table
    vplan, wplan = poisoned_plans(impl.device, 1, 1)
    run_plan(impl, vplan, wplan, rpi=[1], prefix=[2], extend=[0], rtt=rtt, lut=lut)  # 2 entries, capacity 1
    assert (verify_state(vplan)["num_valid"], verify_state(vplan)["enable"]) == (1, 0)
    assert write_state(wplan) == {"offsets": [0, 0], "seeds": [-1], "num_reqs": 1}
    if impl.name == "reference":  # the seed, slot 99, is stored: checked
        message = r"^kv-canary: SWA slot 99 is outside full_to_swa_index_mapping length 10$"
        with pytest.raises(ValueError, match=message):
            run_plan(impl, *poisoned_plans(impl.device, 1, 1), rpi=[1], prefix=[2], extend=[1], rtt=rtt, lut=lut)


@pytest.mark.parametrize("offset", [0, 1, -1])
def test_plan_expected_token_pool(impl, offset):
    """pool[rp, q] with q = pos + offset iff 0 <= q < valid_len, q < pool width, rp < pool rows."""
    pool = [[-1000 * r - q for q in range(5)] for r in range(3)]  # rows 0..2 only; negatives sign-extend
    vplan, wplan = poisoned_plans(impl.device, 16, 3)
    run_plan(impl, vplan, wplan, rpi=[1, 2, 3], prefix=[6, 2, 2], extend=[1, 1, 1], rtt=RTT,
             pool=pool, valid_lens=[4, 9, 9], offset=offset)

    def want(rp, pos, valid_len):
        q = pos + offset
        ok = 0 <= q < valid_len and q < 5 and rp < 3
        return pool[rp][q] if ok else -1

    expected = [want(1, p, 4) for p in range(6)] + [want(2, p, 9) for p in range(2)] + [-1, -1]
    assert verify_state(vplan)["tokens"] == padded(expected, 16)


def test_plan_verify_capacity_overflow(impl):
    vplan, wplan = poisoned_plans(impl.device, 4, 2)
    run_plan(impl, vplan, wplan, rpi=[1, 2], prefix=[3, 2], extend=[1, 1], rtt=RTT)
    assert verify_state(vplan) == {
        "slots": [POISON_I64] * 4, "tokens": [POISON_I64] * 4, "positions": [POISON_I64] * 4,
        "prevs": [POISON_I64] * 4, "num_valid": 4, "enable": 0,
    }
    assert write_state(wplan) == {"offsets": [0, 1, 2], "seeds": [12, 21], "num_reqs": 2}
    run_plan(impl, vplan, wplan, rpi=[1, 2], prefix=[2, 2], extend=[1, 1], rtt=RTT)
    v = verify_state(vplan)
    assert (v["slots"], v["num_valid"], v["enable"]) == ([10, 11, 20, 21], 4, 1)


def test_plan_no_verify_entries_enables(impl):
    vplan, wplan = poisoned_plans(impl.device, 2, 2)
    run_plan(impl, vplan, wplan, rpi=[0, 1], prefix=[4, 0], extend=[1, 3], rtt=RTT)
    assert verify_state(vplan) == {
        "slots": [POISON_I64] * 2, "tokens": [POISON_I64] * 2, "positions": [POISON_I64] * 2,
        "prevs": [POISON_I64] * 2, "num_valid": 0, "enable": 1,
    }
    assert write_state(wplan) == {"offsets": [0, 0, 3], "seeds": [-1, -1], "num_reqs": 2}


def test_plan_shrinking_batch_keeps_stale_tails(impl):
    vplan, wplan = poisoned_plans(impl.device, 8, 4)
    run_plan(impl, vplan, wplan, rpi=[1, 2, 3], prefix=[2, 2, 2], extend=[1, 2, 3], rtt=RTT)
    assert write_state(wplan) == {"offsets": [0, 1, 3, 6, 0], "seeds": [11, 21, 31, POISON_I64], "num_reqs": 3}
    run_plan(impl, vplan, wplan, rpi=[3], prefix=[1], extend=[2], rtt=RTT)
    assert verify_state(vplan) == {
        "slots": padded([30, 11, 20, 21, 30, 31], 8),
        "tokens": padded([-1] * 6, 8),
        "positions": padded([0, 1, 0, 1, 0, 1], 8),
        "prevs": padded([-1, 10, -1, 20, -1, 30], 8),
        "num_valid": 1,
        "enable": 1,
    }
    assert write_state(wplan) == {"offsets": [0, 2, 0, 0, 0], "seeds": [30, 21, 31, POISON_I64], "num_reqs": 1}


def test_plan_reference_errors():
    """Messages of SPEC 4 "Plan reference" (the front end raises its own texts first)."""
    vplan, wplan = poisoned_plans("cpu", 4, 2)
    kw = dict(
        verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=i64([1]), prefix_lens=i64([1]),
        extend_seq_lens=i64([1]), req_to_token=i32(RTT), swa_window_size=0, full_to_swa_index_mapping=None,
        verify_capacity=4, req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    with pytest.raises(ValueError, match=r"^kv-canary: launch_canary_plan_kernels_torch_reference verify_capacity=5 "
                       r"does not match verify_plan_out\.verify_slot_indices\.shape\[0\]=4$"):
        reference.canary_plan_ref(**(kw | {"verify_capacity": 5}))
    with pytest.raises(ValueError, match=r"^kv-canary: launch_canary_plan_kernels_torch_reference requires "
                       r"req_to_verify_expected_tokens_valid_lens when req_to_verify_expected_tokens is set$"):
        reference.canary_plan_ref(**(kw | {"req_to_verify_expected_tokens": i32(RTT)}))
    assert verify_state(vplan)["num_valid"] == POISON_I64  # raised before touching the plans


# ===== scatter (SPEC 3.4)


def run_scatter(impl, flat, offsets, rpi, pool):
    dev = impl.device
    impl.scatter(flat_in=i64(flat, dev), offsets=i64(offsets, dev), req_pool_indices=i64(rpi, dev), pool_out=pool)


def poisoned_pool(device, rows=4, cols=5):
    return torch.full((rows, cols), POISON_I64, dtype=torch.int32, device=device)


def test_scatter_rows_and_truncation(impl):
    pool = poisoned_pool(impl.device)
    run_scatter(impl, list(range(1, 10)), [0, 3, 9], [2, 1], pool)
    want = poisoned_pool("cpu")
    want[2, :3] = torch.tensor([1, 2, 3])
    want[1, :5] = torch.tensor([4, 5, 6, 7, 8])
    assert torch.equal(pool.cpu(), want)


def test_scatter_truncates_int64_to_int32(impl):
    pool = poisoned_pool(impl.device)
    run_scatter(impl, [(1 << 32) + 5, 1 << 31, -1, (1 << 40) - 1, -(1 << 31) - 1], [0, 5], [3], pool)
    assert pool[3].tolist() == [5, -(1 << 31), -1, -1, (1 << 31) - 1]


@pytest.mark.parametrize("flat,offsets,rpi", [([], [0, 0], [1]), ([1, 2], [0], [])], ids=["empty-flat", "bs0"])
def test_scatter_noop(impl, flat, offsets, rpi):
    pool = poisoned_pool(impl.device)
    run_scatter(impl, flat, offsets, rpi, pool)
    assert torch.equal(pool.cpu(), poisoned_pool("cpu"))


def test_scatter_skips_bad_rows_and_masks_reads(impl):
    """Rows 0, 1: pool indices -1, 4 (outside the pool); rows 2, 3: end < start; row 4 reads from
    start -2 (columns 0, 1 untouched), row 5 from start 7 of 9 (columns 2.. untouched)."""
    pool = poisoned_pool(impl.device)
    flat = list(range(100, 109))
    run_scatter(impl, flat, [0, 2, 4, 3, -2, 7, 12], [-1, 4, 1, 2, 3, 0], pool)
    want = poisoned_pool("cpu")
    want[3, 2:5] = torch.tensor([100, 101, 102])
    want[0, :2] = torch.tensor([107, 108])
    assert torch.equal(pool.cpu(), want)


# ===== plan -> write -> verify


def test_plan_write_verify_round_trip(impl):
    """Two steps of one request through plan, write, verify: no violations; then a corruption."""
    dev = impl.device
    buf = make_canary(32, device=dev)
    ctx = make_context(buf)
    vplan, wplan = poisoned_plans(dev, 16, 2)
    rtt = [[0] * 8, [5, 9, 3, 7, 11, 13, 2, 4]]
    toks = [40, 41, 42, 43, 44, 45]
    # step 1: prefill 4 tokens; step 2: decode 1 token at position 4.
    for prefix, extend in ((0, 4), (4, 1)):
        run_plan(impl, vplan, wplan, rpi=[1], prefix=[prefix], extend=[extend], rtt=rtt,
                 pool=[[0] * 8, toks + [0, 0]], valid_lens=[6])
        run_verify(impl, ctx, vplan)
        run_write(impl, ctx, wplan, toks[prefix : prefix + extend], list(range(prefix, prefix + extend)),
                  rtt[1][prefix : prefix + extend])
    assert ring_state(ctx) == (0, expected_ring(8, []))
    assert counters(ctx) == (4, 4 + 5)
    h = ANCHOR
    for p in range(5):
        assert get_slot(buf, rtt[1][p]) == (toks[p], p, h, 0)
        h = link(h, toks[p], p)
    set_slot(buf, 3, 99, 2, get_slot(buf, 3)[2])
    run_plan(impl, vplan, wplan, rpi=[1], prefix=[5], extend=[1], rtt=rtt, pool=[[0] * 8, toks + [0, 0]],
             valid_lens=[6])
    run_verify(impl, ctx, vplan)
    sh3, sh7 = get_slot(buf, 3)[2], get_slot(buf, 7)[2]
    assert ring_state(ctx) == (2, expected_ring(8, [
        [KIND, 3, 2, 99, 42, sh3, sh3, V_TOK],
        [KIND, 7, 3, 43, 43, sh7, py_chain_hash(buf, 3), V_CHAIN],
    ]))
