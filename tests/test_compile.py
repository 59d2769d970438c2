"""torch.compile over a serving step calling the public API (scatter -> plan -> verify -> write).

The step compiles with ``fullgraph=True`` (``torch._dynamo.explain``: one graph, no break); every tensor it touches is
byte-equal to eager over two steps, inputs refilled in place, under Inductor and ``aot_eager`` (CUDA: also
``mode="reduce-overhead"``, Inductor's CUDA graphs replayed). The graph holds only operators and views: Inductor
compiles no C++.
"""

from __future__ import annotations

import re

import pytest
import torch

import tvm_canary as tc
from tvm_canary.consts import RealKvHashMode

from tree import assert_same_bytes, devices, require

SLOTS, ROWS, MAX_LEN, BS, EXTEND = 256, 5, 16, 4, 2
TOKENS = BS * EXTEND
TAG = tc.CanaryLaunchTag.TAIL_K_FULL  # the endpoint the serving step verifies and writes


def make_state(device: str, verify_capacity: int = 64) -> dict[str, torch.Tensor]:
    """Canary state, plans, tables and one step's inputs (int64 unless the API says otherwise)."""
    gen = torch.Generator().manual_seed(0)
    r2t = torch.randperm(SLOTS - 1, generator=gen)[: ROWS * MAX_LEN].add(1).to(torch.int32).view(ROWS, MAX_LEN)
    s = dict(
        canary=torch.zeros(SLOTS, 32, dtype=torch.uint8), ring=torch.full((32, 8), -7, dtype=torch.int64),
        write_index=torch.zeros(1, dtype=torch.int32), counters=torch.zeros(12, dtype=torch.int64),
        chain_assert=torch.ones(1, dtype=torch.int32),
        kv=torch.randint(0, 256, (SLOTS, 64), generator=gen, dtype=torch.uint8),
        r2t=r2t, rpi=torch.arange(1, BS + 1), prefix=torch.zeros(BS, dtype=torch.int64),
        ext=torch.full((BS,), EXTEND), valid_lens=torch.zeros(BS, dtype=torch.int64),
        pool=torch.zeros(ROWS, MAX_LEN, dtype=torch.int32), flat=torch.zeros(BS * MAX_LEN, dtype=torch.int64),
        offsets=torch.zeros(BS + 1, dtype=torch.int64), ids=torch.zeros(TOKENS, dtype=torch.int64),
        pos=torch.zeros(TOKENS, dtype=torch.int64), ocl=torch.zeros(TOKENS, dtype=torch.int64),
        v_slots=torch.zeros(verify_capacity, dtype=torch.int64),
        v_tokens=torch.zeros(verify_capacity, dtype=torch.int64),
        v_pos=torch.zeros(verify_capacity, dtype=torch.int64), v_prev=torch.zeros(verify_capacity, dtype=torch.int64),
        v_num=torch.zeros(1, dtype=torch.int32), v_enable=torch.ones(1, dtype=torch.int32),
        w_offsets=torch.zeros(BS + 1, dtype=torch.int64), w_seeds=torch.zeros(BS, dtype=torch.int64),
        w_num=torch.zeros(1, dtype=torch.int32),
    )
    return {k: v.to(device) for k, v in s.items()}


def refill(s: dict[str, torch.Tensor], step_no: int) -> None:
    """Step ``step_no`` (0, 1, ...): every row extends by EXTEND tokens; a token of row 2 is corrupted in
    the canary after step 0, so step 1 records violations."""
    prefix = torch.full((BS,), EXTEND * step_no)
    pos = (prefix[:, None] + torch.arange(EXTEND)).flatten()
    rows = torch.arange(1, BS + 1).repeat_interleave(EXTEND)
    tokens = 1000 * rows + pos
    lens = prefix + EXTEND
    flat = torch.cat([1000 * r + torch.arange(int(n)) for r, n in zip(range(1, BS + 1), lens)])
    dev = s["ids"].device
    s["prefix"].copy_(prefix.to(dev))
    s["valid_lens"].copy_(lens.to(dev))
    s["pos"].copy_(pos.to(dev))
    s["ids"].copy_(tokens.to(dev))
    s["ocl"].copy_(s["r2t"][rows.to(dev), pos.to(dev)].to(torch.int64))
    s["flat"][: flat.shape[0]].copy_(flat.to(dev))
    s["offsets"][1:].copy_(torch.cumsum(lens, 0).to(dev))
    if step_no == 1:
        s["canary"].view(torch.int64)[int(s["r2t"][2, 1]), 0] += 1


