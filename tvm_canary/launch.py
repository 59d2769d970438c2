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
from .runtime import get_kernel, packing, use_reference


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
    _launch("write", locals())


def launch_canary_verify_kernel(*, context: VerifyOrWriteContext, plan: VerifyPlan, check_verify_expected_token: bool) -> None:
    """Check the plan's entries against ``context.canary_buf`` and append violations (SPEC 3.2)."""
    _launch("verify", locals())


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
    _launch("plan", locals())


def launch_scatter_req_token_ids_kernel(
    *, flat_in: torch.Tensor, offsets: torch.Tensor, req_pool_indices: torch.Tensor, pool_out: torch.Tensor
) -> None:
    """Copy each request's tokens into its row of the expected-token pool (SPEC 3.4)."""
    _launch("scatter", locals())


# kernel -> (front-end check, torch reference, packing of the compiled function's arguments)
_STAGES = {
    "write": (checks.check_write, reference.canary_write_ref, packing.write_call),
    "verify": (checks.check_verify, reference.canary_verify_ref, packing.verify_call),
    "plan": (checks.check_plan, reference.canary_plan_ref, packing.plan_call),
    "scatter": (checks.check_scatter, reference.scatter_req_token_ids_ref, packing.scatter_call),
}


def _launch(kernel: str, kwargs: dict) -> None:
    """Check the arguments, then run the reference (if chosen) or the compiled kernel."""
    check, ref, pack = _STAGES[kernel]
    check(**kwargs)
    if use_reference():
        ref(**kwargs)
        return
    call = pack(**kwargs)
    if call is not None:
        get_kernel(call.kernel, call.spec, call.device, call.size, call.mode)(*call.args)
