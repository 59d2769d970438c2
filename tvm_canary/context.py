"""Launch tags, real-KV sources and the per-endpoint launch context (docs/SPEC.md sections 1.2, 2.3, 2.6).

Construction checks: the contract's ``RealKvSource`` messages (SPEC 4), each preceded by a type check only where needed
(SPEC D9, ``argtypes``); the context's hash mode and sources (SPEC D9).
"""

from __future__ import annotations

import dataclasses
import enum

import torch

from .argtypes import (
    RECORD,
    require_instance,
    require_int64,
    require_integer,
    require_number,
    require_tensor,
    shape_text,
    type_name,
)
from .consts import RealKvHashMode


class CanaryLaunchTag(enum.IntEnum):
    """Which endpoint launched a kernel; stamped into violation rows as ``kernel_kind``."""

    HEAD_K_FULL = 0
    HEAD_V_FULL = 1
    TAIL_K_FULL = 2
    TAIL_V_FULL = 3
    SWEEP_K_FULL = 4
    SWEEP_V_FULL = 5
    HEAD_K_SWA = 6
    HEAD_V_SWA = 7
    TAIL_K_SWA = 8
    TAIL_V_SWA = 9
    SWEEP_K_SWA = 10
    SWEEP_V_SWA = 11


@dataclasses.dataclass(**RECORD)
class RealKvSource:
    """One KV tensor whose bytes are folded into each slot's ``real_kv_hash``.

    Fields:
        tensor: any dtype, at least 2-D when the source is built; a launch views it as
            ``uint8[rows, row_bytes]``, needing it exactly 2-D (view a ``[slots, heads, dim]`` cache as
            2-D). Rows may be ``stride(0)`` elements apart (docs/SPEC.md D5); the innermost stride must be 1.
        page_size: slots per row (slot ``s`` lives in row ``s // page_size``).
        num_bytes_per_token: bytes of one slot's strip, a positive multiple of 16.
        read_bytes: bytes folded in ALL mode, a multiple of 16 in ``(0, num_bytes_per_token]``.
    """

    tensor: torch.Tensor
    page_size: int
    num_bytes_per_token: int
    read_bytes: int

    def __post_init__(self) -> None:
        require_number(self.page_size, "RealKvSource.page_size")
        if self.page_size < 1:
            raise ValueError(f"kv-canary: RealKvSource.page_size must be >= 1, got {self.page_size}")
        nbpt = self.num_bytes_per_token
        require_number(nbpt, "RealKvSource.num_bytes_per_token")
        if nbpt <= 0 or nbpt % 16 != 0:
            raise ValueError(
                f"kv-canary: RealKvSource.num_bytes_per_token must be a positive multiple of 16, got {nbpt}"
            )
        rb = self.read_bytes
        require_number(rb, "RealKvSource.read_bytes")
        if rb <= 0 or rb % 16 != 0 or rb > nbpt:
            raise ValueError(
                "kv-canary: RealKvSource.read_bytes must be a positive multiple of 16 in "
                f"(0, num_bytes_per_token={nbpt}], got {rb}"
            )
        t = self.tensor
        require_tensor(t, "RealKvSource.tensor")
        if t.ndim < 2:
            raise ValueError(f"kv-canary: RealKvSource.tensor must be at least 2-D, got shape {shape_text(t)}")
        check_source_tensor(t)
        for name in ("page_size", "num_bytes_per_token", "read_bytes"):
            require_integer(getattr(self, name), f"RealKvSource.{name}")


def source_tuple(sources, name: str, entry: str = "{name}[{i}]") -> tuple:
    """``sources`` (a tuple or list of ``RealKvSource``, argument ``name``) as a tuple; a TypeError names
    ``name``, or the entry that is no source as ``entry`` formats it."""
    if not isinstance(sources, (tuple, list)):
        raise TypeError(f"kv-canary: {name} must be a tuple of RealKvSource, got {type_name(sources)}")
    for i, source in enumerate(sources):
        require_instance(source, RealKvSource, entry.format(name=name, i=i))
    return tuple(sources)


