"""Front-end argument checks shared by every backend (docs/SPEC.md section 4, D1, D9).

Every public launch function calls its ``check_*`` here before dispatching to the LLVM, CUDA or
torch-reference backend, so a bad argument raises the same error and text everywhere (a memoised eager
launch reruns only some: ``tvm_canary.eager``). The launch checks ``check_write``, ``check_verify``,
``check_plan`` and ``check_scatter`` are keyword-only (the other ``check_*`` helpers positional); all
return None and raise ``ValueError`` except where SPEC 4 says ``TypeError`` (scatter dtypes).

Tensor names in messages follow the original front ends: ``plan.write_offsets`` / ``plan.verify_*``
for write and verify plans, ``out_*`` / ``lut_tensor`` for the plan kernels' tensors,
``scatter_req_token_ids <arg>`` for scatter.

Arguments of the wrong type (a numpy array, a list or None for a tensor, another class for a plan or context, a float or
string for an int) raise ``TypeError`` as ``argtypes`` says (SPEC D9).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import typing
from collections.abc import Iterable, Sequence
from typing import Optional

import torch

from . import consts
from .argtypes import (
    refuse_array,
    refuse_negative,
    require_instance,
    require_int64,
    require_integer,
    require_number,
    require_positive,
    require_tensor,
    shape_text,
)
from .context import SINK_FIELDS, VerifyOrWriteContext, check_source_tensor
from .plans import VerifyPlan, WritePlan

NamedTensor = tuple[torch.Tensor, str]

_DTYPE_MESSAGE = "kv-canary: {name} must have dtype {expected}, got {actual}"
_SCATTER_DTYPE_MESSAGE = "kv-canary: {name} must be {expected_short}, got {actual}"
_SCATTER = "scatter_req_token_ids"


# -- private helpers (one message format each)


def _require_contiguous(tensor: torch.Tensor, name: str) -> None:
    require_tensor(tensor, name)
    if not tensor.is_contiguous():
        raise ValueError(f"kv-canary: {name} must be contiguous")


def _require_all_contiguous(tensors: Iterable[NamedTensor]) -> None:
    for tensor, name in tensors:
        _require_contiguous(tensor, name)


def _require_dtype(
    tensor: torch.Tensor,
    name: str,
    dtype: torch.dtype,
    *,
    message: str = _DTYPE_MESSAGE,
    error: type[Exception] = ValueError,
) -> None:
    require_tensor(tensor, name)
    if tensor.dtype != dtype:
        raise error(
            message.format(
                name=name,
                expected=dtype,
                expected_short=str(dtype).removeprefix("torch."),
                actual=tensor.dtype,
            )
        )


def _require_ndim(tensor: torch.Tensor, name: str, ndim: int) -> None:
    # Array-likes get their rank checked first, as in the contract; a nested tensor has no shape to print
    if not hasattr(tensor, "ndim") or getattr(tensor, "is_nested", False):
        require_tensor(tensor, name)
    if tensor.ndim != ndim:
        raise ValueError(f"kv-canary: {name} must be {ndim}-D, got shape {shape_text(tensor)}")


def _require_1d(tensor: torch.Tensor, name: str) -> None:
    _require_ndim(tensor, name, 1)


def _require_2d(tensor: torch.Tensor, name: str) -> None:
    _require_ndim(tensor, name, 2)


def _require_len(tensor: torch.Tensor, name: str, expected: int) -> None:
    _require_1d(tensor, name)
    actual = int(tensor.shape[0])
    if actual != expected:
        raise ValueError(f"kv-canary: {name} length must be {expected}, got {actual}")


def require_same_length(named: Sequence[NamedTensor]) -> None:
    """Each tensor 1-D with the first one's length (a step's per-request or per-token inputs)."""
    (first, first_name), *others = named
    _require_1d(first, first_name)
    for tensor, name in others:
        _require_len(tensor, name, int(first.shape[0]))


def _require_dim_size(tensor: torch.Tensor, name: str, dim: int, expected: int) -> None:
    actual = int(tensor.shape[dim])
    if actual != expected:
        raise ValueError(f"kv-canary: {name} shape[{dim}] must be {expected}, got {actual}")


def _require_min_dim_size(tensor: torch.Tensor, name: str, dim: int, minimum: int) -> None:
    actual = int(tensor.shape[dim])
    if actual < minimum:
        raise ValueError(f"kv-canary: {name} shape[{dim}] must be >= {minimum}, got {actual}")


def _require_same_device(
    reference: torch.Tensor, reference_name: str, tensors: Iterable[NamedTensor]
) -> None:
    for tensor, name in tensors:
        if tensor.device != reference.device:
            raise ValueError(
                f"kv-canary: {name} must be on {reference_name}'s device {reference.device}, got {tensor.device}"
            )


def _require_vector(tensor: torch.Tensor, name: str, dtype: torch.dtype, length: Optional[int] = None) -> None:
    """dtype, then 1-D (and the exact length when given)."""
    _require_dtype(tensor, name, dtype)
    if length is None:
        _require_1d(tensor, name)
    else:
        _require_len(tensor, name, length)


# -- verify / write context and real-KV sources


def _check_real_kv_source_count(context: VerifyOrWriteContext) -> None:
    n = len(context.real_kv_sources)
    if n > consts.MAX_REAL_KV_SOURCES:
        raise ValueError(
            f"kv-canary: at most {consts.MAX_REAL_KV_SOURCES} RealKvSource entries supported by the CUDA ABI, got {n}"
        )


def check_real_kv_sources(context: VerifyOrWriteContext) -> None:
    """Launch-time checks of ``context.real_kv_sources`` (SPEC 2.6, D5; docs/SEMANTICS.md).

    At most 4 sources; each tensor has innermost stride 1 (rows may be ``stride(0)`` apart), is 2-D viewed as uint8, has
    rows at least ``page_size * num_bytes_per_token`` bytes wide and a whole number of 16-byte units apart, an
    8-byte-aligned data pointer and storage, and lives on ``canary_buf``'s device. Checked on every backend, whatever
    the hash mode.
    """
    _check_real_kv_source_count(context)
    canary_buf = context.canary_buf
    for i, source in enumerate(context.real_kv_sources):
        tensor = source.tensor
        name = f"real_kv_sources[{i}].tensor"
        inner_stride = tensor.stride(-1) if tensor.ndim > 0 else 1
        if inner_stride != 1:
            raise ValueError(f"kv-canary: {name} must be contiguous")
        # Viewing as uint8 rescales the last dimension only, so the rank is the tensor's own.
        if tensor.ndim != 2:
            raise ValueError(f"kv-canary: {name} (viewed as uint8) must be 2-D, got {tensor.ndim}-D")
        row_bytes = int(tensor.shape[1]) * tensor.element_size()
        needed = source.page_size * source.num_bytes_per_token
        if row_bytes < needed:
            raise ValueError(
                "kv-canary: RealKvSource row is too narrow for its slot layout: dim-1 is "
                f"{row_bytes} bytes but page_size={source.page_size} x "
                f"num_bytes_per_token={source.num_bytes_per_token} needs {needed}"
            )
        check_source_tensor(tensor)
        if not tracing():  # no data pointer while tracing: the operator checks it
            check_word_aligned(tensor, name)
        _require_same_device(canary_buf, "canary_buf", [(tensor, name)])


_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack


def tracing() -> bool:
    """Whether torch traces the caller: torch.compile or export, or any dispatch mode (FakeTensor, functionalization,
    ...) is active; tensors then have no data pointer. ``is_compiling`` first: a compiled caller sees a constant."""
    return _is_compiling() or _dispatch_modes() > 0


EXPECTED_INPUTS_UNUSED = "kv-canary: expected input tensors must be None when enable_write_input_assert=False"


def check_expected_inputs_given(enable_write_input_assert: bool, expected_input_tokens,
                                expected_input_positions) -> None:
    """Both expected input tensors given iff the write input assert is on (SPEC 4 "Write front end")."""
    if enable_write_input_assert:
        if expected_input_tokens is None or expected_input_positions is None:
            raise ValueError("kv-canary: expected input tensors are required when enable_write_input_assert=True")
    elif expected_input_tokens is not None or expected_input_positions is not None:
        raise ValueError(EXPECTED_INPUTS_UNUSED)


def check_word_aligned(tensor: torch.Tensor, name: str) -> None:
    """``tensor``'s data pointer and its storage's start are 8-byte aligned, as the kernels' int64 views
    need (canary_buf, real-KV sources; docs/SEMANTICS.md): a source's view counts whole words from the
    storage's start (``packing.source_view``), so a storage starting off a word (``torch.from_numpy`` of
    an odd slice) would shift it off the tensor; for ``canary_buf`` torch's own int64 view would raise
    (``packing.canary_words``). Run by the front-end checks in eager code, and by the write/verify
    operators every call (a traced caller's checks cannot see pointers)."""
    ptr = tensor.data_ptr()
    if ptr % 8 != 0:
        raise ValueError(f"kv-canary: {name} data pointer must be 8-byte aligned, got {ptr:#x}")
    storage_ptr = tensor.untyped_storage().data_ptr()
    if storage_ptr % 8 != 0:
        raise ValueError(f"kv-canary: {name} storage must start 8-byte aligned, got {storage_ptr:#x}")


# The tensors each kernel writes (SPEC 3.1-3.4), by their names in ``launch_tensors`` (the operators'
# schemas declare the same ones mutable, by their last part: ``ops._MUTATES``).
WRITTEN = {
    "write": {"context.canary_buf"} | {f"context.{name}" for name in SINK_FIELDS},
    "verify": {f"context.{name}" for name in SINK_FIELDS},
    "plan": {f"{plan}.{field.name}" for plan, cls in (("verify_plan_out", VerifyPlan), ("write_plan_out", WritePlan))
             for field in dataclasses.fields(cls)},
    "scatter": {"pool_out"},
}


def launch_tensors(kernel: str, launch_kwargs: dict) -> tuple[list[NamedTensor], list[NamedTensor]]:
    """(written, read): the tensor arguments of a public launch of ``kernel`` (its keyword arguments) the
    kernel writes (SPEC 3.1-3.4), and all others, each named by its path in the arguments
    (``context.canary_buf``, ``plan.write_offsets``, ``context.real_kv_sources[0].tensor``,
    ``input_ids``); optional tensors passed as None are left out."""
    written_names = WRITTEN[kernel]
    written: list[NamedTensor] = []
    read: list[NamedTensor] = []

    def visit(value, name: str) -> None:
        if isinstance(value, torch.Tensor):
            (written if name in written_names else read).append((value, name))
        elif type(value) is tuple:
            for i, item in enumerate(value):
                visit(item, f"{name}[{i}]")
        else:
            for field in _tensor_fields(type(value)):
                visit(getattr(value, field), f"{name}.{field}")

    for name, value in launch_kwargs.items():
        visit(value, name)
    return written, read


@functools.lru_cache(maxsize=None)
def _tensor_fields(cls: type) -> tuple[str, ...]:
    """The fields of a dataclass type whose annotation can hold a tensor (``torch.Tensor``, optional or
    not, a dataclass, or a tuple of either: the real-KV sources); () for any other type."""
    if not dataclasses.is_dataclass(cls):
        return ()
    hints = typing.get_type_hints(cls)

    def holds_tensors(hint) -> bool:
        return hint is torch.Tensor or dataclasses.is_dataclass(hint) or any(map(holds_tensors, typing.get_args(hint)))

    return tuple(f.name for f in dataclasses.fields(cls) if holds_tensors(hints[f.name]))


def byte_ranges(named: Iterable[NamedTensor]) -> list[tuple[int, int, str]]:
    """(first byte, past the last byte, name) of each non-empty tensor of ``named`` (a view's range runs
    from its first to its last element; torch strides are never negative); one without strides (an
    ignored argument) gets ``require_tensor``'s error."""
    ranges = []
    for tensor, name in named:
        if tensor.layout != torch.strided:  # cheaper than require_tensor
            require_tensor(tensor, name)
        if tensor.numel():
            start = tensor.data_ptr()
            if tensor.is_contiguous():
                ranges.append((start, start + tensor.nbytes, name))
            else:
                last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
                ranges.append((start, start + (last + 1) * tensor.element_size(), name))
    return ranges


_OVERLAP = ("kv-canary: {written} shares memory with {other}: a tensor the launch writes must not overlap any "
            "other tensor argument")


def check_disjoint(kernel: str, launch_kwargs: dict) -> None:
    """No tensor a launch of ``kernel`` writes shares a byte with any other of its tensor arguments
    (``launch_kwargs``, its keyword arguments; SPEC D10).

    The kernels assume it (``tirx.noalias``): they check an index once and reuse it, so a fingerprint stamped into
    ``out_cache_loc`` or a row appended over a plan would be an unchecked address. Views are compared by their byte
    ranges (``byte_ranges``), so two interleaved views of one storage overlap; the tensors are on one device (checked
    before). Run as ``check_word_aligned``, but by every operator; skipped while tracing."""
    if tracing():
        return
    written, read = launch_tensors(kernel, launch_kwargs)
    require_supported_device(written[0][0].device)  # a meta tensor's null pointer would overlap every other
    written_ranges, read_ranges = byte_ranges(written), byte_ranges(read)
    for i, written_range in enumerate(written_ranges):
        _require_apart([written_range], written_ranges[i + 1:] + read_ranges)


def require_supported_device(device: torch.device) -> None:
    """The kernels run on the CPU and on CUDA GPUs; any other device type is refused."""
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"kv-canary: unsupported device type {device.type!r} (expected cpu or cuda)")


