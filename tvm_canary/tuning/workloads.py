"""Tuning workloads: size buckets, their stand-in functions, and valid inputs with expected outputs.

A workload is (kernel, bucket). Buckets are static sizes: verify ``(entries,)`` in NONE mode and ``(entries, mode)``
with two real-KV sources of 256 bytes per token folded in ``RealKvHashMode`` ``mode`` (PARTIAL or ALL); write
``(requests, tokens per request)`` in NONE mode and ``(requests, tokens per request, mode)`` with the same two
sources; plan ``(bs, prefix)``, scatter ``(bs, tokens)``. A launch takes the nearest bucket of its *mode*
(``mode_of``) and size class, else its default (``apply.tuned_geometry``). Verify and write are tuned without input
checks, plan and scatter in their no-LUT / no-pool specialization, whose geometry serves all of theirs. Write's
real-KV modes have own buckets as its fold blocks run beside the chains: a geometry tuned on NONE chains alone slowed
ALL 64 x 512 by 15% on the H200 (docs/TUNING.md).

Every workload carries the *kernel hash* of the code it was tuned for (``kernel_hash``), so records of a kernel changed
since are recognised and ignored (``tuning.apply``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib

import torch
import tvm_ffi

import tvm_canary as tc
from tvm_canary import reference
from tvm_canary._consts import ANCHOR_HASH, to_signed_int64
from tvm_canary.cases import clean_context
from tvm_canary.consts import RealKvHashMode
from tvm_canary.geometry import Geometry
from tvm_canary.reference.hashing import mix3_t, real_kv_fold_t
from tvm_canary.runtime import compile as C
from tvm_canary.runtime import packing
from tvm_canary.runtime.specializations import launch_mode, spec, spec_id
from tvm_canary.runtime.targets import default_geometry

PRESETS = {
    "ci": {"verify": [(1024,), (1024, 2)], "write": [(8, 16)], "plan": [(8, 16)], "scatter": [(8, 16)]},
    "cpu": {"verify": [(4096,), (262144,)], "write": [(256, 1), (1, 8192)] + [(256, 1, m) for m in (1, 2)],
            "plan": [(64, 512)], "scatter": [(64, 512)]},
    # One bucket per size class the benchmarks time (verify 1K-16M entries: 1K/4K, 64K, 1M/4M, 16M; write
    # 4096 x 1, 64 x 512, 1 x 32768; scatter bs 256 and 4096): a geometry tuned at 4K entries alone ran 64K
    # 1.14x slower than the default on the H200 (docs/PERFORMANCE.md as of `50ab4ae`, 8th session), and
    # scatter's bs-4096 pick (3% faster there) ran bs 256 1.034x slower (the 18th session's run).
    "gpu": {
        "verify": [(n, *m) for m in ((), (1,), (2,)) for n in (4096, 1 << 16, 1 << 20, 1 << 24)],
        "write": [(r, n, *m) for m in ((), (1,), (2,)) for r, n in ((4096, 1), (64, 512), (1, 32768))],
        "plan": [(4096, 2048)],
        "scatter": [(256, 1024), (4096, 1024)],
    },
}
KV_SOURCES, KV_BYTES = 2, 256  # real-KV sources of the folded (real-KV mode) verify and write buckets
# On a GPU a case's slots are scattered over a pool of this many slots, as in a serving engine's and the
# benchmarks' (1 GB of canary): slots packed into a small pool would sit in L2, tuning a geometry for a memory
# the launches do not see (less on a small GPU: ``pool_universe``).
GPU_POOL_SLOTS = 1 << 25
CASE_COPIES = 3  # a case's tensors are held three times: the inputs, their snapshot, the reference's copy
# Where a bucket holds its RealKvHashMode (after its sizes); kernels not named here have none.
MODE_AT = {"verify": 1, "write": 2}


def mode_of(kernel: str, bucket: tuple) -> int:
    """The bucket's RealKvHashMode (verify and write; 0 = NONE, and for every other kernel)."""
    at = MODE_AT.get(kernel)
    return bucket[at] if at is not None and len(bucket) > at else 0


