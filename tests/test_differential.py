"""Seeded differential fuzz: compiled kernels (CPU, and CUDA when present) vs the torch reference: every
launch tensor (canary buffer, ring, write index, counters, plans, pool) byte-identical after the run;
case builders poison outputs first."""

from __future__ import annotations

import pytest
import torch

from tvm_canary.cases import CASES, LAUNCH, REFERENCE, scratch_left_dirty
from tvm_canary.consts import CANARY_FIELD_REAL_KV_HASH, RealKvHashMode
from tvm_canary.geometry import FOLD_PAIRS_MAX_THREADS, Geometry
from tvm_canary.reference.hashing import real_kv_fold_t, valid_slot_mask
from tvm_canary.runtime import compile as compile_
from tvm_canary.runtime import targets, use_backend
from tvm_canary.schedules import CUDA_SIZE_DEFAULTS

from tree import assert_same_bytes, devices, require, tensors

ITERATIONS = {"cpu": 60, "cuda": 300}


def run_differential(kernel: str, device: str, seed: int, prepare=None, launches=1, **case_options) -> None:
    """One seeded case on ``device`` vs the CPU reference, launched ``launches`` times in a row (outputs
    feeding the next); ``prepare(case, launch)`` edits both cases before each launch."""
    want = CASES[kernel](torch.Generator().manual_seed(seed), "cpu", **case_options)
    got = CASES[kernel](torch.Generator().manual_seed(seed), device, **case_options)
    for launch in range(launches):
        for case in (want, got) if prepare else ():
            prepare(case, launch)
        REFERENCE[kernel](**want)
        with use_backend("tvm"):
            LAUNCH[kernel](**got)
        assert_same_bytes(tensors(got), tensors(want))
        assert not scratch_left_dirty(got), scratch_left_dirty(got)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kernel", list(CASES))
def test_differential_fuzz(kernel, device):
    require(device)
    for seed in range(ITERATIONS[device]):
        try:
            run_differential(kernel, device, seed)
        except AssertionError as e:
            raise AssertionError(f"{kernel} on {device}, seed {seed}: {e}") from e