@dataclasses.dataclass(frozen=True)
class WrittenRanges:
    """``byte_ranges`` of the tensors a caller's launches write (a memoised write's context, a session's
    own tensors), kept to check many calls' tensors against (``require_apart``): ``starts`` in order,
    and for each the largest end of the ranges up to it."""

    ranges: list[tuple[int, int, str]]
    starts: list[int]
    reach: list[int]

    @classmethod
    def of(cls, ranges: list[tuple[int, int, str]]) -> WrittenRanges:
        ordered = sorted(ranges)
        return cls(ranges, [start for start, _, _ in ordered], list(itertools.accumulate(
            (end for _, end, _ in ordered), max)))

    def overlap(self, start: int, end: int) -> bool:
        """Whether ``[start, end)`` shares a byte with a range (those starting before ``end`` reach past ``start``)."""
        before = bisect.bisect_left(self.starts, end)
        return before > 0 and self.reach[before - 1] > start


def require_apart(written: WrittenRanges, named: Iterable[NamedTensor]) -> None:
    """No tensor of ``named`` shares a byte with any range of ``written`` (``_require_apart``'s message, as
    ``check_disjoint``'s)."""
    ranges = byte_ranges(named)
    if any(written.overlap(start, end) for start, end, _ in ranges):
        _require_apart(written.ranges, ranges)


