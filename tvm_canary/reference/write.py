"""Torch reference of the write kernel (SPEC 3.1, D2, D3, D4; docs/SEMANTICS.md "Write")."""

from __future__ import annotations

import torch

from .. import _consts, consts
from ..consts import FailReason
from ..context import VerifyOrWriteContext
from ..plans import WritePlan
from .hashing import le_bytes, read_slot_fields, real_kv_fold_t, valid_slot_mask
from .ring import append_violation_rows, violation_row

_INVALID = int(FailReason.INVALID_INDEX)
_TOKEN_MISMATCH = int(FailReason.WRITE_TOKEN_MISMATCH)
_POSITION_MISMATCH = int(FailReason.WRITE_POSITION_MISMATCH)


class _WorkingBuffer:
    """The canary slots the launch touches, updated entry by entry (SPEC 3.1 "working copy").

    Reads fall back to the caller's buffer as it was at launch time (pre-gathered seed rows);
    :meth:`flush` writes bytes 0..31 of every written slot back into ``canary_buf``.
    """

    def __init__(self, canary_buf: torch.Tensor, read_slots: list[int]):
        self._buf = canary_buf
        fields = read_slot_fields(canary_buf, torch.tensor(read_slots, dtype=torch.int64, device=canary_buf.device))
        self._initial = dict(zip(read_slots, fields.cpu().tolist()))
        self._written: dict[int, list[int]] = {}

    def fields(self, slot: int) -> list[int]:
        """(token, position, prev_hash, real_kv_hash) as signed ints; ``slot`` must be a read slot
        or already written."""
        return self._written[slot] if slot in self._written else self._initial[slot]

    def store(self, slot: int, fields: list[int]) -> None:
        self._written[slot] = fields

    def flush(self) -> None:
        if not self._written:
            return
        dev = self._buf.device
        slots = torch.tensor(list(self._written), dtype=torch.int64, device=dev)
        words = torch.tensor(list(self._written.values()), dtype=torch.int64, device=dev)
        self._buf[slots, : _consts.CANARY_SLOT_BYTES] = le_bytes(words)


def _chain_hash(work: _WorkingBuffer, slot: int) -> int:
    """u64 chain-link hash of ``slot`` (anchor hash when negative)."""
    if slot < 0:
        return _consts.ANCHOR_HASH
    tok, pos, prev, _ = work.fields(slot)
    return _consts.splitmix64_mix3(prev, tok, pos)


def _clamped_count(t: torch.Tensor, cap: int) -> int:
    """``t[0]`` clamped to ``[0, cap]`` (SPEC D2)."""
    return min(max(int(t[0]), 0), cap)


def canary_write_ref(
    *,
    context: VerifyOrWriteContext,
    plan: WritePlan,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    enable_write_input_assert: bool,
    expected_input_tokens: torch.Tensor | None,
    expected_input_positions: torch.Tensor | None,
) -> None:
    """Stamp each planned token into the canary buffer and extend its request's hash chain.

    Arguments are validated by the front end. Mutates in place: ``context.canary_buf`` (bytes 0..31
    of written slots), the ring and write index, ``slot_run_counter`` (+ written entries) and
    ``kernel_run_counter`` (+1 always). Token tensors are int64 ``[N]``; ``expected_input_*`` are read
    only when ``enable_write_input_assert``.
    """
    context.kernel_run_counter.add_(1)
    seeds_all = plan.write_seed_slot_indices
    num_reqs = _clamped_count(plan.write_num_valid_reqs, seeds_all.shape[0])
    if num_reqs == 0:
        return

    kind = int(context.kernel_kind)
    num_slots = context.canary_buf.shape[0]
    offsets = plan.write_offsets[: num_reqs + 1].tolist()
    seeds = seeds_all[:num_reqs].tolist()
    toks = input_ids.tolist()
    poss = positions.tolist()
    locs_t = out_cache_loc.cpu()
    locs = locs_t.tolist()
    if enable_write_input_assert:
        exp_toks = expected_input_tokens.tolist()
        exp_poss = expected_input_positions.tolist()
    slot_ok_t = valid_slot_mask(num_slots, context.real_kv_sources, context.real_kv_hash_mode, locs_t)
    real_kv = torch.zeros_like(locs_t)
    real_kv[slot_ok_t] = real_kv_fold_t(context.real_kv_sources, context.real_kv_hash_mode, locs_t[slot_ok_t])
    slot_ok = slot_ok_t.tolist()
    real_kv = real_kv.tolist()

    work = _WorkingBuffer(context.canary_buf, sorted({s for s in seeds if 0 <= s < num_slots}))
    cpa = int(context.enable_chain_position_assert[0]) != 0
    n = len(locs)
    rows: list[list[int]] = []
    written = 0
    for r in range(num_reqs):
        s0 = min(max(offsets[r], 0), n)
        s1 = min(max(offsets[r + 1], s0), n)
        if s1 == s0:
            continue
        seed = seeds[r]
        if seed >= num_slots:
            rows.append(violation_row(kernel_kind=kind, slot_idx=seed, position=0, stored_token=0, expected_token=0,
                                      stored_chain_hash=0, expected_aux=0, fail_reason_bits=_INVALID))
            continue
        h = _chain_hash(work, seed)
        check_pos = seed >= 0 and cpa
        prev_pos = work.fields(seed)[consts.CANARY_FIELD_POSITION] if check_pos else 0
        for i in range(s0, s1):
            slot = locs[i]
            if slot < 0:
                continue
            tok, pos = toks[i], poss[i]
            h_i64 = _consts.to_signed_int64(h)
            if not slot_ok[i]:
                rows.append(violation_row(kernel_kind=kind, slot_idx=slot, position=pos, stored_token=tok,
                                          expected_token=tok, stored_chain_hash=h_i64, expected_aux=pos,
                                          fail_reason_bits=_INVALID))
                continue
            if enable_write_input_assert:
                et, ep = exp_toks[i], exp_poss[i]
                bits = (_TOKEN_MISMATCH if tok != et else 0) | (_POSITION_MISMATCH if pos != ep else 0)
                if bits:
                    rows.append(violation_row(kernel_kind=kind, slot_idx=slot, position=pos, stored_token=tok,
                                              expected_token=et, stored_chain_hash=h_i64, expected_aux=ep,
                                              fail_reason_bits=bits))
            if check_pos:
                want_pos = _consts.to_signed_int64(prev_pos + 1)
                if pos != want_pos:
                    rows.append(violation_row(kernel_kind=kind, slot_idx=slot, position=pos, stored_token=tok,
                                              expected_token=tok, stored_chain_hash=h_i64, expected_aux=want_pos,
                                              fail_reason_bits=_POSITION_MISMATCH))
                prev_pos = pos
            work.store(slot, [tok, pos, h_i64, real_kv[i]])
            h = _consts.splitmix64_mix3(h, tok, pos)
            written += 1

    work.flush()
    context.slot_run_counter.add_(written)
    append_violation_rows(context.violation_ring, context.violation_write_index, rows)
