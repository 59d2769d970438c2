"""Tuning workloads: size buckets, their stand-in functions, and valid inputs with expected outputs.

A workload is (kernel, bucket). Buckets are static sizes: verify ``(entries,)`` in NONE mode and
``(entries, mode)`` with two real-KV sources of 256 bytes per token folded in ``RealKvHashMode``
``mode`` (PARTIAL or ALL); write ``(requests, tokens per request)``, plan ``(bs, prefix)``, scatter
``(bs, tokens)``. A bucket's *mode* (``mode_of``) must match a launch's for its geometry to apply;
within a mode the nearest size wins. Write, plan and scatter are tuned in their NONE / no-check
specialization, whose geometry serves all of theirs.
"""

from __future__ import annotations

import dataclasses

import torch
from tvm.script import tirx as T

import tvm_canary as tc
from tvm_canary import reference
from tvm_canary.consts import RealKvHashMode
from tvm_canary.reference.hashing import mix3_t, real_kv_fold_t
from tvm_canary.runtime import packing

PRESETS = {
    "ci": {"verify": [(1024,), (1024, 2)], "write": [(8, 16)], "plan": [(8, 16)], "scatter": [(8, 16)]},
    "cpu": {"verify": [(4096,), (262144,)], "write": [(256, 1), (1, 8192)], "plan": [(64, 512)], "scatter": [(64, 512)]},
    "gpu": {
        "verify": [(n,) for n in (4096, 1 << 20, 1 << 24)] + [(n, m) for m in (1, 2) for n in (4096, 1 << 20, 1 << 24)],
        "write": [(4096, 1), (1, 32768)],
        "plan": [(4096, 2048)],
        "scatter": [(4096, 1024)],
    },
}
KERNELS = ("plan", "scatter", "verify", "write")
KV_SOURCES, KV_BYTES = 2, 256  # real-KV sources of folded verify buckets


def mode_of(kernel: str, bucket: tuple) -> int:
    """The bucket's RealKvHashMode (verify; 0 = NONE for every other kernel)."""
    return bucket[1] if kernel == "verify" and len(bucket) > 1 else 0


def tuned_spec(kernel: str, bucket: tuple) -> tuple:
    """The specialization a workload is compiled in: no input checks, sources folded per its mode."""
    return {
        "verify": (KV_SOURCES if mode_of(kernel, bucket) else 0, False), "write": (0, False),
        "plan": (False, False), "scatter": (),
    }[kernel]


def descriptor(kernel: str, bucket: tuple):
    """The schedulable stand-in of a workload: one block ``canary``; one buffer per bucket dimension
    (its length), so each (kernel, bucket) is its own MetaSchedule workload."""
    n = bucket[0]
    m = bucket[1] if len(bucket) > 1 else 0

    if m:

        @T.prim_func(s_tir=True)
        def main(x: T.Buffer((n,), "int64"), y: T.Buffer((m,), "int64")):
            T.func_attr({"canary.kernel": kernel, "canary.bucket": list(bucket)})
            for i in range(n):
                with T.sblock("canary"):
                    vi = T.axis.spatial(n, i)
                    T.reads(x[vi], y[0])
                    T.writes(x[vi])
                    x[vi] = x[vi] + y[0]

        return main

    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((n,), "int64")):
        T.func_attr({"canary.kernel": kernel, "canary.bucket": list(bucket)})
        for i in range(n):
            with T.sblock("canary"):
                vi = T.axis.spatial(n, i)
                T.reads(x[vi])
                T.writes(x[vi])
                x[vi] = x[vi]

    return main


def bucket_of(func) -> tuple:
    """The bucket a stand-in function was made for (inverse of ``descriptor``)."""
    return tuple(int(x) for x in func.attrs["canary.bucket"])


class Case:
    """Valid inputs of one launch, a snapshot to reset them, and the reference's outputs."""

    def __init__(self, kernel: str, call_kwargs: dict):
        self.kernel = kernel
        self.kwargs = call_kwargs
        _, _, self.args = getattr(packing, f"{kernel}_call")(**call_kwargs)
        self.tensors = [a for a in self.args if isinstance(a, torch.Tensor)]
        self.initial = [t.clone() for t in self.tensors]
        ref_kwargs = _copy(call_kwargs)  # the reference runs on the same device, on copies
        getattr(reference, _REFERENCE[kernel])(**ref_kwargs)
        _, _, ref_args = getattr(packing, f"{kernel}_call")(**ref_kwargs)
        self.expected = [a for a in ref_args if isinstance(a, torch.Tensor)]

    def reset(self) -> None:
        for t, t0 in zip(self.tensors, self.initial):
            t.copy_(t0)

    def matches(self) -> bool:
        """Outputs equal the reference byte for byte (plan scratch and verify tails excluded)."""
        got, want = self.tensors, self.expected
        skip = _UNCHECKED[self.kernel]
        return all(torch.equal(g, w.to(g.device)) for i, (g, w) in enumerate(zip(got, want)) if i not in skip)


_REFERENCE = {"verify": "canary_verify_ref", "write": "canary_write_ref", "plan": "canary_plan_ref", "scatter": "scatter_req_token_ids_ref"}
# Tensor positions (among the call's tensors) that are scratch: the ring's chunk marks, plan offsets.
_UNCHECKED = {"verify": {11}, "write": {14}, "plan": {16}, "scatter": set()}


