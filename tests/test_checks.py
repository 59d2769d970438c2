"""Front-end argument checks (tvm_canary.checks): every SPEC 4 message, exact text, one case each."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from tvm_canary import checks
from tvm_canary.consts import RealKvHashMode
from tvm_canary.context import CanaryLaunchTag, RealKvSource, VerifyOrWriteContext
from tvm_canary.plans import VerifyPlan, WritePlan

I32, I64, U8 = torch.int32, torch.int64, torch.uint8
NUM_TOKENS = 6
WRITE_CAP = 2
VERIFY_CAP = 4
PLAN_BS = 3
PLAN_WRITE_CAP = 4
PLAN_VERIFY_CAP = 8


# ===== Builders of valid arguments, and small tensor mutators.


def zeros(*shape, dtype=I64):
    return torch.zeros(*shape, dtype=dtype)


def noncontig(t: torch.Tensor) -> torch.Tensor:
    """Same shape and dtype, last-dim stride 2 (not contiguous if the last dim has > 1 element)."""
    return torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[..., ::2]


def meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, device="meta")


def source(tensor=None, *, page_size=1, nbpt=32, read_bytes=32) -> RealKvSource:
    tensor = zeros(8, 32, dtype=U8) if tensor is None else tensor
    return RealKvSource(tensor=tensor, page_size=page_size, num_bytes_per_token=nbpt, read_bytes=read_bytes)


def make_context(**overrides) -> VerifyOrWriteContext:
    fields = dict(
        canary_buf=zeros(8, 32, dtype=U8),
        kernel_kind=CanaryLaunchTag.TAIL_K_FULL,
        violation_ring=zeros(4, 8),
        violation_write_index=zeros(1, dtype=I32),
        slot_run_counter=zeros(1),
        kernel_run_counter=zeros(1),
        real_kv_sources=(source(),),
        real_kv_hash_mode=RealKvHashMode.ALL,
        enable_chain_position_assert=torch.ones(1, dtype=I32),
    )
    fields.update(overrides)
    return VerifyOrWriteContext(**fields)


def write_args() -> dict:
    return dict(
        context=make_context(),
        plan=WritePlan.allocate(write_req_capacity=WRITE_CAP, device="cpu").zero_for_testing_(),
        input_ids=zeros(NUM_TOKENS),
        positions=zeros(NUM_TOKENS),
        out_cache_loc=zeros(NUM_TOKENS),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )


def write_args_asserting() -> dict:
    return dict(
        write_args(),
        enable_write_input_assert=True,
        expected_input_tokens=zeros(NUM_TOKENS),
        expected_input_positions=zeros(NUM_TOKENS),
    )


def verify_args() -> dict:
    return dict(
        context=make_context(),
        plan=VerifyPlan.allocate(verify_capacity=VERIFY_CAP, device="cpu").zero_for_testing_(),
        check_verify_expected_token=True,
    )


def plan_args(bs: int = PLAN_BS, write_cap: int = PLAN_WRITE_CAP) -> dict:
    return dict(
        verify_plan_out=VerifyPlan.allocate(verify_capacity=PLAN_VERIFY_CAP, device="cpu"),
        write_plan_out=WritePlan.allocate(write_req_capacity=write_cap, device="cpu"),
        req_pool_indices=zeros(bs),
        prefix_lens=zeros(bs),
        extend_seq_lens=zeros(bs),
        req_to_token=zeros(4, 16, dtype=I32),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=PLAN_VERIFY_CAP,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )


def plan_args_with_pool() -> dict:
    return dict(
        plan_args(),
        req_to_verify_expected_tokens=zeros(4, 16, dtype=I32),
        req_to_verify_expected_tokens_valid_lens=zeros(PLAN_BS),
    )


def plan_args_with_lut() -> dict:
    return dict(plan_args(), swa_window_size=4, full_to_swa_index_mapping=zeros(10))


def scatter_args() -> dict:
    return dict(
        flat_in=zeros(10),
        offsets=torch.tensor([0, 3, 6, 10], dtype=I64),
        req_pool_indices=torch.tensor([1, 2, 3], dtype=I64),
        pool_out=zeros(4, 16, dtype=I32),
    )


def ctx(**fields):
    """Mutator: replace context fields."""
    return lambda a: dict(a, context=dataclasses.replace(a["context"], **fields))


def ctx_field(field, fn):
    """Mutator: context.<field> := fn(context.<field>)."""
    return lambda a: dict(a, context=dataclasses.replace(a["context"], **{field: fn(getattr(a["context"], field))}))


def arg(name, fn):
    """Mutator: args[name] := fn(args[name])."""
    return lambda a: dict(a, **{name: fn(a[name])})


def plan_field(plan_key, field, fn):
    """Mutator: args[plan_key].<field> := fn(args[plan_key].<field>)."""
    return lambda a: dict(
        a, **{plan_key: dataclasses.replace(a[plan_key], **{field: fn(getattr(a[plan_key], field))})}
    )


def sources(*srcs):
    return ctx(real_kv_sources=tuple(srcs))


def const(value):
    return lambda _old: value


def retype(dtype):
    return lambda t: t.to(dtype)


def resize(n):
    return lambda t: torch.zeros(n, dtype=t.dtype)


def to_2d(t):
    return t.reshape(1, -1)


# A source whose data pointer is 1 byte past alignment (row stride 48 bytes, width 32).
_MISALIGNED = zeros(4, 48, dtype=U8)[:, 1:33]
_MISALIGNED_PTR = _MISALIGNED.data_ptr()
assert _MISALIGNED_PTR % 8 != 0
# A contiguous canary buffer 4 bytes past alignment (its int64 view needs an aligned start).
_MISALIGNED_BUF = zeros(8 * 32 + 4, dtype=U8)[4:].view(8, 32)
_MISALIGNED_BUF_PTR = _MISALIGNED_BUF.data_ptr()
assert _MISALIGNED_BUF_PTR % 8 != 0 and _MISALIGNED_BUF.is_contiguous()


def _off_word_storage(rows: int, width: int) -> torch.Tensor:
    """uint8 ``[rows, width]``, 8-byte aligned, in a storage starting 4 bytes past a word (``from_numpy`` of
    an odd slice): the kernels' int64 view counts words from the storage's start."""
    raw = np.zeros(rows * width + 16, dtype=np.uint8)
    flat = torch.from_numpy(raw[(4 - raw.ctypes.data) % 8:])
    tensor = flat[4: 4 + rows * width].view(rows, width)
    assert tensor.data_ptr() % 8 == 0 and tensor.untyped_storage().data_ptr() % 8 == 4
    return tensor


_OFF_WORD_SOURCE, _OFF_WORD_BUF = _off_word_storage(8, 32), _off_word_storage(8, 32)


def _restrided_source() -> RealKvSource:
    """A source whose tensor is re-strided in place after construction: rows 36 bytes apart."""
    built = source(zeros(8, 48, dtype=U8)[:, :32])
    built.tensor.as_strided_((8, 32), (36, 1))
    return built


def on_meta(value):
    """``value`` (launch arguments, a record or a tuple) with every tensor on the meta device."""
    if isinstance(value, torch.Tensor):
        return meta(value)
    if isinstance(value, dict):
        return {k: on_meta(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(map(on_meta, value))
    if dataclasses.is_dataclass(value):
        fields = dataclasses.fields(value)
        return dataclasses.replace(value, **{f.name: on_meta(getattr(value, f.name)) for f in fields})
    return value


# ===== Construction-time errors (context.py, plans.py).

CONSTRUCTION_CASES = [
    ("page_size", lambda: source(page_size=0), "kv-canary: RealKvSource.page_size must be >= 1, got 0"),
    (
        "nbpt",
        lambda: source(nbpt=8, read_bytes=16),
        "kv-canary: RealKvSource.num_bytes_per_token must be a positive multiple of 16, got 8",
    ),
    (
        "read_bytes",
        lambda: source(nbpt=32, read_bytes=48),
        "kv-canary: RealKvSource.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=32], got 48",
    ),
    (
        "ndim",
        lambda: source(zeros(64, dtype=U8)),
        "kv-canary: RealKvSource.tensor must be at least 2-D, got shape (64,)",
    ),
    (
        "row_stride",
        lambda: source(zeros(4, 24, dtype=U8), nbpt=16, read_bytes=16),
        "kv-canary: RealKvSource.tensor row stride must be a multiple of 16 bytes, got 24 bytes "
        "(shape=(4, 24), strides=(24, 1), dtype=torch.uint8)",
    ),
    (
        "conjugate_view",
        lambda: source(torch.zeros(4, 4, dtype=torch.complex64).conj()),
        "kv-canary: RealKvSource.tensor must not be a conjugate or negative view (its bytes are not its values): "
        "pass tensor.resolve_conj().resolve_neg()",
    ),
    (
        "quantized",
        lambda: source(torch.quantize_per_tensor(torch.zeros(4, 64), 0.1, 0, torch.quint8)),
        "kv-canary: RealKvSource.tensor must not be quantized: pass tensor.int_repr()",
    ),
    (
        "write_plan_past_int64",
        lambda: WritePlan.allocate(write_req_capacity=2**63 - 1, device="cpu"),
        "kv-canary: WritePlan write_req_capacity + 1 (the offsets' length) must fit in int64, got "
        "9223372036854775808",
    ),
    (
        "verify_plan_past_int64",
        lambda: VerifyPlan.allocate(verify_capacity=2**63, device="cpu"),
        "kv-canary: VerifyPlan verify_capacity must fit in int64, got 9223372036854775808",
    ),
    (
        "write_plan_0",
        lambda: WritePlan.allocate(write_req_capacity=0, device="cpu"),
        "kv-canary: WritePlan write_req_capacity must be positive, got 0",
    ),
    (
        "write_plan_-3",
        lambda: WritePlan.allocate(write_req_capacity=-3, device="cpu"),
        "kv-canary: WritePlan write_req_capacity must be positive, got -3",
    ),
    (
        "verify_plan_0",
        lambda: VerifyPlan.allocate(verify_capacity=0, device="cpu"),
        "kv-canary: VerifyPlan verify_capacity must be positive, got 0",
    ),
    (
        "verify_plan_-3",
        lambda: VerifyPlan.allocate(verify_capacity=-3, device="cpu"),
        "kv-canary: VerifyPlan verify_capacity must be positive, got -3",
    ),
]


@pytest.mark.parametrize("build, message", [c[1:] for c in CONSTRUCTION_CASES], ids=[c[0] for c in CONSTRUCTION_CASES])
def test_construction_errors(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


def test_three_d_source_constructs_but_is_rejected_at_launch():
    src = source(zeros(2, 4, 32, dtype=U8))  # construction accepts ndim >= 2
    context = make_context(real_kv_sources=(src,))
    with pytest.raises(
        ValueError, match=re.escape("kv-canary: real_kv_sources[0].tensor (viewed as uint8) must be 2-D, got 3-D")
    ):
        checks.check_real_kv_sources(context)


# ===== Launch-time errors: (id, base-args builder, check function, mutator, exception, exact message).

W, WA, V, P, S = write_args, write_args_asserting, verify_args, plan_args, scatter_args
PP, PL = plan_args_with_pool, plan_args_with_lut
CW, CV, CP, CS = checks.check_write, checks.check_verify, checks.check_plan, checks.check_scatter
FIVE_SOURCES = sources(*(source() for _ in range(5)))

LAUNCH_CASES = [
    # -- real-KV sources (write and verify share check_real_kv_sources)
    ("w_source_count", W, CW, FIVE_SOURCES, ValueError,
     "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"),
    ("v_source_count", V, CV, FIVE_SOURCES, ValueError,
     "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"),
    ("source_inner_stride", V, CV, sources(source(), source(zeros(8, 16, dtype=torch.float32)[:, ::2])), ValueError,
     "kv-canary: real_kv_sources[1].tensor must be contiguous"),
    ("source_3d", W, CW, sources(source(zeros(2, 4, 32, dtype=U8))), ValueError,
     "kv-canary: real_kv_sources[0].tensor (viewed as uint8) must be 2-D, got 3-D"),
    ("source_too_narrow", V, CV, sources(source(page_size=2, nbpt=32)), ValueError,
     "kv-canary: RealKvSource row is too narrow for its slot layout: dim-1 is 32 bytes but "
     "page_size=2 x num_bytes_per_token=32 needs 64"),
    ("source_too_narrow_float", W, CW, sources(source(zeros(8, 4, dtype=torch.float32), nbpt=32)), ValueError,
     "kv-canary: RealKvSource row is too narrow for its slot layout: dim-1 is 16 bytes but "
     "page_size=1 x num_bytes_per_token=32 needs 32"),
    ("source_misaligned", V, CV, sources(source(_MISALIGNED)), ValueError,
     f"kv-canary: real_kv_sources[0].tensor data pointer must be 8-byte aligned, got {_MISALIGNED_PTR:#x}"),
    ("source_device", W, CW, sources(source(meta(zeros(8, 32, dtype=U8)))), ValueError,
     "kv-canary: real_kv_sources[0].tensor must be on canary_buf's device cpu, got meta"),
    ("source_storage_off_word", V, CV, sources(source(_OFF_WORD_SOURCE)), ValueError,
     "kv-canary: real_kv_sources[0].tensor storage must start 8-byte aligned, got "
     f"{_OFF_WORD_SOURCE.untyped_storage().data_ptr():#x}"),
    ("w_canary_buf_storage_off_word", W, CW, ctx(canary_buf=_OFF_WORD_BUF), ValueError,
     f"kv-canary: canary_buf storage must start 8-byte aligned, got {_OFF_WORD_BUF.untyped_storage().data_ptr():#x}"),
    ("source_restrided", W, CW, sources(_restrided_source()), ValueError,
     "kv-canary: RealKvSource.tensor row stride must be a multiple of 16 bytes, got 36 bytes (shape=(8, 32), "
     "strides=(36, 1), dtype=torch.uint8)"),
    ("w_source_list_inside_canary_buf", W, CW, lambda a: dict(a, context=dataclasses.replace(
        a["context"], real_kv_sources=[source(a["context"].canary_buf)])), ValueError,
     "kv-canary: context.canary_buf shares memory with context.real_kv_sources[0].tensor: a tensor the launch "
     "writes must not overlap any other tensor argument"),
    ("w_all_meta", W, CW, on_meta, ValueError, "kv-canary: unsupported device type 'meta' (expected cpu or cuda)"),
    ("v_all_meta", V, CV, on_meta, ValueError, "kv-canary: unsupported device type 'meta' (expected cpu or cuda)"),
    ("p_all_meta", P, CP, on_meta, ValueError, "kv-canary: unsupported device type 'meta' (expected cpu or cuda)"),
    ("s_all_meta", S, CS, on_meta, ValueError, "kv-canary: unsupported device type 'meta' (expected cpu or cuda)"),
    ("w_canary_buf_misaligned", W, CW, ctx(canary_buf=_MISALIGNED_BUF), ValueError,
     f"kv-canary: canary_buf data pointer must be 8-byte aligned, got {_MISALIGNED_BUF_PTR:#x}"),
    ("v_canary_buf_misaligned", V, CV, ctx(canary_buf=_MISALIGNED_BUF), ValueError,
     f"kv-canary: canary_buf data pointer must be 8-byte aligned, got {_MISALIGNED_BUF_PTR:#x}"),
    ("p_swa_window_past_int64", P, CP, lambda a: dict(a, swa_window_size=2**63, full_to_swa_index_mapping=zeros(10)),
     ValueError, "kv-canary: swa_window_size must fit in int64, got 9223372036854775808"),
    ("p_token_offset_past_int64", P, CP, lambda a: dict(a, kv_token_id_vs_position_offset=-(2**63) - 1), ValueError,
     "kv-canary: kv_token_id_vs_position_offset must fit in int64, got -9223372036854775809"),
    # -- write: presence rule
    ("w_expected_required", W, CW, lambda a: dict(a, enable_write_input_assert=True), ValueError,
     "kv-canary: expected input tensors are required when enable_write_input_assert=True"),
    ("w_expected_one_missing", WA, CW, lambda a: dict(a, expected_input_positions=None), ValueError,
     "kv-canary: expected input tensors are required when enable_write_input_assert=True"),
    ("w_expected_must_be_none", W, CW, lambda a: dict(a, expected_input_tokens=zeros(NUM_TOKENS)), ValueError,
     "kv-canary: expected input tensors must be None when enable_write_input_assert=False"),
    # -- write: contiguity
    ("w_nc_canary_buf", W, CW, ctx_field("canary_buf", noncontig), ValueError,
     "kv-canary: canary_buf must be contiguous"),
    ("w_nc_write_offsets", W, CW, plan_field("plan", "write_offsets", noncontig), ValueError,
     "kv-canary: plan.write_offsets must be contiguous"),
    ("w_nc_seeds", W, CW, plan_field("plan", "write_seed_slot_indices", noncontig), ValueError,
     "kv-canary: plan.write_seed_slot_indices must be contiguous"),
    ("w_nc_input_ids", W, CW, arg("input_ids", noncontig), ValueError, "kv-canary: input_ids must be contiguous"),
    ("w_nc_positions", W, CW, arg("positions", noncontig), ValueError, "kv-canary: positions must be contiguous"),
    ("w_nc_out_cache_loc", W, CW, arg("out_cache_loc", noncontig), ValueError,
     "kv-canary: out_cache_loc must be contiguous"),
    ("w_nc_expected_tokens", WA, CW, arg("expected_input_tokens", noncontig), ValueError,
     "kv-canary: expected_input_tokens must be contiguous"),
    ("w_nc_expected_positions", WA, CW, arg("expected_input_positions", noncontig), ValueError,
     "kv-canary: expected_input_positions must be contiguous"),
    ("w_nc_ring", W, CW, ctx_field("violation_ring", noncontig), ValueError,
     "kv-canary: violation_ring must be contiguous"),
    # -- write: context tensors
    ("w_canary_buf_dtype", W, CW, ctx(canary_buf=zeros(8, 4)), ValueError,
     "kv-canary: canary_buf must have dtype torch.uint8, got torch.int64"),
    ("w_canary_buf_rank", W, CW, ctx(canary_buf=zeros(256, dtype=U8)), ValueError,
     "kv-canary: canary_buf must be 2-D, got shape (256,)"),
    ("w_canary_buf_stride_multiple", W, CW, ctx(canary_buf=zeros(8, 36, dtype=U8)), ValueError,
     "kv-canary: canary_buf slot stride must be a multiple of 8 bytes, got 36"),
    ("w_canary_buf_stride_small", W, CW, ctx(canary_buf=zeros(8, 24, dtype=U8)), ValueError,
     "kv-canary: canary_buf slot stride must hold at least 4 int64 fields, got 3"),
    ("w_ring_dtype", W, CW, ctx(violation_ring=zeros(4, 8, dtype=I32)), ValueError,
     "kv-canary: violation_ring must have dtype torch.int64, got torch.int32"),
    ("w_ring_rank", W, CW, ctx(violation_ring=zeros(32)), ValueError,
     "kv-canary: violation_ring must be 2-D, got shape (32,)"),
    ("w_ring_columns", W, CW, ctx(violation_ring=zeros(4, 7)), ValueError,
     "kv-canary: violation_ring shape[1] must be 8, got 7"),
    ("w_ring_rows", W, CW, ctx(violation_ring=zeros(0, 8)), ValueError,
     "kv-canary: violation_ring shape[0] must be >= 1, got 0"),
    ("w_write_index_dtype", W, CW, ctx(violation_write_index=zeros(1)), ValueError,
     "kv-canary: violation_write_index must have dtype torch.int32, got torch.int64"),
    ("w_write_index_rank", W, CW, ctx(violation_write_index=zeros(1, 1, dtype=I32)), ValueError,
     "kv-canary: violation_write_index must be 1-D, got shape (1, 1)"),
    ("w_write_index_len", W, CW, ctx(violation_write_index=zeros(2, dtype=I32)), ValueError,
     "kv-canary: violation_write_index length must be 1, got 2"),
    ("w_slot_counter_dtype", W, CW, ctx(slot_run_counter=zeros(1, dtype=I32)), ValueError,
     "kv-canary: slot_run_counter must have dtype torch.int64, got torch.int32"),
    ("w_kernel_counter_len", W, CW, ctx(kernel_run_counter=zeros(12)), ValueError,
     "kv-canary: kernel_run_counter length must be 1, got 12"),
    ("w_chain_flag_dtype", W, CW, ctx(enable_chain_position_assert=zeros(1)), ValueError,
     "kv-canary: enable_chain_position_assert must have dtype torch.int32, got torch.int64"),
    ("w_chain_flag_len", W, CW, ctx(enable_chain_position_assert=zeros(0, dtype=I32)), ValueError,
     "kv-canary: enable_chain_position_assert length must be 1, got 0"),
    # -- write: plan tensors
    ("w_seeds_dtype", W, CW, plan_field("plan", "write_seed_slot_indices", retype(I32)), ValueError,
     "kv-canary: plan.write_seed_slot_indices must have dtype torch.int64, got torch.int32"),
    ("w_seeds_rank", W, CW, plan_field("plan", "write_seed_slot_indices", to_2d), ValueError,
     "kv-canary: plan.write_seed_slot_indices must be 1-D, got shape (1, 2)"),
    ("w_offsets_dtype", W, CW, plan_field("plan", "write_offsets", retype(I32)), ValueError,
     "kv-canary: plan.write_offsets must have dtype torch.int64, got torch.int32"),
    ("w_offsets_len", W, CW, plan_field("plan", "write_offsets", resize(4)), ValueError,
     "kv-canary: plan.write_offsets length must be 3, got 4"),
    ("w_num_valid_reqs_dtype", W, CW, plan_field("plan", "write_num_valid_reqs", retype(I64)), ValueError,
     "kv-canary: plan.write_num_valid_reqs must have dtype torch.int32, got torch.int64"),
    # -- write: token tensors
    ("w_input_ids_dtype", W, CW, arg("input_ids", retype(I32)), ValueError,
     "kv-canary: input_ids must have dtype torch.int64, got torch.int32"),
    ("w_input_ids_rank", W, CW, arg("input_ids", to_2d), ValueError,
     "kv-canary: input_ids must be 1-D, got shape (1, 6)"),
    ("w_positions_len", W, CW, arg("positions", resize(5)), ValueError,
     "kv-canary: positions length must be 6, got 5"),
    ("w_out_cache_loc_dtype", W, CW, arg("out_cache_loc", retype(I32)), ValueError,
     "kv-canary: out_cache_loc must have dtype torch.int64, got torch.int32"),
    ("w_expected_tokens_dtype", WA, CW, arg("expected_input_tokens", retype(I32)), ValueError,
     "kv-canary: expected_input_tokens must have dtype torch.int64, got torch.int32"),
    ("w_expected_positions_len", WA, CW, arg("expected_input_positions", resize(7)), ValueError,
     "kv-canary: expected_input_positions length must be 6, got 7"),
    # -- write: devices
    ("w_device_input_ids", W, CW, arg("input_ids", meta), ValueError,
     "kv-canary: input_ids must be on canary_buf's device cpu, got meta"),
    ("w_device_offsets", W, CW, plan_field("plan", "write_offsets", meta), ValueError,
     "kv-canary: plan.write_offsets must be on canary_buf's device cpu, got meta"),
    ("w_device_expected", WA, CW, arg("expected_input_tokens", meta), ValueError,
     "kv-canary: expected_input_tokens must be on canary_buf's device cpu, got meta"),
    ("w_device_chain_flag", W, CW, ctx_field("enable_chain_position_assert", meta), ValueError,
     "kv-canary: enable_chain_position_assert must be on canary_buf's device cpu, got meta"),
    ("w_device_write_index", W, CW, ctx_field("violation_write_index", meta), ValueError,
     "kv-canary: violation_write_index must be on canary_buf's device cpu, got meta"),
    # -- verify
    ("v_nc_canary_buf", V, CV, ctx_field("canary_buf", noncontig), ValueError,
     "kv-canary: canary_buf must be contiguous"),
    ("v_nc_slots", V, CV, plan_field("plan", "verify_slot_indices", noncontig), ValueError,
     "kv-canary: plan.verify_slot_indices must be contiguous"),
    ("v_nc_prev", V, CV, plan_field("plan", "verify_prev_slot_indices", noncontig), ValueError,
     "kv-canary: plan.verify_prev_slot_indices must be contiguous"),
    ("v_nc_ring", V, CV, ctx_field("violation_ring", noncontig), ValueError,
     "kv-canary: violation_ring must be contiguous"),
    ("v_canary_buf_stride_small", V, CV, ctx(canary_buf=zeros(8, 16, dtype=U8)), ValueError,
     "kv-canary: canary_buf slot stride must hold at least 4 int64 fields, got 2"),
    ("v_ring_columns", V, CV, ctx(violation_ring=zeros(4, 9)), ValueError,
     "kv-canary: violation_ring shape[1] must be 8, got 9"),
    ("v_slots_dtype", V, CV, plan_field("plan", "verify_slot_indices", retype(I32)), ValueError,
     "kv-canary: plan.verify_slot_indices must have dtype torch.int64, got torch.int32"),
    ("v_expected_tokens_len", V, CV, plan_field("plan", "verify_expected_tokens", resize(3)), ValueError,
     "kv-canary: plan.verify_expected_tokens length must be 4, got 3"),
    ("v_expected_positions_dtype", V, CV, plan_field("plan", "verify_expected_positions", retype(I32)), ValueError,
     "kv-canary: plan.verify_expected_positions must have dtype torch.int64, got torch.int32"),
    ("v_prev_rank", V, CV, plan_field("plan", "verify_prev_slot_indices", to_2d), ValueError,
     "kv-canary: plan.verify_prev_slot_indices must be 1-D, got shape (1, 4)"),
    ("v_num_valid_dtype", V, CV, plan_field("plan", "verify_num_valid", retype(I64)), ValueError,
     "kv-canary: plan.verify_num_valid must have dtype torch.int32, got torch.int64"),
    ("v_enable_len", V, CV, plan_field("plan", "enable", resize(2)), ValueError,
     "kv-canary: plan.enable length must be 1, got 2"),
    ("v_device_enable", V, CV, plan_field("plan", "enable", meta), ValueError,
     "kv-canary: plan.enable must be on canary_buf's device cpu, got meta"),
    ("v_device_ring", V, CV, ctx_field("violation_ring", meta), ValueError,
     "kv-canary: violation_ring must be on canary_buf's device cpu, got meta"),
    # -- plan: steps 1 and 4
    ("p_lut_required", P, CP, lambda a: dict(a, swa_window_size=4), ValueError,
     "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0"),
    ("p_swa_window_negative", P, CP, lambda a: dict(a, swa_window_size=-5), ValueError,
     "kv-canary: swa_window_size must be non-negative, got -5"),
    ("p_swa_window_negative_lut", PL, CP, lambda a: dict(a, swa_window_size=-(2**63)), ValueError,
     f"kv-canary: swa_window_size must be non-negative, got {-(2**63)}"),
    ("p_verify_capacity", P, CP, lambda a: dict(a, verify_capacity=7), ValueError,
     "kv-canary: launch_canary_plan_kernels verify_capacity=7 does not match "
     "verify_plan_out.verify_slot_indices.shape[0]=8"),
    ("p_slots_rank", P, CP, plan_field("verify_plan_out", "verify_slot_indices", const(zeros(()))), ValueError,
     "kv-canary: out_verify_slot_indices must be 1-D, got shape ()"),
    # -- plan step 5: contiguity
    ("p_nc_req_pool_indices", P, CP, arg("req_pool_indices", noncontig), ValueError,
     "kv-canary: req_pool_indices must be contiguous"),
    ("p_nc_req_to_token", P, CP, arg("req_to_token", noncontig), ValueError,
     "kv-canary: req_to_token must be contiguous"),
    ("p_nc_lut", PL, CP, arg("full_to_swa_index_mapping", noncontig), ValueError,
     "kv-canary: lut_tensor must be contiguous"),
    ("p_nc_expected_tokens", P, CP, plan_field("verify_plan_out", "verify_expected_tokens", noncontig), ValueError,
     "kv-canary: out_verify_expected_tokens must be contiguous"),
    ("p_nc_write_offsets", P, CP, plan_field("write_plan_out", "write_offsets", noncontig), ValueError,
     "kv-canary: out_write_offsets must be contiguous"),
    # -- plan step 5: dtypes
    ("p_req_pool_indices_dtype", P, CP, arg("req_pool_indices", retype(I32)), ValueError,
     "kv-canary: req_pool_indices must have dtype torch.int64, got torch.int32"),
    ("p_prefix_lens_dtype", P, CP, arg("prefix_lens", retype(I32)), ValueError,
     "kv-canary: prefix_lens must have dtype torch.int64, got torch.int32"),
    ("p_extend_seq_lens_dtype", P, CP, arg("extend_seq_lens", retype(torch.float32)), ValueError,
     "kv-canary: extend_seq_lens must have dtype torch.int64, got torch.float32"),
    ("p_req_to_token_dtype", P, CP, arg("req_to_token", retype(I64)), ValueError,
     "kv-canary: req_to_token must have dtype torch.int32, got torch.int64"),
    ("p_lut_dtype", PL, CP, arg("full_to_swa_index_mapping", retype(I32)), ValueError,
     "kv-canary: lut_tensor must have dtype torch.int64, got torch.int32"),
    ("p_slots_dtype", P, CP, plan_field("verify_plan_out", "verify_slot_indices", retype(I32)), ValueError,
     "kv-canary: out_verify_slot_indices must have dtype torch.int64, got torch.int32"),
    ("p_seeds_dtype", P, CP, plan_field("write_plan_out", "write_seed_slot_indices", retype(I32)), ValueError,
     "kv-canary: out_write_seed_slot_indices must have dtype torch.int64, got torch.int32"),
    ("p_num_valid_dtype", P, CP, plan_field("verify_plan_out", "verify_num_valid", retype(I64)), ValueError,
     "kv-canary: out_verify_num_valid must have dtype torch.int32, got torch.int64"),
    ("p_enable_dtype", P, CP, plan_field("verify_plan_out", "enable", retype(I64)), ValueError,
     "kv-canary: out_verify_enable must have dtype torch.int32, got torch.int64"),
    ("p_num_valid_reqs_dtype", P, CP, plan_field("write_plan_out", "write_num_valid_reqs", retype(I64)), ValueError,
     "kv-canary: out_write_num_valid_reqs must have dtype torch.int32, got torch.int64"),
    # -- plan step 5: ranks and derived scalars
    ("p_req_to_token_rank", P, CP, arg("req_to_token", const(zeros(16, dtype=I32))), ValueError,
     "kv-canary: req_to_token must be 2-D, got shape (16,)"),
    ("p_req_pool_indices_rank", P, CP, arg("req_pool_indices", to_2d), ValueError,
     "kv-canary: req_pool_indices must be 1-D, got shape (1, 3)"),
    ("p_lut_rank", PL, CP, arg("full_to_swa_index_mapping", lambda t: t.reshape(2, 5)), ValueError,
     "kv-canary: lut_tensor must be 1-D, got shape (2, 5)"),
    ("p_write_offsets_len_positive", P, CP, plan_field("write_plan_out", "write_offsets", resize(0)), ValueError,
     "kv-canary: write_offsets_len must be positive, got 0"),
    ("p_req_to_token_stride0", P, CP, arg("req_to_token", const(zeros(16, dtype=I32).as_strided((1, 16), (0, 1)))),
     ValueError, "kv-canary: req_to_token_stride0 must be positive, got 0"),
    ("p_lut_len_positive", PL, CP, arg("full_to_swa_index_mapping", resize(0)), ValueError,
     "kv-canary: lut_len must be positive when has_swa_lut is True"),
    # -- plan step 5: lengths
    ("p_prefix_lens_len", P, CP, arg("prefix_lens", resize(2)), ValueError,
     "kv-canary: prefix_lens length must be 3, got 2"),
    ("p_extend_seq_lens_len", P, CP, arg("extend_seq_lens", resize(4)), ValueError,
     "kv-canary: extend_seq_lens length must be 3, got 4"),
    ("p_prev_len", P, CP, plan_field("verify_plan_out", "verify_prev_slot_indices", resize(7)), ValueError,
     "kv-canary: out_verify_prev_slot_indices length must be 8, got 7"),
    ("p_num_valid_len", P, CP, plan_field("verify_plan_out", "verify_num_valid", resize(2)), ValueError,
     "kv-canary: out_verify_num_valid length must be 1, got 2"),
    ("p_num_valid_reqs_len", P, CP, plan_field("write_plan_out", "write_num_valid_reqs", resize(0)), ValueError,
     "kv-canary: out_write_num_valid_reqs length must be 1, got 0"),
    ("p_write_offsets_vs_cap", P, CP, plan_field("write_plan_out", "write_offsets", resize(6)), ValueError,
     "kv-canary: write_offsets_len must equal write_req_capacity + 1, got 6 and 4"),
    ("p_bs_exceeds_cap", lambda: plan_args(bs=5), CP, lambda a: a, ValueError,
     "kv-canary: bs=5 exceeds write_req_capacity=4"),
    # -- plan step 5: devices
    ("p_device_prefix_lens", P, CP, arg("prefix_lens", meta), ValueError,
     "kv-canary: prefix_lens must be on out_verify_slot_indices's device cpu, got meta"),
    ("p_device_lut", PL, CP, arg("full_to_swa_index_mapping", meta), ValueError,
     "kv-canary: lut_tensor must be on out_verify_slot_indices's device cpu, got meta"),
    ("p_device_num_valid_reqs", P, CP, plan_field("write_plan_out", "write_num_valid_reqs", meta), ValueError,
     "kv-canary: out_write_num_valid_reqs must be on out_verify_slot_indices's device cpu, got meta"),
    # -- plan step 6: expected-token pool
    ("p_valid_lens_required", PP, CP, lambda a: dict(a, req_to_verify_expected_tokens_valid_lens=None), ValueError,
     "kv-canary: launch_plan_entries_kernel requires req_to_verify_expected_tokens_valid_lens when "
     "req_to_verify_expected_tokens is set"),
    ("p_nc_pool", PP, CP, arg("req_to_verify_expected_tokens", noncontig), ValueError,
     "kv-canary: req_to_verify_expected_tokens must be contiguous"),
    ("p_nc_valid_lens", PP, CP, arg("req_to_verify_expected_tokens_valid_lens", noncontig), ValueError,
     "kv-canary: req_to_verify_expected_tokens_valid_lens must be contiguous"),
    ("p_pool_dtype", PP, CP, arg("req_to_verify_expected_tokens", retype(I64)), ValueError,
     "kv-canary: req_to_verify_expected_tokens must have dtype torch.int32, got torch.int64"),
    ("p_pool_rank", PP, CP, arg("req_to_verify_expected_tokens", const(zeros(64, dtype=I32))), ValueError,
     "kv-canary: req_to_verify_expected_tokens must be 2-D, got shape (64,)"),
    ("p_valid_lens_dtype", PP, CP, arg("req_to_verify_expected_tokens_valid_lens", retype(I32)), ValueError,
     "kv-canary: req_to_verify_expected_tokens_valid_lens must have dtype torch.int64, got torch.int32"),
    ("p_valid_lens_len", PP, CP, arg("req_to_verify_expected_tokens_valid_lens", resize(2)), ValueError,
     "kv-canary: req_to_verify_expected_tokens_valid_lens length must be 3, got 2"),
    ("p_device_pool", PP, CP, arg("req_to_verify_expected_tokens", meta), ValueError,
     "kv-canary: req_to_verify_expected_tokens must be on out_verify_slot_indices's device cpu, got meta"),
    # -- scatter
    ("s_flat_in_rank", S, CS, arg("flat_in", to_2d), ValueError,
     "kv-canary: scatter_req_token_ids flat_in must be 1-D, got shape (1, 10)"),
    ("s_offsets_rank", S, CS, arg("offsets", to_2d), ValueError,
     "kv-canary: scatter_req_token_ids offsets must be 1-D, got shape (1, 4)"),
    ("s_req_pool_indices_rank", S, CS, arg("req_pool_indices", to_2d), ValueError,
     "kv-canary: scatter_req_token_ids req_pool_indices must be 1-D, got shape (1, 3)"),
    ("s_pool_out_rank", S, CS, arg("pool_out", const(zeros(64, dtype=I32))), ValueError,
     "kv-canary: scatter_req_token_ids pool_out must be 2-D, got shape (64,)"),
    ("s_flat_in_dtype", S, CS, arg("flat_in", retype(I32)), TypeError,
     "kv-canary: scatter_req_token_ids flat_in must be int64, got torch.int32"),
    ("s_offsets_dtype", S, CS, arg("offsets", retype(I32)), TypeError,
     "kv-canary: scatter_req_token_ids offsets must be int64, got torch.int32"),
    ("s_req_pool_indices_dtype", S, CS, arg("req_pool_indices", retype(I32)), TypeError,
     "kv-canary: scatter_req_token_ids req_pool_indices must be int64, got torch.int32"),
    ("s_pool_out_dtype", S, CS, arg("pool_out", retype(I64)), TypeError,
     "kv-canary: scatter_req_token_ids pool_out must be int32, got torch.int64"),
    ("s_offsets_len", S, CS, arg("offsets", resize(3)), ValueError,
     "kv-canary: scatter_req_token_ids offsets length 3 != bs+1 (4)"),
    ("s_nc_flat_in", S, CS, arg("flat_in", noncontig), ValueError,
     "kv-canary: scatter_req_token_ids flat_in must be contiguous"),
    ("s_nc_pool_out", S, CS, arg("pool_out", noncontig), ValueError,
     "kv-canary: scatter_req_token_ids pool_out must be contiguous"),
    ("s_device_flat_in", S, CS, arg("flat_in", meta), ValueError,
     "kv-canary: scatter_req_token_ids flat_in must be on scatter_req_token_ids pool_out's device cpu, got meta"),
    # -- precedence between rules
    ("order_count_before_presence", W, CW,
     lambda a: FIVE_SOURCES(dict(a, enable_write_input_assert=True, context=dataclasses.replace(
         a["context"], canary_buf=noncontig(a["context"].canary_buf)))), ValueError,
     "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"),
    ("order_presence_before_rest", W, CW,
     lambda a: ctx_field("canary_buf", noncontig)(dict(a, enable_write_input_assert=True)), ValueError,
     "kv-canary: expected input tensors are required when enable_write_input_assert=True"),
    ("order_step1_before_step4", P, CP, lambda a: dict(a, swa_window_size=1, verify_capacity=3), ValueError,
     "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0"),
    ("order_step4_before_step5", P, CP,
     lambda a: arg("prefix_lens", retype(I32))(dict(a, verify_capacity=3)), ValueError,
     "kv-canary: launch_canary_plan_kernels verify_capacity=3 does not match "
     "verify_plan_out.verify_slot_indices.shape[0]=8"),
    ("order_step5_before_step6", PP, CP,
     lambda a: arg("prefix_lens", resize(1))(dict(a, req_to_verify_expected_tokens_valid_lens=None)), ValueError,
     "kv-canary: prefix_lens length must be 3, got 1"),
    ("order_scatter_rank_before_dtype", S, CS, arg("flat_in", lambda t: to_2d(t).to(I32)), ValueError,
     "kv-canary: scatter_req_token_ids flat_in must be 1-D, got shape (1, 10)"),
]


# ===== Argument types (SPEC D9): a kv-canary TypeError where the contract's own check would have
# crashed; the "order_*" cases pin that contract messages keep their precedence.


def numpy(t: torch.Tensor):
    return t.numpy()


def as_list(t: torch.Tensor):
    return t.tolist()


def plan_of(plan_key, cls, capacity):
    return lambda a: dict(a, **{plan_key: cls.allocate(**{
        "verify_capacity" if cls is VerifyPlan else "write_req_capacity": capacity}, device="cpu")})


TYPE_CASES = [
    # -- write
    ("t_w_context_none", W, CW, arg("context", const(None)), TypeError,
     "kv-canary: context must be a VerifyOrWriteContext, got NoneType"),
    ("t_w_plan_is_verify_plan", W, CW, plan_of("plan", VerifyPlan, 2), TypeError,
     "kv-canary: plan must be a WritePlan, got tvm_canary.VerifyPlan"),
    ("t_w_order_presence_before_plan_type", W, CW,
     lambda a: plan_of("plan", VerifyPlan, 2)(dict(a, enable_write_input_assert=True)), ValueError,
     "kv-canary: expected input tensors are required when enable_write_input_assert=True"),
    ("t_w_input_ids_numpy", W, CW, arg("input_ids", numpy), TypeError,
     "kv-canary: input_ids must be a torch.Tensor, got numpy.ndarray"),
    ("t_w_positions_list", W, CW, arg("positions", as_list), TypeError,
     "kv-canary: positions must be a torch.Tensor, got list"),
    ("t_w_expected_tokens_numpy", WA, CW, arg("expected_input_tokens", numpy), TypeError,
     "kv-canary: expected_input_tokens must be a torch.Tensor, got numpy.ndarray"),
    ("t_w_ring_none", W, CW, ctx(violation_ring=None), TypeError,
     "kv-canary: violation_ring must be a torch.Tensor, got NoneType"),
    ("t_w_canary_buf_numpy", W, CW, ctx_field("canary_buf", numpy), TypeError,
     "kv-canary: canary_buf must be a torch.Tensor, got numpy.ndarray"),
    ("t_w_plan_field_list", W, CW, plan_field("plan", "write_offsets", as_list), TypeError,
     "kv-canary: plan.write_offsets must be a torch.Tensor, got list"),
    ("t_w_input_ids_nested", W, CW, arg("input_ids", lambda t: torch.nested.nested_tensor([t])), TypeError,
     "kv-canary: input_ids must be a dense (strided) tensor, got a nested tensor"),
    ("t_w_order_contiguity_before_later_type", W, CW,
     lambda a: arg("input_ids", numpy)(plan_field("plan", "write_offsets", noncontig)(a)), ValueError,
     "kv-canary: plan.write_offsets must be contiguous"),
    # -- verify
    ("t_v_chain_flag_sparse", V, CV, ctx_field("enable_chain_position_assert", lambda t: t.to_sparse()), TypeError,
     "kv-canary: context.enable_chain_position_assert must be a dense (strided) tensor, got a sparse_coo tensor"),
    ("t_v_context_dict", V, CV, arg("context", lambda c: {"canary_buf": c.canary_buf}), TypeError,
     "kv-canary: context must be a VerifyOrWriteContext, got dict"),
    ("t_v_plan_is_write_plan", V, CV, plan_of("plan", WritePlan, 4), TypeError,
     "kv-canary: plan must be a VerifyPlan, got tvm_canary.WritePlan"),
    ("t_v_order_source_count_before_plan_type", V, CV, lambda a: FIVE_SOURCES(plan_of("plan", WritePlan, 4)(a)),
     ValueError, "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"),
    ("t_v_plan_field_numpy", V, CV, plan_field("plan", "verify_slot_indices", numpy), TypeError,
     "kv-canary: plan.verify_slot_indices must be a torch.Tensor, got numpy.ndarray"),
    ("t_v_counter_none", V, CV, ctx(kernel_run_counter=None), TypeError,
     "kv-canary: kernel_run_counter must be a torch.Tensor, got NoneType"),
    # -- plan
    ("t_p_verify_plan_out_is_write_plan", P, CP, plan_of("verify_plan_out", WritePlan, 8), TypeError,
     "kv-canary: verify_plan_out must be a VerifyPlan, got tvm_canary.WritePlan"),
    ("t_p_order_step1_before_plan_type", P, CP,
     lambda a: plan_of("verify_plan_out", WritePlan, 8)(dict(a, swa_window_size=4)), ValueError,
     "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0"),
    ("t_p_write_plan_out_none", P, CP, arg("write_plan_out", const(None)), TypeError,
     "kv-canary: write_plan_out must be a WritePlan, got NoneType"),
    ("t_p_order_step4_before_write_plan_type", P, CP,
     lambda a: dict(a, write_plan_out=None, verify_capacity=3), ValueError,
     "kv-canary: launch_canary_plan_kernels verify_capacity=3 does not match "
     "verify_plan_out.verify_slot_indices.shape[0]=8"),
    ("t_p_slot_indices_list", P, CP, plan_field("verify_plan_out", "verify_slot_indices", as_list), TypeError,
     "kv-canary: out_verify_slot_indices must be a torch.Tensor, got list"),
    ("t_p_req_to_token_numpy", P, CP, arg("req_to_token", numpy), TypeError,
     "kv-canary: req_to_token must be a torch.Tensor, got numpy.ndarray"),
    ("t_p_req_to_token_sparse_csr", P, CP, arg("req_to_token", lambda t: t.to_sparse_csr()), TypeError,
     "kv-canary: req_to_token must be a dense (strided) tensor, got a sparse_csr tensor"),
    ("t_p_req_pool_indices_list", P, CP, arg("req_pool_indices", as_list), TypeError,
     "kv-canary: req_pool_indices must be a torch.Tensor, got list"),
    ("t_p_lut_numpy", PL, CP, arg("full_to_swa_index_mapping", numpy), TypeError,
     "kv-canary: lut_tensor must be a torch.Tensor, got numpy.ndarray"),
    ("t_p_pool_numpy", PP, CP, arg("req_to_verify_expected_tokens", numpy), TypeError,
     "kv-canary: req_to_verify_expected_tokens must be a torch.Tensor, got numpy.ndarray"),
    ("t_p_swa_window_none", P, CP, lambda a: dict(a, swa_window_size=None), TypeError,
     "kv-canary: swa_window_size must be an int, got NoneType"),
    ("t_p_swa_window_float", PL, CP, lambda a: dict(a, swa_window_size=4.0), TypeError,
     "kv-canary: swa_window_size must be an int, got float 4.0"),
    ("t_p_order_step1_before_swa_window_type", P, CP, lambda a: dict(a, swa_window_size=4.0), ValueError,
     "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0"),
    ("t_p_verify_capacity_float", P, CP, lambda a: dict(a, verify_capacity=8.0), TypeError,
     "kv-canary: verify_capacity must be an int, got float 8.0"),
    # Arrays have __index__ but no single truth value against an int.
    ("t_p_verify_capacity_tensor", P, CP, lambda a: dict(a, verify_capacity=torch.tensor([8, 8])), TypeError,
     "kv-canary: verify_capacity must be an int, got torch.Tensor"),
    ("t_p_swa_window_array", P, CP, lambda a: dict(a, swa_window_size=np.array([2, 2])), TypeError,
     "kv-canary: swa_window_size must be an int, got numpy.ndarray"),
    # An argument the launch ignores is still refused by the overlap check's look at its bytes.
    ("t_p_valid_lens_sparse_without_pool", P, CP,
     lambda a: dict(a, req_to_verify_expected_tokens=None,
                    req_to_verify_expected_tokens_valid_lens=torch.tensor([5], dtype=I64).to_sparse()), TypeError,
     "kv-canary: req_to_verify_expected_tokens_valid_lens must be a dense (strided) tensor, got a sparse_coo tensor"),
    # A string never equals the plan's length, so the contract's step 4 answers it.
    ("t_p_order_verify_capacity_str", P, CP, lambda a: dict(a, verify_capacity="8"), ValueError,
     "kv-canary: launch_canary_plan_kernels verify_capacity=8 does not match "
     "verify_plan_out.verify_slot_indices.shape[0]=8"),
    ("t_p_order_step5_before_capacity_type", P, CP,
     lambda a: arg("prefix_lens", retype(I32))(dict(a, verify_capacity=8.0)), ValueError,
     "kv-canary: prefix_lens must have dtype torch.int64, got torch.int32"),
    ("t_p_offset_str", P, CP, lambda a: dict(a, kv_token_id_vs_position_offset="1"), TypeError,
     "kv-canary: kv_token_id_vs_position_offset must be an int, got str"),
    # -- scatter: ranks (ValueError), then dtypes (TypeError), as in the contract
    ("t_s_flat_in_numpy", S, CS, arg("flat_in", numpy), TypeError,
     "kv-canary: scatter_req_token_ids flat_in must be a torch.Tensor, got numpy.ndarray"),
    ("t_s_offsets_list", S, CS, arg("offsets", as_list), TypeError,
     "kv-canary: scatter_req_token_ids offsets must be a torch.Tensor, got list"),
    ("t_s_flat_in_nested", S, CS, arg("flat_in", lambda t: torch.nested.nested_tensor([t, t[:1]])), TypeError,
     "kv-canary: scatter_req_token_ids flat_in must be a dense (strided) tensor, got a nested tensor"),
    ("t_s_pool_out_sparse_csr", S, CS, arg("pool_out", lambda t: t.to_sparse_csr()), TypeError,
     "kv-canary: scatter_req_token_ids pool_out must be a dense (strided) tensor, got a sparse_csr tensor"),
    ("t_s_order_rank_before_type", S, CS, arg("pool_out", lambda t: t.reshape(-1).numpy()), ValueError,
     "kv-canary: scatter_req_token_ids pool_out must be 2-D, got shape (64,)"),
]


@pytest.mark.parametrize(
    "base, check, mutate, error, message",
    [c[1:] for c in LAUNCH_CASES + TYPE_CASES],
    ids=[c[0] for c in LAUNCH_CASES + TYPE_CASES],
)
def test_launch_errors(base, check, mutate, error, message):
    args = mutate(base())
    with pytest.raises(error, match=re.escape(message)) as info:
        check(**args)
    assert str(info.value) == message
    assert type(info.value) is error


_KERNEL_OF_CHECK = {checks.check_write: "write", checks.check_verify: "verify", checks.check_plan: "plan",
                    checks.check_scatter: "scatter"}


@pytest.mark.parametrize(
    "base, check, mutate, error, message", [c[1:] for c in LAUNCH_CASES], ids=[c[0] for c in LAUNCH_CASES])
def test_operators_run_the_launch_checks(base, check, mutate, error, message):
    """Called directly, each operator raises what the public launch raises on the same arguments, before anything runs.
    Two refusals come earlier, still before anything runs: an empty one-element state gets the operator's message
    (``ops._refuse_empty_state``: why, under torch.compile), an int past int64 the schema's. Meta cases skipped (the
    fake runs nothing)."""
    from tvm_canary import ops
    from tvm_canary.cases import tensors

    args = mutate(base())
    if any(t.device.type == "meta" for t in tensors(args)):
        pytest.skip("a meta tensor dispatches to the fake implementation: nothing runs")
    kernel = _KERNEL_OF_CHECK[check]
    before = [t.clone() for t in tensors(args)]
    with pytest.raises(Exception) as info:
        getattr(torch.ops.tvm_canary, kernel)(*ops.ARGS[kernel](**args))
    got = str(info.value)
    one_element = re.match(r"kv-canary: (\w+) reached the operator with 0 elements, not 1", got)
    past_int64 = got.startswith(f"tvm_canary::{kernel}() Expected a value of type 'int'") and "int64" in message
    if one_element:
        assert re.match(rf"kv-canary: (plan\.|out_)?{one_element[1]} length must be 1, got 0", message), got
    elif not past_int64:
        assert (type(info.value), got) == (error, message)
    assert all(torch.equal(t, b) for t, b in zip(tensors(args), before))


def test_launch_functions_raise_type_errors_before_any_backend():
    """The public launch functions run the same checks (a bad argument dispatches nothing)."""
    import tvm_canary as tc

    with pytest.raises(TypeError, match=re.escape("kv-canary: plan must be a WritePlan, got NoneType")):
        tc.launch_canary_write_kernel(**dict(write_args(), plan=None))
    with pytest.raises(
        TypeError, match=re.escape("kv-canary: scatter_req_token_ids flat_in must be a torch.Tensor, got list")
    ):
        tc.launch_scatter_req_token_ids_kernel(**dict(scatter_args(), flat_in=[1, 2, 3]))


def _context_fields(**overrides) -> dict:
    fields = dict(
        canary_buf=zeros(8, 32, dtype=U8), kernel_kind=CanaryLaunchTag.TAIL_K_FULL, violation_ring=zeros(4, 8),
        violation_write_index=zeros(1, dtype=I32), slot_run_counter=zeros(1), kernel_run_counter=zeros(1),
        real_kv_sources=(), real_kv_hash_mode=RealKvHashMode.NONE, enable_chain_position_assert=zeros(1, dtype=I32),
    )
    return dict(fields, **overrides)


TYPE_CONSTRUCTION_CASES = [
    ("t_write_plan_tensor", lambda: WritePlan.allocate(write_req_capacity=torch.tensor([4, 4]), device="cpu"),
     TypeError, "kv-canary: WritePlan write_req_capacity must be an int, got torch.Tensor"),
    ("t_source_page_size_array", lambda: RealKvSource(tensor=zeros(8, 32, dtype=U8), page_size=np.array([1, 1]),
                                                      num_bytes_per_token=32, read_bytes=16), TypeError,
     "kv-canary: RealKvSource.page_size must be an int, got numpy.ndarray"),
    # -- plan capacities: the contract's "must be positive" first, then the type
    ("t_verify_plan_str", lambda: VerifyPlan.allocate(verify_capacity="8", device="cpu"), TypeError,
     "kv-canary: VerifyPlan verify_capacity must be an int, got str"),
    ("t_verify_plan_none", lambda: VerifyPlan.allocate(verify_capacity=None, device="cpu"), TypeError,
     "kv-canary: VerifyPlan verify_capacity must be an int, got NoneType"),
    ("t_verify_plan_float", lambda: VerifyPlan.allocate(verify_capacity=2.5, device="cpu"), TypeError,
     "kv-canary: VerifyPlan verify_capacity must be an int, got float 2.5"),
    ("t_verify_plan_order_float_zero", lambda: VerifyPlan.allocate(verify_capacity=0.0, device="cpu"), ValueError,
     "kv-canary: VerifyPlan verify_capacity must be positive, got 0.0"),
    ("t_write_plan_str", lambda: WritePlan.allocate(write_req_capacity="4", device="cpu"), TypeError,
     "kv-canary: WritePlan write_req_capacity must be an int, got str"),
    ("t_write_plan_float", lambda: WritePlan.allocate(write_req_capacity=4.0, device="cpu"), TypeError,
     "kv-canary: WritePlan write_req_capacity must be an int, got float 4.0"),
    ("t_write_plan_order_negative_float", lambda: WritePlan.allocate(write_req_capacity=-1.5, device="cpu"),
     ValueError, "kv-canary: WritePlan write_req_capacity must be positive, got -1.5"),
    # -- RealKvSource
    ("t_source_page_size_str", lambda: source(page_size="1"), TypeError,
     "kv-canary: RealKvSource.page_size must be an int, got str"),
    ("t_source_order_page_size_range", lambda: source(page_size=0.5), ValueError,
     "kv-canary: RealKvSource.page_size must be >= 1, got 0.5"),
    ("t_source_page_size_float", lambda: source(page_size=1.0), TypeError,
     "kv-canary: RealKvSource.page_size must be an int, got float 1.0"),
    ("t_source_read_bytes_none", lambda: source(read_bytes=None), TypeError,
     "kv-canary: RealKvSource.read_bytes must be an int, got NoneType"),
    ("t_source_tensor_numpy", lambda: source(np.zeros((8, 32), dtype=np.uint8)), TypeError,
     "kv-canary: RealKvSource.tensor must be a torch.Tensor, got numpy.ndarray"),
    # -- VerifyOrWriteContext: launch tag (any int64 is stamped as it is), hash mode and sources
    ("t_context_kind_float", lambda: VerifyOrWriteContext(**_context_fields(kernel_kind=2.5)), TypeError,
     "kv-canary: kernel_kind must be an int, got float 2.5"),
    ("t_context_kind_none", lambda: VerifyOrWriteContext(**_context_fields(kernel_kind=None)), TypeError,
     "kv-canary: kernel_kind must be an int, got NoneType"),
    ("t_context_kind_past_int64", lambda: VerifyOrWriteContext(**_context_fields(kernel_kind=2**63)), ValueError,
     "kv-canary: kernel_kind must fit in int64, got 9223372036854775808"),
    ("t_context_mode_7", lambda: VerifyOrWriteContext(**_context_fields(real_kv_hash_mode=7)), ValueError,
     "kv-canary: real_kv_hash_mode must be one of NONE (0), PARTIAL (1) or ALL (2), got 7"),
    ("t_context_mode_str", lambda: VerifyOrWriteContext(**_context_fields(real_kv_hash_mode="ALL")), TypeError,
     "kv-canary: real_kv_hash_mode must be a RealKvHashMode, got str"),
    ("t_context_all_without_sources",
     lambda: VerifyOrWriteContext(**_context_fields(real_kv_hash_mode=RealKvHashMode.ALL)), ValueError,
     "kv-canary: real_kv_hash_mode=ALL hashes every byte of the real-KV sources but real_kv_sources is empty; "
     "use RealKvHashMode.NONE for a context without sources"),
    ("t_context_sources_none", lambda: VerifyOrWriteContext(**_context_fields(real_kv_sources=None)), TypeError,
     "kv-canary: real_kv_sources must be a tuple of RealKvSource, got NoneType"),
    ("t_context_source_is_tensor",
     lambda: VerifyOrWriteContext(**_context_fields(real_kv_sources=(zeros(8, 32, dtype=U8),))), TypeError,
     "kv-canary: real_kv_sources[0] must be a RealKvSource, got torch.Tensor"),
]


@pytest.mark.parametrize(
    "build, error, message", [c[1:] for c in TYPE_CONSTRUCTION_CASES], ids=[c[0] for c in TYPE_CONSTRUCTION_CASES]
)
def test_construction_type_errors(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert type(info.value) is error
    assert str(info.value) == message


def test_integer_like_values_are_accepted():
    """numpy ints and the int-valued IntEnum modes pass (anything with ``__index__``)."""
    assert VerifyPlan.allocate(verify_capacity=np.int64(3), device="cpu").verify_slot_indices.shape == (3,)
    assert WritePlan.allocate(write_req_capacity=np.int32(2), device="cpu").write_offsets.shape == (3,)
    src = RealKvSource(tensor=zeros(8, 32, dtype=U8), page_size=np.int64(1), num_bytes_per_token=32, read_bytes=16)
    VerifyOrWriteContext(**_context_fields(real_kv_sources=(src,), real_kv_hash_mode=2))


def test_case_ids_are_unique():
    ids = [c[0] for c in LAUNCH_CASES + CONSTRUCTION_CASES + TYPE_CASES + TYPE_CONSTRUCTION_CASES]
    assert len(ids) == len(set(ids))


# Messages no public argument reaches (the value is a length or a checked equality), defensive checks as
# in the original validator; their format pinned here.
@pytest.mark.parametrize(
    "helper, value, what, message",
    [
        (checks.refuse_negative, -1, "offsets kernel bs",
         "kv-canary: offsets kernel bs must be non-negative, got -1"),
        (checks.refuse_negative, -2, "write_req_capacity",
         "kv-canary: write_req_capacity must be non-negative, got -2"),
        (checks.refuse_negative, -3, "verify_capacity",
         "kv-canary: verify_capacity must be non-negative, got -3"),
        (checks.refuse_negative, -4, "lut_len", "kv-canary: lut_len must be non-negative, got -4"),
    ],
    ids=["bs", "write_req_capacity", "verify_capacity", "lut_len"],
)
def test_defensive_scalar_messages(helper, value, what, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        helper(value, what)


# ===== Valid arguments pass.


def _strided_source() -> RealKvSource:
    # SPEC D5: a view whose rows are stride(0) elements apart, innermost stride 1.
    view = zeros(8, 64, dtype=U8)[:, :32]
    assert not view.is_contiguous()
    return source(view)


VALID_CASES = [
    ("write", W, CW, lambda a: a),
    ("write_asserting", WA, CW, lambda a: a),
    ("write_no_sources", W, CW, ctx(real_kv_sources=(), real_kv_hash_mode=RealKvHashMode.NONE)),
    ("write_source_list", W, CW, ctx(real_kv_sources=[source()])),
    ("plan_numpy_int_scalars", P, CP,
     lambda a: dict(a, verify_capacity=np.int64(PLAN_VERIFY_CAP), kv_token_id_vs_position_offset=np.int32(1))),
    ("write_four_sources", W, CW, sources(*(source() for _ in range(4)))),
    ("write_strided_source", W, CW, sources(_strided_source())),
    ("write_wide_slots", W, CW, ctx(canary_buf=zeros(8, 48, dtype=U8))),
    ("write_float_source", W, CW, sources(source(zeros(8, 16, dtype=torch.bfloat16), page_size=1, nbpt=32))),
    ("write_paged_source", W, CW, sources(source(zeros(4, 128, dtype=U8), page_size=4, nbpt=32, read_bytes=16))),
    ("write_zero_tokens", W, CW, lambda a: dict(a, input_ids=zeros(0), positions=zeros(0), out_cache_loc=zeros(0))),
    ("verify", V, CV, lambda a: a),
    ("verify_no_check", V, CV, lambda a: dict(a, check_verify_expected_token=False)),
    ("verify_ignores_chain_flag", V, CV, ctx(enable_chain_position_assert=zeros(3))),
    ("verify_strided_source", V, CV, sources(_strided_source(), source())),
    ("plan", P, CP, lambda a: a),
    ("plan_with_pool", PP, CP, lambda a: a),
    ("plan_with_lut", PL, CP, lambda a: a),
    ("plan_lut_without_window", P, CP, lambda a: dict(a, full_to_swa_index_mapping=zeros(1))),
    ("plan_valid_lens_without_pool", P, CP, lambda a: dict(a, req_to_verify_expected_tokens_valid_lens=zeros(99, 2))),
    ("plan_bs_equals_cap", lambda: plan_args(bs=4), CP, lambda a: a),
    ("plan_bs_above_4096", lambda: plan_args(bs=5000, write_cap=5000), CP, lambda a: a),
    ("plan_bs_zero", lambda: plan_args(bs=0), CP, lambda a: a),
    ("plan_draft_offset", P, CP, lambda a: dict(a, kv_token_id_vs_position_offset=1)),
    ("plan_int64_ends", PL, CP, lambda a: dict(a, swa_window_size=2**63 - 1, kv_token_id_vs_position_offset=-(2**63))),
    ("scatter", S, CS, lambda a: a),
    ("scatter_empty", S, CS, lambda a: dict(a, offsets=zeros(1), req_pool_indices=zeros(0), flat_in=zeros(0))),
]


@pytest.mark.parametrize("base, check, mutate", [c[1:] for c in VALID_CASES], ids=[c[0] for c in VALID_CASES])
def test_valid_arguments_pass(base, check, mutate):
    assert check(**mutate(base())) is None


def test_check_real_kv_sources_valid():
    assert checks.check_real_kv_sources(make_context(real_kv_sources=(_strided_source(), source()))) is None


def test_checks_are_keyword_only():
    with pytest.raises(TypeError):
        checks.check_scatter(*scatter_args().values())  # type: ignore[misc]


def test_written_ranges_find_every_overlap():
    """``WrittenRanges.overlap`` (bisect over sorted ranges and their running reach) agrees with pairwise
    comparison on random ranges that nest, touch and repeat."""
    gen = np.random.default_rng(0)
    for _ in range(200):
        starts = gen.integers(0, 100, size=gen.integers(0, 8))
        ranges = [(int(s), int(s + gen.integers(1, 30)), f"r{i}") for i, s in enumerate(starts)]
        written = checks.WrittenRanges.of(ranges)
        for _ in range(20):
            start = int(gen.integers(0, 130))
            end = start + int(gen.integers(1, 20))
            want = any(start < e and s < end for s, e, _ in ranges)
            assert written.overlap(start, end) == want, (ranges, start, end)
