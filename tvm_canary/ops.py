"""The four kernels as torch operators: ``torch.ops.tvm_canary.{write, verify, plan, scatter}``.

Importing ``tvm_canary`` registers them (``torch.library``), so a serving step calling the public launch functions can
be traced by ``torch.compile(fullgraph=True)`` and captured in CUDA graphs: the launch functions check their arguments
(metadata only, so at trace time) and call these operators with flat arguments.

Each operator
* takes tensors, ints, bools, an int list and a tensor list (the real-KV sources) - never dataclasses;
* declares as mutable (``Tensor(a!)`` in its schema) exactly the caller tensors its kernel writes:
  write: ``canary_buf``, ``violation_ring``, ``violation_write_index``, ``slot_run_counter``,
  ``kernel_run_counter``; verify: the same minus ``canary_buf``; plan: the nine plan tensors;
  scatter: ``pool_out`` (SPEC 3.1-3.4);
* returns nothing, so its fake (meta) implementation returns None (``_fake``);
* runs, on CPU and CUDA, the compiled module (``runtime.get_kernel``) on the arguments built by
  ``runtime.packing``, or the torch reference under ``use_backend("reference")``.

Scratch the kernels also write is owned here, not exposed: verify/write's per-ring ``flags`` (kept
by ``runtime.packing``, zero again after every launch) and plan's offsets scratch (allocated per
launch). Neither is an output, so traced graphs need not see them; allocated during a CUDA-graph
capture, they come from the graph's pool and serve only its launch (``packing.flags_for``).

Every call runs the public launch's checks (SPEC 4, D10: ``checks.CHECKS``) on its tensors, then the kernel (a call
whose tensors are all meta only infers shapes), so a direct call is as safe as a public launch (the kernels rely on the
shape relations the checks establish: a too-short plan tensor would be read past its end). A traced caller's launch ran
them on fake tensors, without data pointers (alignment, overlaps). Untraced eager launches skip the operator and call
``run`` after their own checks (``launch.py``). Under ``torch.compile`` the implementations are opaque calls: nothing in
them is traced (locks, module loading, the tvm-ffi call).
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef

from . import checks, reference
from .argtypes import require_tensor
from .context import CanaryLaunchTag, RealKvSource, VerifyOrWriteContext, hash_mode, refuse_view_bits
from .plans import VerifyPlan, WritePlan, plan_tensors
from .runtime import get_kernel, packing, use_reference

NAMESPACE = "tvm_canary"
_lib = torch.library.Library(NAMESPACE, "DEF")


def _run_checked(kernel: str, launch_kwargs: dict) -> None:
    """``run`` after the public launch's checks (``checks.CHECKS``; the module docstring says why again)."""
    checks.CHECKS[kernel](**launch_kwargs)
    run(kernel, launch_kwargs)


def run(kernel: str, launch_kwargs: dict) -> None:
    """Run ``kernel`` on the public launch's keyword arguments: the reference when chosen, else the
    compiled module on the ``runtime.packing`` call (None: nothing to launch)."""
    if use_reference():
        reference.REFERENCE[kernel](**launch_kwargs)
        return
    call = packing.CALLS[kernel](**launch_kwargs)
    if call is not None:
        get_kernel(call.kernel, call.spec, call.device, call.size, call.mode)(*call.args)


# -- flat <-> dataclasses


def _context_args(context: VerifyOrWriteContext) -> tuple:
    """A launch context as the operators' leading arguments (inverse: ``_context``)."""
    sources = context.real_kv_sources
    layout = [x for s in sources for x in (s.page_size, s.num_bytes_per_token, s.read_bytes)]
    return (
        context.canary_buf, context.violation_ring, context.violation_write_index, context.slot_run_counter,
        context.kernel_run_counter, context.enable_chain_position_assert, int(context.kernel_kind),
        [s.tensor for s in sources], layout, int(context.real_kv_hash_mode),
    )


