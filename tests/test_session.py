"""CanarySession (SPEC 6) and violation decoding, on CPU tensors with the default backend."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import tvm_canary as tc
from tvm_canary.consts import FailReason, RealKvHashMode
from tvm_canary.context import CanaryLaunchTag as Tag
from tvm_canary.context import RealKvSource
from tvm_canary.plans import plan_tensors
from tvm_canary.runtime import use_backend
from tvm_canary.session import CanaryGroup, CanarySession
from tvm_canary.testing import KvPool
from tvm_canary.violations import Violation, ViolationReport

NUM_SLOTS = 64
ROWS = (1, 2)
MAX_LEN = 16
TABLE = torch.tensor([[0] * MAX_LEN] + [[1 + MAX_LEN * (r - 1) + p for p in range(MAX_LEN)] for r in ROWS],
                     dtype=torch.int32)


def slot(row: int, pos: int) -> int:
    return int(TABLE[row, pos])


def token(row: int, pos: int) -> int:
    return 100 * row + pos


def make_session(swa_lut: torch.Tensor | None = None, **kw) -> tuple[CanarySession, KvPool]:
    """Session over a random K/V pool (2 sources per half); ``swa_lut`` adds an SWA group of window 2
    (``2 * NUM_SLOTS`` slots, no real-KV sources)."""
    kv = KvPool.paged(NUM_SLOTS, gen=torch.Generator().manual_seed(0), device="cpu")
    swa = None
    if swa_lut is not None:
        swa = CanaryGroup(num_slots=2 * NUM_SLOTS, swa_window_size=2, full_to_swa_index_mapping=swa_lut)
    args = dict(
        full=CanaryGroup(num_slots=NUM_SLOTS, k_sources=kv.sources("K"), v_sources=kv.sources("V")),
        swa=swa, device="cpu", write_req_capacity=2, write_entry_capacity=16, violation_mode="quiet",
    )
    args.update(kw)
    return CanarySession(**args), kv


def step_inputs(session: CanarySession, prefix: int, extend: int, *, reported: list[int] | None = None,
                **extra) -> dict:
    """``before_forward``'s arguments: both rows write positions [prefix, prefix + extend); ``reported``
    overrides the prefix lengths; expected tokens passed if the session has a pool."""
    span = [(r, p) for r in ROWS for p in range(prefix, prefix + extend)]
    if session.expected_token_pool is not None:
        extra.update(token_ids=[token(r, p) for r in ROWS for p in range(prefix + extend)],
                     token_lens=[prefix + extend] * len(ROWS))
    return dict(
        req_pool_indices=list(ROWS), prefix_lens=reported or [prefix] * len(ROWS),
        extend_seq_lens=[extend] * len(ROWS), input_ids=[token(r, p) for r, p in span],
        positions=[p for _, p in span], out_cache_loc=[slot(r, p) for r, p in span], req_to_token=TABLE, **extra,
    )


def step(session: CanarySession, kv: KvPool, prefix: int, extend: int, **kw) -> None:
    """One step of ``step_inputs(session, prefix, extend, **kw)``; the model writes the KV of its slots."""
    inputs = step_inputs(session, prefix, extend, **kw)
    session.before_forward(**inputs)
    kv.write(inputs["out_cache_loc"])
    session.after_forward()


def chain(row: int, length: int) -> list[tuple[int, int, int]]:
    return [(slot(row, p), p, slot(row, p - 1) if p else -1) for p in range(length)]


def poke(session: CanarySession, endpoint: str, half: str, s: int, field: int, delta: int, group="FULL") -> None:
    session.canary_buffer(endpoint, half, group).view(torch.int64)[s, field] += delta


# -- counters, groups, capacities


@pytest.mark.parametrize("enable_v", [True, False])
def test_clean_steps_record_nothing_and_count_per_tag(enable_v):
    session, kv = make_session(enable_v=enable_v, sweep_interval=1)
    step(session, kv, 0, 4)
    step(session, kv, 4, 1)
    session.sweep(chain(1, 5))
    assert not session.violations()
    kernel, slots = session.kernel_run_counters.tolist(), session.slot_run_counters.tolist()
    halves = ("K", "V") if enable_v else ("K",)
    for t in Tag:
        half = t.name.split("_")[1]
        on = t.name.endswith("FULL") and half in halves
        if t.name.startswith(("HEAD", "TAIL")):
            # 2 steps x (verify + write); slots: 8 verified in step 2, 8 + 2 written.
            assert (kernel[t], slots[t]) == ((4, 18) if on else (0, 0)), t.name
        else:
            assert (kernel[t], slots[t]) == ((1, 5) if on else (0, 0)), t.name
    assert set(session.active_tags) == {t for t in Tag if t.name.endswith("FULL") and t.name.split("_")[1] in halves}


def test_swa_group_verifies_the_window_in_swa_slots():
    lut = torch.zeros(NUM_SLOTS, dtype=torch.int64)
    lut[1:] = torch.arange(1, NUM_SLOTS) + NUM_SLOTS  # SWA slot = full slot + 64
    session, kv = make_session(swa_lut=lut)
    step(session, kv, 0, 4)
    step(session, kv, 4, 1)
    assert not session.violations()
    slots = session.slot_run_counters.tolist()
    assert slots[Tag.HEAD_K_SWA] == 2 * 2 + 10  # window of 2 per row verified, 10 written
    poke(session, "HEAD", "K", slot(1, 4) + NUM_SLOTS, 1, 7, group="SWA")
    step(session, kv, 5, 1)
    (row,) = session.violations().records
    assert (row.tag, row.slot, row.position, row.reasons) == (
        Tag.HEAD_K_SWA, slot(1, 4) + NUM_SLOTS, 11, FailReason.VERIFY_POSITION_MISMATCH)


def test_a_sweep_translates_its_chains_for_the_swa_group():
    """A sweep reaches the SWA group through its LUT: a clean sweep reports nothing there (untranslated slots would read
    others); a stale SWA fingerprint is reported at its SWA slot on the SWA sweep endpoint alone."""
    lut = torch.zeros(NUM_SLOTS, dtype=torch.int64)
    lut[1:] = torch.arange(1, NUM_SLOTS) + NUM_SLOTS  # SWA slot = full slot + 64
    session, kv = make_session(swa_lut=lut, sweep_interval=1)
    step(session, kv, 0, 4)
    session.sweep(chain(1, 4) + chain(2, 4))
    assert not session.violations()
    poke(session, "TAIL", "V", slot(2, 2) + NUM_SLOTS, 1, 7, group="SWA")  # SWEEP reads the TAIL buffers
    session.sweep(chain(1, 4) + chain(2, 4))
    assert [(r.tag, r.slot, r.position, r.reasons) for r in session.violations().records] == [
        (Tag.SWEEP_V_SWA, slot(2, 2) + NUM_SLOTS, 9, FailReason.VERIFY_POSITION_MISMATCH),
        (Tag.SWEEP_V_SWA, slot(2, 3) + NUM_SLOTS, 3, FailReason.VERIFY_CHAIN_HASH_MISMATCH)]  # its successor


def test_capacities_raise():
    session, kv = make_session(write_req_capacity=1)
    with pytest.raises(RuntimeError, match="batch of 2 requests exceeds the session's write request capacity 1"):
        step(session, kv, 0, 4)
    session, kv = make_session(write_entry_capacity=4)
    with pytest.raises(RuntimeError, match="batch of 8 tokens exceeds the session's write entry capacity 4"):
        step(session, kv, 0, 4)


def test_verify_capacity_overflow_warns_and_skips_verify():
    session, kv = make_session(verify_capacity=4)
    step(session, kv, 0, 4)
    with pytest.warns(RuntimeWarning, match="per-forward verify skipped this step due to overflow \\(step 2\\)"):
        step(session, kv, 4, 1)
    assert session.slot_run_counters[Tag.HEAD_K_FULL] == 8 + 2  # writes only: the 8 entries did not fit
    with pytest.warns(RuntimeWarning) as caught:  # every skipped step warns, not only the first
        step(session, kv, 5, 1)
        step(session, kv, 6, 1)
    assert [str(w.message) for w in caught] == [
        f"kv-canary: per-forward verify skipped this step due to overflow (step {n})" for n in (3, 4)]


def test_session_argument_errors():
    with pytest.raises(ValueError, match="violation_mode"):
        make_session(violation_mode="loud")
    with pytest.raises(ValueError, match="health check would flag the sweep tags"):
        make_session(sweep_interval=10, health_check_interval=5)
    session, _ = make_session()
    with pytest.raises(RuntimeError, match="after_forward\\(\\) called without a matching before_forward"):
        session.after_forward()


def test_before_forward_and_sweep_are_refused_while_a_step_awaits_after_forward():
    """A second before_forward() (overwriting the pending step) or a sweep (verifying slots before TAIL
    stamps them) raises and changes nothing; the pending step completes (a second after_forward raises)."""
    session, kv = make_session(sweep_interval=1)
    session.before_forward(**step_inputs(session, 0, 4))
    before = session_state(session)
    with pytest.raises(RuntimeError, match=r"kv-canary: before_forward\(\) called while a step awaits after_forward"):
        session.before_forward(**step_inputs(session, 4, 1))
    with pytest.raises(RuntimeError, match=r"kv-canary: sweep\(\) called while a step awaits after_forward"):
        session.sweep(chain(1, 4))
    assert session.step == 1 and all(map(torch.equal, before, session_state(session)))
    kv.write(step_inputs(session, 0, 4)["out_cache_loc"])
    session.after_forward()
    with pytest.raises(RuntimeError, match=r"after_forward\(\) called without a matching before_forward"):
        session.after_forward()
    step(session, kv, 4, 1)
    session.sweep(chain(1, 5))
    assert session.step == 2 and not session.flush()


def zero_source(page_size: int = 1) -> RealKvSource:
    """32-byte rows of ``page_size`` 32-byte slots (too narrow for 2 or more)."""
    return RealKvSource(tensor=torch.zeros(16, 32, dtype=torch.uint8), page_size=page_size, num_bytes_per_token=32,
                        read_bytes=32)


@pytest.mark.parametrize("changes, message", [
    (dict(full=CanaryGroup(num_slots=-1)), "FULL group num_slots must be positive, got -1"),
    (dict(write_entry_capacity=-1), "write_entry_capacity must be positive, got -1"),
    (dict(expected_token_pool_shape=(-1, 4)), "expected_token_pool_shape rows must be positive, got -1"),
    (dict(expected_token_pool_shape=(4,)), "expected_token_pool_shape must be (rows, max_context_len), got (4,)"),
    (dict(full=CanaryGroup(num_slots=NUM_SLOTS, k_sources=(zero_source(),) * 5)),
     "at most 4 RealKvSource entries supported by the CUDA ABI, got 5"),
    (dict(full=CanaryGroup(num_slots=NUM_SLOTS, v_sources=(zero_source(page_size=2),))),
     "RealKvSource row is too narrow for its slot layout"),
    (dict(swa_lut=torch.zeros(NUM_SLOTS, dtype=torch.int32)),
     "lut_tensor must have dtype torch.int64, got torch.int32"),
    (dict(swa_lut=torch.zeros(0, dtype=torch.int64)), "lut_len must be positive when has_swa_lut is True"),
    (dict(swa_lut=torch.zeros(2, NUM_SLOTS, dtype=torch.int64)), "lut_tensor must be 1-D"),
    (dict(ring_capacity=0), "ring_capacity must be positive, got 0"),
    (dict(device="meta"), "unsupported device type 'meta' (expected cpu or cuda)"),
    (dict(full=CanaryGroup(num_slots=NUM_SLOTS, v_sources=(zero_source(),)), enable_v=False),
     "real_kv_hash_mode=PARTIAL folds real-KV sources but no group has any in a half that runs"),
    (dict(full=CanaryGroup(num_slots=NUM_SLOTS, k_sources=(zero_source(),))),
     f"the FULL group's k_sources[0] has rows for 16 slots, fewer than its num_slots {NUM_SLOTS}"),
], ids=["num_slots", "write_entry_capacity", "pool_rows", "pool_rank", "sources", "narrow_source",
        "lut_dtype", "lut_empty", "lut_rank", "ring_capacity", "meta", "v_sources_unused", "short_source"])
def test_the_constructor_rejects_what_a_step_would_fail_on(changes, message):
    """Checked when the session is built, with the launches' messages (SPEC 4) where they have one."""
    with pytest.raises(ValueError, match=re.escape(f"kv-canary: {message}")):
        make_session(**changes)