def _require_apart(written: list[tuple[int, int, str]], others: list[tuple[int, int, str]]) -> None:
    """No written range overlaps any of ``others`` (byte ranges); the first overlapping pair, written
    ranges outer, is named."""
    for start, end, name in written:
        for other_start, other_end, other in others:
            if start < other_end and other_start < end:
                raise ValueError(_OVERLAP.format(written=name, other=other))


def _context_tensors(context: VerifyOrWriteContext, *, with_chain_flag: bool) -> list[NamedTensor]:
    tensors = [(getattr(context, name), name) for name in SINK_FIELDS]
    if with_chain_flag:
        tensors.append((context.enable_chain_position_assert, "enable_chain_position_assert"))
    return tensors


def _check_context_tensors(context: VerifyOrWriteContext, *, with_chain_flag: bool) -> None:
    """Dtypes and shapes of canary_buf, the violation sink, the counters (and the chain flag)."""
    buf = context.canary_buf
    _require_dtype(buf, "canary_buf", torch.uint8)
    _require_2d(buf, "canary_buf")
    stride_bytes = int(buf.shape[1])
    if stride_bytes % 8 != 0:
        raise ValueError(f"kv-canary: canary_buf slot stride must be a multiple of 8 bytes, got {stride_bytes}")
    fields = stride_bytes // 8
    if fields < consts.CANARY_FIELDS_PER_SLOT:
        raise ValueError(
            f"kv-canary: canary_buf slot stride must hold at least {consts.CANARY_FIELDS_PER_SLOT} int64 fields, "
            f"got {fields}"
        )
    if not tracing():  # as for the sources
        check_word_aligned(buf, "canary_buf")

    ring = context.violation_ring
    _require_dtype(ring, "violation_ring", torch.int64)
    _require_2d(ring, "violation_ring")
    _require_dim_size(ring, "violation_ring", 1, consts.VIOLATION_FIELDS)
    _require_min_dim_size(ring, "violation_ring", 0, 1)

    _require_vector(context.violation_write_index, "violation_write_index", torch.int32, 1)
    _require_vector(context.slot_run_counter, "slot_run_counter", torch.int64, 1)
    _require_vector(context.kernel_run_counter, "kernel_run_counter", torch.int64, 1)
    if with_chain_flag:
        _require_vector(context.enable_chain_position_assert, "enable_chain_position_assert", torch.int32, 1)