def _context(canary_buf, violation_ring, violation_write_index, slot_run_counter, kernel_run_counter,
             enable_chain_position_assert, kernel_kind, real_kv_tensors, real_kv_layout, real_kv_hash_mode):
    """Inverse of ``_context_args``; ``real_kv_layout`` is ``(page_size, num_bytes_per_token, read_bytes)``
    per source, flattened (the records check what they hold as they are built)."""
    if len(real_kv_layout) != 3 * len(real_kv_tensors):
        raise ValueError(f"kv-canary: real_kv_layout must hold 3 ints per real-KV tensor, got {len(real_kv_layout)} "
                         f"for {len(real_kv_tensors)}")
    sources = tuple(
        RealKvSource(tensor=t, page_size=real_kv_layout[3 * i], num_bytes_per_token=real_kv_layout[3 * i + 1],
                     read_bytes=real_kv_layout[3 * i + 2])
        for i, t in enumerate(real_kv_tensors)
    )
    return VerifyOrWriteContext(
        canary_buf=canary_buf, kernel_kind=_launch_tag(kernel_kind), violation_ring=violation_ring,
        violation_write_index=violation_write_index, slot_run_counter=slot_run_counter,
        kernel_run_counter=kernel_run_counter, real_kv_sources=sources,
        real_kv_hash_mode=hash_mode(real_kv_hash_mode), enable_chain_position_assert=enable_chain_position_assert,
    )


def _launch_tag(kernel_kind: int) -> CanaryLaunchTag | int:
    """The context's ``kernel_kind`` from the operator's int: its tag, or the int itself if it names
    none (a context takes any int64 and stamps it as is)."""
    return CanaryLaunchTag(kernel_kind) if kernel_kind in CanaryLaunchTag._value2member_map_ else kernel_kind


# The public launch's keyword arguments -> the operator's positional arguments.


def write_args(*, context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert,
               expected_input_tokens, expected_input_positions) -> tuple:
    return (*_context_args(context), *plan_tensors(plan), input_ids, positions, out_cache_loc,
            bool(enable_write_input_assert), expected_input_tokens, expected_input_positions)


def verify_args(*, context, plan, check_verify_expected_token) -> tuple:
    return (*_context_args(context), *plan_tensors(plan), bool(check_verify_expected_token))


def plan_args(*, verify_plan_out, write_plan_out, req_pool_indices, prefix_lens, extend_seq_lens, req_to_token,
              swa_window_size, full_to_swa_index_mapping, verify_capacity, req_to_verify_expected_tokens,
              req_to_verify_expected_tokens_valid_lens, kv_token_id_vs_position_offset) -> tuple:
    return (*plan_tensors(verify_plan_out), *plan_tensors(write_plan_out), req_pool_indices, prefix_lens,
            extend_seq_lens, req_to_token, int(swa_window_size), full_to_swa_index_mapping, verify_capacity,
            req_to_verify_expected_tokens, req_to_verify_expected_tokens_valid_lens,
            int(kv_token_id_vs_position_offset))


def scatter_args(*, flat_in, offsets, req_pool_indices, pool_out) -> tuple:
    return (flat_in, offsets, req_pool_indices, pool_out)


ARGS = {"write": write_args, "verify": verify_args, "plan": plan_args, "scatter": scatter_args}


# -- the four operators
# Parameter names are the schema's; ``_MUTATES`` names the tensors each kernel writes.

Tensor = torch.Tensor


def write(
    canary_buf: Tensor, violation_ring: Tensor, violation_write_index: Tensor, slot_run_counter: Tensor,
    kernel_run_counter: Tensor, enable_chain_position_assert: Tensor, kernel_kind: int,
    real_kv_tensors: list[Tensor], real_kv_layout: list[int], real_kv_hash_mode: int,
    write_offsets: Tensor, write_seed_slot_indices: Tensor, write_num_valid_reqs: Tensor,
    input_ids: Tensor, positions: Tensor, out_cache_loc: Tensor, enable_write_input_assert: bool,
    expected_input_tokens: Optional[Tensor], expected_input_positions: Optional[Tensor],
) -> None:
    """``launch_canary_write_kernel`` and its argument checks (``_run_checked``; SPEC 3.1)."""
    _refuse_empty_state(violation_write_index=violation_write_index, slot_run_counter=slot_run_counter,
                         kernel_run_counter=kernel_run_counter,
                         enable_chain_position_assert=enable_chain_position_assert,
                         write_num_valid_reqs=write_num_valid_reqs)
    _run_checked("write", dict(
        context=_context(canary_buf, violation_ring, violation_write_index, slot_run_counter, kernel_run_counter,
                         enable_chain_position_assert, kernel_kind, real_kv_tensors, real_kv_layout,
                         real_kv_hash_mode),
        plan=WritePlan(write_offsets=write_offsets, write_seed_slot_indices=write_seed_slot_indices,
                       write_num_valid_reqs=write_num_valid_reqs),
        input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc,
        enable_write_input_assert=enable_write_input_assert, expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
    ))


