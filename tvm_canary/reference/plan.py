"""Torch reference of the plan kernels (SPEC 3.3; docs/SEMANTICS.md "Plan").

Computes on CPU, raises before mutating anything, then copies results into the caller's plan tensors.
"""

from __future__ import annotations

import torch

from .. import consts
from ..plans import VerifyPlan, WritePlan
from .swa import to_group_slots


def _translate(slots: torch.Tensor, lut: torch.Tensor | None) -> torch.Tensor:
    """``to_group_slots`` after checking the range: raises ValueError for the first ``x >= len(lut)``
    (kernels clamp instead, SPEC D4)."""
    if lut is not None:
        bad = slots >= lut.shape[0]
        if bool(bad.any()):
            slot = int(slots[bad][0])
            raise ValueError(f"kv-canary: SWA slot {slot} is outside full_to_swa_index_mapping length {lut.shape[0]}")
    return to_group_slots(slots, lut)


def _verify_entries(
    rows: torch.Tensor,
    pos: torch.Tensor,
    rp: torch.Tensor,
    req_to_token: torch.Tensor,
    lut: torch.Tensor | None,
    pool: torch.Tensor | None,
    valid_lens: torch.Tensor | None,
    token_offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(slot, expected_token, prev_slot) int64 vectors for entries at batch rows ``rows`` and
    positions ``pos`` (all CPU int64, entry order)."""
    req = rp[rows]
    slot = _translate(req_to_token[req, pos].to(torch.int64), lut)
    prev_raw = torch.where(pos > 0, req_to_token[req, (pos - 1).clamp(min=0)].to(torch.int64), -1)
    prev = _translate(prev_raw, lut)
    exp_tok = torch.full_like(pos, -1)
    if pool is not None:
        q = pos + token_offset
        hit = (q >= 0) & (q < valid_lens[rows]) & (q < pool.shape[1]) & (req < pool.shape[0])
        exp_tok[hit] = pool[req[hit], q[hit]].to(torch.int64)
    return slot, exp_tok, prev


def canary_plan_ref(
    *,
    verify_plan_out: VerifyPlan,
    write_plan_out: WritePlan,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int,
    full_to_swa_index_mapping: torch.Tensor | None,
    verify_capacity: int,
    req_to_verify_expected_tokens: torch.Tensor | None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None,
    kv_token_id_vs_position_offset: int,
) -> None:
    """Fill one VerifyPlan and one WritePlan from the batch (inputs int64 ``[bs]``, ``req_to_token``
    int32 ``[R, L]``, LUT int64, pool int32, valid_lens int64 ``[bs]``).

    Writes: verify vectors ``[0, total)`` only when ``total <= cap`` (stale tail untouched),
    ``verify_num_valid = min(total, cap)``, ``enable = total <= cap``; ``write_offsets[0..bs]`` exclusive
    cumsum and ``[bs+1..]`` zero; seeds ``r < bs`` (others untouched); ``write_num_valid_reqs = bs``.
    Rows beyond the plans' capacities are truncated.
    """
    cap = verify_plan_out.verify_slot_indices.shape[0]
    if verify_capacity != cap:
        raise ValueError(
            f"kv-canary: launch_canary_plan_kernels_torch_reference verify_capacity={verify_capacity} does not "
            f"match verify_plan_out.verify_slot_indices.shape[0]={cap}"
        )
    pool = req_to_verify_expected_tokens
    valid_lens = req_to_verify_expected_tokens_valid_lens
    if pool is not None and valid_lens is None:
        raise ValueError(
            "kv-canary: launch_canary_plan_kernels_torch_reference requires "
            "req_to_verify_expected_tokens_valid_lens when req_to_verify_expected_tokens is set"
        )
    cpu = torch.device("cpu")
    rp = req_pool_indices.to(cpu)
    prefix = prefix_lens.to(cpu)
    extend = extend_seq_lens.to(cpu)
    rtt = req_to_token.to(cpu)
    lut = None if full_to_swa_index_mapping is None else full_to_swa_index_mapping.to(cpu)
    bs = rp.shape[0]
    num_req_rows, table_len = rtt.shape

    active = (rp > consts.REQ_POOL_IDX_PADDING) & (rp < num_req_rows)
    # max(0, P - W) for W > 0, with P - W formed only where it is positive (no int64 wrap, as the kernels)
    win_start = torch.zeros_like(prefix)
    if swa_window_size > 0:
        win_start = torch.where(prefix > swa_window_size, prefix - swa_window_size, 0)
    verify_lens = torch.where(active, (prefix.clamp(max=table_len) - win_start).clamp(min=0), 0)
    total = int(verify_lens.sum())
    fits = total <= cap
    # Entries are built (and LUT-translated) only when they will be stored.
    rows = torch.repeat_interleave(torch.arange(bs), verify_lens if fits else torch.zeros_like(verify_lens))
    row_starts = torch.cumsum(verify_lens, 0) - verify_lens
    pos = win_start[rows] + torch.arange(rows.shape[0]) - row_starts[rows]
    slot, exp_tok, prev = _verify_entries(
        rows, pos, rp, rtt, lut,
        None if pool is None else pool.to(cpu),
        None if valid_lens is None else valid_lens.to(cpu),
        kv_token_id_vs_position_offset,
    )

    write_lens = torch.where(active & (extend > 0), extend, 0)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(write_lens, 0)])
    num_seeds = min(bs, write_plan_out.write_seed_slot_indices.shape[0])
    seeded = (active & (extend > 0) & (prefix > 0))[:num_seeds] & (table_len > 0)
    seed_pos = (prefix[:num_seeds] - 1).clamp(max=table_len - 1)
    seeds = torch.full((num_seeds,), -1, dtype=torch.int64)
    seeds[seeded] = _translate(rtt[rp[:num_seeds][seeded], seed_pos[seeded]].to(torch.int64), lut)

    if fits:
        verify_plan_out.verify_slot_indices[:total].copy_(slot)
        verify_plan_out.verify_expected_tokens[:total].copy_(exp_tok)
        verify_plan_out.verify_expected_positions[:total].copy_(pos)
        verify_plan_out.verify_prev_slot_indices[:total].copy_(prev)
    verify_plan_out.verify_num_valid.fill_(min(total, cap))
    verify_plan_out.enable.fill_(1 if fits else 0)

    num_offsets = min(bs + 1, write_plan_out.write_offsets.shape[0])
    write_plan_out.write_offsets[:num_offsets].copy_(offsets[:num_offsets])
    write_plan_out.write_offsets[num_offsets:].zero_()
    write_plan_out.write_seed_slot_indices[:num_seeds].copy_(seeds)
    write_plan_out.write_num_valid_reqs.fill_(bs)