# -- write and verify front ends


def check_write(
    *,
    context: VerifyOrWriteContext,
    plan: WritePlan,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    enable_write_input_assert: bool,
    expected_input_tokens: Optional[torch.Tensor],
    expected_input_positions: Optional[torch.Tensor],
) -> None:
    """Arguments of ``launch_canary_write_kernel`` (SPEC 3.1, 4 "Shared" and "Write front end")."""
    _check_write(context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert, expected_input_tokens,
                 expected_input_positions, context_and_plan_checked=False)


def check_write_inputs(
    context: VerifyOrWriteContext,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    enable_write_input_assert: bool,
    expected_input_tokens: Optional[torch.Tensor],
    expected_input_positions: Optional[torch.Tensor],
    written_ranges: WrittenRanges,
) -> None:
    """``check_write`` for a context and plan known to pass it (``tvm_canary.eager``: the same objects
    passed before with the same tensor metadata): only the checks reading the per-step arguments, in
    ``check_write``'s order, so the first failing check and its message are the same. ``written_ranges``:
    ``byte_ranges`` of the tensors the per-step ones must not overlap (the context's the launch writes,
    as a memoised launch keeps them)."""
    _check_write(context, None, input_ids, positions, out_cache_loc, enable_write_input_assert, expected_input_tokens,
                 expected_input_positions, context_and_plan_checked=True, written_ranges=written_ranges)


