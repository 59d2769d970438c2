"""The torch operators (``torch.ops.tvm_canary.*``): schema, fake tensors, AOT dispatch, results.

``torch.library.opcheck`` runs each operator on real cases (the differential fuzz's builders): the schema's mutable
arguments are exactly those changed, the fake implementation matches, AOT-dispatch tracing gives the eager result;
outputs match the torch reference byte for byte too.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch

import tvm_canary as tc
from tvm_canary import ops
from tvm_canary.cases import LAUNCH
from tvm_canary.reference import REFERENCE
from tvm_canary.runtime import use_backend

from cases import CASES
from tree import assert_same_bytes, devices, require, tensors

SEEDS = (1, 2)


def op_args(kernel: str, launch_kwargs: dict) -> tuple:
    return getattr(ops, f"{kernel}_args")(**launch_kwargs)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kernel", list(CASES))
def test_opcheck_and_reference_bytes(kernel, device):
    require(device)
    op = getattr(torch.ops.tvm_canary, kernel).default
    for seed in SEEDS:
        got = CASES[kernel](torch.Generator().manual_seed(seed), device)
        with use_backend("tvm"):
            torch.library.opcheck(op, op_args(kernel, got))  # runs on copies: ``got`` is unchanged
            op(*op_args(kernel, got))
        want = CASES[kernel](torch.Generator().manual_seed(seed), "cpu")
        REFERENCE[kernel](**want)
        assert_same_bytes(tensors(got), tensors(want))


@pytest.mark.parametrize("kernel", list(CASES))
def test_fake_implementation_accepts_meta_tensors(kernel):
    """Each operator's fake (Meta) implementation accepts meta tensors, returning None (without one the
    dispatcher raises here)."""
    case = CASES[kernel](torch.Generator().manual_seed(0), "cpu")
    def meta(a):
        if isinstance(a, torch.Tensor):
            return a.to("meta")
        return [meta(x) for x in a] if isinstance(a, list) else a

    args = [meta(a) for a in op_args(kernel, case)]
    assert getattr(torch.ops.tvm_canary, kernel)(*args) is None


# The launch argument (or "plan.field") the test below moves to meta.
_ON_META = {"write": "input_ids", "verify": "plan.enable", "plan": "prefix_lens", "scatter": "offsets"}


@pytest.mark.parametrize("kernel", list(CASES))
def test_a_direct_call_with_one_meta_tensor_raises_the_launchs_error(kernel):
    """One meta tensor among CPU ones sends a call to the fake implementation: it raised nothing, did nothing."""
    case = CASES[kernel](torch.Generator().manual_seed(0), "cpu")
    key, _, field = _ON_META[kernel].partition(".")
    case[key] = (dataclasses.replace(case[key], **{field: getattr(case[key], field).to("meta")}) if field
                 else case[key].to("meta"))
    with pytest.raises(ValueError) as launched:
        LAUNCH[kernel](**case)
    assert str(launched.value).startswith("kv-canary: ") and "device" in str(launched.value)
    with pytest.raises(ValueError, match=f"^{re.escape(str(launched.value))}$"):
        getattr(torch.ops.tvm_canary, kernel)(*op_args(kernel, case))


VIEW_BITS = {"conj": torch.conj, "neg": torch._neg_view}
VIEW_BITS_ERROR = "^kv-canary: RealKvSource.tensor must not be a conjugate or negative view"


@pytest.mark.parametrize("view", list(VIEW_BITS))
@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_a_direct_call_refuses_a_conjugate_or_negative_source(kernel, view):
    """As the launch does (torch's fallback gave the operator a resolved copy)."""
    args = list(op_args(kernel, CASES[kernel](torch.Generator().manual_seed(0), "cpu")))
    args[7] = [VIEW_BITS[view](t.view(torch.complex64)) for t in args[7]]
    with pytest.raises(ValueError, match=VIEW_BITS_ERROR):
        getattr(torch.ops.tvm_canary, kernel)(*args)


@pytest.mark.parametrize("kernel", list(CASES))
def test_operator_arguments_take_the_launch_keywords(kernel):
    launch = getattr(tc, {"plan": "launch_canary_plan_kernels", "scatter": "launch_scatter_req_token_ids_kernel"}.get(
        kernel, f"launch_canary_{kernel}_kernel"))
    assert list(inspect.signature(ops.ARGS[kernel]).parameters) == list(inspect.signature(launch).parameters)


def test_schema_declares_what_each_kernel_writes():
    mutable = {
        k: {a.name for a in getattr(torch.ops.tvm_canary, k).default._schema.arguments if a.is_write}
        for k in REFERENCE
    }
    context = {"violation_ring", "violation_write_index", "slot_run_counter", "kernel_run_counter"}
    assert mutable == {
        "write": context | {"canary_buf"},
        "verify": context,
        "plan": {"verify_slot_indices", "verify_expected_tokens", "verify_expected_positions",
                 "verify_prev_slot_indices", "verify_num_valid", "enable", "write_offsets",
                 "write_seed_slot_indices", "write_num_valid_reqs"},
        "scatter": {"pool_out"},
    }


@pytest.mark.parametrize("kernel", ["verify", "write", "plan", "scatter"])
def test_public_launch_under_a_dispatch_mode_goes_through_the_operator(kernel, recwarn):
    """Under FakeTensorMode the launch records the operator (its fake runs), not calling the kernel (which cannot take
    fake tensors); its checks read no data pointer (a fake has none: torch warned reading one is deprecated)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fake(obj, mode):
        if isinstance(obj, torch.Tensor):
            return mode.from_tensor(obj)
        if dataclasses.is_dataclass(obj):
            fields = dataclasses.fields(obj)
            return dataclasses.replace(obj, **{f.name: fake(getattr(obj, f.name), mode) for f in fields})
        return tuple(fake(x, mode) for x in obj) if isinstance(obj, tuple) else obj

    case = CASES[kernel](torch.Generator().manual_seed(0), "cpu")
    with FakeTensorMode() as mode:
        LAUNCH[kernel](**{k: fake(v, mode) for k, v in case.items()})
    assert not [w for w in recwarn if "data pointer" in str(w.message)], [str(w.message) for w in recwarn]


def test_an_unknown_launch_tag_is_stamped_as_it_is_through_the_operator():
    """A context takes any int64 as its kernel_kind; the operator path (torch.compile, dispatch modes)
    stamps it as the eager launch does."""
    got = CASES["verify"](torch.Generator().manual_seed(3), "cpu")
    want = CASES["verify"](torch.Generator().manual_seed(3), "cpu")
    for case in (got, want):
        case["context"] = dataclasses.replace(case["context"], kernel_kind=99)
    with use_backend("tvm"):
        torch.ops.tvm_canary.verify(*op_args("verify", got))
        tc.launch_canary_verify_kernel(**want)
    assert 99 in got["context"].violation_ring[:, 0].tolist()
    assert_same_bytes(tensors(got), tensors(want))
