"""Turning public-API tensors into the arguments of the compiled kernels (zero-copy views).

``write_call``, ``verify_call``, ``plan_call`` and ``scatter_call`` take a launch's (already checked) keyword arguments,
named as the public launch function's, and return a ``KernelCall`` (None: nothing to launch).

* The uint8 canary buffer is passed as its int64 view ``[S, stride / 8]``.
* A real-KV source is passed as an int64 view ``[rows, row_bytes // 8]`` whose row stride is
  ``stride(0) * element_size / 8`` words (SPEC D5), plus ``(page_size, token_words, fold_words)``.
  Unused source slots get a 1x1 placeholder on the device and ``UNUSED_SOURCE`` parameters; kernels
  never read them.
* Scratch ``flags`` (int32, per ring, shared by write and verify; layout: ``flags_for``): ``[1 + c]``
  marks chunk ``c`` (FLAG_CHUNK entries or requests) holding violation rows or (write) a seed save;
  write's seed saves (kernels/write.py) may share words with a longer verify's marks (each launch
  leaves them zero); the LAST element ``[NF - 1]``, the ticket, is always past every chunk mark
  (``need`` reserves it). Zero between launches: each launch clears what it marked and the last block
  resets the ticket. They only grow, and old ones stay referenced so CUDA graphs captured with them
  stay valid.
"""

from __future__ import annotations

import dataclasses

import torch

from .._consts import PARTIAL_READ_BYTES
from ..consts import MAX_REAL_KV_SOURCES, RealKvHashMode
from ..context import SINK_FIELDS, VerifyOrWriteContext
from ..geometry import flag_words
from .specializations import fold_words, launch_mode, spec


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One launch of a compiled kernel.

    kernel: "write", "verify", "plan" or "scatter".
    spec: its specialization (``specializations.spec``).
    size, mode: the workload point choosing its geometry (``tuning.apply.nearest``), from shapes: verify's
        plan capacity, plan's request capacity, scatter's batch size (not its pool's rows, sized once by
        an engine), write's request capacity and tokens per request; and verify's or write's real-KV hash
        mode if it folds sources (0 elsewhere; ``tuning.workloads.mode_of``).
    args: the positional arguments of the compiled function.
    scratch: positions in ``args`` of scratch tensors, whose contents after the launch are no part of
        the result (the ring's chunk marks, plan's offsets); all else is compared byte for byte with the
        reference when a tuning candidate is checked.
    """

    kernel: str
    spec: tuple
    size: int | tuple
    mode: int
    args: tuple
    scratch: frozenset = frozenset()

    @property
    def device(self) -> torch.device:
        return self.args[0].device

_flags: dict[tuple, list[torch.Tensor]] = {}


def canary_words(canary_buf: torch.Tensor) -> torch.Tensor:
    """int64 view ``[S, row_bytes // 8]`` of the canary buffer, rows dense (the front end guarantees a
    contiguous uint8 buffer, an 8-byte aligned start and whole-word rows). Built with its row stride
    set: torch ignores a one-slot buffer's row stride, which may be any number of bytes."""
    rows, row_bytes = canary_buf.shape
    return canary_buf.as_strided((rows, row_bytes), (row_bytes, 1)).view(torch.int64)