def _check_write(context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert, expected_input_tokens,
                 expected_input_positions, *, context_and_plan_checked: bool,
                 written_ranges: WrittenRanges | None = None) -> None:
    """``check_write``'s sequence; with ``context_and_plan_checked`` the checks of the context and plan alone are
    skipped (each would pass), and the per-step tensors are checked for overlaps against ``written_ranges`` only."""
    if not context_and_plan_checked:
        require_instance(context, VerifyOrWriteContext, "context")
        _check_real_kv_source_count(context)
    check_expected_inputs_given(enable_write_input_assert, expected_input_tokens, expected_input_positions)

    token_tensors = [(input_ids, "input_ids"), (positions, "positions"), (out_cache_loc, "out_cache_loc")]
    expected_tensors = (
        [(expected_input_tokens, "expected_input_tokens"), (expected_input_positions, "expected_input_positions")]
        if enable_write_input_assert
        else []
    )
    if context_and_plan_checked:
        others = token_tensors + expected_tensors
        _require_all_contiguous(others)
    else:
        require_instance(plan, WritePlan, "plan")
        plan_tensors = [
            (plan.write_offsets, "plan.write_offsets"),
            (plan.write_seed_slot_indices, "plan.write_seed_slot_indices"),
            (plan.write_num_valid_reqs, "plan.write_num_valid_reqs"),
        ]
        others = plan_tensors + token_tensors + expected_tensors + _context_tensors(context, with_chain_flag=True)
        _require_all_contiguous([(context.canary_buf, "canary_buf")] + others)

        _check_context_tensors(context, with_chain_flag=True)

        _require_vector(plan.write_seed_slot_indices, "plan.write_seed_slot_indices", torch.int64)
        capacity = int(plan.write_seed_slot_indices.shape[0])
        _require_vector(plan.write_offsets, "plan.write_offsets", torch.int64, capacity + 1)
        _require_vector(plan.write_num_valid_reqs, "plan.write_num_valid_reqs", torch.int32, 1)

    _require_vector(input_ids, "input_ids", torch.int64)
    num_tokens = int(input_ids.shape[0])
    for tensor, name in token_tensors[1:] + expected_tensors:
        _require_vector(tensor, name, torch.int64, num_tokens)

    if not context_and_plan_checked:
        check_real_kv_sources(context)
    _require_same_device(context.canary_buf, "canary_buf", others)
    if context_and_plan_checked:
        require_apart(written_ranges, token_tensors + expected_tensors)
    else:
        check_disjoint("write", dict(
            context=context, plan=plan, input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc,
            expected_input_tokens=expected_input_tokens, expected_input_positions=expected_input_positions))


