"""Eager launches of verify and write: checked and packed once per (context, plan), then replayed.

An untraced compiled launch (``launch.py``) of verify or write looks here for what the last launch with the same
context and plan objects and flag (``check_verify_expected_token``, ``enable_write_input_assert``) prepared: the
compiled function and its packed arguments (the int64 view of ``canary_buf``, the real-KV source views, the ring's
chunk marks, the specialization). It replays them when nothing the checks (SPEC 4) and the packing read of the context
and plan changed; else it checks and packs again, raising what the checks raise, and keeps the result.

A replay's contract (what it relies on, how each is known unchanged):

* The context, the plan and their real-KV sources are frozen dataclasses: their fields are never
  reassigned (``object.__setattr__`` on them is unsupported). Entries are keyed by the context's and
  plan's identities and forgotten when either is collected (weak references), so an identity is never
  mistaken for another object's.
* Their tensors may change in place (``resize_``, ``set_``, ``as_strided_``, ``.data =``, ...): each
  tensor the checks or the packing read (the context's, the plan's, each source's) has its data
  pointer, shape, strides and dtype compared with those at packing, a source's also its conjugate and
  negative bits (SPEC 4 refuses such views; ``.data =`` can set them at one address). If equal, every
  check passes again and every view addresses the same bytes with the same layout. The device
  follows from a non-null data pointer (CUDA's unified addressing gives host and devices disjoint addresses).
* Not memoised (checked and packed at every launch): a flag not a ``bool``; tensors not
  exactly ``torch.Tensor`` (subclasses can redefine what the comparison reads); a tensor with a null
  data pointer (no elements: its device would not follow from it). A launch packed during a CUDA-graph
  capture is not kept (its chunk marks may be the capture's own: ``packing.flags_for``); one kept
  before the capture is replayed in it.
* The compiled function is looked up once per entry (``runtime.get_kernel`` keeps it per launch key
  for the process's life); write's again when the launch's token count, which its geometry follows,
  changes (``_WriteKernel``, ``packing.write_point``).

Write's per-step tensors (``input_ids``, ``positions``, ``out_cache_loc``, the expected tensors) are no part of an
entry: each launch checks them (``checks.check_write_inputs``) and passes them as they are. Verify's replay runs no
check.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref

import torch
import tvm_ffi

from . import checks, reference
from .context import SINK_FIELDS, RealKvSource, VerifyOrWriteContext
from .plans import VerifyPlan, WritePlan, plan_tensors
from .runtime import get_kernel, packing, use_reference

_Tensor = torch.Tensor


@dataclasses.dataclass(slots=True, eq=False)
class _Packed:
    """One (context, plan, flag)'s checked launch.

    tensors: every tensor the checks and the packing read, in a fixed order, the real-KV sources' last.
    sources: how many are real-KV sources.
    metadata: ``_metadata(tensors, sources)`` when packed.
    fn, head, tail: the compiled function (write: a ``_WriteKernel``, giving it per token count) and its
        arguments; write's per-step tensors go between ``head`` and ``tail`` (verify: ``tail`` empty).
    lifelines: weak references to the context and plan, whose callbacks forget the entry.
    written_ranges: write's: ``checks.WrittenRanges`` of the context's tensors the kernel writes, which
        its per-step tensors must not overlap (``checks.check_write_inputs``); verify's: empty.
    """

    tensors: tuple
    sources: int
    metadata: list
    fn: object
    head: tuple
    tail: tuple
    lifelines: tuple
    written_ranges: checks.WrittenRanges


# (kernel, id(context), id(plan), flag) -> its checked launch; only bool flags are memoised
_memo: dict[tuple, _Packed] = {}


def _metadata(tensors: tuple, sources: int) -> list:
    return [(t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors] + [
        t.is_conj() or t.is_neg() for t in tensors[len(tensors) - sources:]]


def verify(context, plan, check_verify_expected_token) -> None:
    """``launch_canary_verify_kernel`` untraced."""
    key = None
    if check_verify_expected_token is True or check_verify_expected_token is False:
        key = ("verify", id(context), id(plan), check_verify_expected_token)
        packed = _memo.get(key)
        if packed is not None and packed.metadata == _metadata(packed.tensors, packed.sources) and not use_reference():
            packed.fn(*packed.head)
            return
    kwargs = dict(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
    checks.check_verify(**kwargs)
    if use_reference():
        reference.canary_verify_ref(**kwargs)
        return
    call = packing.verify_call(**kwargs)
    fn = get_kernel(call.kernel, call.spec, call.device, call.size, call.mode)
    _remember(key, context, plan, plan_tensors(plan), fn, call.args, ())
    fn(*call.args)


def write(context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert, expected_input_tokens,
          expected_input_positions) -> None:
    """``launch_canary_write_kernel`` untraced."""
    inputs = (input_ids, positions, out_cache_loc, enable_write_input_assert, expected_input_tokens,
              expected_input_positions)
    key = None
    if enable_write_input_assert is True or enable_write_input_assert is False:
        key = ("write", id(context), id(plan), enable_write_input_assert)
        packed = _memo.get(key)
        if packed is not None and packed.metadata == _metadata(packed.tensors, packed.sources):
            checks.check_write_inputs(context, *inputs, packed.written_ranges)
            if not use_reference():
                packed.fn(input_ids.shape[0])(*packed.head, *packing.write_inputs(*inputs), *packed.tail)
                return
    kwargs = dict(context=context, plan=plan, input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc,
                  enable_write_input_assert=enable_write_input_assert, expected_input_tokens=expected_input_tokens,
                  expected_input_positions=expected_input_positions)
    checks.check_write(**kwargs)
    if use_reference():
        reference.canary_write_ref(**kwargs)
        return
    call = packing.write_call(**kwargs)
    fn = get_kernel(call.kernel, call.spec, call.device, call.size, call.mode)
    end = packing.WRITE_INPUTS + 5
    kernel = _WriteKernel(call.spec, call.device, call.size[0], call.mode, input_ids.shape[0], fn)
    _remember(key, context, plan, plan_tensors(plan) + (context.enable_chain_position_assert,), kernel,
              call.args[: packing.WRITE_INPUTS], call.args[end:])
    fn(*call.args)


class _WriteKernel:
    """A memoised write's compiled function for a launch of ``tokens`` tokens (``kernel(tokens)``), its
    geometry following the token count and the plan as an unmemoised launch's (``packing.write_point``).
    The last count's function is kept, so a steady shape costs a comparison."""

    __slots__ = ("spec", "device", "request_capacity", "mode", "tokens", "fn")

    def __init__(self, spec: tuple, device: torch.device, request_capacity: int, mode: int, tokens: int, fn):
        self.spec, self.device, self.request_capacity, self.mode, self.tokens, self.fn = (
            spec, device, request_capacity, mode, tokens, fn)

    def __call__(self, tokens: int):
        if tokens != self.tokens:
            point = packing.write_point(self.request_capacity, tokens)
            self.tokens, self.fn = tokens, get_kernel("write", self.spec, self.device, point, self.mode)
        return self.fn


