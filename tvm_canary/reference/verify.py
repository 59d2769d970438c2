"""Torch reference of the verify kernel (SPEC 3.2, D2, D3, D4; docs/SEMANTICS.md "Verify").

Vectorized over entries with tensor ops on the plan's device (it doubles as the GPU speed baseline).
"""

from __future__ import annotations

import torch

from .. import consts
from ..consts import FailReason
from ..context import VerifyOrWriteContext
from ..plans import VerifyPlan
from .hashing import chain_hash_t, read_slot_fields, real_kv_fold_t, valid_slot_mask
from .ring import append_violation_rows, violation_row


def _bit(mask: torch.Tensor, flag: FailReason) -> torch.Tensor:
    """int64 tensor: ``flag`` where ``mask`` else 0."""
    return mask.to(torch.int64) * int(flag)


def canary_verify_ref(*, context: VerifyOrWriteContext, plan: VerifyPlan, check_verify_expected_token: bool) -> None:
    """Check the first ``verify_num_valid`` plan entries against the canary buffer.

    The canary buffer is read only. Mutates in place: ``kernel_run_counter`` (+1 always),
    ``slot_run_counter`` (+ active entries, slot-0 ones included, when ``enable != 0``) and the ring
    (one row per failing entry, entry order). ``verify_expected_tokens`` is read only when
    ``check_verify_expected_token``.
    """
    context.kernel_run_counter.add_(1)
    if int(plan.enable[0]) == 0:
        return
    cap = plan.verify_slot_indices.shape[0]
    active = min(max(int(plan.verify_num_valid[0]), 0), cap)
    if active == 0:
        return
    context.slot_run_counter.add_(active)

    keep = plan.verify_slot_indices[:active] != consts.TOKEN_TO_KV_SLOT_PADDING
    slot = plan.verify_slot_indices[:active][keep]
    exp_pos = plan.verify_expected_positions[:active][keep]
    prev = plan.verify_prev_slot_indices[:active][keep]
    if check_verify_expected_token:
        exp_tok = plan.verify_expected_tokens[:active][keep]
    else:
        exp_tok = torch.full_like(slot, -1)

    buf = context.canary_buf
    sources, mode = context.real_kv_sources, context.real_kv_hash_mode
    ok = valid_slot_mask(buf.shape[0], sources, mode, slot)
    fields = torch.zeros((slot.shape[0], consts.CANARY_FIELDS_PER_SLOT), dtype=torch.int64, device=slot.device)
    fields[ok] = read_slot_fields(buf, slot[ok])
    st = fields[:, consts.CANARY_FIELD_TOKEN]
    sp = fields[:, consts.CANARY_FIELD_POSITION]
    sh = fields[:, consts.CANARY_FIELD_PREV_HASH]
    sr = fields[:, consts.CANARY_FIELD_REAL_KV_HASH]

    prev_invalid = prev >= buf.shape[0]
    chained = ok & (prev != consts.TOKEN_TO_KV_SLOT_PADDING) & ~prev_invalid
    eh = sh.clone()
    eh[chained] = chain_hash_t(buf, prev[chained])
    er = torch.zeros_like(slot)
    er[ok] = real_kv_fold_t(sources, mode, slot[ok])

    bits = (
        _bit(sh != eh, FailReason.VERIFY_CHAIN_HASH_MISMATCH)
        | _bit((exp_tok != -1) & (st != exp_tok), FailReason.VERIFY_TOKEN_MISMATCH)
        | _bit(sp != exp_pos, FailReason.VERIFY_POSITION_MISMATCH)
        | _bit(sr != er, FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
        | _bit(prev_invalid, FailReason.INVALID_INDEX)
    )
    bits = torch.where(ok, bits, int(FailReason.INVALID_INDEX))
    kind = torch.full_like(slot, int(context.kernel_kind))
    rows = violation_row(kernel_kind=kind, slot_idx=slot, position=sp, stored_token=st, expected_token=exp_tok,
                         stored_chain_hash=sh, expected_aux=eh, fail_reason_bits=bits)
    append_violation_rows(context.violation_ring, context.violation_write_index, rows[bits != 0])