def test_a_short_source_is_accepted_in_none_mode():
    """No NONE launch reads a source row (SPEC D4), so a source short of the group's slots is no error."""
    short = CanaryGroup(num_slots=NUM_SLOTS, k_sources=(zero_source(),))
    make_session(full=short, real_kv_hash_mode=RealKvHashMode.NONE)


@pytest.mark.parametrize("ring_capacity, message", [
    (1.5, "ring_capacity must be an int, got float 1.5"), (None, "ring_capacity must be an int, got NoneType")])
def test_the_constructor_refuses_a_ring_capacity_that_is_not_an_int(ring_capacity, message):
    with pytest.raises(TypeError, match=re.escape(f"kv-canary: {message}")):
        make_session(ring_capacity=ring_capacity)


@pytest.mark.parametrize("changes, message", [
    (dict(full=None), "full must be a CanaryGroup, got NoneType"),
    (dict(swa=5), "swa must be a CanaryGroup, got int"),
    (dict(sweep_interval="2"), "sweep_interval must be an int, got str"),
    (dict(sweep_interval=2.5), "sweep_interval must be an int, got float 2.5"),
    (dict(health_check_interval=None), "health_check_interval must be an int, got NoneType"),
    (dict(health_warmup_steps=1.0), "health_warmup_steps must be an int, got float 1.0"),
    (dict(expected_token_pool_shape=5), "expected_token_pool_shape must be (rows, max_context_len), got int"),
    (dict(enable_v="no"), "enable_v must be a bool, got str"),
    (dict(enable_write_input_assert=1), "enable_write_input_assert must be a bool, got int"),
], ids=["full", "swa", "sweep_str", "sweep_float", "health_none", "warmup_float", "pool_shape_int", "enable_v",
        "input_assert"])