def step_context(s: dict[str, torch.Tensor], kernel_kind=TAG, page_size: int = 1) -> tc.VerifyOrWriteContext:
    """The serving step's context: TAG's counters, ALL mode over one real-KV source (``kernel_kind`` and
    its ``page_size`` can be wrong, for the argument checks)."""
    source = tc.RealKvSource(tensor=s["kv"], page_size=page_size, num_bytes_per_token=64, read_bytes=64)
    return tc.VerifyOrWriteContext(
        canary_buf=s["canary"], kernel_kind=kernel_kind, violation_ring=s["ring"],
        violation_write_index=s["write_index"], slot_run_counter=s["counters"][TAG : TAG + 1],
        kernel_run_counter=s["counters"][TAG + 6 : TAG + 7], real_kv_sources=(source,),
        real_kv_hash_mode=RealKvHashMode.ALL, enable_chain_position_assert=s["chain_assert"],
    )


def serving_step(s: dict[str, torch.Tensor]) -> None:
    """Scatter the known tokens, plan, then verify + write the TAIL_K_FULL endpoint (one real-KV source)."""
    context = step_context(s)
    verify_plan = tc.VerifyPlan(
        verify_slot_indices=s["v_slots"], verify_expected_tokens=s["v_tokens"], verify_expected_positions=s["v_pos"],
        verify_prev_slot_indices=s["v_prev"], verify_num_valid=s["v_num"], enable=s["v_enable"],
    )
    write_plan = tc.WritePlan(
        write_offsets=s["w_offsets"], write_seed_slot_indices=s["w_seeds"], write_num_valid_reqs=s["w_num"]
    )
    tc.launch_scatter_req_token_ids_kernel(
        flat_in=s["flat"], offsets=s["offsets"], req_pool_indices=s["rpi"], pool_out=s["pool"]
    )
    tc.launch_canary_plan_kernels(
        verify_plan_out=verify_plan, write_plan_out=write_plan, req_pool_indices=s["rpi"], prefix_lens=s["prefix"],
        extend_seq_lens=s["ext"], req_to_token=s["r2t"], swa_window_size=0, full_to_swa_index_mapping=None,
        verify_capacity=verify_plan.verify_slot_indices.shape[0], req_to_verify_expected_tokens=s["pool"],
        req_to_verify_expected_tokens_valid_lens=s["valid_lens"], kv_token_id_vs_position_offset=0,
    )
    tc.launch_canary_verify_kernel(context=context, plan=verify_plan, check_verify_expected_token=True)
    tc.launch_canary_write_kernel(
        context=context, plan=write_plan, input_ids=s["ids"], positions=s["pos"], out_cache_loc=s["ocl"],
        enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None,
    )


def run_steps(fn, s: dict[str, torch.Tensor], steps: int = 3) -> list[torch.Tensor]:
    for i in range(steps):
        refill(s, i)
        fn(s)
    return list(s.values())


def error_chain(error: BaseException) -> list[str]:
    """The messages of ``error`` and of the errors it was raised from (Dynamo wraps the step's own)."""
    chain = []
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    return chain


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", devices())
def test_serving_step_is_one_graph(device):
    require(device)
    s = make_state(device)
    refill(s, 0)
    explained = torch._dynamo.explain(serving_step)(s)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_fullgraph_compile_equals_eager(device, backend):
    require(device)
    want = run_steps(serving_step, make_state(device))
    assert int(want[2][0]) > 0  # the corrupted slot was detected (write index of the ring)
    got = run_steps(torch.compile(serving_step, fullgraph=True, backend=backend), make_state(device))
    assert_same_bytes(got, want)