def point_of(kernel: str, bucket: tuple):
    """The workload point (``packing.KernelCall.size``) of a launch of the bucket's size, as the benchmark and
    the tuner's case launch it: write's request capacity and tokens per request (``packing.write_point``), every
    other kernel's leading size."""
    return tuple(bucket[:2]) if kernel == "write" else bucket[0]


def default_of(kernel: str, bucket: tuple, target: str) -> Geometry:
    """The default geometry (``targets.default_geometry``; ``target`` a tag or kind) of a launch in the
    bucket: its mode and size."""
    return default_geometry(kernel, target, mode_of(kernel, bucket), point_of(kernel, bucket))


def tuned_spec(kernel: str, bucket: tuple) -> tuple:
    """The specialization a workload is compiled in: no input checks, sources folded per its mode, each source's
    fold word count passed at launch (``fold_words`` 0: the kernel whose hash keys the records; an ALL launch
    building its count in runs the same bucket's geometry)."""
    mode = mode_of(kernel, bucket)
    sources = KV_SOURCES if mode else 0
    partial = mode == int(RealKvHashMode.PARTIAL)
    return {
        "verify": lambda: spec("verify", num_sources=sources, partial=partial, check_token=False, fold_words=0),
        "write": lambda: spec("write", num_sources=sources, partial=partial, input_assert=False, fold_words=0),
        "plan": lambda: spec("plan", has_lut=False, has_pool=False),
        "scatter": lambda: spec("scatter"),
    }[kernel]()


# The geometries the kernel hash is taken in: a fixed reference geometry (not the hand-tuned defaults), so only a change
# of the kernel's TensorIR changes the hash, with every value of the knobs choosing between code paths rather than
# sizing them: ``thin`` (CUDA's small-launch grid, ``kernels.common.work_grid``) and, where sources are folded,
# ``pairs`` (``specializations.launch_mode``). Each is a tuning knob, so records are measured on each path.
_HASH_GEOMETRIES = {
    "cuda": tuple(Geometry(gpu=True, blocks=264, threads=128, tile=256, unroll=4, min_blocks=1, thin=t, pairs=p)
                  for t in (0, 1) for p in (0, 1, 2)),
    "llvm": tuple(Geometry(gpu=False, unroll=4, pairs=p) for p in (0, 1)),
}
# Names how hashes are computed in the remembered tables' file names (``kernel_hash``): a table of an earlier
# way is not read. 2: both fold forms (13th session); 3: thin and pairs 2 too.
_HASH_METHOD = 3
# The version of a kernel's tuning case (``make_case``) where it changed since its records were first kept:
# records timed on another case are stale (``apply.measured_records``), so a tune on top of a database never
# ranks records of two cases together. Verify 2: two launches of the bucket's size each (before, of half of it
# each); 3: each launch timed alone, a record's times per launch (``measure.run_case``; before, one time per
# pass over both), and held (below). Write, plan, scatter 2: GPU replays timed held (``timing.HOLD_CYCLES``;
# before, a replay's time also held the host's submission of its graph, about 1 µs per launch of a few µs: not
# comparable). The CPU's timing did not change, but its records carry the same versions (a version is the
# kernel's, not the target's).
CASE_VERSIONS = {"verify": 3, "write": 2, "plan": 2, "scatter": 2}
# Launches of a kernel's tuning case (``make_case``; 1 where not named): a record's ``run_secs`` hold
# one time per launch per repeat (``apply.launch_seconds``).
CASE_LAUNCHES = {"verify": 2}
_IGNORED_ATTRS = ("tirx.is_scheduled",)  # says how the function may be scheduled further; no effect on its code


def kernel_hash(kernel: str, bucket: tuple, target_kind: str) -> str:
    """Hash of what a workload's records were measured on: the code it tunes and, where the kernel's case
    changed since records were first kept (``CASE_VERSIONS``), the case. The code's hash: the structural hash
    (16 hex digits) of the TensorIR of ``kernels.<kernel>.make(*tuned_spec(kernel, bucket), geometry)`` for the
    target kind (``cuda`` or ``llvm``) in fixed reference geometries, one per code path the knobs choose
    (``_HASH_GEOMETRIES``), less attributes not shaping the generated code (``tirx.is_scheduled``); if they give
    different TensorIR, the SHA-256 (16 hex digits) of the distinct structural hashes in order. Renaming Python
    helpers, naming constants or reformatting the kernel source leaves it unchanged; changing the TensorIR any
    path builds (so maybe the generated code) changes it. Computing it parses the kernel (about a second a
    path), so code hashes are remembered per ``compile.source_hash()`` in the kernel cache folder."""
    return _with_case(code_hash(kernel, bucket, target_kind), CASE_VERSIONS.get(kernel))


