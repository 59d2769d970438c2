"""Baseline (b): verify and write as a user would write them in Triton.

* verify: one program per 1024 entries of the plan's capacity (grid ``cdiv(cap, 1024)``, 4 warps), the
  active count read on the device; every lane checks one entry; violation rows are appended by atomic
  arrival (so a ring is compared to the reference's as a set of rows).
* write: one program per request walking its tokens serially (the chain is sequential), the real-KV
  fold of each token inline.
Real-KV sources: up to two (a K and a V pool, the common case), each passed as an int64 view
``[rows, row_words]`` with its page size and words per token. The arithmetic is the uint64 splitmix64 /
mix3 of docs/SPEC.md section 1.3.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tvm_canary._consts import ANCHOR_HASH, PARTIAL_READ_BYTES
from tvm_canary.consts import RealKvHashMode

VERIFY_BLOCK = 1024
ANCHOR = tl.constexpr(ANCHOR_HASH)  # splitmix64(CANARY_CHAIN_ANCHOR) as a uint64 literal
MAX_SOURCES = 2


@triton.jit
def _splitmix64(x):
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _mix3(a, b, c):
    h = _splitmix64(a)
    h = _splitmix64(h ^ b)
    return _splitmix64(h ^ c)


@triton.jit
def _u64(x):
    return x.to(tl.uint64, bitcast=True)


@triton.jit
def _i64(x):
    return x.to(tl.int64, bitcast=True)


@triton.jit
def _fold_one(src, row_words, page_size, token_words, slot, mask, FOLD_WORDS: tl.constexpr):
    base = (slot // page_size) * row_words + (slot % page_size) * token_words
    acc = tl.zeros_like(slot).to(tl.uint64)
    for w in tl.static_range(FOLD_WORDS):
        acc = _splitmix64(acc ^ _u64(tl.load(src + base + w, mask=mask, other=0)))
    return acc


@triton.jit
def _fold(src0, rw0, ps0, tw0, src1, rw1, ps1, tw1, slot, mask, NUM_SOURCES: tl.constexpr, FOLD_WORDS: tl.constexpr):
    acc = tl.zeros_like(slot).to(tl.uint64)
    if NUM_SOURCES >= 1:
        acc = _splitmix64(acc ^ _fold_one(src0, rw0, ps0, tw0, slot, mask, FOLD_WORDS))
    if NUM_SOURCES >= 2:
        acc = _splitmix64(acc ^ _fold_one(src1, rw1, ps1, tw1, slot, mask, FOLD_WORDS))
    return acc


@triton.jit
def _record(ring, ring_rows, write_index, bad, kind, f1, f2, f3, f4, f5, f6, f7):
    k = tl.atomic_add(write_index + tl.zeros_like(f1).to(tl.int32), 1, mask=bad).to(tl.int64)
    keep = bad & (k < ring_rows)
    row = ring + k * 8
    tl.store(row + 0, kind + tl.zeros_like(f1), mask=keep)
    tl.store(row + 1, f1, mask=keep)
    tl.store(row + 2, f2, mask=keep)
    tl.store(row + 3, f3, mask=keep)
    tl.store(row + 4, f4, mask=keep)
    tl.store(row + 5, f5, mask=keep)
    tl.store(row + 6, f6, mask=keep)
    tl.store(row + 7, f7, mask=keep)


@triton.jit
def _verify_kernel(canary, fields, slots, expected_tokens, expected_positions, prev_slots, num_valid, enable, cap,
                   ring, ring_rows, write_index, slot_counter, kernel_counter, kind,
                   src0, rw0, ps0, tw0, src1, rw1, ps1, tw1,
                   NUM_SOURCES: tl.constexpr, FOLD_WORDS: tl.constexpr, CHECK_TOKEN: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid == 0:
        tl.atomic_add(kernel_counter, 1)
    if tl.load(enable) != 0:
        active = tl.minimum(tl.maximum(tl.load(num_valid).to(tl.int64), 0), cap)
        k = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = k < active
        slot = tl.load(slots + k, mask=m, other=0)
        live = m & (slot != 0)
        row = canary + slot * fields
        st = tl.load(row + 0, mask=live, other=0)
        sp = tl.load(row + 1, mask=live, other=0)
        sh = tl.load(row + 2, mask=live, other=0)
        sr = tl.load(row + 3, mask=live, other=0)
        prev = tl.load(prev_slots + k, mask=live, other=0)
        linked = live & (prev > 0)
        prow = canary + tl.maximum(prev, 0) * fields
        pt = tl.load(prow + 0, mask=linked, other=0)
        pp = tl.load(prow + 1, mask=linked, other=0)
        ph = tl.load(prow + 2, mask=linked, other=0)
        anchor = tl.full(k.shape, ANCHOR, tl.uint64)
        eh = tl.where(prev < 0, _i64(anchor), _i64(_mix3(_u64(ph), _u64(pt), _u64(pp))))
        eh = tl.where(prev != 0, eh, sh)
        er = _i64(_fold(src0, rw0, ps0, tw0, src1, rw1, ps1, tw1, slot, live, NUM_SOURCES, FOLD_WORDS))
        if CHECK_TOKEN:
            et = tl.load(expected_tokens + k, mask=live, other=-1)
        else:
            et = tl.full(k.shape, -1, tl.int64)
        ep = tl.load(expected_positions + k, mask=live, other=0)
        bits = tl.where((prev != 0) & (sh != eh), 1, 0).to(tl.int64)
        bits |= tl.where((et != -1) & (st != et), 32, 0)
        bits |= tl.where(sp != ep, 2, 0)
        bits |= tl.where(sr != er, 4, 0)
        _record(ring, ring_rows, write_index, live & (bits != 0), kind, slot, sp, st, et, sh, eh, bits)
        tl.atomic_add(slot_counter, tl.sum(m.to(tl.int64)), mask=pid.to(tl.int64) * BLOCK < active)


@triton.jit
def _write_kernel(canary, fields, offsets, seeds, num_valid_reqs, cap, input_ids, positions, out_cache_loc,
                  expected_tokens, expected_positions, chain_assert, ring, ring_rows, write_index, slot_counter,
                  kernel_counter, kind, src0, rw0, ps0, tw0, src1, rw1, ps1, tw1,
                  NUM_SOURCES: tl.constexpr, FOLD_WORDS: tl.constexpr, INPUT_ASSERT: tl.constexpr):
    r = tl.program_id(0)
    if r == 0:
        tl.atomic_add(kernel_counter, 1)
    active = tl.minimum(tl.maximum(tl.load(num_valid_reqs).to(tl.int64), 0), cap)
    if r < active:
        s0 = tl.load(offsets + r)
        s1 = tl.load(offsets + r + 1)
        seed = tl.load(seeds + r)
        has_seed = seed >= 0
        srow = canary + tl.maximum(seed, 0) * fields
        st = tl.load(srow + 0, mask=has_seed, other=0)
        sp = tl.load(srow + 1, mask=has_seed, other=0)
        sh = tl.load(srow + 2, mask=has_seed, other=0)
        h = tl.where(has_seed, _mix3(_u64(sh), _u64(st), _u64(sp)), tl.full((), ANCHOR, tl.uint64))
        check_pos = has_seed & (tl.load(chain_assert) != 0)
        prev_pos = tl.where(check_pos, sp, 0)
        written = tl.zeros((), tl.int64)
        for i in range(s0, s1):
            slot = tl.load(out_cache_loc + i)
            live = slot >= 0
            tok = tl.load(input_ids + i)
            pos = tl.load(positions + i)
            if INPUT_ASSERT:
                et = tl.load(expected_tokens + i)
                ep = tl.load(expected_positions + i)
                bits = tl.where(tok != et, 8, 0).to(tl.int64) | tl.where(pos != ep, 16, 0)
                _record(ring, ring_rows, write_index, live & (bits != 0), kind, slot, pos, tok, et, _i64(h), ep, bits)
            seq = live & check_pos
            _record(ring, ring_rows, write_index, seq & (pos != prev_pos + 1), kind, slot, pos, tok, tok, _i64(h),
                    prev_pos + 1, tl.full((), 16, tl.int64))
            prev_pos = tl.where(seq, pos, prev_pos)
            rk = _i64(_fold(src0, rw0, ps0, tw0, src1, rw1, ps1, tw1, tl.maximum(slot, 0), live,
                            NUM_SOURCES, FOLD_WORDS))
            row = canary + slot * fields
            tl.store(row + 0, tok, mask=live)
            tl.store(row + 1, pos, mask=live)
            tl.store(row + 2, _i64(h), mask=live)
            tl.store(row + 3, rk, mask=live)
            h = tl.where(live, _mix3(h, _u64(tok), _u64(pos)), h)
            written += live.to(tl.int64)
        tl.atomic_add(slot_counter, written, mask=written != 0)


def _sources(context):
    """(kernel arguments of two source slots, NUM_SOURCES, FOLD_WORDS) of a context."""
    used = context.real_kv_sources if context.real_kv_hash_mode != RealKvHashMode.NONE else ()
    if len(used) > MAX_SOURCES:
        raise ValueError(f"kv-canary: the Triton baseline folds at most {MAX_SOURCES} real-KV sources")
    args: list = []
    fold_bytes = 0
    for s in used:
        words = s.tensor.view(torch.uint8).reshape(s.tensor.shape[0], -1).view(torch.int64)
        args += [words, words.stride(0), s.page_size, s.num_bytes_per_token // 8]
        fold_bytes = PARTIAL_READ_BYTES if context.real_kv_hash_mode == RealKvHashMode.PARTIAL else s.read_bytes
    if len({s.read_bytes for s in used}) > 1:
        raise ValueError("kv-canary: the Triton baseline needs one read_bytes for all sources")
    filler = context.violation_ring
    for _ in range(MAX_SOURCES - len(used)):
        args += [filler, 0, 1, 0]
    return args, len(used), fold_bytes // 8


def _sink(context):
    return [context.violation_ring, context.violation_ring.shape[0], context.violation_write_index,
            context.slot_run_counter, context.kernel_run_counter, int(context.kernel_kind)]


def verify(*, context, plan, check_verify_expected_token):
    canary = context.canary_buf.view(torch.int64)
    cap = plan.verify_slot_indices.shape[0]
    src, n, words = _sources(context)
    _verify_kernel[(triton.cdiv(cap, VERIFY_BLOCK),)](
        canary, canary.shape[1], plan.verify_slot_indices, plan.verify_expected_tokens, plan.verify_expected_positions,
        plan.verify_prev_slot_indices, plan.verify_num_valid, plan.enable, cap, *_sink(context), *src,
        NUM_SOURCES=n, FOLD_WORDS=words, CHECK_TOKEN=bool(check_verify_expected_token), BLOCK=VERIFY_BLOCK,
        num_warps=4,
    )


def write(*, context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert, expected_input_tokens,
          expected_input_positions):
    canary = context.canary_buf.view(torch.int64)
    cap = plan.write_seed_slot_indices.shape[0]
    on = bool(enable_write_input_assert)
    src, n, words = _sources(context)
    _write_kernel[(cap,)](
        canary, canary.shape[1], plan.write_offsets, plan.write_seed_slot_indices, plan.write_num_valid_reqs, cap,
        input_ids, positions, out_cache_loc, expected_input_tokens if on else input_ids,
        expected_input_positions if on else positions, context.enable_chain_position_assert, *_sink(context), *src,
        NUM_SOURCES=n, FOLD_WORDS=words, INPUT_ASSERT=on, num_warps=1,
    )


LAUNCHES = {"verify": verify, "write": write}