def test_the_constructor_refuses_arguments_of_the_wrong_type(changes, message):
    with pytest.raises(TypeError, match=re.escape(f"kv-canary: {message}")):
        make_session(**changes)


@pytest.mark.parametrize("name", ["sweep_interval", "health_warmup_steps", "health_check_interval"])
def test_the_constructor_refuses_a_negative_step_count(name):
    with pytest.raises(ValueError, match=re.escape(f"kv-canary: {name} must be non-negative, got -1")):
        make_session(**{name: -1})


@pytest.mark.parametrize("fields, error, message", [
    (dict(k_sources=zero_source()), TypeError,
     "CanaryGroup.k_sources must be a tuple of RealKvSource, got tvm_canary.RealKvSource"),
    (dict(v_sources=(zero_source(), "x")), TypeError, "each of CanaryGroup.v_sources must be a RealKvSource, got str"),
    (dict(swa_window_size="2"), TypeError, "CanaryGroup.swa_window_size must be an int, got str"),
    (dict(swa_window_size=-3), ValueError, "CanaryGroup.swa_window_size must be non-negative, got -3"),
    (dict(full_to_swa_index_mapping=[0, 1]), TypeError,
     "CanaryGroup.full_to_swa_index_mapping must be a torch.Tensor, got list"),
], ids=["sources_not_a_tuple", "source_not_a_source", "window_str", "window_negative", "lut_list"])
def test_a_group_refuses_fields_of_the_wrong_type(fields, error, message):
    with pytest.raises(error, match=re.escape(f"kv-canary: {message}")):
        CanaryGroup(num_slots=NUM_SLOTS, **fields)


@pytest.mark.parametrize("dtype", [torch.uint32, torch.uint64])
def test_unsigned_inputs_are_read_as_their_values(dtype):
    """uint32 and uint64 inputs step as their int64 values; a uint64 past int64 is refused first."""
    session, kv = make_session()
    inputs = {name: torch.as_tensor(value).to(dtype) for name, value in step_inputs(session, 0, 4).items()}
    session.before_forward(**inputs)
    kv.write(inputs["out_cache_loc"].tolist())
    session.after_forward()
    chains = torch.tensor(chain(1, 4))
    chains[0, 2] = 0  # an unsigned chain has no -1 for its head: its predecessor unknown
    session.sweep(chains.to(dtype))
    assert session.step == 1 and not session.flush()
    if dtype == torch.uint64:
        with pytest.raises(ValueError, match=re.escape("kv-canary: input_ids holds values outside torch.int64 "
                                                       "(uint64 values of 2**63 and more)")):
            session.before_forward(**{**step_inputs(session, 4, 1),
                                      "input_ids": torch.tensor([2**63, 0], dtype=torch.uint64)})
        assert session.step == 1


def test_a_reversed_numpy_view_is_read_as_its_values():
    """torch refuses numpy's negative strides; an input is its values, so the view is copied."""
    import numpy as np

    from tvm_canary.session import _integers

    assert _integers(np.arange(4)[::-1], "positions").tolist() == [3, 2, 1, 0]


def test_a_sweep_after_the_lut_was_emptied_in_place_launches_nothing():
    """The SWA table, read at every launch and changeable in place, is checked by a sweep as by a step,
    before its first launch."""
    lut = torch.arange(NUM_SLOTS, dtype=torch.int64) + NUM_SLOTS
    session, kv = make_session(swa_lut=lut)
    step(session, kv, 0, 4)
    before = session_state(session)
    lut.resize_(0)
    with pytest.raises(ValueError, match="kv-canary: lut_len must be positive when has_swa_lut is True"):
        session.sweep(chain(1, 4))
    assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))