def earlier_case_hashes(kernel: str, bucket: tuple, target_kind: str) -> set[str]:
    """The hashes ``kernel_hash`` gave the current code on the kernel's earlier tuning cases (every version
    before ``CASE_VERSIONS``'s; the first case's is the code's hash alone)."""
    code = code_hash(kernel, bucket, target_kind)
    return {_with_case(code, v) for v in range(1, CASE_VERSIONS.get(kernel, 1))}


def _with_case(code: str, version: int | None) -> str:
    """A code hash with the tuning case's version (``kernel_hash``): the code's hash alone for the first
    case (``None`` or 1), else the SHA-256 (16 hex digits) of both."""
    if version is None or version == 1:
        return code
    return hashlib.sha256(f"{code} case {version}".encode()).hexdigest()[:16]


def code_hash(kernel: str, bucket: tuple, target_kind: str) -> str:
    """The hash of the code a workload tunes (``kernel_hash`` without the case), remembered per
    ``compile.source_hash()``."""
    kernel_spec = tuned_spec(kernel, bucket)
    path = C.cache_dir() / "kernel-hashes" / f"structural{_HASH_METHOD}-{C.source_hash()}.json"
    table = _hash_table(path)
    name = f"{kernel}/{spec_id(kernel_spec)}/{target_kind}"
    if name not in table:
        table[name] = _script_hash(kernel, kernel_spec, target_kind)
        try:  # a memo only: a read-only cache (prebuilt modules) computes the hash again next time
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass
    return table[name]