def _remember(key: tuple | None, context, plan, own_tensors: tuple, fn, head: tuple, tail: tuple) -> None:
    """Keep a checked launch under ``key`` unless the contract (module docstring) cannot vouch for it.
    ``own_tensors``: the plan's and any other tensors the checks read besides the context's."""
    if key is None or packing.capturing(context.canary_buf.device):
        return
    sources = context.real_kv_sources  # a tuple: the context keeps a list given to it as one
    if type(context) is not VerifyOrWriteContext:
        return
    if any(type(s) is not RealKvSource for s in sources):
        return
    if type(plan) is not (VerifyPlan if key[0] == "verify" else WritePlan):
        return
    tensors = (context.canary_buf, *(getattr(context, name) for name in SINK_FIELDS), *own_tensors,
               *(s.tensor for s in sources))
    if any(type(t) is not _Tensor or t.data_ptr() == 0 for t in tensors):
        return
    forget = functools.partial(_memo.pop, key)  # called with the dead weak reference as pop's default
    try:
        lifelines = (weakref.ref(context, forget), weakref.ref(plan, forget))
    except TypeError:  # Python 3.10: the records are not weakly referable (argtypes.RECORD)
        return
    head, tail = _converted(head, keep_first=True), _converted(tail)
    written = checks.launch_tensors("write", {"context": context})[0] if key[0] == "write" else []
    written_ranges = checks.WrittenRanges.of(checks.byte_ranges(written))
    _memo[key] = _Packed(tensors, len(sources), _metadata(tensors, len(sources)), fn, head, tail, lifelines,
                         written_ranges)


def _converted(args: tuple, *, keep_first: bool = False) -> tuple:
    """``args`` with its torch tensors converted to tvm-ffi tensors once, not at every replay's call. Each is converted
    from a detached alias (its own shape and strides, which nothing changes) through torch's DLPack exchange API, which
    neither synchronises nor enqueues work; without that API they stay torch tensors. With ``keep_first`` the first
    stays a torch tensor: tvm-ffi takes the launch's stream (torch's current one) from a torch tensor argument."""
    if not hasattr(_Tensor, "__dlpack_c_exchange_api__"):
        return args
    return tuple(
        tvm_ffi.from_dlpack(a.detach()) if type(a) is _Tensor and not (keep_first and i == 0) else a
        for i, a in enumerate(args)
    )
