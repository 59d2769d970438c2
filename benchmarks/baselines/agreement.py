"""Before a baseline is timed it must give the reference's bytes: ``check(kernel, launch, device)`` runs
``launch`` (keyword arguments of the public launch function, docs/SPEC.md section 0) and the torch
reference on twin copies of small inputs with violations, seeds, skipped and padding entries and
real-KV sources in every mode, and raises ``AssertionError`` naming the first difference.

Compared exactly: canary bytes, plan tensors, pool, counters and ``violation_write_index``. Ring rows
are compared as a sorted set, since the original's kernels (and the baselines) append them in atomic
arrival order (docs/SPEC.md section 3.5); no case overflows the ring.
"""

from __future__ import annotations

import itertools

import torch

import tvm_canary as tc
from tvm_canary import reference
from tvm_canary.consts import RealKvHashMode

SLOTS, KV_BYTES = 16384, 64
MODES = (RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL)


def _context(device, mode, gen):
    kv = torch.randint(-(2**62), 2**62, (2 * SLOTS, KV_BYTES // 8), generator=gen).to(device)
    sources = tuple(tc.RealKvSource(tensor=half, page_size=1, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES)
                    for half in (kv[:SLOTS], kv[SLOTS:]))
    return tc.VerifyOrWriteContext(
        canary_buf=torch.zeros(SLOTS, 32, dtype=torch.uint8, device=device), kernel_kind=tc.CanaryLaunchTag.TAIL_V_FULL,
        violation_ring=torch.zeros(4096, 8, dtype=torch.int64, device=device),
        violation_write_index=torch.zeros(1, dtype=torch.int32, device=device),
        slot_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        kernel_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        real_kv_sources=sources if mode != RealKvHashMode.NONE else (), real_kv_hash_mode=mode,
        enable_chain_position_assert=torch.ones(1, dtype=torch.int32, device=device),
    )


# Write's cases, requests of ``range(*tokens)`` tokens each: 100-399 (a launch of 32 requests' capacity
# with about 180 tokens per request: the long-chain size class of ``schedules.CUDA_SIZE_DEFAULTS`` in
# every mode, ALL's from 128), 8-15 (about 11: PARTIAL's class from 5 tokens, below the long chains'
# in every mode) and 1-3 (about 2 per request: below every class, a decode step's), so each of each
# mode's default geometries is checked.
WRITE_TOKENS = ((100, 400), (8, 16), (1, 4))


def _write_kwargs(context, gen, device, input_assert, tokens):
    """Requests of ``range(*tokens)`` tokens over random distinct slots, some skipped (-1), a few seeded by
    slots stamped earlier; with the input assert, a few tokens and positions disagree."""
    lengths = torch.randint(*tokens, (24,), generator=gen)
    lengths[3] = 0
    total = int(lengths.sum())
    slots = torch.randperm(SLOTS - 20, generator=gen)[:total] + 20  # never a seed slot (SPEC D7)
    slots[torch.randint(0, total, (12,), generator=gen)] = -1
    plan = tc.WritePlan.allocate(write_req_capacity=32, device=device)
    offsets = torch.zeros(33, dtype=torch.int64)
    offsets[1:25] = torch.cumsum(lengths, 0)
    offsets[25:] = total
    plan.write_offsets.copy_(offsets)
    seeds = torch.full((32,), -1, dtype=torch.int64)
    seeds[5:9] = torch.tensor([7, 11, 13, 17])
    plan.write_seed_slot_indices.copy_(seeds)
    plan.write_num_valid_reqs.fill_(24)
    ids = torch.randint(0, 150000, (total,), generator=gen)
    pos = torch.cat([torch.arange(int(n)) for n in lengths])
    pos[torch.randint(0, total, (5,), generator=gen)] += 3
    expected_ids, expected_pos = ids.clone(), pos.clone()
    expected_ids[torch.randint(0, total, (6,), generator=gen)] += 1
    expected_pos[torch.randint(0, total, (6,), generator=gen)] += 1
    return {
        "context": context, "plan": plan, "input_ids": ids.to(device), "positions": pos.to(device),
        "out_cache_loc": slots.to(device),
        "enable_write_input_assert": input_assert,
        "expected_input_tokens": expected_ids.to(device) if input_assert else None,
        "expected_input_positions": expected_pos.to(device) if input_assert else None,
    }


def _stamp(context, gen, device):
    """Stamp chains over every other slot (reference write); returns the plan's (slots, prevs, positions, tokens)."""
    chains, length = 32, 60
    slots = (torch.randperm(SLOTS - 1, generator=gen)[: chains * length] + 1).view(chains, length)
    ids = torch.randint(0, 150000, (chains, length), generator=gen)
    plan = tc.WritePlan.allocate(write_req_capacity=chains, device=device)
    plan.write_offsets.copy_(torch.arange(chains + 1) * length)
    plan.write_seed_slot_indices.fill_(-1)
    plan.write_num_valid_reqs.fill_(chains)
    reference.canary_write_ref(
        context=context, plan=plan, input_ids=ids.reshape(-1).to(device),
        positions=torch.arange(length).repeat(chains).to(device),
        out_cache_loc=slots.reshape(-1).to(device), enable_write_input_assert=False, expected_input_tokens=None,
        expected_input_positions=None,
    )
    prevs = torch.cat([torch.full((chains, 1), -1), slots[:, :-1]], 1)
    return slots.reshape(-1), prevs.reshape(-1), torch.arange(length).repeat(chains), ids.reshape(-1)


def _verify_kwargs(context, gen, device, check_token):
    """A stamped canary with corrupted fields, and a plan with slot-0 entries, unknown (0) and anchor
    (-1) predecessors, wrong expected tokens/positions and a num_valid below capacity."""
    slots, prevs, pos, ids = _stamp(context, gen, device)
    n = slots.numel()
    words = context.canary_buf.view(torch.int64)
    hit = slots[torch.randint(0, n, (9,), generator=gen)].to(device)
    words[hit[:3], 0] += 1
    words[hit[3:6], 1] += 1
    words[hit[6:], 3] ^= 1
    plan = tc.VerifyPlan.allocate(verify_capacity=n + 50, device=device)
    slots, prevs, ids = slots.clone(), prevs.clone(), ids.clone()
    slots[torch.randint(0, n, (7,), generator=gen)] = 0
    prevs[torch.randint(0, n, (7,), generator=gen)] = 0
    pos = pos + (torch.rand(n, generator=gen) < 0.003).long()
    ids[torch.randint(0, n, (5,), generator=gen)] = -1
    ids[torch.randint(0, n, (5,), generator=gen)] += 2
    pad = torch.zeros(50, dtype=torch.int64)
    plan.verify_slot_indices.copy_(torch.cat([slots, pad]))
    plan.verify_prev_slot_indices.copy_(torch.cat([prevs, pad]))
    plan.verify_expected_positions.copy_(torch.cat([pos, pad]))
    plan.verify_expected_tokens.copy_(torch.cat([ids, pad]))
    plan.verify_num_valid.fill_(n - 3)
    return {"context": context, "plan": plan, "check_verify_expected_token": check_token}


def _plan_kwargs(gen, device):
    bs, width = 40, 512
    rpi = torch.randperm(60, generator=gen)[:bs] + 1
    rpi[[2, 17]] = 0
    total = 40 * 512
    kw = {
        "req_pool_indices": rpi.to(device), "prefix_lens": torch.randint(0, 400, (bs,), generator=gen).to(device),
        "extend_seq_lens": torch.randint(0, 5, (bs,), generator=gen).to(device),
        "req_to_token": torch.randint(1, 1 << 20, (61, width), dtype=torch.int32, generator=gen).to(device),
        "swa_window_size": 0, "full_to_swa_index_mapping": None, "verify_capacity": total,
        "req_to_verify_expected_tokens": None,
        "req_to_verify_expected_tokens_valid_lens": None, "kv_token_id_vs_position_offset": 0,
    }
    return dict(kw, verify_plan_out=tc.VerifyPlan.allocate(verify_capacity=total, device=device).zero_for_testing_(),
                write_plan_out=tc.WritePlan.allocate(write_req_capacity=48, device=device).zero_for_testing_())


def _scatter_kwargs(gen, device):
    lengths = torch.randint(0, 1500, (9,), generator=gen)
    offsets = torch.zeros(10, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    return {"flat_in": torch.randint(-(2**40), 2**40, (int(offsets[-1]),), generator=gen).to(device),
                "offsets": offsets.to(device),
                "req_pool_indices": (torch.randperm(12, generator=gen)[:9] + 1).to(device),
                "pool_out": torch.zeros(13, 1200, dtype=torch.int32, device=device)}


def _twins(make):
    """Two identical argument sets (same generator seed): one for the reference, one for the launch."""
    return make(torch.Generator().manual_seed(1234)), make(torch.Generator().manual_seed(1234))


def _same(name, a, b):
    if not torch.equal(a.cpu(), b.cpu()):
        raise AssertionError(f"{name} differs from the reference")


def _same_sink(context_ref, context):
    _same("violation_write_index", context_ref.violation_write_index, context.violation_write_index)
    _same("slot_run_counter", context_ref.slot_run_counter, context.slot_run_counter)
    _same("kernel_run_counter", context_ref.kernel_run_counter, context.kernel_run_counter)
    n = min(int(context.violation_write_index), context.violation_ring.shape[0])
    rows = sorted(map(tuple, context.violation_ring[:n].cpu().tolist()))
    ref_rows = sorted(map(tuple, context_ref.violation_ring[:n].cpu().tolist()))
    if rows != ref_rows:
        raise AssertionError(f"violation rows differ from the reference ({n} rows)")
    if n == 0:
        raise AssertionError("the agreement case produced no violation rows (it would not test the ring)")


def check(kernel: str, launch, device: torch.device) -> None:
    """Raise AssertionError unless ``launch`` matches the reference for ``kernel`` on ``device``."""
    if kernel in ("verify", "write"):
        for mode, flag, tokens in itertools.product(MODES, (False, True),
                                                    WRITE_TOKENS if kernel == "write" else (None,)):
            def make(gen, mode=mode, flag=flag, tokens=tokens):
                context = _context(device, mode, gen)
                if kernel == "verify":
                    return _verify_kwargs(context, gen, device, flag)
                return _write_kwargs(context, gen, device, flag, tokens)

            ref_kw, kw = _twins(make)
            getattr(reference, f"canary_{kernel}_ref")(**ref_kw)
            launch(**kw)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            try:
                _same("canary bytes", ref_kw["context"].canary_buf, kw["context"].canary_buf)
                _same_sink(ref_kw["context"], kw["context"])
            except AssertionError as e:
                case = f", requests of {tokens[0]}-{tokens[1] - 1} tokens" if tokens else ""
                raise AssertionError(f"{kernel} ({mode.name}, flag {flag}{case}): {e}") from None
    elif kernel == "plan":
        ref_kw, kw = _twins(lambda gen: _plan_kwargs(gen, device))
        reference.canary_plan_ref(**ref_kw)
        launch(**kw)
        total = int(ref_kw["verify_plan_out"].verify_num_valid)
        for field in ("verify_slot_indices", "verify_expected_tokens", "verify_expected_positions",
                      "verify_prev_slot_indices"):
            _same(field, getattr(ref_kw["verify_plan_out"], field)[:total],
                  getattr(kw["verify_plan_out"], field)[:total])
        for field in ("verify_num_valid", "enable"):
            _same(field, getattr(ref_kw["verify_plan_out"], field), getattr(kw["verify_plan_out"], field))
        for field in ("write_offsets", "write_seed_slot_indices", "write_num_valid_reqs"):
            _same(field, getattr(ref_kw["write_plan_out"], field), getattr(kw["write_plan_out"], field))
    elif kernel == "scatter":
        ref_kw, kw = _twins(lambda gen: _scatter_kwargs(gen, device))
        reference.scatter_req_token_ids_ref(**ref_kw)
        launch(**kw)
        _same("pool_out", ref_kw["pool_out"], kw["pool_out"])
    else:
        raise ValueError(f"kv-canary: unknown kernel {kernel!r}")