@functools.lru_cache(maxsize=None)
def _hash_table(path: pathlib.Path) -> dict:
    """The kernel hashes remembered in ``path`` (``{kernel/spec/target kind: hash}``); none if it is missing or
    unreadable (computed again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _script_hash(kernel: str, kernel_spec: tuple, target_kind: str) -> str:
    folds = launch_mode(kernel, kernel_spec) != 0
    from tvm_canary.runtime.parse import kernel_ir  # the TVMScript parser: compiler hosts only

    hashes = []
    for geom in _HASH_GEOMETRIES[target_kind]:
        if geom.pairs and not folds:
            continue  # pairs shapes only the folds
        func = kernel_ir(kernel, kernel_spec, geom)
        for attr in _IGNORED_ATTRS:
            func = func.without_attr(attr)
        # The structural hash, not a hash of func.script(): the TVMScript printer's text differs between Python
        # versions (3.11 prints TypeVar lines 3.12 does not), the IR's structure does not.
        hashes.append(f"{tvm_ffi.structural_hash(func):016x}")
    distinct = list(dict.fromkeys(hashes))
    if len(distinct) == 1:  # the knobs choose no other TensorIR (plan, scatter)
        return distinct[0]
    return hashlib.sha256(" ".join(distinct).encode()).hexdigest()[:16]


def descriptor(kernel: str, bucket: tuple, target_kind: str):
    """The schedulable stand-in of a workload for a target kind (``cuda`` or ``llvm``): one block ``canary``;
    one buffer per bucket dimension (its length: ``x``, ``y``, ``z``), so each (kernel, bucket) is its own
    MetaSchedule workload whose argument shapes give the bucket (``measure.alloc_bucket``); attributes name the
    kernel, the bucket and the kernel hash."""
    from tvm.script.ir_builder import IRBuilder  # TVMScript's builder: compiler hosts only
    from tvm.script.ir_builder import tirx as Tb

    assert len(bucket) < 3 or bucket[2] in (1, 2), f"{bucket}: a write bucket's mode is PARTIAL or ALL (NONE has none)"
    attrs = {"canary.kernel": kernel, "canary.bucket": list(bucket),
             "canary.kernel_hash": kernel_hash(kernel, bucket, target_kind)}
    n = bucket[0]
    with IRBuilder() as builder:
        with Tb.prim_func(s_tir=True):
            Tb.func_name("main")
            x, *rest = (Tb.arg(name, Tb.buffer((size,), "int64")) for name, size in zip("xyz", bucket))
            Tb.func_attr(attrs)
            with Tb.serial(n) as i:
                with Tb.sblock("canary"):
                    vi = Tb.axis.spatial(n, i)
                    Tb.reads([x[vi], *(b[0] for b in rest)])
                    Tb.writes([x[vi]])
                    value = x[vi]
                    for b in rest:
                        value = value + b[0]
                    Tb.buffer_store(x, value, [vi])
    return builder.get()


def bucket_of(func) -> tuple:
    """The bucket a stand-in function was made for (inverse of ``descriptor``)."""
    return tuple(int(x) for x in func.attrs["canary.bucket"])


def workload_kernel_hash(func) -> str | None:
    """The kernel hash a stand-in function carries (None for workloads written before hashes)."""
    value = func.attrs.get("canary.kernel_hash") if func.attrs is not None else None
    return None if value is None else str(value)


class Case:
    """Valid inputs of the launches a candidate is timed on (one, or verify's two, sharing their context and run
    in order), a snapshot to reset them, and the reference's outputs after them all."""

    def __init__(self, kernel: str, launch_kwargs: list[dict]):
        self.kernel = kernel
        calls = [packing.CALLS[kernel](**kwargs) for kwargs in launch_kwargs]
        self.launches = [call.args for call in calls]
        # Each region of memory once: the launches' views of their shared context are new tensor objects over
        # the same bytes (at 16M ALL entries, 16 GB of K/V sources), snapshot and compared once.
        regions = {}
        for n, call in enumerate(calls):
            for i, a in enumerate(call.args):
                if isinstance(a, torch.Tensor):
                    regions.setdefault((a.data_ptr(), a.numel() * a.element_size()), (n, i, a, i in call.scratch))
        # (launch, argument position, tensor) of every result tensor: scratch is not part of the result
        self.tensors = [(n, i, a) for n, i, a, scratch in regions.values() if not scratch]
        self.initial = {key: (a, a.clone()) for key, (_, _, a, _) in regions.items()}
        ref_launches = _copy(launch_kwargs, {})  # the reference runs on the same device, on copies
        for kwargs in ref_launches:
            reference.REFERENCE[kernel](**kwargs)
        self.expected = [packing.CALLS[kernel](**kwargs).args for kwargs in ref_launches]

    def reset(self) -> None:
        for a, a0 in self.initial.values():
            a.copy_(a0)

    def matches(self) -> bool:
        """Every result tensor equals the reference's byte for byte (scratch excluded)."""
        return all(torch.equal(t, self.expected[n][i].to(t.device)) for n, i, t in self.tensors)


def _copy(obj, memo: dict):
    """A copy of ``obj`` with every tensor cloned; an object reached twice is copied once (``memo``, by ``id``),
    so launches sharing a context share its copy."""
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        out = obj.clone()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = dataclasses.replace(obj, **{f.name: _copy(getattr(obj, f.name), memo) for f in dataclasses.fields(obj)})
    elif isinstance(obj, dict):
        out = {k: _copy(v, memo) for k, v in obj.items()}
    elif isinstance(obj, (tuple, list)):
        out = type(obj)(_copy(v, memo) for v in obj)
    else:
        return obj
    memo[id(obj)] = out
    return out


def _context(num_slots: int, device) -> tc.VerifyOrWriteContext:
    return clean_context(num_slots, device, kernel_kind=tc.CanaryLaunchTag.TAIL_K_FULL, ring_rows=64, ring_fill=0)