@pytest.mark.parametrize("device", devices())
def test_the_verify_capacity_can_be_a_dynamic_dimension(device):
    """Marked dynamic, the verify plan's capacity stays symbolic through the checks and operator: one
    graph serves three capacities, each byte-equal to eager (the checks indexed it into a graph constant:
    marked dynamic, it failed to compile)."""
    require(device)
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(serving_step, fullgraph=True, backend="aot_eager")
    for capacity in (48, 64, 80):
        want = run_steps(serving_step, make_state(device, capacity))
        s = make_state(device, capacity)
        for name in ("v_slots", "v_tokens", "v_pos", "v_prev"):
            torch._dynamo.mark_dynamic(s[name], 0)
        assert_same_bytes(run_steps(compiled, s), want)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_state_inside_a_buffer_of_another_dtype(backend):
    """A one-element view of another dtype at a nonzero offset of a larger buffer, taken in the compiled
    step, reaches an operator empty (torch.compile rebuilds ``buf[i : i + 1].view(torch.int32)[:1]``
    wrongly): refused with a kv-canary error (its writes were lost: the enable flag stayed 0, on every
    backend). Viewed from the whole buffer, as the session's status words, it compiles byte-equal to eager."""
    def state():
        s = make_state("cpu")
        del s["v_enable"]
        s["status"] = torch.tensor([0, 1], dtype=torch.int64)  # word 1's low half: the plan's enable flag
        return s

    def step_viewing(view):
        return lambda s: serving_step({**s, "v_enable": view(s["status"])})

    whole = step_viewing(lambda status: status.view(torch.int32)[2:3])
    sliced = step_viewing(lambda status: status[1:2].view(torch.int32)[:1])
    want = run_steps(whole, state())
    assert int(want[-1][1]) == 1  # verify ran (the flag is set again by each plan)
    assert_same_bytes(run_steps(torch.compile(whole, fullgraph=True, backend=backend), state()), want)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="^kv-canary: enable reached the operator with 0 elements, not 1"):
        run_steps(torch.compile(sliced, fullgraph=True, backend=backend), state())


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_written_views_of_one_buffer_in_two_dtypes_are_refused_compiled(backend):
    """A write index viewed as int32 beside int64 counters of one buffer: eager records both; compiled, the
    index stayed 0 under aot_eager (Inductor lost rows in a step of two verify launches), silently. Refused
    under both (the fake implementation cannot tell which trace loses them)."""
    def state():
        return {**make_state("cpu"), "status": torch.zeros(13, dtype=torch.int64)}

    def step(s):
        serving_step({**s, "write_index": s["status"].view(torch.int32)[0:1], "counters": s["status"][1:]})

    eager = state()
    run_steps(step, eager)
    assert int(eager["status"].view(torch.int32)[0]) == 2  # the rows of the corrupted token (step 1)
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError) as raised:
        run_steps(torch.compile(step, fullgraph=True, backend=backend), state())
    message = ("kv-canary: kernel_run_counter (torch.int64) and violation_write_index (torch.int32) are views of "
               "one buffer in two dtypes, and torch.compile's functionalization would lose the writes of one: give "
               "violation_write_index a buffer of its own")
    assert message in error_chain(raised.value)


@pytest.mark.skipif(not torch.__version__.startswith(("2.11.", "2.13.")), reason="a bug seen in torch 2.11, 2.13")
def test_a_state_view_at_an_offset_passed_in_is_written_one_word_off_under_aot_eager():
    """Pins the torch bug docs/EMBEDDING.md warns of (torch 2.11, 2.13): counters passed in as ``status[1:]`` and
    sliced in the step land one word past under ``aot_eager``; Inductor writes the right words."""
    def run(step):
        status = torch.zeros(13, dtype=torch.int64)
        run_steps(step, {**make_state("cpu"), "counters": status[1:]})
        return status

    want = run(serving_step)
    assert int(want[1 + TAG]) > 0  # the slot counter of TAG
    assert torch.equal(run(torch.compile(serving_step, fullgraph=True, backend="inductor")), want)
    torch._dynamo.reset()
    assert torch.equal(run(torch.compile(serving_step, fullgraph=True, backend="aot_eager"))[1:], want[:-1])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_meta_chain_flag_is_ignored_by_a_compiled_verify(backend):
    """Verify ignores the chain flag, but a meta one sent its operator call to the fake, which did nothing."""
    def meta_flag_state():
        s = make_state("cpu")
        s["chain_assert"] = torch.ones(1, dtype=torch.int32, device="meta")
        refill(s, 0)
        return s

    def verify_step(s):
        plan = tc.VerifyPlan(verify_slot_indices=s["v_slots"], verify_expected_tokens=s["v_tokens"],
                             verify_expected_positions=s["v_pos"], verify_prev_slot_indices=s["v_prev"],
                             verify_num_valid=s["v_num"], enable=s["v_enable"])
        tc.launch_canary_verify_kernel(context=step_context(s), plan=plan, check_verify_expected_token=True)

    want = meta_flag_state()
    want["v_num"].fill_(3)
    verify_step(want)
    got = meta_flag_state()
    got["v_num"].fill_(3)
    torch.compile(verify_step, fullgraph=True, backend=backend)(got)
    assert int(want["counters"][TAG + 6]) == 1
    assert_same_bytes([t for t in got.values() if t.device.type == "cpu"],
                      [t for t in want.values() if t.device.type == "cpu"])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("view", [torch.conj, torch._neg_view])