def check_verify(*, context: VerifyOrWriteContext, plan: VerifyPlan, check_verify_expected_token: bool) -> None:
    """Arguments of ``launch_canary_verify_kernel`` (SPEC 3.2, 4 "Shared" and "Verify").

    ``check_verify_expected_token`` is taken for signature parity; any value is accepted (read as a truth value).
    """
    del check_verify_expected_token
    require_instance(context, VerifyOrWriteContext, "context")
    _check_real_kv_source_count(context)
    require_instance(plan, VerifyPlan, "plan")

    vectors = [
        (plan.verify_slot_indices, "plan.verify_slot_indices"),
        (plan.verify_expected_tokens, "plan.verify_expected_tokens"),
        (plan.verify_expected_positions, "plan.verify_expected_positions"),
        (plan.verify_prev_slot_indices, "plan.verify_prev_slot_indices"),
    ]
    scalars = [(plan.verify_num_valid, "plan.verify_num_valid"), (plan.enable, "plan.enable")]
    others = vectors + scalars + _context_tensors(context, with_chain_flag=False)
    _require_all_contiguous([(context.canary_buf, "canary_buf")] + others)

    _check_context_tensors(context, with_chain_flag=False)

    _require_vector(plan.verify_slot_indices, "plan.verify_slot_indices", torch.int64)
    capacity = int(plan.verify_slot_indices.shape[0])
    for tensor, name in vectors[1:]:
        _require_vector(tensor, name, torch.int64, capacity)
    for tensor, name in scalars:
        _require_vector(tensor, name, torch.int32, 1)

    check_real_kv_sources(context)
    _require_same_device(context.canary_buf, "canary_buf", others)
    check_disjoint("verify", dict(context=context, plan=plan))


# -- plan front end


