"""Public launch functions (SPEC 0): check the arguments, then run the kernel's torch operator.

Every function is keyword-only, mutates its outputs in place on the device of its inputs, and returns None. The checks
read only metadata (dtypes, shapes, strides, devices), so they also run while ``torch.compile`` traces a caller, which
then records the operator (``tvm_canary.ops``); untraced calls run the operator's implementation directly (compiled
verify and write replay the checked, packed launch of their context and plan while its tensors' metadata is unchanged:
``tvm_canary.eager``). Either runs the compiled kernel, or the torch reference under
``use_backend("reference")``. CUDA launches go on torch's current stream with no host synchronisation; tensors reach the
kernels zero-copy through DLPack (tvm-ffi).
"""

from __future__ import annotations

import torch

from . import checks, eager, ops
from .context import VerifyOrWriteContext
from .plans import VerifyPlan, WritePlan

_ops = torch.ops.tvm_canary
_tracing = checks.tracing


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
    if not _tracing():
        eager.write(context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert,
                    expected_input_tokens, expected_input_positions)
        return
    kwargs = dict(
        context=context, plan=plan, input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc,
        enable_write_input_assert=enable_write_input_assert, expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
    )
    checks.check_write(**kwargs)
    dispatch("write", kwargs)


def launch_canary_verify_kernel(
    *, context: VerifyOrWriteContext, plan: VerifyPlan, check_verify_expected_token: bool
) -> None:
    """Check the plan's entries against ``context.canary_buf`` and append violations (SPEC 3.2)."""
    if not _tracing():
        eager.verify(context, plan, check_verify_expected_token)
        return
    kwargs = dict(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
    checks.check_verify(**kwargs)
    dispatch("verify", kwargs)


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
        verify_plan_out=verify_plan_out, write_plan_out=write_plan_out, req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens, extend_seq_lens=extend_seq_lens, req_to_token=req_to_token,
        swa_window_size=swa_window_size, full_to_swa_index_mapping=full_to_swa_index_mapping,
        verify_capacity=verify_capacity, req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
    )
    checks.check_plan(**kwargs)
    dispatch("plan", kwargs)


def launch_scatter_req_token_ids_kernel(
    *, flat_in: torch.Tensor, offsets: torch.Tensor, req_pool_indices: torch.Tensor, pool_out: torch.Tensor
) -> None:
    """Copy each request's tokens into its row of the expected-token pool (SPEC 3.4)."""
    kwargs = dict(flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out)
    checks.check_scatter(**kwargs)
    dispatch("scatter", kwargs)


def dispatch(kernel: str, kwargs: dict) -> None:
    """Run a launch whose arguments passed its ``checks.check_*``: through its torch operator while torch traces the
    caller, else straight to the operator's implementation (minus the dispatcher's host time)."""
    if _tracing():
        getattr(_ops, kernel)(*ops.ARGS[kernel](**kwargs))
    else:
        ops.run(kernel, kwargs)