def stamp_true_folds(case: dict, launch: int = 0) -> None:
    """Field 3 of every readable slot := its real-KV fold, so clean entries verify and a kernel folding
    otherwise adds violation rows (random field 3 values mismatch any fold)."""
    ctx = case["context"]
    words = ctx.canary_buf.view(torch.int64)
    slots = torch.arange(words.shape[0], device=words.device)
    ok = valid_slot_mask(words.shape[0], ctx.real_kv_sources, ctx.real_kv_hash_mode, slots)
    words[ok, CANARY_FIELD_REAL_KV_HASH] = real_kv_fold_t(ctx.real_kv_sources, ctx.real_kv_hash_mode, slots[ok])


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_differential_wide_tokens(kernel, device):
    """Sources of up to 512 bytes per token (ALL folds of up to 64 words), so the prefetched batches
    (``PAIR_PREFETCH``, ``FOLD_PREFETCH``) run full and partial; verify's canaries hold the true folds."""
    require(device)
    prepare = stamp_true_folds if kernel == "verify" else None
    for seed in range(ITERATIONS[device] // 4):
        try:
            run_differential(kernel, device, seed, prepare, token_units=16)
        except AssertionError as e:
            raise AssertionError(f"{kernel} on {device}, wide tokens, seed {seed}: {e}") from e


@pytest.mark.gpu
def test_verify_split_folds_on_cuda(monkeypatch):
    """Verify ALL's default below 16K entries folds split (two lanes an entry, ``split_fold``; emit
    paired): on CUDA the seeded and wide-token cases, on canaries holding the true folds (a wrong fold
    is an extra violation), give the reference's bytes."""
    require("cuda")
    assert targets.default_geometry("verify", "cuda", 2).pairs == 2
    monkeypatch.setenv("TVM_CANARY_TUNED", "0")
    monkeypatch.setattr(compile_, "_by_launch", {})
    for seed in range(ITERATIONS["cuda"] // 4):
        for options in ({}, {"token_units": 16}):
            try:
                run_differential("verify", "cuda", seed, stamp_true_folds, **options)
            except AssertionError as e:
                raise AssertionError(f"verify with split folds, seed {seed}, {options}: {e}") from e


@pytest.mark.parametrize("pairs_capped", [False, True])
@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_differential_sources_folded_one_after_another(kernel, pairs_capped, monkeypatch):
    """The CPU default folds sources in pairs (``Geometry.fold_pairs``); without ``pairs``, or under a
    register cap below the pairs' threshold, one after another: same bytes on the wide-token cases.
    Launches use the patched default's function (no database, launch cache emptied and restored)."""
    geom = {"unroll": 4, "pairs": 1, "min_blocks": FOLD_PAIRS_MAX_THREADS + 1} if pairs_capped else {"unroll": 4}
    monkeypatch.setitem(targets.CPU_DEFAULTS, kernel, geom)
    monkeypatch.setenv("TVM_CANARY_TUNED", "0")
    monkeypatch.setattr(compile_, "_by_launch", {})
    single = targets.default_geometry(kernel, "llvm")
    assert not single.fold_pairs()
    prepare = stamp_true_folds if kernel == "verify" else None
    for seed in range(ITERATIONS["cpu"] // 4):
        try:
            run_differential(kernel, "cpu", seed, prepare, token_units=16)
        except AssertionError as e:
            raise AssertionError(f"{kernel} folding one source at a time, seed {seed}: {e}") from e
    launched = {fn for key, fn in compile_._by_launch.items() if key[0] == kernel}
    built = {fn for key, fn in compile_._memory.items() if key[0] == kernel and key[4] == single}
    assert launched and launched <= built


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_verify_a_lone_failing_entry(device, where):
    """Every entry padding but one (first, middle or last) on a random canary: the reference's row alone, on every
    backend. Random plans mark nearly every chunk, hiding a kernel skipping an entry; here nothing else marks."""
    require(device)
    for seed in range(8):
        want, got = (CASES["verify"](torch.Generator().manual_seed(seed), dev, capacity=1 + 37 * seed)
                     for dev in ("cpu", device))
        for case in (want, got):
            plan = case["plan"]
            cap = plan.verify_slot_indices.numel()
            lone = {"first": 0, "middle": cap // 2, "last": cap - 1}[where]
            plan.verify_slot_indices.fill_(0)[lone] = 1
            plan.verify_num_valid.fill_(cap)
            plan.enable.fill_(1)
        rows_before = int(want["context"].violation_write_index[0])
        REFERENCE["verify"](**want)
        with use_backend("tvm"):
            LAUNCH["verify"](**got)
        assert int(want["context"].violation_write_index[0]) == rows_before + 1
        assert_same_bytes(tensors(got), tensors(want))


@pytest.mark.parametrize("device", devices())
def test_differential_long_chains(device):
    """Requests of 33-100 valid tokens (``cases.long_write_case``) take write's CUDA lockstep path, with
    position gaps, input-assert mismatches and a slot stored twice in a request."""
    require(device)
    for seed in range(ITERATIONS[device] // 4):
        try:
            run_differential("write", device, seed, long_chains=True)
        except AssertionError as e:
            raise AssertionError(f"write on {device}, long chains, seed {seed}: {e}") from e


# requests x tokens per request, on CUDA NONE (528 x 64): a warp per request (4 x 100), one lane per request
# over the blocks (40 x 8; 128 x 23), consecutive lanes (200 x 1), one block (3 x 1); real-KV modes alike.
LANE_MAPPING_SHAPES = [(4, 100), (40, 8), (128, 23), (200, 1), (3, 1)]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("shape", LANE_MAPPING_SHAPES, ids=[f"{r}x{t}" for r, t in LANE_MAPPING_SHAPES])
def test_write_request_lane_mappings(device, shape):
    """Write's three lane mappings (``kernels.write``, phase 1) give the reference's bytes in every mode."""
    require(device)
    requests, tokens = shape
    for seed in range(ITERATIONS[device] // 20):
        try:
            run_differential("write", device, seed, shape=shape)
        except AssertionError as e:
            raise AssertionError(f"write on {device}, {requests} x {tokens}, seed {seed}: {e}") from e


# A CPU grid of several blocks (one lane each), as CUDA's write folds: its fold lanes then number the
# blocks (``kernels.write``, phase 0).
FOLD_GRID_BLOCKS = 48


def fold_lane_widths(case: dict) -> tuple[int, int]:
    """(lanes per request for the plan's capacity, for its active requests) of write's fold phase on a
    CPU grid of FOLD_GRID_BLOCKS blocks."""
    cap = case["plan"].write_seed_slot_indices.shape[0]
    active = min(max(int(case["plan"].write_num_valid_reqs[0]), 0), cap)
    lanes = max(min(max(case["out_cache_loc"].shape[0], cap), FOLD_GRID_BLOCKS), 1)
    return max(lanes // min(cap, lanes), 1), max(lanes // max(active, 1), 1)


def test_write_fold_lanes_over_several_blocks(monkeypatch):
    """Write's fold lanes map for the plan's capacity, and again for the active requests when they get more lanes each
    (``fold_lanes``): a multi-block CPU grid runs both (the cases reach both), stamping the reference's bytes."""
    monkeypatch.setitem(targets.CPU_DEFAULTS, "write", {"blocks": FOLD_GRID_BLOCKS, "unroll": 2, "pairs": 1})
    monkeypatch.setenv("TVM_CANARY_TUNED", "0")
    monkeypatch.setattr(compile_, "_by_launch", {})
    same, more = 0, 0
    for seed in range(ITERATIONS["cpu"] // 3):
        case = CASES["write"](torch.Generator().manual_seed(seed), "cpu")
        if case["context"].real_kv_hash_mode != RealKvHashMode.NONE and case["context"].real_kv_sources:
            with_cap, with_active = fold_lane_widths(case)
            same, more = same + (with_cap == with_active), more + (with_cap != with_active)
        try:
            run_differential("write", "cpu", seed)
        except AssertionError as e:
            raise AssertionError(f"write over {FOLD_GRID_BLOCKS} CPU blocks, seed {seed}: {e}") from e
    assert same and more, (same, more)


@pytest.mark.parametrize("device", devices())
def test_write_own_seed_slot_rows(device):
    """A request whose second entry writes its seed slot, with an input-assert mismatch: its row counts
    from the seed as before the launch (SPEC D7), though emit walks it after the stamp."""
    require(device)

    def own_seed(case, launch):
        ctx = case["context"]
        ctx.canary_buf.view(torch.int64)[3, 1] = 10
        plan = case["plan"]
        plan.write_offsets[:2] = torch.tensor([0, 2])
        plan.write_seed_slot_indices[0] = 3
        plan.write_num_valid_reqs.fill_(1)
        dev = ctx.canary_buf.device
        case.update(input_ids=torch.tensor([7, 8], device=dev), positions=torch.tensor([11, 12], device=dev),
                    out_cache_loc=torch.tensor([5, 3], device=dev), enable_write_input_assert=True,
                    expected_input_tokens=torch.tensor([7, 9], device=dev),
                    expected_input_positions=torch.tensor([11, 12], device=dev))

    run_differential("write", device, 3, own_seed)


# 32-lane grids for the last-block ticket (``LAST_BLOCK_TICKET``): 8192 blocks exceed an H200's resident
# blocks, so the emitting block waits on unstarted ones; a case's launches alternate grids on one scratch.
TICKET_GRIDS = [Geometry(gpu=True, blocks=8192, threads=32), Geometry(gpu=True, blocks=1056, threads=128),
                Geometry(gpu=True, blocks=3, threads=32)]


def launch_grids(monkeypatch, grids) -> list:
    """Make every launch take ``grids[i]`` while ``chosen[0] == i`` (the launch cache emptied first).
    No defaults, so no AOT build holds them: a runtime-only TVM skips."""
    if not compile_.compiler_available():
        pytest.skip("kv-canary: the ticket grids are built at load, which a runtime-only TVM cannot do")
    chosen = [0]
    monkeypatch.setattr(compile_, "geometry", lambda name, device, size, mode=0: grids[chosen[0]])
    monkeypatch.setattr(compile_, "_by_launch", {})
    monkeypatch.setattr(compile_, "_write_geometries", lambda device, mode: [])
    return chosen


@pytest.mark.gpu
def test_verify_every_default_geometry_on_cuda(monkeypatch):
    """Verify on CUDA with full plans either side of each size-class bound (``CUDA_SIZE_DEFAULTS``) and of
    twice the largest default grid's reach (each lane strides two entries), in every real-KV mode, so
    each default geometry launches (no database): reference bytes."""
    require("cuda")
    monkeypatch.setenv("TVM_CANARY_TUNED", "0")
    monkeypatch.setattr(compile_, "_by_launch", {})
    bounds = sorted({at_least for (kernel, _), classes in CUDA_SIZE_DEFAULTS.items() if kernel == "verify"
                     for at_least, _ in classes})
    launched = set()
    real_geometry = compile_.geometry

    def recorded(name, device, size, mode=0):
        geom = real_geometry(name, device, size, mode)
        launched.add((mode, geom))
        return geom

    monkeypatch.setattr(compile_, "geometry", recorded)
    reach = max(geom.blocks * geom.threads
                for mode in (0, 1, 2) for geom in targets.default_geometries("verify", "cuda", mode))
    def full(case, launch):  # every entry valid and the plan enabled (the case draws both at random)
        case["plan"].verify_num_valid.fill_(case["plan"].verify_slot_indices.numel())
        case["plan"].enable.fill_(1)

    for capacity in [c for bound in bounds for c in (bound - 1, bound)] + [2 * reach + 1]:
        modes_run = set()
        for seed in range(40):
            mode = int(CASES["verify"](torch.Generator().manual_seed(seed), "cpu", capacity=1)
                       ["context"].real_kv_hash_mode)
            if mode not in modes_run:
                modes_run.add(mode)
                run_differential("verify", "cuda", seed, full, capacity=capacity)
        assert modes_run == {0, 1, 2}, (capacity, modes_run)
    for mode in (0, 1, 2):
        assert set(targets.default_geometries("verify", "cuda", mode)) <= {g for m, g in launched if m == mode}, mode


@pytest.mark.gpu
@pytest.mark.parametrize("marks", ["every block", "few blocks"])
def test_verify_ticket_over_many_blocks(marks, monkeypatch):
    """Verify of 256K entries on 32-lane grids, three launches on one scratch (8192, 1056, 3 blocks), with
    every block marking or only far-apart ones: reference bytes, scratch zero after each launch."""
    chosen = launch_grids(monkeypatch, TICKET_GRIDS)

    def prepare(case, launch):
        chosen[0] = launch
        plan = case["plan"]
        if marks == "few blocks":
            keep = torch.zeros_like(plan.verify_slot_indices, dtype=torch.bool)
            keep[torch.tensor([7 * launch, 40000 + launch, 131071, (1 << 18) - 1 - launch])] = True
            plan.verify_slot_indices.masked_fill_(~keep, 0)
        plan.verify_num_valid.fill_(plan.verify_slot_indices.numel() - launch)
        plan.enable.fill_(1)

    for seed in range(2):
        run_differential("verify", "cuda", seed, prepare, launches=len(TICKET_GRIDS), capacity=1 << 18)


@pytest.mark.gpu
def test_write_ticket_over_many_blocks(monkeypatch):
    """Write of 8192 one-token requests on 32-lane grids, three launches on one scratch: violation rows
    from requests spread over hundreds of blocks, appended in request order by one of them."""
    chosen = launch_grids(monkeypatch, TICKET_GRIDS)

    def prepare(case, launch):
        chosen[0] = launch

    for seed in range(2):
        run_differential("write", "cuda", seed, prepare, launches=len(TICKET_GRIDS), shape=(8192, 1))


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("start, end", [(-2, INT64_MAX), (-1, INT64_MAX), (INT64_MIN, INT64_MAX), (3, INT64_MIN),
                                        (INT64_MAX - 1, INT64_MAX), (INT64_MAX, INT64_MIN), (-6, 3), (4, 2)])
def test_scatter_offsets_at_the_int64_ends(device, start, end):
    """Scatter's row length and sources are exact for offsets anywhere in int64 (no wrapped difference)."""
    require(device)
    cases = {}
    for side in ("want", "got"):
        cases[side] = {"flat_in": torch.arange(1, 9, dtype=torch.int64, device=device),
                       "offsets": torch.tensor([start, end], dtype=torch.int64, device=device),
                       "req_pool_indices": torch.tensor([1], dtype=torch.int64, device=device),
                       "pool_out": torch.full((2, 6), -7, dtype=torch.int32, device=device)}
    REFERENCE["scatter"](**cases["want"])
    with use_backend("tvm"):
        LAUNCH["scatter"](**cases["got"])
    assert cases["got"]["pool_out"].tolist() == cases["want"]["pool_out"].tolist()