def test_after_forward_refuses_inputs_changed_in_place_before_any_tail_launch():
    """An input resized since ``before_forward`` is refused by ``after_forward`` before the TAIL launches;
    the step ends, the next runs."""
    session, kv = make_session()
    inputs = {name: torch.tensor(value) if name != "req_to_token" else value
              for name, value in step_inputs(session, 0, 4).items()}
    session.before_forward(**inputs)
    kv.write(inputs["out_cache_loc"].tolist())
    ids = inputs["input_ids"]
    before = session_state(session)
    ids.resize_(3)
    with pytest.raises(ValueError, match="kv-canary: positions length must be 3, got 8"):
        session.after_forward()
    assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))
    with pytest.raises(RuntimeError, match=r"after_forward\(\) called without a matching before_forward"):
        session.after_forward()
    step(session, kv, 0, 4)
    assert session.step == 2


def test_after_forward_refuses_a_token_count_changed_in_place_before_any_tail_launch():
    """Inputs lengthened alike pass the launch checks but not the HEAD's plans: refused before any TAIL."""
    session, kv = make_session(swa_lut=torch.arange(NUM_SLOTS, dtype=torch.int64) + NUM_SLOTS)
    inputs = {name: torch.tensor(value) if name != "req_to_token" else value
              for name, value in step_inputs(session, 0, 3).items()}
    session.before_forward(**inputs)
    before = session_state(session)
    for name in ("input_ids", "positions", "out_cache_loc"):
        inputs[name].resize_(8)
    with pytest.raises(ValueError, match=re.escape("kv-canary: input_ids length changed since before_forward(): "
                                                   "6, now 8")):
        session.after_forward()
    assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))


def test_after_forward_refuses_a_tail_source_restrided_in_place_before_any_tail_launch():
    """All TAIL real-KV sources are checked before the first TAIL launch: a re-strided V source changes nothing."""
    session, kv = make_session()
    session.before_forward(**step_inputs(session, 0, 4))
    kv.write(step_inputs(session, 0, 4)["out_cache_loc"])
    before = session_state(session)
    source = session._groups[0].contexts["TAIL", "V"].real_kv_sources[-1].tensor
    shape, stride = tuple(source.shape), source.stride()
    source.as_strided_(shape, (stride[0] - 1, *stride[1:]))
    with pytest.raises(ValueError, match="kv-canary: RealKvSource.tensor row stride must be a multiple of 16 bytes"):
        session.after_forward()
    assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))
    source.as_strided_(shape, stride)
    step(session, kv, 0, 4)
    assert session.step == 2


# -- detection through the session


def test_session_input_errors():
    session, kv = make_session(enable_v=False)
    with pytest.raises(KeyError, match="kv-canary: no HEAD V canary buffer in this session"):
        session.canary_buffer("HEAD", "V")
    step(session, kv, 0, 3)
    with pytest.raises(ValueError, match=r"kv-canary: sweep chains must be \[n, 3\] .*got shape \(3, 2\)"):
        session.sweep(torch.tensor([[slot(1, p), p] for p in range(3)]))
    with pytest.raises(ValueError, match="kv-canary: real_kv_hash_mode must be one of NONE .* got 5"):
        make_session(real_kv_hash_mode=5)
    with pytest.raises(ValueError, match="kv-canary: real_kv_hash_mode=ALL folds .* but no group has any"):
        make_session(full=CanaryGroup(num_slots=NUM_SLOTS, v_sources=kv.sources("V")), enable_v=False,
                     real_kv_hash_mode=RealKvHashMode.ALL)
    pooled, _ = make_session(expected_token_pool_shape=(3, MAX_LEN))
    with pytest.raises(ValueError, match="kv-canary: token_lens has 3 entries for a batch of 2 requests"):
        pooled.before_forward(req_pool_indices=list(ROWS), prefix_lens=[0, 0], extend_seq_lens=[1, 1],
                              input_ids=[1, 2], positions=[0, 0], out_cache_loc=[slot(1, 0), slot(2, 0)],
                              req_to_token=TABLE, token_ids=[1] * 6, token_lens=[2, 2, 2])


def session_state(session: CanarySession) -> list[torch.Tensor]:
    """Copies of the tensors a step changes."""
    tensors = [session._status, session.slot_run_counters, session.violation_log.violation_ring]
    for g in session._groups:
        tensors += [c.canary_buf for c in g.contexts.values()] + [*plan_tensors(g.verify_plan),
                                                                  *plan_tensors(g.write_plan)]
    if session.expected_token_pool is not None:
        tensors.append(session.expected_token_pool)
    return [t.clone() for t in tensors]


