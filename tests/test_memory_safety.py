"""Memory safety of the compiled kernels on garbage plans (SPEC D4).

Each launch tensor (but read-only RealKvSource ones) is re-homed between random-byte guard bands (same shape, dtype,
contiguity) at a random multiple of its promised alignment, mostly not 16-byte aligned (``cases.rehome``). Garbage cases
(``valid=False``: huge and negative indices, inconsistent offsets, bad counts) run via the public API, tvm backend: no
crash or raise, guard bands and inputs unchanged.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from tvm_canary import checks, ops
from tvm_canary.cases import (
    CASES,
    GARBAGE_SEED_BASE,
    LAUNCH,
    REFERENCE,
    Guarded,
    guard_violations,
    guarded_case,
    promised_alignment,
    raw_bytes,
    reference_launch,
    rehome,
    settle_scatter_races,
)
from tvm_canary.runtime import use_backend

from tree import assert_same_bytes, devices, require, tensors

ITERATIONS = {"cpu": 40, "cuda": 200}


def launch_guarded(kernel: str, device: str, kw: dict, guarded, inputs) -> list[str]:
    """Launch ``kernel`` (tvm backend) on a ``guarded_case``; returns its guard-band violations."""
    with use_backend("tvm"):
        LAUNCH[kernel](**kw)
    if device == "cuda":
        torch.cuda.synchronize()
    return guard_violations(guarded, inputs)


def run_guarded(kernel: str, device: str, seed: int) -> None:
    bad = launch_guarded(kernel, device, *guarded_case(kernel, device, seed))
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kernel", list(CASES))
def test_garbage_plans_stay_in_bounds(kernel, device):
    require(device)
    for seed in range(GARBAGE_SEED_BASE, GARBAGE_SEED_BASE + ITERATIONS[device]):
        try:
            run_guarded(kernel, device, seed)
        except Exception as e:
            raise AssertionError(f"{kernel} on {device}, seed {seed}: {type(e).__name__}: {e}") from e


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kernel", list(CASES))
def test_garbage_plans_match_reference(kernel, device):
    """Garbage plans (docs/SEMANTICS.md) give the reference's bytes; LUT indices past the end (the
    reference rejects them) its bytes on SPEC D4's clamped indices. Scatter elements written by several
    rows may hold any of their values."""
    require(device)
    for seed in range(GARBAGE_SEED_BASE, GARBAGE_SEED_BASE + ITERATIONS[device]):
        want = CASES[kernel](torch.Generator().manual_seed(seed), "cpu", valid=False)
        got = CASES[kernel](torch.Generator().manual_seed(seed), device, valid=False)
        reference_launch(kernel, want)
        with use_backend("tvm"):
            LAUNCH[kernel](**got)
        try:
            if kernel == "scatter":
                settle_scatter_races(got, want)
            assert_same_bytes(tensors(got), tensors(want))
        except AssertionError as e:
            raise AssertionError(f"{kernel} on {device}, seed {seed}: {e}") from e


def test_rehome_keeps_layout_and_detects_stray_writes():
    """Harness self-test: views keep shape/dtype/contiguity at their promised (often not 16-byte)
    alignment; a write one element past a view shows in its guard band."""
    gen = torch.Generator().manual_seed(0)
    case = CASES["write"](gen, "cpu", valid=False)
    guarded: list[Guarded] = []
    kw = rehome(case, "", torch.Generator().manual_seed(1), guarded)
    for old, new in zip(tensors(case), tensors(kw)):
        if any(new is s.tensor for s in case["context"].real_kv_sources):
            assert new is old
            continue
        assert new.dtype == old.dtype and new.shape == old.shape and new.is_contiguous()
        assert new.data_ptr() != old.data_ptr() and torch.equal(new, old)
    assert {g.name for g in guarded} >= {"context.canary_buf", "plan.write_offsets", "input_ids"}
    assert all(g.view.data_ptr() % promised_alignment(g.view) == 0 for g in guarded)
    assert any(g.view.data_ptr() % 16 for g in guarded)
    g = next(g for g in guarded if g.name == "context.violation_ring")
    flat = g.backing.view(torch.uint8)
    flat[g.start + g.nbytes] ^= 0xFF
    assert not torch.equal(g.backing[g.start + g.nbytes :], g.tail)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_a_wrapped_write_index_drops_the_rows_before_the_ring(kernel, device):
    """A write index past 2**31 - 1 wraps negative (SPEC 2, D4): rows before the ring are dropped like
    rows past its capacity; the index advances by the rows counted. Guarded garbage cases starting before
    the ring, at -2**31 and before the wrap give the reference's bytes."""
    require(device)
    for seed in range(GARBAGE_SEED_BASE, GARBAGE_SEED_BASE + ITERATIONS[device] // 4):
        for start in (-3, -(2**31), 2**31 - 2):
            want = CASES[kernel](torch.Generator().manual_seed(seed), "cpu", valid=False)
            got, guarded, inputs = guarded_case(kernel, device, seed)
            for case in (want, got):
                case["context"].violation_write_index.fill_(start)
            REFERENCE[kernel](**want)
            bad = launch_guarded(kernel, device, got, guarded, inputs)
            try:
                assert not bad, "; ".join(bad)
                assert_same_bytes(tensors(got), tensors(want))
            except AssertionError as e:
                raise AssertionError(f"{kernel} on {device}, seed {seed}, write index {start}: {e}") from e


# -- overlapping arguments (SPEC D10)


def with_tensor(obj, path: list, tensor: torch.Tensor):
    """``obj`` (launch keywords, a dataclass or a tuple) with ``tensor`` at ``path`` (the keys, fields and
    indices of a ``checks.launch_tensors`` name)."""
    if not path:
        return tensor
    step, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {**obj, step: with_tensor(obj[step], rest, tensor)}
    if isinstance(obj, tuple):
        return tuple(with_tensor(x, rest, tensor) if i == step else x for i, x in enumerate(obj))
    return dataclasses.replace(obj, **{step: with_tensor(getattr(obj, step), rest, tensor)})


def path_of(name: str) -> list:
    """``context.real_kv_sources[0].tensor`` -> ["context", "real_kv_sources", 0, "tensor"]."""
    return [int(part) if part.isdigit() else part for part in re.split(r"[.\[\]]+", name) if part]


def overlapping(kernel: str, kw: dict, written: str, other: str) -> dict:
    """``kw`` (a launch of ``kernel``) with its tensors ``written`` and ``other`` (names from
    ``checks.launch_tensors``) moved to one storage, both starting at its first byte."""
    tensors_by_name = {name: t for named in checks.launch_tensors(kernel, kw) for t, name in named}
    a, b = tensors_by_name[written], tensors_by_name[other]
    storage = torch.zeros(max(a.nbytes, b.nbytes), dtype=torch.uint8, device=a.device)
    for name, t in ((written, a), (other, b)):
        kw = with_tensor(kw, path_of(name), storage[: t.nbytes].view(t.dtype).view(t.shape))
    return kw


@pytest.mark.parametrize("kernel", list(CASES))
def test_a_written_tensor_overlapping_another_argument_is_refused(kernel):
    """A written tensor sharing storage with another: the launch raises SPEC D10's error naming both, on
    each backend and via the operator, before any write."""
    base = CASES[kernel](torch.Generator().manual_seed(11), "cpu")
    written, read = checks.launch_tensors(kernel, base)
    pairs = [(w, o) for i, (wt, w) in enumerate(written) for ot, o in written[i + 1:] + read
             if wt.numel() and ot.numel()]
    assert len(pairs) >= len(written)
    for w, o in pairs:
        kw = overlapping(kernel, base, w, o)
        message = f"kv-canary: {w} shares memory with {o}: a tensor the launch writes must not overlap any other"
        before = [raw_bytes(t) for t in tensors(kw)]
        for backend in ("tvm", "reference"):
            with use_backend(backend), pytest.raises(ValueError, match=re.escape(message)):
                LAUNCH[kernel](**kw)
        with pytest.raises(ValueError, match=re.escape(message)):
            getattr(torch.ops.tvm_canary, kernel)(*getattr(ops, f"{kernel}_args")(**kw))
        assert all(torch.equal(raw_bytes(t), b) for t, b in zip(tensors(kw), before)), (w, o)


def test_a_replayed_write_refuses_step_tensors_inside_its_outputs():
    """A memoised eager write (same context and plan) checks its per-step tensors against the context's
    written tensors each launch: out_cache_loc carved from canary_buf's storage is refused."""
    kw = CASES["write"](torch.Generator().manual_seed(12), "cpu")
    LAUNCH["write"](**kw)  # packs and remembers the launch
    buf = kw["context"].canary_buf
    carved = buf.view(-1)[: kw["out_cache_loc"].nbytes].view(torch.int64)
    with pytest.raises(ValueError, match=re.escape("kv-canary: context.canary_buf shares memory with out_cache_loc")):
        LAUNCH["write"](**{**kw, "out_cache_loc": carved})

    ring = kw["context"].violation_ring  # two overlaps: a replay names the one a first launch names
    both = {**kw, "out_cache_loc": carved, "input_ids": ring.view(-1)[: kw["input_ids"].shape[0]]}
    with pytest.raises(ValueError) as first:
        checks.check_write(**both)
    with pytest.raises(ValueError, match=f"^{re.escape(str(first.value))}$"):
        LAUNCH["write"](**both)


@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_a_one_slot_canary_buffer_may_have_any_row_stride(kernel):
    """A one-slot buffer, contiguous to torch whatever its row stride, is packed with dense rows: the
    reference's bytes (no torch error on a stride not a multiple of 8)."""
    want = CASES[kernel](torch.Generator().manual_seed(5), "cpu")
    got = CASES[kernel](torch.Generator().manual_seed(5), "cpu")
    for kw in (want, got):
        buf = kw["context"].canary_buf[:1]
        odd = torch.zeros(buf.nbytes + 8, dtype=torch.uint8).as_strided(buf.shape, (7, 1))
        odd.copy_(buf)
        kw["context"] = dataclasses.replace(kw["context"], canary_buf=odd)
    REFERENCE[kernel](**want)
    with use_backend("tvm"):
        LAUNCH[kernel](**got)
    assert_same_bytes(tensors(got), tensors(want))


def _packed_call(kernel: str, device: str, wanted: dict):
    """A valid case of ``kernel`` (CASES' first seed whose specialization has the ``wanted`` axis values,
    at least ``num_sources``), packed: (compiled function, arguments by parameter name, names in order)."""
    from tvm_canary.runtime import get_kernel, packing, parse, targets
    from tvm_canary.runtime.specializations import axis_values

    for seed in range(200):
        call = packing.CALLS[kernel](**CASES[kernel](torch.Generator().manual_seed(seed), device))
        axes = axis_values(kernel, call.spec)
        if all(axes[k] >= v if k == "num_sources" else axes[k] == v for k, v in wanted.items()):
            break
    else:
        raise AssertionError(f"no {kernel} case with {wanted}")
    fn = get_kernel(call.kernel, call.spec, call.device, call.size, call.mode)
    geom = targets.default_geometry(kernel, targets.tag_for(call.device), call.mode, call.size)
    names = [p.name for p in parse.kernel_ir(kernel, call.spec, geom).params]
    return fn, dict(zip(names, call.args)), names


def _shorter(name):
    return lambda a: {name: a[name][:-1]}


# (kernel, the axis values the case needs, the arguments that break one relation, the kernel's message)
KERNEL_REFUSALS = [
    ("verify", {}, lambda a: {"buf": torch.zeros(4, 3, dtype=torch.int64, device=a["buf"].device)},
     "buf rows must hold at least 4 int64 fields"),
    ("verify", {}, lambda a: {"flags": a["flags"][:1]}, "flags is shorter than the launch's marks need"),
    ("verify", {"num_sources": 1}, lambda a: {"ps0": 0}, "ps0 must be at least 1"),
    ("verify", {"num_sources": 1}, lambda a: {"tw0": a["src0"].shape[1] + 1}, "src0 rows must hold ps0 x tw0 words"),
    ("verify", {"num_sources": 1, "partial": True}, lambda a: {"tw0": 1}, "tw0 must hold the fold's words"),
    ("write", {}, lambda a: {"buf": torch.zeros(4, 3, dtype=torch.int64, device=a["buf"].device)},
     "buf rows must hold at least 4 int64 fields"),
    ("write", {}, lambda a: {"flags": a["flags"][:2]}, "flags is shorter than the launch's marks need"),
    ("write", {}, _shorter("offsets"), "offsets must have one entry more than seeds"),
    ("write", {"input_assert": True}, lambda a: {"etoks": a["etoks"][:-1], "epos": a["epos"][:-1]},
     "etoks and epos must have one entry per token"),
    ("write", {"num_sources": 1}, lambda a: {"ps0": 0}, "ps0 must be at least 1"),
    ("plan", {}, _shorter("woff"), "woff must have one entry more than wseeds"),
    ("plan", {}, lambda a: {"wseeds": a["wseeds"][: a["rpi"].shape[0] - 1], "woff": a["woff"][: a["rpi"].shape[0]]},
     "the batch (rpi's length) must not exceed the write capacity"),
    ("plan", {}, _shorter("scratch"), "scratch must have one entry more than rpi"),
    ("plan", {"has_lut": True}, lambda a: {"lut": a["lut"][:0]}, "lut must not be empty"),
    ("plan", {"has_pool": True}, _shorter("vlens"), "vlens must have one entry per request"),
    ("scatter", {}, _shorter("offsets"), "offsets must have one entry more than rpi"),
]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kernel, wanted, broken, message", KERNEL_REFUSALS,
                         ids=[f"{k}-{m.split(' ')[0]}" for k, _, _, m in KERNEL_REFUSALS])
def test_compiled_kernels_refuse_arguments_that_break_their_shape_relations(kernel, wanted, broken, message, device):
    """Kernels stay in bounds given the launch checks' shape relations (SPEC 4, D4); a call bypassing the
    checks (Relax, the compiled function) breaking one raises the kernel's ValueError on the host before
    any block runs, changing no byte."""
    require(device)
    fn, args, names = _packed_call(kernel, device, wanted)
    args.update(broken(args))
    before = [t.clone() for t in args.values() if isinstance(t, torch.Tensor)]
    with pytest.raises(ValueError, match=f"^kv-canary: {kernel}: {re.escape(message)}"):
        fn(*(args[name] for name in names))
    assert all(torch.equal(t, b) for t, b in zip((t for t in args.values() if isinstance(t, torch.Tensor)), before))
