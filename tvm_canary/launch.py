"""Public launch functions (SPEC 0): check -> pick backend -> run the compiled kernel.

Every function is keyword-only, mutates its outputs in place on the device of its inputs, and
returns None. CUDA launches go on torch's current stream with no host synchronisation; tensors reach
the kernels zero-copy through DLPack (tvm-ffi).
"""

from __future__ import annotations

import torch

from . import checks, reference
from .context import VerifyOrWriteContext
from .plans import VerifyPlan, WritePlan
from .runtime import get_kernel, use_reference
from .runtime.packing import canary_words, flags_for, folded_sources, source_args


def _context_args(context: VerifyOrWriteContext) -> list:
    return [
        context.violation_ring,
        context.violation_write_index,
        context.slot_run_counter,
        context.kernel_run_counter,
    ]


def launch_canary_write_kernel(
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
    """Stamp the fingerprints of the plan's tokens into ``context.canary_buf`` (SPEC 3.1)."""
    kwargs = dict(
        context=context,
        plan=plan,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        enable_write_input_assert=enable_write_input_assert,
        expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
    )
    checks.check_write(**kwargs)
    if use_reference():
        reference.canary_write_ref(**kwargs)
        return
    assert_on = bool(enable_write_input_assert)
    fn = get_kernel("write", (folded_sources(context), assert_on), context.canary_buf.device)
    cap = plan.write_seed_slot_indices.shape[0]
    expected_tokens = expected_input_tokens if assert_on else input_ids
    expected_positions = expected_input_positions if assert_on else positions
    fn(
        canary_words(context.canary_buf),
        plan.write_offsets,
        plan.write_seed_slot_indices,
        plan.write_num_valid_reqs,
        input_ids,
        positions,
        out_cache_loc,
        expected_tokens,
        expected_positions,
        context.enable_chain_position_assert,
        *_context_args(context),
        flags_for(context.violation_ring, cap),
        int(context.kernel_kind),
        *source_args(context),
    )


def launch_canary_verify_kernel(*, context: VerifyOrWriteContext, plan: VerifyPlan, check_verify_expected_token: bool) -> None:
    """Check the plan's entries against ``context.canary_buf`` and append violations (SPEC 3.2)."""
    checks.check_verify(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
    if use_reference():
        reference.canary_verify_ref(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
        return
    fn = get_kernel("verify", (folded_sources(context), bool(check_verify_expected_token)), context.canary_buf.device)
    fn(
        canary_words(context.canary_buf),
        plan.verify_slot_indices,
        plan.verify_expected_tokens,
        plan.verify_expected_positions,
        plan.verify_prev_slot_indices,
        plan.verify_num_valid,
        plan.enable,
        *_context_args(context),
        flags_for(context.violation_ring, plan.verify_slot_indices.shape[0]),
        int(context.kernel_kind),
        *source_args(context),
    )


def launch_canary_plan_kernels(
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
    """Fill ``verify_plan_out`` and ``write_plan_out`` from the engine's tables (SPEC 3.3)."""
    kwargs = dict(
        verify_plan_out=verify_plan_out,
        write_plan_out=write_plan_out,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        verify_capacity=verify_capacity,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
    )
    checks.check_plan(**kwargs)
    if use_reference():
        reference.canary_plan_ref(**kwargs)
        return
    device = verify_plan_out.verify_slot_indices.device
    has_lut = full_to_swa_index_mapping is not None
    has_pool = req_to_verify_expected_tokens is not None
    fn = get_kernel("plan", (has_lut, has_pool), device)
    bs = req_pool_indices.shape[0]
    scratch = torch.empty(bs + 1, dtype=torch.int64, device=device)
    lut = full_to_swa_index_mapping if has_lut else _placeholder(device, torch.int64, (1,))
    pool = req_to_verify_expected_tokens if has_pool else _placeholder(device, torch.int32, (1, 1))
    lens = req_to_verify_expected_tokens_valid_lens if has_pool else req_pool_indices
    fn(
        verify_plan_out.verify_slot_indices,
        verify_plan_out.verify_expected_tokens,
        verify_plan_out.verify_expected_positions,
        verify_plan_out.verify_prev_slot_indices,
        verify_plan_out.verify_num_valid,
        verify_plan_out.enable,
        write_plan_out.write_offsets,
        write_plan_out.write_seed_slot_indices,
        write_plan_out.write_num_valid_reqs,
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        lut,
        pool,
        lens,
        scratch,
        int(swa_window_size),
        int(kv_token_id_vs_position_offset),
    )


def launch_scatter_req_token_ids_kernel(
    *, flat_in: torch.Tensor, offsets: torch.Tensor, req_pool_indices: torch.Tensor, pool_out: torch.Tensor
) -> None:
    """Copy each request's tokens into its row of the expected-token pool (SPEC 3.4)."""
    checks.check_scatter(flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out)
    if use_reference():
        reference.scatter_req_token_ids_ref(flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out)
        return
    if req_pool_indices.shape[0] == 0 or flat_in.shape[0] == 0:
        return
    get_kernel("scatter", (), pool_out.device)(flat_in, offsets, req_pool_indices, pool_out)


_placeholders: dict[tuple, torch.Tensor] = {}


def _placeholder(device: torch.device, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """A small zero tensor standing in for an absent optional input (never read by the kernel)."""
    key = (device.type, device.index, dtype, shape)
    if key not in _placeholders:
        _placeholders[key] = torch.zeros(shape, dtype=dtype, device=device)
    return _placeholders[key]