def check_plan(
    *,
    verify_plan_out: VerifyPlan,
    write_plan_out: WritePlan,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int,
    full_to_swa_index_mapping: Optional[torch.Tensor],
    verify_capacity: int,
    req_to_verify_expected_tokens: Optional[torch.Tensor],
    req_to_verify_expected_tokens_valid_lens: Optional[torch.Tensor],
    kv_token_id_vs_position_offset: int,
) -> None:
    """Arguments of ``launch_canary_plan_kernels`` (SPEC 3.3; SPEC 4 "Plan" steps 1, 4, 5, 6).

    Step 3 (bs <= 4096) is dropped (SPEC D6); ``bs <= write_req_capacity`` is kept. This front end has no scratch
    tensor. The reference device is the plan's (``verify_plan_out.verify_slot_indices``, named
    ``out_verify_slot_indices``).
    """
    # Step 1.
    require_number(swa_window_size, "swa_window_size")
    if swa_window_size > 0 and full_to_swa_index_mapping is None:
        raise ValueError(
            "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0"
        )
    refuse_negative(swa_window_size, "swa_window_size")  # SPEC D9: upstream planned the whole prefix

    # Step 4.
    require_instance(verify_plan_out, VerifyPlan, "verify_plan_out")
    slot_indices = verify_plan_out.verify_slot_indices
    _require_1d(slot_indices, "out_verify_slot_indices")
    plan_verify_capacity = int(slot_indices.shape[0])
    refuse_array(verify_capacity, "verify_capacity")  # a str gets step 4's message, as upstream's
    if verify_capacity != plan_verify_capacity:
        raise ValueError(
            f"kv-canary: launch_canary_plan_kernels verify_capacity={verify_capacity} does not match "
            f"verify_plan_out.verify_slot_indices.shape[0]={plan_verify_capacity}"
        )

    # Step 5: the offsets-kernel validator, adapted (no scratch; entries-kernel outputs included).
    require_instance(write_plan_out, WritePlan, "write_plan_out")
    has_lut = full_to_swa_index_mapping is not None
    row_inputs = [
        (req_pool_indices, "req_pool_indices"),
        (prefix_lens, "prefix_lens"),
        (extend_seq_lens, "extend_seq_lens"),
    ]
    lut = [(full_to_swa_index_mapping, "lut_tensor")] if has_lut else []
    verify_vectors = [
        (slot_indices, "out_verify_slot_indices"),
        (verify_plan_out.verify_expected_tokens, "out_verify_expected_tokens"),
        (verify_plan_out.verify_expected_positions, "out_verify_expected_positions"),
        (verify_plan_out.verify_prev_slot_indices, "out_verify_prev_slot_indices"),
    ]
    write_vectors = [
        (write_plan_out.write_offsets, "out_write_offsets"),
        (write_plan_out.write_seed_slot_indices, "out_write_seed_slot_indices"),
    ]
    scalars = [
        (verify_plan_out.verify_num_valid, "out_verify_num_valid"),
        (verify_plan_out.enable, "out_verify_enable"),
        (write_plan_out.write_num_valid_reqs, "out_write_num_valid_reqs"),
    ]
    vectors_1d = row_inputs + lut + verify_vectors + write_vectors + scalars
    named = row_inputs + [(req_to_token, "req_to_token")] + lut + verify_vectors + write_vectors + scalars
    _require_all_contiguous(named)
    int32_names = {"req_to_token"} | {name for _, name in scalars}
    for tensor, name in named:
        _require_dtype(tensor, name, torch.int32 if name in int32_names else torch.int64)
    _require_2d(req_to_token, "req_to_token")
    for tensor, name in vectors_1d:
        _require_1d(tensor, name)

    bs = int(req_pool_indices.shape[0])
    write_offsets_len = int(write_plan_out.write_offsets.shape[0])
    write_req_capacity = int(write_plan_out.write_seed_slot_indices.shape[0])
    lut_len = int(full_to_swa_index_mapping.shape[0]) if has_lut else 0
    refuse_negative(bs, "offsets kernel bs")
    require_positive(write_offsets_len, "write_offsets_len")
    refuse_negative(write_req_capacity, "write_req_capacity")
    refuse_negative(verify_capacity, "verify_capacity")
    require_positive(int(req_to_token.stride(0)), "req_to_token_stride0")
    refuse_negative(lut_len, "lut_len")
    if has_lut and lut_len <= 0:
        raise ValueError("kv-canary: lut_len must be positive when has_swa_lut is True")

    require_same_length(row_inputs)
    for tensor, name in verify_vectors[1:]:
        _require_len(tensor, name, verify_capacity)
    for tensor, name in scalars:
        _require_len(tensor, name, 1)
    if write_offsets_len != write_req_capacity + 1:
        raise ValueError(
            "kv-canary: write_offsets_len must equal write_req_capacity + 1, got "
            f"{write_offsets_len} and {write_req_capacity}"
        )
    if bs > write_req_capacity:
        raise ValueError(f"kv-canary: bs={bs} exceeds write_req_capacity={write_req_capacity}")
    _require_same_device(slot_indices, "out_verify_slot_indices", named)

    # Step 6: the expected-token pool (entries kernel).
    if req_to_verify_expected_tokens is not None:
        _check_expected_token_pool(
            req_to_verify_expected_tokens, req_to_verify_expected_tokens_valid_lens, bs, slot_indices
        )

    # Integer scalars (SPEC D9): after every contract check, all passing for e.g. a float 8.0. The
    # kernels take the two offsets as int64 arguments, so every backend rejects a value outside int64.
    require_int64(swa_window_size, "swa_window_size")
    require_integer(verify_capacity, "verify_capacity")
    # Any int64 is valid: 0 for target pools, +1 for EAGLE draft pools.
    require_int64(kv_token_id_vs_position_offset, "kv_token_id_vs_position_offset")
    check_disjoint("plan", dict(
        verify_plan_out=verify_plan_out, write_plan_out=write_plan_out, req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens, extend_seq_lens=extend_seq_lens, req_to_token=req_to_token,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens))


