"""Eager replays (tvm_canary.eager): once a launch is memoised, changing its context's or plan's tensors in
place (resize_, set_, as_strided_, .data =) makes the next launch check and pack again, raising what the
checks raise, using the tensors as they now are. Correctness only, no timing."""

from __future__ import annotations

import gc
import re

import pytest
import torch
from test_checks import LAUNCH_CASES, TYPE_CASES, verify_args

import tvm_canary as tc
from tvm_canary import checks, eager
from tvm_canary.cases import CASES, LAUNCH, REFERENCE

from tree import assert_same_bytes, tensors


def _memoised(kernel: str, args: dict) -> eager._Packed:
    flag = args["check_verify_expected_token" if kernel == "verify" else "enable_write_input_assert"]
    return eager._memo[kernel, id(args["context"]), id(args["plan"]), flag]


def _roll(t: torch.Tensor) -> torch.Tensor:
    """Other bytes, new storage, same shape."""
    return t.roll(1, 0).contiguous()


def _restride_sources(args: dict) -> None:
    """Each real-KV source whose rows lie apart (a column slice of a wider tensor) gets rows 16 bytes closer,
    in place: the same data pointer, shape and dtype, other bytes read."""
    for source in args["context"].real_kv_sources:
        t = source.tensor
        closer = t.stride(0) - 16 // t.element_size()
        if closer >= t.shape[1]:
            t.as_strided_(t.shape, (closer, 1))