def verify(
    canary_buf: Tensor, violation_ring: Tensor, violation_write_index: Tensor, slot_run_counter: Tensor,
    kernel_run_counter: Tensor, enable_chain_position_assert: Tensor, kernel_kind: int,
    real_kv_tensors: list[Tensor], real_kv_layout: list[int], real_kv_hash_mode: int,
    verify_slot_indices: Tensor, verify_expected_tokens: Tensor, verify_expected_positions: Tensor,
    verify_prev_slot_indices: Tensor, verify_num_valid: Tensor, enable: Tensor, check_verify_expected_token: bool,
) -> None:
    """``launch_canary_verify_kernel`` and its argument checks (``_run_checked``; SPEC 3.2)."""
    _refuse_empty_state(violation_write_index=violation_write_index, slot_run_counter=slot_run_counter,
                         kernel_run_counter=kernel_run_counter, verify_num_valid=verify_num_valid, enable=enable)
    _run_checked("verify", dict(
        context=_context(canary_buf, violation_ring, violation_write_index, slot_run_counter, kernel_run_counter,
                         enable_chain_position_assert, kernel_kind, real_kv_tensors, real_kv_layout,
                         real_kv_hash_mode),
        plan=VerifyPlan(verify_slot_indices=verify_slot_indices, verify_expected_tokens=verify_expected_tokens,
                        verify_expected_positions=verify_expected_positions,
                        verify_prev_slot_indices=verify_prev_slot_indices, verify_num_valid=verify_num_valid,
                        enable=enable),
        check_verify_expected_token=check_verify_expected_token,
    ))


def plan(
    verify_slot_indices: Tensor, verify_expected_tokens: Tensor, verify_expected_positions: Tensor,
    verify_prev_slot_indices: Tensor, verify_num_valid: Tensor, enable: Tensor,
    write_offsets: Tensor, write_seed_slot_indices: Tensor, write_num_valid_reqs: Tensor,
    req_pool_indices: Tensor, prefix_lens: Tensor, extend_seq_lens: Tensor, req_to_token: Tensor,
    swa_window_size: int, full_to_swa_index_mapping: Optional[Tensor], verify_capacity: int,
    req_to_verify_expected_tokens: Optional[Tensor], req_to_verify_expected_tokens_valid_lens: Optional[Tensor],
    kv_token_id_vs_position_offset: int,
) -> None:
    """``launch_canary_plan_kernels`` and its argument checks (``_run_checked``; SPEC 3.3)."""
    _refuse_empty_state(verify_num_valid=verify_num_valid, enable=enable, write_num_valid_reqs=write_num_valid_reqs)
    _run_checked("plan", dict(
        verify_plan_out=VerifyPlan(verify_slot_indices=verify_slot_indices,
                                   verify_expected_tokens=verify_expected_tokens,
                                   verify_expected_positions=verify_expected_positions,
                                   verify_prev_slot_indices=verify_prev_slot_indices,
                                   verify_num_valid=verify_num_valid, enable=enable),
        write_plan_out=WritePlan(write_offsets=write_offsets, write_seed_slot_indices=write_seed_slot_indices,
                                 write_num_valid_reqs=write_num_valid_reqs),
        req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token, swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping, verify_capacity=verify_capacity,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
    ))


def scatter(flat_in: Tensor, offsets: Tensor, req_pool_indices: Tensor, pool_out: Tensor) -> None:
    """``launch_scatter_req_token_ids_kernel`` and its argument checks (``_run_checked``; SPEC 3.4)."""
    _run_checked("scatter", dict(flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices,
                                 pool_out=pool_out))