@pytest.mark.parametrize("changes, error, message", [
    (dict(req_pool_indices=[1, 2, 1], prefix_lens=[4] * 3, extend_seq_lens=[1] * 3, token_lens=[5] * 3),
     RuntimeError, "batch of 3 requests exceeds the session's write request capacity 2"),
    (dict(prefix_lens=[4]), ValueError, "prefix_lens length must be 2, got 1"),
    (dict(req_to_token=TABLE[1]), ValueError, "req_to_token must be 2-D"),
    (dict(token_ids=[[1, 2]] * 5), ValueError, "scatter_req_token_ids flat_in must be 1-D"),
    (dict(positions=[4]), ValueError, "positions length must be 2, got 1"),
    (dict(out_cache_loc=[1, 2, 3]), ValueError, "out_cache_loc length must be 2, got 3"),
    (dict(expected_input_tokens=[1, 2]), ValueError, "expected input tensors must be None"),
    (dict(req_to_token=torch.cat([TABLE, TABLE[:1]])), ValueError,
     re.escape("the expected-token pool (3, 16) (expected_token_pool_shape) is smaller than req_to_token (4, 16)")),
    (dict(req_to_token=torch.nn.functional.pad(TABLE, (0, 1))), ValueError,
     re.escape("the expected-token pool (3, 16) (expected_token_pool_shape) is smaller than req_to_token (3, 17)")),
    # Non-integer inputs are refused, not truncated.
    (dict(out_cache_loc=torch.tensor([1.9, 2.7])), TypeError,
     "out_cache_loc must hold int64 values, got torch.float32"),
    (dict(input_ids=[2**63, 0]), TypeError, "input_ids must hold int64 values, got list"),
    (dict(req_to_token=TABLE.float()), TypeError, "req_to_token must hold int32 values, got torch.float32"),
    (dict(req_to_token=(TABLE.to(torch.int64) + 2**32).tolist()), ValueError,
     "req_to_token holds values outside torch.int32: 4294967296 .. "),
    (dict(req_pool_indices=torch.tensor(1)), ValueError, re.escape("req_pool_indices must be 1-D, got shape ()")),
    (dict(token_lens=torch.tensor(5)), ValueError, re.escape("token_lens must be 1-D, got shape ()")),
    (dict(input_ids=None), TypeError, "input_ids must be a torch.Tensor, got NoneType"),
    (dict(input_ids=5), ValueError, re.escape("input_ids must be 1-D, got shape ()")),
    # More tokens than given: the kernels' clamped reads would stamp a row's tokens into another row's slots.
    (dict(extend_seq_lens=[1, 2]), ValueError, "extend_seq_lens write 3 tokens, more than the 2 of input_ids"),
    (dict(token_lens=[5, 6]), ValueError, "token_lens add up to 11 tokens, more than the 10 of token_ids"),
    (dict(token_lens=[-2, 12]), ValueError, "token_lens must not be negative, got -2"),
    (dict(extend_seq_lens=[2**63 - 1, 2]), ValueError, "extend_seq_lens write 9223372036854775809 tokens, more "
     "than the 2 of input_ids"),  # past int64: no wrap
], ids=["capacity", "prefix_lens", "req_to_token", "token_ids", "positions", "out_cache_loc", "expected_inputs",
        "pool_rows", "pool_columns", "float_slots", "past_int64", "float_table", "table_past_int32", "scalar_rows",
        "scalar_lens", "no_input_ids", "scalar_ids", "extend_past_input_ids", "token_lens_past_token_ids",
        "negative_token_lens", "extend_past_int64"])
def test_a_rejected_step_changes_nothing(changes, error, message):
    """It raises before the step is counted or anything runs; later steps run clean."""
    lut = torch.arange(NUM_SLOTS, dtype=torch.int64) + NUM_SLOTS
    session, kv = make_session(swa_lut=lut, expected_token_pool_shape=(3, MAX_LEN), health_warmup_steps=0,
                               health_check_interval=1)
    step(session, kv, 0, 4)
    before = session_state(session)
    with pytest.raises(error, match=f"kv-canary: {message}"):
        session.before_forward(**{**step_inputs(session, 4, 1), **changes})
    assert session.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))
    step(session, kv, 4, 1)
    step(session, kv, 5, 1)
    assert not session.flush()


def test_a_padding_rows_extend_length_counts_no_token():
    """SPEC 3.3: a padding row (``req_pool_indices`` 0) writes nothing whatever its ``extend_seq_lens``: the
    other row's one token is the first of ``input_ids``, stamped at the first of ``out_cache_loc`` alone."""
    session, _ = make_session()
    buffers = [context.canary_buf for group in session._groups for context in group.contexts.values()]
    before = [buf.clone() for buf in buffers]
    session.before_forward(**{**step_inputs(session, 0, 1), "req_pool_indices": [0, ROWS[1]],
                              "extend_seq_lens": [5, 1]})
    session.after_forward()
    for buf, old in zip(buffers, before):  # step_inputs laid input_ids and out_cache_loc out by ROWS: ROWS[0]'s first
        assert (buf != old).any(dim=1).nonzero().flatten().tolist() == [slot(ROWS[0], 0)]
        assert buf.view(torch.int64)[slot(ROWS[0], 0), :2].tolist() == [token(ROWS[0], 0), 0]


def test_the_reference_backend_refuses_a_slot_past_the_lut_before_the_step():
    """The reference plan raises for it (the kernels clamp, SPEC D4): before the step is counted."""
    with use_backend("reference"):
        session, kv = make_session(swa_lut=torch.arange(8, dtype=torch.int64) + NUM_SLOTS, enable_v=False)
        step(session, kv, 0, 4)  # no verify entries, no seeds: nothing translated by the plan
        before = session_state(session)
        with pytest.raises(ValueError, match="kv-canary: SWA slot 19 is outside full_to_swa_index_mapping length 8"):
            session.before_forward(**step_inputs(session, 4, 1))
        assert session.step == 1
        assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))