def _with_sources(ctx: tc.VerifyOrWriteContext, mode: int, device) -> tc.VerifyOrWriteContext:
    """``ctx`` folding KV_SOURCES random K/V pools (KV_BYTES per slot each) in ``mode``; unchanged in NONE."""
    if not mode:
        return ctx
    num_slots = ctx.canary_buf.shape[0]
    kv_gen = torch.Generator(device=device).manual_seed(1)  # 16 GB at 16M entries: drawn on the device
    kv = torch.randint(-(2**62), 2**62, (KV_SOURCES * num_slots, KV_BYTES // 8), generator=kv_gen, device=device)
    sources = tuple(tc.RealKvSource(tensor=part, page_size=1, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES)
                    for part in kv.view(torch.uint8).chunk(KV_SOURCES))
    return dataclasses.replace(ctx, real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode(mode))


def pool_universe(scattered: int, device, mode: int) -> int:
    """How many slots the pool of a case with ``scattered`` random slots holds (``_pool_slots``; a verify case's
    consecutive run lies in it too): twice as many, and on a GPU at least ``GPU_POOL_SLOTS``, or as many as fit
    in half its free memory (a slot's canary row, and in a real-KV mode its K/V rows, ``CASE_COPIES`` times)."""
    if device.type != "cuda":
        return 2 * scattered
    slot_bytes = CASE_COPIES * (32 + (KV_SOURCES * KV_BYTES if mode else 0))
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return max(2 * scattered, min(GPU_POOL_SLOTS, free_bytes // 2 // slot_bytes))


def _pool_slots(scattered: int, device, gen, mode: int, consecutive: int = 0) -> tuple[torch.Tensor, int]:
    """(slots, the pool size S = U + 1, U = ``pool_universe(scattered)``): ``scattered`` distinct random slots among
    slots ``consecutive + 1 .. U``, then ``consecutive`` (at most ``scattered``) slots in a row, ``1 .. consecutive``
    (slot 0 stays unused). The run lies inside the pool, so a case holds U + 1 slots whatever its run; where U is
    exactly twice the random slots (on a CPU, and an H200's 16M buckets), the random slots are all of ``consecutive + 1
    .. U`` in random order: a 16M launch reads 512 MB of canary and more of K/V, far beyond L2, dense or not."""
    universe = pool_universe(scattered, device, mode)
    assert consecutive <= scattered <= universe - consecutive, (scattered, consecutive, universe)
    shuffled = torch.randperm(universe - consecutive, generator=gen)[:scattered] + consecutive + 1
    return torch.cat([shuffled, torch.arange(1, consecutive + 1)]).to(device), universe + 1


def make_case(kernel: str, bucket: tuple, device) -> Case:
    gen = torch.Generator().manual_seed(0)
    case = Case(kernel, _BUILDERS[kernel](bucket, device, gen))
    assert len(case.launches) == CASE_LAUNCHES.get(kernel, 1), (kernel, len(case.launches))
    return case


def _verify_kwargs(bucket, device, gen):
    """A clean canary of 64-token chains (real-KV fields folded from random K/V pools in the bucket's mode),
    chain-checked by two launches of the bucket's size: chains on random slots in random order, then on consecutive
    slots in chain order (as a prefill's tokens land in fresh pages): the benchmarks' two orders, each in its own launch
    of the size of the benchmark row the bucket serves (``apply.nearest``), both served by one geometry. Tuned on random
    order alone, the ALL 1M bucket chose a geometry 1.07x slower than the default in chain order on the H200
    (docs/TUNING.md); on one launch holding both halves (9th and 10th sessions), the 11th session's tune picked three
    geometries its case ran 4-13% faster and the benchmark's rows, one of the two orders, 4-9% slower; on two launches
    of half the bucket's size each (11th to 15th sessions), the 15th session's tune picked a NONE 64K geometry of 264 x
    128 threads, one pass over its 32K-entry launches and two over the benchmark's 64K, running the benchmark's rows
    5-7% slower than the default."""
    n, mode = bucket[0], mode_of("verify", bucket)
    length = 64
    chains = -(-n // length)  # per order
    slots, num_slots = _pool_slots(chains * length, device, gen, mode, consecutive=chains * length)
    slots = slots.view(2 * chains, length)  # random-slot chains first, then the consecutive ones
    toks = torch.randint(0, 150000, (2 * chains, length), generator=gen).to(device)
    words = torch.zeros(num_slots, 4, dtype=torch.int64, device=device)
    h = torch.full((2 * chains,), to_signed_int64(ANCHOR_HASH), dtype=torch.int64, device=device)
    for p in range(length):
        words[slots[:, p], 0] = toks[:, p]
        words[slots[:, p], 1] = p
        words[slots[:, p], 2] = h
        h = mix3_t(h, toks[:, p], torch.full_like(h, p))
    ctx = _with_sources(_context(num_slots, device), mode, device)
    if mode:
        flat = slots.flatten()
        words[flat, 3] = real_kv_fold_t(ctx.real_kv_sources, RealKvHashMode(mode), flat)
    ctx.canary_buf.copy_(words.view(torch.uint8).view(-1, 32))
    in_random_order = torch.randperm(chains * length, generator=gen)[:n]
    in_chain_order = torch.arange(chains * length, chains * length + n)
    return [_verify_launch(ctx, slots, toks, pick.to(device)) for pick in (in_random_order, in_chain_order)]


def _verify_launch(ctx, slots, toks, pick):
    """Keyword arguments of a verify launch of the entries ``pick`` (indices into the flattened chains)."""
    length = slots.shape[1]
    r, p = pick // length, pick % length
    plan = tc.VerifyPlan.allocate(verify_capacity=len(pick), device=pick.device)
    plan.verify_slot_indices.copy_(slots[r, p])
    plan.verify_prev_slot_indices.copy_(torch.where(p > 0, slots[r, (p - 1).clamp(min=0)], -1))
    plan.verify_expected_positions.copy_(p)
    plan.verify_expected_tokens.copy_(toks[r, p])
    plan.verify_num_valid.fill_(len(pick))
    return dict(context=ctx, plan=plan, check_verify_expected_token=False)


def _write_kwargs(bucket, device, gen):
    """Requests of ``length`` tokens stamped on random slots, each from the anchor; in a real-KV mode the slots'
    folds come from two random K/V pools."""
    reqs, length = bucket[:2]
    n, mode = reqs * length, mode_of("write", bucket)
    out_cache_loc, num_slots = _pool_slots(n, device, gen, mode)
    ctx = _with_sources(_context(num_slots, device), mode, device)
    plan = tc.WritePlan.allocate(write_req_capacity=reqs, device=device)
    plan.write_offsets.copy_(torch.arange(reqs + 1) * length)
    plan.write_seed_slot_indices.fill_(-1)
    plan.write_num_valid_reqs.fill_(reqs)
    return [dict(
        context=ctx, plan=plan, input_ids=torch.randint(0, 150000, (n,), generator=gen).to(device),
        positions=torch.arange(length).repeat(reqs).to(device),
        out_cache_loc=out_cache_loc,
        enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None,
    )]


def _plan_kwargs(bucket, device, gen):
    bs, prefix = bucket
    total = bs * prefix
    return [dict(
        verify_plan_out=tc.VerifyPlan.allocate(verify_capacity=total, device=device),
        write_plan_out=tc.WritePlan.allocate(write_req_capacity=bs, device=device),
        req_pool_indices=torch.arange(1, bs + 1, device=device), prefix_lens=torch.full((bs,), prefix, device=device),
        extend_seq_lens=torch.ones(bs, dtype=torch.int64, device=device),
        req_to_token=torch.randint(1, 1 << 24, (bs + 1, prefix + 1), generator=gen, dtype=torch.int32).to(device),
        swa_window_size=0, full_to_swa_index_mapping=None, verify_capacity=total, req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None, kv_token_id_vs_position_offset=0,
    )]


def _scatter_kwargs(bucket, device, gen):
    bs, length = bucket
    return [dict(
        flat_in=torch.randint(0, 150000, (bs * length,), generator=gen).to(device),
        offsets=(torch.arange(bs + 1) * length).to(device),
        req_pool_indices=(torch.randperm(bs, generator=gen) + 1).to(device),
        pool_out=torch.zeros(bs + 1, length, dtype=torch.int32, device=device),
    )]


# Each returns the keyword arguments of the case's launches, a list.
_BUILDERS = {"verify": _verify_kwargs, "write": _write_kwargs, "plan": _plan_kwargs, "scatter": _scatter_kwargs}