def test_a_compiled_step_refuses_a_conjugate_or_negative_source(backend, view):
    """The operator refuses them (the launch's check is skipped while Dynamo traces)."""
    def step(s):
        serving_step({**s, "kv": view(s["kv"].view(torch.complex64))})

    s = make_state("cpu")
    refill(s, 0)
    with pytest.raises(Exception) as raised:
        torch.compile(step, fullgraph=True, backend=backend)(s)
    chain = error_chain(raised.value)
    assert any(text.startswith("kv-canary: RealKvSource.tensor must not be a conjugate") for text in chain), chain


def test_reduce_overhead_replays_with_refilled_inputs():
    require("cuda")
    want = run_steps(serving_step, make_state("cuda"), steps=4)
    s = make_state("cuda")
    for t in s.values():  # state lives at fixed addresses, so the CUDA graph may mutate it
        torch._dynamo.mark_static_address(t)
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(serving_step, fullgraph=True, mode="reduce-overhead")
    got = run_steps(compiled, s, steps=4)  # steps 0-1 warm up and record, 2-3 replay
    assert not torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    assert_same_bytes(got, want)


@pytest.mark.parametrize(("field", "wrong"), [("kernel_kind", 2.0), ("kernel_kind", "x"), ("page_size", 1.0)])
def test_a_wrong_argument_raises_its_error_from_a_compiled_step(field, wrong):
    """A non-int for an int raises the eager error from the compiled function (torch 2.11's Dynamo made
    operator.index's TypeError an internal error); with fullgraph=True, in Dynamo's Unsupported's chain."""
    s = make_state("cpu")
    shown = f"{type(wrong).__name__} {wrong!r}" if isinstance(wrong, float) else type(wrong).__name__  # SPEC 4
    message = f"^kv-canary: (RealKvSource.)?{field} must be an int, got {shown}$"
    with pytest.raises(TypeError, match=message):
        step_context(s, **{field: wrong})
    with pytest.raises(TypeError, match=message):
        torch.compile(step_context, backend="eager")(s, **{field: wrong})
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported) as raised:
        torch.compile(step_context, fullgraph=True, backend="eager")(s, **{field: wrong})
    chain = error_chain(raised.value)
    assert any("kv-canary: " in text and field in text for text in chain), chain


def test_a_wrong_shape_prints_its_numbers_from_a_step_with_dynamic_sizes():
    """A shape in an error raised while torch.compile traces symbolic sizes prints as eagerly (it printed
    the symbols: ``got shape (1, s56)``); fullgraph=True, so the error is the one raised tracing."""
    s = make_state("cpu")
    refill(s, 0)
    s["ids"] = s["ids"].view(1, -1).clone()
    message = f"kv-canary: input_ids must be 1-D, got shape (1, {TOKENS})"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        serving_step(s)
    for name in ("ids", "pos", "ocl"):
        torch._dynamo.maybe_mark_dynamic(s[name], s[name].dim() - 1)
    with pytest.raises(torch._dynamo.exc.Unsupported) as raised:
        torch.compile(serving_step, fullgraph=True, backend="eager")(s)
    chain = error_chain(raised.value)
    assert any(message in text for text in chain), chain