CHANGES = {
    "canary_buf set_": lambda a: a["context"].canary_buf.set_(_roll(a["context"].canary_buf)),
    "sources as_strided_": _restride_sources,
    "canary_buf .data": lambda a: setattr(a["context"].canary_buf, "data", _roll(a["context"].canary_buf)),
    "first plan tensor set_": lambda a: (lambda t: t.set_(_roll(t)))(next(iter(tensors(dict(plan=a["plan"]))))),
    "ring .data": lambda a: setattr(a["context"].violation_ring, "data", a["context"].violation_ring.clone()),
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_a_replay_follows_tensors_replaced_in_place(kernel, change):
    # Rolling write's offsets gives each request the next one's entries: an entry storing its request's
    # seed slot would store another request's, outside the contract (SPEC D7).
    options = {"own_seeds": 0} if kernel == "write" else {}
    changed = 0  # cases whose tensors the change moved, re-strided or replaced (some cases have no sources)
    for seed in range(4):
        got = CASES[kernel](torch.Generator().manual_seed(seed), "cpu", **options)
        want = CASES[kernel](torch.Generator().manual_seed(seed), "cpu", **options)
        LAUNCH[kernel](**got)
        REFERENCE[kernel](**want)
        if seed == 0:
            assert _memoised(kernel, got)  # the second launch replays or repacks a memoised one
        for case in (got, want):  # the first may fill the ring: the second's rows must land too
            case["context"].violation_write_index.zero_()
        before = _layouts(got)
        CHANGES[change](got)
        CHANGES[change](want)
        changed += _layouts(got) != before
        LAUNCH[kernel](**got)
        REFERENCE[kernel](**want)
        assert_same_bytes(tensors(got), tensors(want))
    assert changed


def _layouts(args: dict) -> list:
    return [(t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors(args)]


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros(t.shape[0], t.shape[1] + 8, dtype=t.dtype)
    return wide[:, 1 : 1 + t.shape[1]]


def _shifted_by_4_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous uint8 tensor like ``t``, data 4 bytes past alignment."""
    return torch.zeros(t.numel() + 4, dtype=t.dtype)[4:].view(t.shape)


IN_PLACE = {
    "resize_": lambda a: a["plan"].verify_expected_tokens.resize_(3),
    "as_strided_": lambda a: a["context"].canary_buf.as_strided_((8, 16), (32, 2)),
    "set_ misaligned": lambda a: a["context"].real_kv_sources[0].tensor.set_(_misaligned(
        a["context"].real_kv_sources[0].tensor)),
    "set_ misaligned canary_buf": lambda a: a["context"].canary_buf.set_(_shifted_by_4_bytes(a["context"].canary_buf)),
    ".data dtype": lambda a: setattr(a["context"].violation_ring, "data",
                                     a["context"].violation_ring.view(torch.float64)),
    ".data shorter": lambda a: setattr(a["plan"].enable, "data", a["plan"].enable.new_zeros(2)[:2]),
    "unsqueeze_": lambda a: a["context"].slot_run_counter.unsqueeze_(0),
}


@pytest.mark.parametrize("change", list(IN_PLACE))
def test_a_tensor_changed_in_place_is_checked_again(change):
    args = verify_args()
    tc.launch_canary_verify_kernel(**args)
    tc.launch_canary_verify_kernel(**args)  # a replay
    IN_PLACE[change](args)
    with pytest.raises(ValueError) as want:
        checks.check_verify(**args)
    with pytest.raises(ValueError) as got:
        tc.launch_canary_verify_kernel(**args)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize(
    "base, check, mutate, error, message",
    [c[1:] for c in LAUNCH_CASES + TYPE_CASES if c[2] in (checks.check_write, checks.check_verify)],
    ids=[c[0] for c in LAUNCH_CASES + TYPE_CASES if c[2] in (checks.check_write, checks.check_verify)],
)
def test_launch_errors_after_a_memoised_launch(base, check, mutate, error, message):
    """Each write/verify case of test_checks via the public launch, after a clean launch of the base
    arguments: cases changing only write's per-step tensors replay the memoised context and plan
    (``checks.check_write_inputs``), failing as ``check_write`` does."""
    args = base()
    launch = tc.launch_canary_write_kernel if check is checks.check_write else tc.launch_canary_verify_kernel
    launch(**args)
    with pytest.raises(error) as info:
        launch(**mutate(args))
    assert str(info.value) == message, re.escape(message)
    assert type(info.value) is error


def test_a_source_given_the_conjugate_bit_in_place_is_refused_again():
    """``.data =`` sets the bit at the same address, shape, strides and dtype: SPEC 4 refuses it at every launch."""
    import dataclasses

    from tvm_canary.cases import clean_context

    kv = torch.randn(16, 8, dtype=torch.complex64)
    ctx = dataclasses.replace(clean_context(16, "cpu"), real_kv_hash_mode=tc.consts.RealKvHashMode.ALL,
                              real_kv_sources=(tc.RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=64,
                                                                read_bytes=64),))
    plan = tc.VerifyPlan.allocate(verify_capacity=4, device="cpu").zero_for_testing_()
    for _ in range(2):  # the second a replay
        tc.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
    kv.data = kv.conj()
    with pytest.raises(ValueError, match="kv-canary: RealKvSource.tensor must not be a conjugate or negative view"):
        tc.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)


def test_entries_are_forgotten_with_their_context():
    args = verify_args()
    tc.launch_canary_verify_kernel(**args)
    key = ("verify", id(args["context"]), id(args["plan"]), True)
    assert key in eager._memo
    del args
    gc.collect()
    assert key not in eager._memo


def test_flags_that_are_not_bools_are_not_memoised():
    args = dict(verify_args(), check_verify_expected_token=1)
    before = len(eager._memo)
    tc.launch_canary_verify_kernel(**args)
    assert len(eager._memo) == before


def test_a_memoised_write_takes_the_geometry_of_each_launchs_token_count(monkeypatch):
    """Write's geometry follows its plan's request capacity and the launch's tokens per request
    (``packing.write_point``); a memoised plan's replay at another token count looks up that count's
    kernel as an unmemoised launch does, kept for the count's next launch."""
    from tvm_canary.cases import write_case
    from tvm_canary.runtime import packing

    looked_up, checked = [], []
    original, check = eager.get_kernel, checks.check_write
    monkeypatch.setattr(eager, "get_kernel", lambda *a: looked_up.append(a[3]) or original(*a))
    monkeypatch.setattr(checks, "check_write", lambda **kw: checked.append(1) or check(**kw))
    args = write_case(torch.Generator().manual_seed(6), "cpu")  # input assert on
    cap, tokens = args["plan"].write_seed_slot_indices.shape[0], args["input_ids"].shape[0]
    assert packing.write_point(cap, tokens) != packing.write_point(cap, 2 * tokens)
    tc.launch_canary_write_kernel(**args)
    assert ("write", id(args["context"]), id(args["plan"]), args["enable_write_input_assert"]) in eager._memo
    longer = {k: torch.cat([args[k], args[k]]) if k in ("input_ids", "positions", "out_cache_loc") else v
              for k, v in args.items()}
    if longer["enable_write_input_assert"]:
        longer["expected_input_tokens"], longer["expected_input_positions"] = longer["input_ids"], longer["positions"]
    tc.launch_canary_write_kernel(**longer)
    tc.launch_canary_write_kernel(**longer)  # the same count again: the kept function, no lookup
    assert looked_up == [packing.write_point(cap, tokens), packing.write_point(cap, 2 * tokens)]
    assert len(checked) == 1  # later launches replayed the memoised one