def check_source_tensor(tensor: torch.Tensor) -> None:
    """A source tensor's rows are a whole number of 16-byte units apart (SPEC 2.6), and its bytes are its values: no
    conjugate or negative view, whose bits torch applies only when reading the values (the kernels hash the bytes in
    memory; the reference cannot view such a tensor as bytes). Checked when the source is built and at every launch
    (``checks.check_real_kv_sources``): a tensor may be re-strided in place (``as_strided_``). Dynamo cannot
    trace the view bits: the operators read them then (``ops._view_bits_kernel``)."""
    if not torch.compiler.is_compiling():
        refuse_view_bits(tensor)
    if tensor.is_quantized:  # its uint8 view keeps the quantizer, which the reference's indexing crashes on
        raise ValueError("kv-canary: RealKvSource.tensor must not be quantized: pass tensor.int_repr()")
    row_stride_bytes = tensor.stride(0) * tensor.element_size()
    if row_stride_bytes % 16 != 0:
        raise ValueError(
            "kv-canary: RealKvSource.tensor row stride must be a multiple of 16 bytes, got "
            f"{row_stride_bytes} bytes (shape={shape_text(tensor)}, strides={tuple(tensor.stride())}, "
            f"dtype={tensor.dtype})"
        )


def refuse_view_bits(tensor: torch.Tensor) -> None:
    """``tensor``, a real-KV source's, is no conjugate or negative view (SPEC 4 "Argument types")."""
    if tensor.is_conj() or tensor.is_neg():
        raise ValueError("kv-canary: RealKvSource.tensor must not be a conjugate or negative view (its bytes are "
                         "not its values): pass tensor.resolve_conj().resolve_neg()")


# The modes by value, looked up, not ``RealKvHashMode(value)``: torch 2.11's Dynamo cannot trace an
# enum's construction (a graph break in a compiled step building a context).
_HASH_MODES = {mode.value: mode for mode in RealKvHashMode}


def hash_mode(value: object) -> RealKvHashMode:
    """``value`` as a ``RealKvHashMode``: an int (not a bool) naming one of the three modes (SPEC D9)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"kv-canary: real_kv_hash_mode must be a RealKvHashMode, got {type_name(value)}")
    if value not in _HASH_MODES:
        raise ValueError(f"kv-canary: real_kv_hash_mode must be one of NONE (0), PARTIAL (1) or ALL (2), got {value}")
    return _HASH_MODES[value]


# The context's fields that every verify and write launch updates: the violation sink and the counters.
SINK_FIELDS = ("violation_ring", "violation_write_index", "slot_run_counter", "kernel_run_counter")


@dataclasses.dataclass(**RECORD)
class VerifyOrWriteContext:
    """Everything one endpoint's verify/write launch shares (SPEC 2.3).

    Fields:
        canary_buf: uint8 ``[num_slots, slot_stride_bytes]`` contiguous; read by verify, written by write.
        kernel_kind: the tag stamped into violation rows: a ``CanaryLaunchTag``, or any int64
            (``Violation.tag_name`` reads an unknown one as ``unknown(<kind>)``).
        violation_ring: int64 ``[ring_capacity, 8]``; rows appended in reference order (SPEC D3).
        violation_write_index: int32 ``[1]``; count of violations ever recorded.
        slot_run_counter, kernel_run_counter: int64 ``[1]`` health counters.
        real_kv_sources: up to 4 sources folded into ``real_kv_hash`` (empty: none).
        real_kv_hash_mode: NONE, PARTIAL or ALL.
        enable_chain_position_assert: int32 ``[1]`` device flag read by write.
    """

    canary_buf: torch.Tensor
    kernel_kind: CanaryLaunchTag
    violation_ring: torch.Tensor
    violation_write_index: torch.Tensor
    slot_run_counter: torch.Tensor
    kernel_run_counter: torch.Tensor
    real_kv_sources: tuple[RealKvSource, ...]
    real_kv_hash_mode: RealKvHashMode
    enable_chain_position_assert: torch.Tensor

    def __post_init__(self) -> None:
        """The launch tag is an int64, the hash mode one of the three modes, and ALL mode has sources to
        hash (SPEC D9)."""
        if not isinstance(self.kernel_kind, CanaryLaunchTag):
            require_int64(self.kernel_kind, "kernel_kind")
        sources = source_tuple(self.real_kv_sources, "real_kv_sources")
        object.__setattr__(self, "real_kv_sources", sources)  # a list is kept as a tuple: it cannot change
        mode = hash_mode(self.real_kv_hash_mode)
        if mode == RealKvHashMode.ALL and not sources:
            raise ValueError(
                "kv-canary: real_kv_hash_mode=ALL hashes every byte of the real-KV sources but "
                "real_kv_sources is empty; use RealKvHashMode.NONE for a context without sources"
            )