def test_an_overflow_warning_made_an_error_is_raised_once():
    """At its step's end; later steps, violations and flush go on."""
    session, kv = make_session(verify_capacity=4)
    step(session, kv, 0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(RuntimeWarning, match=r"skipped this step due to overflow \(step 2\)"):
            step(session, kv, 4, 1)
        poke(session, "HEAD", "K", slot(1, 0), 1, 100)
        step(session, kv, 1, 1)  # verifies position 0 of each row
        assert [v.slot for v in session.flush().records] == [slot(1, 0)]


def test_a_report_without_a_step_repeats_no_overflow_warning():
    """An overflowing step warns once, of its step; a sweep's report after it (a snapshot of no step, the plan
    still disabled) warns no more."""
    session, kv = make_session(verify_capacity=4, sweep_interval=1)
    step(session, kv, 0, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(session, kv, 4, 1)
        session.sweep(chain(1, 5))
        session.violations()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == [
        "kv-canary: per-forward verify skipped this step due to overflow (step 2)"]


def test_a_refused_after_forward_still_warns_of_its_overflow():
    session, kv = make_session(verify_capacity=4)
    step(session, kv, 0, 4)
    inputs = step_inputs(session, 4, 1)
    inputs["input_ids"] = torch.tensor(inputs["input_ids"])  # used in place
    session.before_forward(**inputs)  # 8 verify entries: HEAD verify skipped
    inputs["input_ids"].resize_(1)
    with pytest.raises(ValueError, match="kv-canary: positions length must be 1, got 2"):
        session.after_forward()
    with pytest.warns(RuntimeWarning, match=r"skipped this step due to overflow \(step 2\)"):
        session.flush()


def test_swa_slots_past_the_table_are_clamped_as_the_kernels_do():
    """An SWA group translates the step's slots through its table on the device, taking the last entry
    for a slot past it (the plan kernels' clamp, SPEC D4), never indexing out of it."""
    lut = torch.arange(NUM_SLOTS // 2, dtype=torch.int64) + NUM_SLOTS  # shorter than the pool
    session, kv = make_session(swa_lut=lut, enable_v=False)
    session.before_forward(req_pool_indices=[1], prefix_lens=[0], extend_seq_lens=[1], input_ids=[7], positions=[0],
                           out_cache_loc=[NUM_SLOTS - 1], req_to_token=TABLE)
    session.after_forward()
    assert session.canary_buffer("HEAD", "K", "SWA").view(torch.int64)[int(lut[-1]), 0] == 7


def test_chain_position_assert_is_off_until_init_finished():
    session, kv = make_session()
    step(session, kv, 0, 4)
    step(session, kv, 4, 1, reported=[4, 3])  # row 2 seeds from position 2 instead of 3
    assert not session.violations()
    session.mark_init_finished()
    step(session, kv, 5, 1, reported=[5, 4])
    rows = session.violations().records
    assert {(r.tag, r.slot, r.reasons) for r in rows} == {
        (t, slot(2, 5), FailReason.WRITE_POSITION_MISMATCH)
        for t in (Tag.HEAD_K_FULL, Tag.HEAD_V_FULL, Tag.TAIL_K_FULL, Tag.TAIL_V_FULL)
    }


def test_verify_token_check_and_decoded_fields():
    session, kv = make_session(expected_token_pool_shape=(3, MAX_LEN))
    step(session, kv, 0, 4)
    poke(session, "HEAD", "K", slot(2, 1), 0, 5)
    step(session, kv, 4, 1)
    token_row, chain_row = session.violations().records
    assert (token_row.tag, token_row.reason_names, token_row.slot, token_row.position) == (
        Tag.HEAD_K_FULL, ("verify_token",), slot(2, 1), 1)
    assert (token_row.stored_token, token_row.expected_token) == (token(2, 1) + 5, token(2, 1))
    assert token_row.stored_chain_hash == token_row.expected_aux
    assert (chain_row.reason_names, chain_row.slot) == (("verify_chain_hash",), slot(2, 2))
    assert chain_row.stored_chain_hash != chain_row.expected_aux


def test_write_input_assert():
    session, kv = make_session(enable_write_input_assert=True)
    wrong = [token(r, p) + (r == 2 and p == 1) for r in ROWS for p in range(4)]
    step(session, kv, 0, 4, expected_input_tokens=wrong, expected_input_positions=[p for _ in ROWS for p in range(4)])
    rows = session.violations().records
    assert {(r.tag, r.slot, r.stored_token, r.expected_token, r.reasons) for r in rows} == {
        (t, slot(2, 1), token(2, 1), token(2, 1) + 1, FailReason.WRITE_TOKEN_MISMATCH)
        for t in (Tag.HEAD_K_FULL, Tag.HEAD_V_FULL, Tag.TAIL_K_FULL, Tag.TAIL_V_FULL)
    }
    with pytest.raises(ValueError, match="expected input tensors are required"):
        step(session, kv, 4, 1)


def test_a_step_turns_the_write_input_assert_off():
    """``write_input_assert=False`` (an EAGLE draft step, SPEC 6 item 4) turns the assert off for that
    step alone: expected inputs given are refused before anything runs; the next step asserts again."""
    session, kv = make_session(enable_write_input_assert=True)
    step(session, kv, 0, 4, expected_input_tokens=[token(r, p) for r in ROWS for p in range(4)],
         expected_input_positions=[p for _ in ROWS for p in range(4)])
    wrong = dict(expected_input_tokens=[0, 0], expected_input_positions=[0, 0])
    step_count = session.step
    with pytest.raises(ValueError, match="^kv-canary: expected input tensors must be None in a step with "
                                         "write_input_assert=False$"):
        session.before_forward(**step_inputs(session, 4, 1, **wrong), write_input_assert=False)
    for not_a_bool in (None, 0, "False"):  # None or 0 would turn the assert off, "False" leave it on
        with pytest.raises(TypeError, match="^kv-canary: write_input_assert must be a bool, got "):
            session.before_forward(**step_inputs(session, 4, 1), write_input_assert=not_a_bool)
    assert session.step == step_count
    session.before_forward(**step_inputs(session, 4, 1), write_input_assert=False)
    session.after_forward()
    assert session.step == step_count + 1 and not session.violations()
    step(session, kv, 5, 1, **wrong)  # asserting again: both rows' token and position rows, on 4 endpoints
    assert len(session.violations().records) == 4 * 2


def test_sweep_finds_a_stale_chain():
    session, kv = make_session(sweep_interval=1)
    step(session, kv, 0, 4)
    session.sweep(chain(1, 4))
    assert not session.violations()
    stale = [(slot(2, 0), 0, -1), (slot(2, 1), 5, slot(2, 0))]  # row 2's slot 1 claimed at position 5
    session.sweep(stale)
    assert {(r.tag, r.slot, r.position, r.reasons) for r in session.violations().records} == {
        (t, slot(2, 1), 1, FailReason.VERIFY_POSITION_MISMATCH) for t in (Tag.SWEEP_K_FULL, Tag.SWEEP_V_FULL)
    }


# -- ring reading and reporting


def test_reads_only_new_rows_and_reports_overflow():
    session, kv = make_session(ring_capacity=2)
    step(session, kv, 0, 4)
    for p in range(3):
        poke(session, "HEAD", "K", slot(1, p), 1, 100)
    step(session, kv, 4, 1)  # 3 position rows + 1 chain row (position 3's predecessor)
    report = session.violations()
    assert (len(report.records), report.total, report.dropped) == (2, 4, 2)
    assert report.messages(step=2)[-1] == (
        "kv_canary: 2 more violations were dropped (ring capacity 2, total_violations=4)")
    assert not session.violations()
    step(session, kv, 5, 1)
    report = session.violations()
    assert (report.records, report.total, report.dropped) == ((), 8, 4)


def test_violations_are_counted_past_the_write_index_wrap():
    """The int32 write index wraps negative after 2^31 - 1 violations (SPEC D4); the session's count goes on."""
    session, kv = make_session(ring_capacity=2)
    step(session, kv, 0, 4)
    for p in range(3):
        poke(session, "HEAD", "K", slot(1, p), 1, 100)
    step(session, kv, 4, 1)  # 4 violations, 2 of them stored
    assert len(session.violations().records) == 2
    session.violation_log.violation_write_index.fill_(2**31 - 2)
    step(session, kv, 5, 1)  # 4 more: the index wraps to -2^31 + 2
    assert int(session.violation_log.violation_write_index[0]) == -(2**31) + 2
    report = session.violations()
    assert (report.records, report.total, report.dropped, bool(report)) == ((), 2**31 + 2, 2**31 - 2, True)
    step(session, kv, 6, 1)  # 4 more
    report = session.violations()
    assert (report.total, report.dropped, bool(report)) == (2**31 + 6, 4, True)


def test_log_mode_warns_each_row():
    session, kv = make_session(violation_mode="log")
    step(session, kv, 0, 4)
    poke(session, "TAIL", "V", slot(1, 3), 1, 1)
    step(session, kv, 4, 1)
    with pytest.warns(tc.CanaryViolationWarning) as caught:
        report = session.violations()
    assert [str(w.message).splitlines()[0] for w in caught] == [v.line() for v in report.records]
    assert report.records[0].line().startswith(
        f"kv_canary violation: launch_tag=TAIL_V_FULL fail_reason=verify_position slot_idx={slot(1, 3)} position=4 ")


def test_raise_mode_raises_once():
    session, kv = make_session(violation_mode="raise")
    step(session, kv, 0, 4)
    poke(session, "HEAD", "K", slot(2, 0), 1, 1)
    step(session, kv, 4, 1)
    with pytest.raises(tc.CanaryViolationError, match="^kv_canary violation: launch_tag=HEAD_K_FULL") as err:
        session.violations()
    assert err.value.report.records[0].slot == slot(2, 0)
    step(session, kv, 5, 1)
    assert session.violations().records  # reported, not raised again


def test_health_check_flags_a_tag_that_stops_running():
    session, kv = make_session(sweep_interval=2, health_warmup_steps=1, health_check_interval=2)
    step(session, kv, 0, 4)
    for p in range(4, 7):
        step(session, kv, p, 1)
        if session.sweep_due:
            session.sweep(chain(1, p + 1))
    session, kv = make_session(sweep_interval=2, health_warmup_steps=1, health_check_interval=2)
    step(session, kv, 0, 4)
    step(session, kv, 4, 1)
    step(session, kv, 5, 1)
    with pytest.raises(RuntimeError, match="canary path is not executing: kernel_run_counter of SWEEP_K_FULL, "
                                           "SWEEP_V_FULL did not advance over steps 2..3"):
        step(session, kv, 6, 1)


def test_a_failed_health_check_is_raised_once_at_the_end_of_a_whole_step():
    """Raised once, at the end of the step decoding it (run whole); the next check judges its own step alone.
    A step "without" a tag: its counter restored after it."""
    session, kv = make_session(enable_v=False, health_warmup_steps=0, health_check_interval=1)
    counters = session.kernel_run_counters
    step(session, kv, 0, 4)
    head = counters[Tag.HEAD_K_FULL].item()
    step(session, kv, 4, 1)
    counters[Tag.HEAD_K_FULL] = head  # step 2 without HEAD_K
    before = counters.clone()
    with pytest.raises(RuntimeError, match=r"kernel_run_counter of HEAD_K_FULL did not advance over steps 2\.\.2$"):
        step(session, kv, 5, 1)
    assert (counters - before)[[Tag.HEAD_K_FULL, Tag.TAIL_K_FULL]].tolist() == [2, 2]  # step 3 ran whole
    counters[Tag.TAIL_K_FULL] = before[Tag.TAIL_K_FULL]  # step 3 without TAIL_K
    with pytest.raises(RuntimeError, match=r"kernel_run_counter of TAIL_K_FULL did not advance over steps 3\.\.3$"):
        step(session, kv, 6, 1)
    step(session, kv, 7, 1)
    step(session, kv, 8, 1)
    assert not session.flush()


# -- formatting (no kernels)


def make_row(kind=Tag.HEAD_K_FULL, slot_idx=17, position=42, stored_token=111, expected_token=0, stored_chain_hash=0,
        expected_aux=0, bits=0) -> Violation:
    return Violation.from_row([int(kind), slot_idx, position, stored_token, expected_token, stored_chain_hash,
                               expected_aux, int(bits)])


def test_message_of_a_verify_row():
    v = make_row(stored_chain_hash=0x1111111111111111, expected_aux=0x2222222222222222,
            bits=FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH
            | FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
    assert v.message(total=1, ring_overflow=False, step=7) == (
        "kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=verify_chain_hash+verify_position+verify_real_kv_hash "
        "slot_idx=17 position=42 stored_token=111 expected_token=0 stored_chain_hash=0x1111111111111111 "
        "expected_aux=0x2222222222222222\n"
        "KV cache canary violation detected (kernel_kind=HEAD_K_FULL, slot_idx=17, position=42)\n"
        "canary_kind:       per_forward_head_k_full\n"
        "  fail_reasons: verify_chain_hash verify_position verify_real_kv_hash\n"
        "  stored:   token_id=111   position=42 prev_hash=0x1111111111111111\n"
        "  expected: prev_hash=0x2222222222222222\n"
        "  total_violations=1 ring_overflow=False step_when_pumped=7"
    )


def test_message_of_a_write_row():
    v = make_row(position=42, stored_token=999, expected_token=888, stored_chain_hash=0xDEADBEEFCAFEBABE - (1 << 64),
            expected_aux=43, bits=FailReason.WRITE_TOKEN_MISMATCH)
    assert v.message(total=1, ring_overflow=False, step=0) == (
        "kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=write_token slot_idx=17 position=42 "
        "stored_token=999 expected_token=888 stored_chain_hash=0xdeadbeefcafebabe "
        "expected_aux=0x000000000000002b\n"
        "KV cache canary violation detected (kernel_kind=HEAD_K_FULL, slot_idx=17, position=42)\n"
        "canary_kind:       per_forward_head_k_full\n"
        "  fail_reasons: write_token\n"
        "  actual:   token_id=999   position=42 prev_hash=0xdeadbeefcafebabe\n"
        "  expected: token_id=888   position=43\n"
        "  total_violations=1 ring_overflow=False step_when_pumped=0"
    )


def test_message_of_a_write_position_row():
    """The chain-position assert's row (the position bit alone) is a write row: actual against expected."""
    v = make_row(stored_token=999, expected_token=999, expected_aux=43, bits=FailReason.WRITE_POSITION_MISMATCH)
    assert v.is_write
    assert v.message(total=1, ring_overflow=False, step=0).splitlines()[3:6] == [
        "  fail_reasons: write_position",
        "  actual:   token_id=999   position=42 prev_hash=0x0000000000000000",
        "  expected: token_id=999   position=43",
    ]


@pytest.mark.parametrize("total, dropped, overflow", [(2, 0, False), (3, 1, True)])
def test_ring_overflow_means_rows_were_dropped(total, dropped, overflow):
    """A ring filled exactly has not overflowed; one violation more has."""
    report = ViolationReport(records=(make_row(), make_row()), total=total, dropped=dropped, ring_capacity=2)
    messages = report.messages(step=3)
    assert [m.splitlines()[-1] for m in messages[:2]] == [
        f"  total_violations={total} ring_overflow={overflow} step_when_pumped=3"] * 2
    assert messages[2:] == ([f"kv_canary: 1 more violations were dropped (ring capacity 2, total_violations={total})"]
                            if dropped else [])


def test_labels_of_sweep_unknown_token_and_invalid_rows():
    sweep = make_row(kind=Tag.SWEEP_V_SWA, expected_token=5, bits=FailReason.VERIFY_TOKEN_MISMATCH)
    assert sweep.message(total=3, ring_overflow=True, step=1).splitlines()[2:] == [
        "canary_kind:       sweep_v_swa",
        "  fail_reasons: verify_token",
        "  stored:   token_id=111   position=42 prev_hash=0x0000000000000000",
        "  expected: token_id=5 prev_hash=0x0000000000000000",
        "  total_violations=3 ring_overflow=True step_when_pumped=1",
    ]
    unknown = make_row(kind=9999, bits=FailReason.INVALID_INDEX | FailReason.VERIFY_POSITION_MISMATCH)
    assert (unknown.tag, unknown.tag_name) == (None, "unknown(9999)")
    assert unknown.line().startswith(
        "kv_canary violation: launch_tag=unknown(9999) fail_reason=verify_position+invalid_index ")
    # a verify row whose predecessor was invalid (other bits beside it): its stored fields are real
    assert unknown.message(total=1, ring_overflow=False, step=0).splitlines()[4:6] == [
        "  stored:   token_id=111   position=42 prev_hash=0x0000000000000000",
        "  expected: prev_hash=0x0000000000000000",
    ]
    assert make_row().line().split()[3] == "fail_reason=none"
    invalid = make_row(bits=FailReason.INVALID_INDEX).message(total=1, ring_overflow=False, step=0).splitlines()
    assert invalid[4] == ("  invalid_index: the slot, its predecessor or the request's seed slot is outside the "
                          "canary buffer or a real-KV source (SPEC D4); the fields are those of the line above")


def test_step_inputs_inside_the_expected_token_pool_are_refused_before_the_step():
    """SPEC D10 for a whole step: prefix_lens carved from the expected-token pool (which scatter writes
    before the plan reads prefix_lens) is refused before the step."""
    session, kv = make_session(expected_token_pool_shape=(3, MAX_LEN))
    step(session, kv, 0, 4)
    carved = session.expected_token_pool[1].view(torch.int64)[: len(ROWS)]
    carved.copy_(torch.tensor([4] * len(ROWS)))
    before = session_state(session)
    with pytest.raises(ValueError, match="^kv-canary: expected_token_pool shares memory with prefix_lens"):
        session.before_forward(**{**step_inputs(session, 4, 1), "prefix_lens": carved})
    assert session.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))


def test_step_inputs_inside_a_plan_are_refused_before_the_step():
    """SPEC D10 for a whole step: input_ids carved from the FULL group's verify plan (written before write
    reads input_ids) is refused before the step."""
    session, kv = make_session()
    step(session, kv, 0, 4)
    inputs = step_inputs(session, 4, 1)
    carved = session._groups[0].verify_plan.verify_slot_indices[: len(inputs["input_ids"])]
    carved.copy_(torch.tensor(inputs["input_ids"]))
    before = session_state(session)
    with pytest.raises(ValueError, match="^kv-canary: FULL group verify_plan_out.verify_slot_indices shares memory "
                                         "with input_ids"):
        session.before_forward(**{**inputs, "input_ids": carved})
    assert session.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))


def test_step_inputs_inside_any_endpoints_buffer_are_refused_before_the_step():
    """SPEC D10 for a whole step: out_cache_loc carved from the SWA TAIL V canary buffer (the last write)
    is refused before the step, not at that write."""
    lut = torch.arange(NUM_SLOTS, dtype=torch.int64) + NUM_SLOTS
    session, kv = make_session(swa_lut=lut)
    step(session, kv, 0, 4)
    before = session_state(session)
    carved = session.canary_buffer("TAIL", "V", "SWA").view(-1)[:16].view(torch.int64)
    with pytest.raises(ValueError, match="^kv-canary: context.canary_buf shares memory with out_cache_loc"):
        session.before_forward(**{**step_inputs(session, 4, 1), "out_cache_loc": carved})
    assert session.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, session_state(session)))