def source_view(tensor: torch.Tensor) -> torch.Tensor:
    """int64 view ``[rows, row_bytes // 8]`` of a 2-D source whose rows are ``stride(0)`` elements apart.

    The front end guarantees a 2-D tensor, inner stride 1, an 8-byte aligned start and a 16-byte row stride.
    """
    el = tensor.element_size()
    out = torch.empty(0, dtype=torch.int64, device=tensor.device)
    return out.set_(
        tensor.untyped_storage(),
        tensor.storage_offset() * el // 8,
        (tensor.shape[0], tensor.shape[1] * el // 8),
        (tensor.stride(0) * el // 8, 1),
    )


def folded_sources(context: VerifyOrWriteContext) -> int:
    """Number of sources the kernels fold: 0 in NONE mode (a compile-time specialization)."""
    if context.real_kv_hash_mode == RealKvHashMode.NONE:
        return 0
    return len(context.real_kv_sources)


def partial_fold(context: VerifyOrWriteContext) -> bool:
    """Whether a verify or write launch folds its sources in PARTIAL mode (each source's first
    ``PARTIAL_READ_BYTES``, a word count its kernel has built in: specialization axis ``partial``)."""
    return context.real_kv_hash_mode == RealKvHashMode.PARTIAL and folded_sources(context) > 0


def built_in_fold_words(context: VerifyOrWriteContext) -> int:
    """The ``fold_words`` axis of a verify or write launch (``specializations.fold_words``): the word
    count its ALL-mode kernel has built in, from its sources' layouts, or 0."""
    used = context.real_kv_sources[: folded_sources(context)]
    return fold_words(len(used), partial_fold(context), [src.read_bytes // 8 for src in used])


# (page_size, token_words, fold_words) of an unused source slot, by the kernels' parameter prefixes
UNUSED_SOURCE = {"ps": 1, "tw": 0, "fw": 0}


def source_args(context: VerifyOrWriteContext) -> list:
    """The 16 trailing kernel arguments: (view, page_size, token_words, fold_words) x 4."""
    args: list = []
    partial = partial_fold(context)
    used = context.real_kv_sources[: folded_sources(context)]
    for src in used:
        fold_bytes = PARTIAL_READ_BYTES if partial else src.read_bytes
        args += [source_view(src.tensor), src.page_size, src.num_bytes_per_token // 8, fold_bytes // 8]
    unused = placeholder(context.canary_buf.device, torch.int64, (1, 1))
    for _ in range(MAX_REAL_KV_SOURCES - len(used)):
        args += [unused, *UNUSED_SOURCE.values()]
    return args


def _ring_key(ring: torch.Tensor) -> tuple:
    return ring.device.type, ring.device.index, ring.data_ptr()


def flags_of(ring: torch.Tensor) -> list[torch.Tensor]:
    """The scratch tensors ``flags_for`` made for ``ring`` so far (each is zero between launches)."""
    return list(_flags.get(_ring_key(ring), []))


def flags_for(ring: torch.Tensor, entries: int, seed_saves: int = 0) -> torch.Tensor:
    """Zeroed int32 scratch covering ``entries``, owned by ``ring``: ``[0]`` = the any-mark (CPU) or the marking
    blocks' ranks (CUDA), ``[1 + c]`` one mark per chunk, then ``SEED_SAVE_WORDS`` per seed save (write: one per
    request, ``seed_saves`` = its plan's capacity), then at least one more element; the last is the arrivals counter
    (ticket) of write's and verify's single launch on CUDA (``kernels.common.LAST_BLOCK_TICKET``).

    Scratch first needed during a CUDA-graph capture is the capturing launch's own, never kept: the
    graph zeroes it before that launch at each replay, and nothing before the first, so no other launch
    (eager, or another graph's) may use it (``capturing``)."""
    # write places its saves after the chunk marks of its own capacity (seed_saves), whatever ``entries``
    need = flag_words(max(entries, seed_saves), seed_saves)
    owned = _flags.setdefault(_ring_key(ring), [])
    if owned and owned[-1].numel() >= need:
        return owned[-1]
    if capturing(ring.device):
        return torch.zeros(need, dtype=torch.int32, device=ring.device)
    owned.append(torch.zeros(max(need, 2 * owned[-1].numel() if owned else need), dtype=torch.int32,
                             device=ring.device))
    return owned[-1]


def capturing(device: torch.device) -> bool:
    """Whether work enqueued now for ``device`` is captured into a CUDA graph (torch's current stream)."""
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _sink_args(context: VerifyOrWriteContext) -> list:
    return [getattr(context, name) for name in SINK_FIELDS]


def write_inputs(input_ids, positions, out_cache_loc, enable_write_input_assert, expected_input_tokens,
                 expected_input_positions) -> tuple:
    """Write's per-step tensors as they stand in its arguments, from position ``WRITE_INPUTS``: the
    expected tensors are the inputs themselves if the assert is off (then never read)."""
    if enable_write_input_assert:
        return input_ids, positions, out_cache_loc, expected_input_tokens, expected_input_positions
    return input_ids, positions, out_cache_loc, input_ids, positions


WRITE_INPUTS = 4  # write's arguments: canary words and the three plan tensors, then ``write_inputs``


def write_call(*, context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert,
               expected_input_tokens, expected_input_positions):
    assert_on = bool(enable_write_input_assert)
    cap = plan.write_seed_slot_indices.shape[0]
    marks = flags_for(context.violation_ring, cap, seed_saves=cap)
    args = (
        canary_words(context.canary_buf), plan.write_offsets, plan.write_seed_slot_indices, plan.write_num_valid_reqs,
        *write_inputs(input_ids, positions, out_cache_loc, assert_on, expected_input_tokens, expected_input_positions),
        context.enable_chain_position_assert, *_sink_args(context), marks, int(context.kernel_kind),
        *source_args(context),
    )
    kernel_spec = spec("write", num_sources=folded_sources(context), partial=partial_fold(context),
                       input_assert=assert_on, fold_words=built_in_fold_words(context))
    point = write_point(cap, input_ids.shape[0])
    return KernelCall("write", kernel_spec, point, launch_mode("write", kernel_spec), args,
                      scratch=_positions(args, marks))


def write_point(request_capacity: int, tokens: int) -> tuple:
    """Write's workload point (``KernelCall.size``, ``tuning.apply.nearest``): its request capacity and
    tokens per request, both from shapes (no host sync)."""
    return request_capacity, max(1, tokens // max(request_capacity, 1))


def verify_call(*, context, plan, check_verify_expected_token):
    cap = plan.verify_slot_indices.shape[0]
    marks = flags_for(context.violation_ring, cap)
    args = (
        canary_words(context.canary_buf), plan.verify_slot_indices, plan.verify_expected_tokens,
        plan.verify_expected_positions, plan.verify_prev_slot_indices, plan.verify_num_valid, plan.enable,
        *_sink_args(context), marks, int(context.kernel_kind), *source_args(context),
    )
    kernel_spec = spec("verify", num_sources=folded_sources(context), partial=partial_fold(context),
                       check_token=bool(check_verify_expected_token), fold_words=built_in_fold_words(context))
    return KernelCall("verify", kernel_spec, cap, launch_mode("verify", kernel_spec), args,
                      scratch=_positions(args, marks))


def plan_call(*, verify_plan_out, write_plan_out, req_pool_indices, prefix_lens, extend_seq_lens, req_to_token,
              swa_window_size, full_to_swa_index_mapping, verify_capacity, req_to_verify_expected_tokens,
              req_to_verify_expected_tokens_valid_lens, kv_token_id_vs_position_offset):
    device = verify_plan_out.verify_slot_indices.device
    has_lut = full_to_swa_index_mapping is not None
    has_pool = req_to_verify_expected_tokens is not None
    bs = req_pool_indices.shape[0]
    offsets = torch.empty(bs + 1, dtype=torch.int64, device=device)  # verify offsets scratch (capture-safe)
    args = (
        verify_plan_out.verify_slot_indices, verify_plan_out.verify_expected_tokens,
        verify_plan_out.verify_expected_positions, verify_plan_out.verify_prev_slot_indices,
        verify_plan_out.verify_num_valid, verify_plan_out.enable,
        write_plan_out.write_offsets, write_plan_out.write_seed_slot_indices, write_plan_out.write_num_valid_reqs,
        req_pool_indices, prefix_lens, extend_seq_lens, table(req_to_token),
        full_to_swa_index_mapping if has_lut else placeholder(device, torch.int64, (1,)),
        table(req_to_verify_expected_tokens) if has_pool else placeholder(device, torch.int32, (1, 1)),
        req_to_verify_expected_tokens_valid_lens if has_pool else req_pool_indices,
        offsets,
        int(swa_window_size), int(kv_token_id_vs_position_offset),
    )
    kernel_spec = spec("plan", has_lut=has_lut, has_pool=has_pool)
    return KernelCall("plan", kernel_spec, write_plan_out.write_seed_slot_indices.shape[0], 0, args,
                      scratch=_positions(args, offsets))


def scatter_call(*, flat_in, offsets, req_pool_indices, pool_out):
    """None (nothing to launch) for an empty batch or no tokens (SPEC 3.4)."""
    if req_pool_indices.shape[0] == 0 or flat_in.shape[0] == 0:
        return None
    return KernelCall("scatter", spec("scatter"), req_pool_indices.shape[0], 0,
                      (flat_in, offsets, req_pool_indices, table(pool_out)))


def table(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous 2-D table as the kernels take it: one with no columns (``[R, 0]``, strides ``(1, 1)`` to torch)
    viewed with the compact strides ``(0, 1)`` tvm-ffi checks for; the kernels read and write no element of it."""
    return tensor if tensor.shape[1] else tensor.as_strided(tensor.shape, (0, 1))


def _positions(args: tuple, scratch: torch.Tensor) -> frozenset:
    """Positions in ``args`` of the ``scratch`` tensor (by identity)."""
    return frozenset(i for i, a in enumerate(args) if a is scratch)


_placeholders: dict[tuple, torch.Tensor] = {}


def placeholder(device: torch.device, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """A small zero tensor standing in for an absent optional input (never read by the kernel)."""
    key = (device.type, device.index, dtype, shape)
    if key not in _placeholders:
        _placeholders[key] = torch.zeros(shape, dtype=dtype, device=device)
    return _placeholders[key]


# kernel -> its ``*_call``
CALLS = {"write": write_call, "verify": verify_call, "plan": plan_call, "scatter": scatter_call}