def _check_expected_token_pool(
    pool: torch.Tensor, valid_lens: torch.Tensor | None, bs: int, slot_indices: torch.Tensor
) -> None:
    """Step 6 of SPEC 4 "Plan": the expected-token pool and its valid lengths."""
    if valid_lens is None:
        raise ValueError(
            "kv-canary: launch_plan_entries_kernel requires "
            "req_to_verify_expected_tokens_valid_lens when req_to_verify_expected_tokens is set"
        )
    pool_tensors = [
        (pool, "req_to_verify_expected_tokens"),
        (valid_lens, "req_to_verify_expected_tokens_valid_lens"),
    ]
    _require_all_contiguous(pool_tensors)
    _require_dtype(pool, "req_to_verify_expected_tokens", torch.int32)
    _require_2d(pool, "req_to_verify_expected_tokens")
    _require_vector(valid_lens, "req_to_verify_expected_tokens_valid_lens", torch.int64, bs)
    _require_same_device(slot_indices, "out_verify_slot_indices", pool_tensors)


# -- scatter front end


def check_scatter(
    *,
    flat_in: torch.Tensor,
    offsets: torch.Tensor,
    req_pool_indices: torch.Tensor,
    pool_out: torch.Tensor,
) -> None:
    """Arguments of ``launch_scatter_req_token_ids_kernel`` (SPEC 3.4, 4 "Scatter").

    SPEC order: ranks (ValueError), dtypes (TypeError), offsets length. tvm_canary also requires the four tensors
    contiguous and on ``pool_out``'s device (the kernels index them as dense buffers, SPEC D4).
    """
    named: Sequence[tuple[torch.Tensor, str, int, torch.dtype]] = (
        (flat_in, f"{_SCATTER} flat_in", 1, torch.int64),
        (offsets, f"{_SCATTER} offsets", 1, torch.int64),
        (req_pool_indices, f"{_SCATTER} req_pool_indices", 1, torch.int64),
        (pool_out, f"{_SCATTER} pool_out", 2, torch.int32),
    )
    for tensor, name, ndim, _ in named:
        _require_ndim(tensor, name, ndim)
    for tensor, name, _, dtype in named:
        _require_dtype(tensor, name, dtype, message=_SCATTER_DTYPE_MESSAGE, error=TypeError)
    bs = int(req_pool_indices.shape[0])
    n = int(offsets.shape[0])
    if n != bs + 1:
        raise ValueError(f"kv-canary: {_SCATTER} offsets length {n} != bs+1 ({bs + 1})")
    _require_all_contiguous((t, name) for t, name, _, _ in named)
    _require_same_device(pool_out, f"{_SCATTER} pool_out", ((t, name) for t, name, _, _ in named[:3]))
    check_disjoint("scatter", dict(flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices,
                                   pool_out=pool_out))


# Each kernel's front-end check, by kernel name (the public launch's keyword arguments).
CHECKS = {"write": check_write, "verify": check_verify, "plan": check_plan, "scatter": check_scatter}