def _copy(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _copy(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_copy(v) for v in obj)
    return obj


def _context(num_slots: int, device) -> tc.VerifyOrWriteContext:
    return tc.VerifyOrWriteContext(
        canary_buf=torch.zeros(num_slots, 32, dtype=torch.uint8, device=device),
        kernel_kind=tc.CanaryLaunchTag.TAIL_K_FULL,
        violation_ring=torch.zeros(64, 8, dtype=torch.int64, device=device),
        violation_write_index=torch.zeros(1, dtype=torch.int32, device=device),
        slot_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        kernel_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        real_kv_sources=(),
        real_kv_hash_mode=RealKvHashMode.NONE,
        enable_chain_position_assert=torch.ones(1, dtype=torch.int32, device=device),
    )


def make_case(kernel: str, bucket: tuple, device) -> Case:
    gen = torch.Generator().manual_seed(0)
    return Case(kernel, _BUILDERS[kernel](bucket, device, gen))


def _verify_kwargs(bucket, device, gen):
    """A clean canary of chains over random slots (real-KV fields folded from random K/V pools in
    the bucket's mode); entries in random order, chain-checked."""
    n, mode = bucket[0], mode_of("verify", bucket)
    length = 64
    chains = -(-n // length)
    slots = (torch.randperm(2 * chains * length, generator=gen)[: chains * length] + 1).view(chains, length).to(device)
    toks = torch.randint(0, 150000, (chains, length), generator=gen).to(device)
    num_slots = 2 * chains * length + 1
    words = torch.zeros(num_slots, 4, dtype=torch.int64, device=device)
    h = torch.full((chains,), tc.consts.to_signed_int64(tc.consts.ANCHOR_HASH), dtype=torch.int64, device=device)
    for p in range(length):
        words[slots[:, p], 0] = toks[:, p]
        words[slots[:, p], 1] = p
        words[slots[:, p], 2] = h
        h = mix3_t(h, toks[:, p], torch.full_like(h, p))
    ctx = _context(num_slots, device)
    if mode:
        kv_gen = torch.Generator(device=device).manual_seed(1)  # 16 GB at 16M entries: drawn on the device
        kv = torch.randint(-(2**62), 2**62, (KV_SOURCES * num_slots, KV_BYTES // 8), generator=kv_gen, device=device)
        sources = tuple(tc.RealKvSource(tensor=part, page_size=1, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES)
                        for part in kv.view(torch.uint8).chunk(KV_SOURCES))
        ctx = dataclasses.replace(ctx, real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode(mode))
        for first in range(0, num_slots, 1 << 20):  # chunks: the reference's gather is 2 KB of indices per slot
            chunk = torch.arange(first, min(first + (1 << 20), num_slots), device=device)
            words[chunk, 3] = real_kv_fold_t(sources, RealKvHashMode(mode), chunk)
    ctx.canary_buf.copy_(words.view(torch.uint8).view(-1, 32))
    pick = torch.randperm(chains * length, generator=gen)[:n].to(device)
    r, p = pick // length, pick % length
    plan = tc.VerifyPlan.allocate(verify_capacity=n, device=device)
    plan.verify_slot_indices.copy_(slots[r, p])
    plan.verify_prev_slot_indices.copy_(torch.where(p > 0, slots[r, (p - 1).clamp(min=0)], -1))
    plan.verify_expected_positions.copy_(p)
    plan.verify_expected_tokens.copy_(toks[r, p])
    plan.verify_num_valid.fill_(n)
    return dict(context=ctx, plan=plan, check_verify_expected_token=False)


def _write_kwargs(bucket, device, gen):
    reqs, length = bucket
    n = reqs * length
    ctx = _context(2 * n + 1, device)
    plan = tc.WritePlan.allocate(write_req_capacity=reqs, device=device)
    plan.write_offsets.copy_(torch.arange(reqs + 1) * length)
    plan.write_seed_slot_indices.fill_(-1)
    plan.write_num_valid_reqs.fill_(reqs)
    return dict(
        context=ctx, plan=plan, input_ids=torch.randint(0, 150000, (n,), generator=gen).to(device),
        positions=torch.arange(length).repeat(reqs).to(device),
        out_cache_loc=(torch.randperm(2 * n, generator=gen)[:n] + 1).to(device),
        enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None,
    )


def _plan_kwargs(bucket, device, gen):
    bs, prefix = bucket
    total = bs * prefix
    return dict(
        verify_plan_out=tc.VerifyPlan.allocate(verify_capacity=total, device=device),
        write_plan_out=tc.WritePlan.allocate(write_req_capacity=bs, device=device),
        req_pool_indices=torch.arange(1, bs + 1, device=device), prefix_lens=torch.full((bs,), prefix, device=device),
        extend_seq_lens=torch.ones(bs, dtype=torch.int64, device=device),
        req_to_token=torch.randint(1, 1 << 24, (bs + 1, prefix + 1), generator=gen, dtype=torch.int32).to(device),
        swa_window_size=0, full_to_swa_index_mapping=None, verify_capacity=total, req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None, kv_token_id_vs_position_offset=0,
    )


def _scatter_kwargs(bucket, device, gen):
    bs, length = bucket
    return dict(
        flat_in=torch.randint(0, 150000, (bs * length,), generator=gen).to(device),
        offsets=(torch.arange(bs + 1) * length).to(device),
        req_pool_indices=(torch.randperm(bs, generator=gen) + 1).to(device),
        pool_out=torch.zeros(bs + 1, length, dtype=torch.int32, device=device),
    )


_BUILDERS = {"verify": _verify_kwargs, "write": _write_kwargs, "plan": _plan_kwargs, "scatter": _scatter_kwargs}