def _refuse_empty_state(**tensors: Tensor) -> None:
    """No one-element state of the operator (write index, counters, flags, counts) arrived empty: under
    ``torch.compile`` (aot_eager, Inductor) a one-element view of another dtype at a nonzero offset of a
    larger buffer reaches an operator empty (torch rebuilds the view wrongly), losing its writes. Run
    before the launch checks, whose message (``length must be 1, got 0``) would not say why."""
    for name, tensor in tensors.items():
        require_tensor(tensor, name)
        if tensor.numel() == 0:
            raise ValueError(
                f"kv-canary: {name} reached the operator with 0 elements, not 1: under torch.compile a one-element "
                "view of another dtype inside a larger buffer arrives empty; view the buffer whole "
                "(buf.view(torch.int32)[2 * i : 2 * i + 1], not buf[i : i + 1].view(torch.int32)[:1])")


# Each operator's mutable parameters: the tensors its kernel writes (``checks.WRITTEN``, whose names end in
# the parameter's: ``context.canary_buf``, ``verify_plan_out.enable``, ``pool_out``).
_MUTATES = {fn: sorted(name.rsplit(".", 1)[-1] for name in checks.WRITTEN[fn.__name__])
            for fn in (write, verify, plan, scatter)}


def _fake(fn):
    """``fn``'s fake (Meta) implementation: None on fake or only meta tensors. Real tensors, one on meta,
    reach it too: it runs ``fn``, which refuses them as the launch does (or ignores the tensor, as verify
    its chain flag), so no call is skipped. Traced (fake tensors), it refuses written views of one buffer
    in two dtypes (``_refuse_two_dtype_views``)."""
    names, written = list(inspect.signature(fn).parameters), _MUTATES[fn]

    def fake(*args) -> None:
        tensors = [t for a in args for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)]
        if any(isinstance(t, FakeTensor) for t in tensors):
            _refuse_two_dtype_views(written, dict(zip(names, args)))
        elif any(t.device.type != "meta" for t in tensors):
            fn(*args)
    return fake


def _refuse_two_dtype_views(written: list[str], args: dict) -> None:
    """No two tensors the operator writes (``written``, by name in ``args``) are views of one buffer in two
    dtypes: functionalizing such a call (``torch.compile``'s ``aot_eager`` always, Inductor in some graphs)
    loses one view's writes (docs/EMBEDDING.md). The fake implementation cannot tell a functionalizing trace
    from another, so every traced call (fake tensors) is refused, also ``backend="eager"``'s, which would
    write both; eager calls and CUDA graphs are not."""
    first_view: dict = {}  # buffer -> (name, dtype) of its first written view
    for name in written:
        tensor = args[name]
        first_name, first_dtype = first_view.setdefault(StorageWeakRef(tensor.untyped_storage()),
                                                        (name, tensor.dtype))
        if first_dtype != tensor.dtype:
            raise ValueError(
                f"kv-canary: {first_name} ({first_dtype}) and {name} ({tensor.dtype}) are views of one buffer in "
                f"two dtypes, and torch.compile's functionalization would lose the writes of one: give {name} a "
                "buffer of its own")


_VIEW_BITS = torch._C.DispatchKeySet(torch._C.DispatchKey.Conjugate).add(torch._C.DispatchKey.Negative)


def _view_bits_kernel(fn):
    """``fn`` for a conjugate or negative view argument (those dispatch keys): it refuses such a real-KV
    source, also while tracing (before torch's fallback copies it, whose values would be folded); any
    other goes on as is, as a launch passes it."""
    op = getattr(torch.ops.tvm_canary, fn.__name__).default
    names = list(inspect.signature(fn).parameters)

    def kernel(*args) -> None:
        for tensor in dict(zip(names, args)).get("real_kv_tensors", ()):
            refuse_view_bits(tensor)
        with torch._C._ExcludeDispatchKeyGuard(_VIEW_BITS):
            op(*args)
    return kernel


def _register() -> None:
    for fn, mutates in _MUTATES.items():
        name = fn.__name__
        _lib.define(name + torch.library.infer_schema(fn, mutates_args=mutates))
        for key in ("CPU", "CUDA"):
            _lib.impl(name, fn, key)
        for key in ("Conjugate", "Negative"):
            _lib.impl(name, _view_bits_kernel(fn), key)
        torch.library.register_fake(f"{NAMESPACE}::{name}", _fake(fn), lib=_lib)


_register()
