"""Kernel benchmarks on a CUDA GPU: each kernel beside its floor and its baselines, in one run.

Per row (same inputs, same timing method for everything in the row):
* the kernel with its **default** geometry (``tvm_canary/schedules/defaults.py``; the targets are for
  it), and with ``--ab`` its **tuned** geometry, measured interleaved with the default (A/B/A/B
  rounds in one process, so run-to-run noise cannot pass for a gain);
* its **floor** (``floors.py``): the fastest of several grids of a kernel that moves the same bytes
  with the same pattern (verify: gather; write: the larger of the register-only chain and the
  gather-and-store of its tokens; plan, scatter: a dense copy; the gather and the store with two
  sources also split over two lanes an entry or token, ``memory_floors``); a kernel faster than its floor by more
  than noise, in either arm of the A/B, is reported as a floor bug (``BELOW FLOOR``,
  ``verdicts.py``); verify rows of at most 64K entries, which
  are latency-bound, also get the floors that bound them beyond their bytes (``Bench.bounds``: the
  gather that hashes as SPEC 1 requires, and that plus the least cost of appending rows in entry
  order), reported beside the target, which stays against the gather floor;
* **baselines**: ``original`` (clean-room CUDA with the original's fixed geometry, tvm-ffi JIT),
  ``triton`` (verify and write written as a user would), ``torch`` (the reference,
  ``tvm_canary.reference``, one eager call). Each baseline must first give the reference's bytes
  (``baselines/agreement.py``); one that does not is reported and left out;
* the row's performance **target** (docs/PERFORMANCE.md) and PASS/FAIL; a real-KV write row's NONE
  target divides by NONE's default kernel on the row's own inputs, timed as one more arm in its rounds
  (``none_us``; runs from before the thirty-ninth session divided by the NONE row of the shape).

Times are medians of CUDA-graph replays (each replay launches on 2-4 rotating input sets, so small
inputs do not sit in L2), divided by the launches per replay, each replay held behind a spin kernel so
that it times the device alone (``tvm_canary.timing``); the torch reference is one eager call. A row's
kernel arms and every grid of its floors are timed interleaved (``Bench.timed``: AB_ROUNDS rounds,
each replaying every arm in turn; medians of the rounds), so a floor and the kernel it bounds see the
same state of the GPU; the baselines are timed after them.

Byte model, verify: 24 B of plan vectors + the slot's 32 B + the predecessor's 32 B + per source one
32 B sector (PARTIAL) or ``read_bytes`` (ALL). Write: 16 B of offsets and seed per request, 24 B of token vectors + 32 B
stamped per token (+ the folded source bytes). Plan: 32 B written per verify entry + 4 B of table read.
Scatter: 8 B read + 4 B written per token.

    python benchmarks/bench_kernels.py [--quick] [--ab] [--kernels verify write plan scatter]
        [--baselines original triton torch] [--candidates 1056x512m1 ...] [--plan-candidates 528x512k1024 ...]
        [--verify-sizes ENTRIES ...] [--verify-modes MODE ...] [--json OUT.json [--resume [--redo KERNEL ...]]]

``--resume`` continues the run in ``--json``, cut short or run a part at a time: it keeps the rows of every kernel
that file finished (write's, plan's and scatter's rows are written when their sweep ends, verify's as each is
timed), runs the rest of ``--kernels`` (of verify, the rows the file lacks: a sweep cut short goes on where it
stopped) and writes the whole run back (``resume_run``; e.g. ``--kernels write plan scatter``, then ``--kernels
verify --resume``). The file must come from the same GPU model, driver, versions, defaults and options; ``parts``
records each invocation's kernels, wall time, empty launch and register-only chain (a row's floors are always timed
in its own process). A complete run on a freshly started host can take longer than one call of a lent GPU allows
(600 s): run ``--kernels verify`` first, then ``--resume``; a call cut short in verify's sweep goes on with the same
command, with ``--resume`` and without ``--redo`` (which would drop the rows it timed). ``--redo write`` (with
``--resume``) drops a finished kernel's rows and times it again, after a change to that kernel alone (its code,
defaults or database); the part that timed the dropped rows names them ``replaced``. ``--verify-sizes`` and
``--verify-modes`` time verify's rows of those sizes and modes only; with ``--redo verify`` they drop and time again
only those, after a change to their defaults or database alone: every verify row kept must have run the default this
checkout gives it (``verify_default_of``), and every part that timed one this checkout's code (``code_digest``,
which each part records): one table never mixes two versions of the code (its defaults and the tuned arm's database
are not hashed). So a verify sweep resumes at the code that began it, or runs again whole. A run's ``wall_s`` sums
its parts'; ``--candidates`` add to them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import torch
import verdicts  # benchmarks/, the script's folder

from tvm_canary.timing import AB_ROUNDS, graph_time_us, interleaved_us

HERE = os.path.dirname(os.path.abspath(__file__))
DEV = torch.device("cuda", 0)
KV_BYTES = 256  # bytes per token per source (K and V)
MODES = ("NONE", "PARTIAL", "ALL")
ORDERS = ("random", "chain")  # verify's entry orders (``verify_plans``), in the sweep's order
KERNELS = ("verify", "write", "plan", "scatter")  # every sweep, in a whole run's order
POOL_SLOTS = {"full": 1 << 25, "quick": 1 << 22}  # canary slots (the K/V pool is 512 B per slot)
VERIFY_SIZES = {"full": (1 << 10, 1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24),
                "quick": (1 << 10, 1 << 12, 1 << 16, 1 << 20)}
WRITE_SHAPES = ((4096, 1), (64, 512), (1, 32768))  # (requests, tokens per request)
PLAN_SHAPES = ((64, 2048), (1024, 2048), (4096, 2048))  # (bs, prefix)
SCATTER_SHAPES = ((256, 1024), (4096, 1024))  # (bs, tokens per request)
COPY_FLOOR_LAUNCHES = 8  # copies per graph of the plan/scatter copy floor (the kernels' graphs hold 2)
# Verify rows up to this size are small (latency-bound): their target is 1.25x the floor, and they also get
# the hash and ordered floors (Bench.bounds; ``bounded_row``).
SMALL_VERIFY_ENTRIES = 1 << 16


def bounded_row(mode: str, n: int) -> bool:
    """Whether the verify row of ``n`` entries in ``mode`` also times what bounds it beyond its bytes
    (``Bench.bounds``: the hash and ordered floors): every row up to ``SMALL_VERIFY_ENTRIES``, which
    launch latency bounds, and ALL's at every size, whose fold hashes each source's whole row in 32
    dependent steps, so that SPEC's hashing, not the bytes, may be what bounds it."""
    return n <= SMALL_VERIFY_ENTRIES or mode == "ALL"


def fail(message: str) -> int:
    print(f"kv-canary: {message}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------------------------------------
# Timing


def medians(times: dict) -> dict:
    """{arm: median of its rounds} of ``timing.interleaved_us``'s {arm: rounds}."""
    return {arm: statistics.median(rounds) for arm, rounds in times.items()}


def once_us(fn) -> float:
    """µs of one eager call (after one warm-up), for the slow torch reference (NaN if out of memory)."""
    try:
        fn()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return float("nan")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000


# ------------------------------------------------------------------------------------------------
# Launching tvm_canary kernels with a chosen geometry


def parse_geometry(text: str, tile: int = 1):
    """``BLOCKSxTHREADS[kTILE][uUNROLL][mMIN_BLOCKS][w][p|pp]`` (e.g. ``1056x512m1``, ``528x512k1024``,
    ``528x128u8``, ``528x128m2wp``, ``528x32wpp``; ``w``: thin, ``p``: paired folds, ``pp``: split folds)
    -> a CUDA Geometry (``tile`` when the text names none)."""
    from tvm_canary.geometry import Geometry

    match = re.fullmatch(r"(\d+)x(\d+)(?:k(\d+))?(?:u(\d+))?(?:m(\d+))?(w?)(p{0,2})", text)
    if match is None:
        raise ValueError(f"{text!r} is not BLOCKSxTHREADS[kTILE][uUNROLL][mMIN_BLOCKS][w][p|pp]")
    blocks, threads, tile_text, unroll, min_blocks, thin, pairs = match.groups()
    return Geometry(gpu=True, blocks=int(blocks), threads=int(threads), tile=int(tile_text or tile),
                    unroll=int(unroll or 1), min_blocks=int(min_blocks or 1), thin=int(bool(thin)), pairs=len(pairs))


def geometry_label(geom) -> str:
    """``parse_geometry``'s text of a geometry, without its tile; a floor's held grid (``floors.HeldGeometry``)
    ends in "h", which ``parse_geometry`` does not read."""
    return (f"{geom.blocks}x{geom.threads}" + (f"u{geom.unroll}" if geom.unroll != 1 else "")
            + (f"m{geom.min_blocks}" if geom.min_blocks != 1 else "") + "w" * geom.thin + "p" * geom.pairs
            + "h" * getattr(geom, "held", False))


def default_labels(kernel: str, tag: str) -> str:
    """The kernel's default geometry, then the real-KV modes whose default differs and the size classes
    (``2112x128m16, PARTIAL 2112x128m2wp, PARTIAL >= 16385 1056x128m8, ...``; write's ``528x64u2, NONE >=
    1x23 528x64u8, ...``)."""
    from tvm_canary.consts import RealKvHashMode
    from tvm_canary.runtime import targets

    labels = []
    for mode, at_least, geom in targets.distinct_defaults(kernel, tag, [int(m) for m in RealKvHashMode]):
        name = "" if not labels else f"{RealKvHashMode(mode).name} " + ("" if at_least is None
                                                                        else f">= {targets.size_label(at_least)} ")
        labels.append(name + geometry_label(geom))
    return ", ".join(labels)


class Launchers:
    """tvm_canary launches whose geometry is chosen explicitly: ``default`` (tvm_canary/schedules/defaults.py),
    ``tuned`` (the device's tuning database, as the public launch picks it; the default without one)
    or a Geometry. Arguments are packed as the public launch packs them; the front-end checks are
    skipped (the inputs are the benchmark's own)."""

    def __init__(self):
        from tvm_canary.runtime import compile as C
        from tvm_canary.runtime import packing, targets

        self.C, self.packing, self.targets = C, packing, targets
        self.tag = targets.tag_for(DEV)
        self.functions: dict = {}

    def geometry(self, kernel, choice, size, mode):
        if choice == "default":
            return self.targets.default_geometry(kernel, self.tag, mode, size)
        if choice == "tuned":
            return self.C.geometry(kernel, DEV, size, mode)
        return choice

    def call(self, kernel, kw):
        """The packed launch (``packing.KernelCall``) of the public launch's keyword arguments, or None."""
        return getattr(self.packing, f"{kernel}_call")(**kw)

    def launch(self, kernel, choice):
        def run(**kw):
            call = self.call(kernel, kw)
            if call is not None:
                self.function(kernel, call.spec, self.geometry(kernel, choice, call.size, call.mode))(*call.args)

        return run

    def function(self, kernel, spec, geom):
        key = (kernel, spec, geom)
        if key not in self.functions:
            self.functions[key] = self.C._load_or_build(kernel, spec, DEV, geom)
        return self.functions[key]

    def tuned_geometry(self, kernel, kw):
        call = self.call(kernel, kw)
        return self.geometry(kernel, "tuned", call.size, call.mode)

    def same(self, kernel, kw) -> bool:
        """Whether the tuned geometry of this launch is the default one (of its launch mode and size)."""
        call = self.call(kernel, kw)
        return (self.geometry(kernel, "tuned", call.size, call.mode)
                == self.geometry(kernel, "default", call.size, call.mode))


# ------------------------------------------------------------------------------------------------
# Inputs


class Pool:
    """A canary buffer of ``slots`` slots and a K/V pool (two sources, page size 1)."""

    def __init__(self, slots: int):
        self.slots = slots
        self.canary = torch.zeros(slots, 32, dtype=torch.uint8, device=DEV)
        self.kv = torch.randint(-(2**62), 2**62, (2 * slots, KV_BYTES // 8), dtype=torch.int64, device=DEV)
        self.ring = torch.zeros(1024, 8, dtype=torch.int64, device=DEV)
        self.widx = torch.zeros(1, dtype=torch.int32, device=DEV)
        self.counters = torch.zeros(2, dtype=torch.int64, device=DEV)
        self.cpa = torch.zeros(1, dtype=torch.int32, device=DEV)
        # the ticket floor's arrivals (zero between launches)
        self.floor_flags = torch.zeros(1, dtype=torch.int32, device=DEV)
        self.floor_counter = torch.zeros(1, dtype=torch.int64, device=DEV)

    def context(self, mode: str):
        import tvm_canary as tc
        from tvm_canary.consts import RealKvHashMode

        sources = ()
        if mode != "NONE":
            sources = tuple(
                tc.RealKvSource(tensor=half, page_size=1, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES)
                for half in (self.kv[: self.slots], self.kv[self.slots :])
            )
        return tc.VerifyOrWriteContext(
            canary_buf=self.canary, kernel_kind=tc.CanaryLaunchTag.TAIL_K_FULL, violation_ring=self.ring,
            violation_write_index=self.widx, slot_run_counter=self.counters[0:1], kernel_run_counter=self.counters[1:2],
            real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode[mode], enable_chain_position_assert=self.cpa,
        )

    def flagged(self) -> int:
        """Violations recorded since the last call (then cleared): a clean benchmark records none."""
        n = int(self.widx)
        self.widx.zero_()
        return n


def fold_words(mode: str) -> int:
    return {"NONE": 0, "PARTIAL": 2, "ALL": KV_BYTES // 8}[mode]


def fold_orders(mode: str) -> dict:
    """{floor name infix: fold order} of the hashing floors (gather and store) in ``mode``: with two
    sources every order of ``floors.FOLD_ORDERS``, without sources one."""
    import floors

    return {"": "together"} if mode == "NONE" else dict(floors.FOLD_ORDERS)


def memory_floors(mode: str, family: str) -> dict:
    """{floor name: fold order} of ``family``'s memory floor in ``mode``, every form timed and the
    fastest counting: one lane an entry or token (order ``None``), and with two sources also "split"
    (two lanes an entry or token, each reading one source, as verify's and write's split folds spread
    its bytes)."""
    split = "split" in fold_orders(mode).values()
    return {f"{family}-{mode}": None} | ({f"{family}-split-{mode}": "split"} if split else {})


def floor_grids(name: str) -> list:
    """The grids floor ``name`` (``floor_makers``) is timed in: ``floors.floor_geometries``, with the
    bounded grids for each of verify's gather floors (its memory forms, ``memory_floors``, and the hash and
    ticket variants that bound a row beyond its bytes, ``Bench.bound_names``): register-bounded
    grids (``floors.BOUNDED_GATHER_GRIDS``, ``HELD_GATHER_GRIDS``). Other floors (``bench_embedding``'s token-reading
    gathers among them) run the plain grids."""
    import floors

    verify_floors = {floor for mode in MODES
                     for floor in (*memory_floors(mode, "gather"), *Bench.bound_names("gather", mode))}
    return floors.floor_geometries(bounded=name in verify_floors)


def order_label(order) -> str:
    """A floor's label suffix for its fold order: none for one lane an entry or "together"."""
    return "" if order in (None, "together") else f" sources {order}"


def floor_makers() -> dict:
    """{floor name: make(geom) -> TIR function}: gather per real-KV mode (verify, two sources), store per
    mode (write), each in its memory forms (``memory_floors``) and with its ``hash`` and ``ticket``
    variants (``bounds`` below), copy (plan, scatter)."""
    import floors

    # The memory floor of each family (verify: gather, its args in verify's order; write: store) and its
    # hashing variants (``hash``, and ``ticket`` = hash + the ordered append's clean path) per fold order.
    families = {"gather": lambda g, fw, sources, **kw: floors.gather(g, fw, False, sources, **kw),
                "store": floors.store}
    out = {}
    for mode in MODES:
        sources = 2 if mode != "NONE" else 0
        for family, make in families.items():
            for name, order in memory_floors(mode, family).items():
                out[name] = lambda g, make=make, mode=mode, sources=sources, order=order: make(
                    g, fold_words(mode), sources, **({"fold_order": order} if order else {}))
            for infix, order in fold_orders(mode).items():
                for variant, ticket in (("hash", False), ("ticket", True)):
                    out[f"{family}-{variant}-{infix}{mode}"] = (
                        lambda g, make=make, mode=mode, sources=sources, ticket=ticket, order=order: make(
                            g, fold_words(mode), sources, hashing=True, ticket=ticket, fold_order=order))
    out["copy"] = floors.copy
    return out


def write_args(pool, mode, slots_2d, ids, capacity=None):
    """Write launch arguments for requests = rows of ``slots_2d`` (positions 0.., anchor seeds), in a plan
    of ``capacity`` requests (default: as many as rows; the requests past the rows are empty and not
    valid, as in a plan padded to a CUDA graph's capacity)."""
    import tvm_canary as tc

    reqs, length = slots_2d.shape
    plan = tc.WritePlan.allocate(write_req_capacity=capacity or reqs, device=DEV)
    plan.write_offsets.copy_(torch.arange(plan.write_offsets.shape[0], device=DEV).clamp(max=reqs) * length)
    plan.write_seed_slot_indices.fill_(-1)
    plan.write_num_valid_reqs.fill_(reqs)
    pos = torch.arange(length, device=DEV).repeat(reqs)
    return {
        "context": pool.context(mode), "plan": plan, "input_ids": ids.reshape(-1), "positions": pos,
        "out_cache_loc": slots_2d.reshape(-1).contiguous(), "enable_write_input_assert": False,
        "expected_input_tokens": None, "expected_input_positions": None,
    }


def stamp_chains(bench, pool, mode, order):
    """Stamp every slot as chains of 4096 tokens; returns (slots [chains, L], ids) in chain order."""
    n = pool.slots - 1
    perm = (torch.randperm(n, device=DEV) if order == "random" else torch.arange(n, device=DEV)) + 1
    length = 4096
    slots_2d = perm[: n // length * length].view(-1, length)
    ids = torch.randint(0, 150000, slots_2d.shape, device=DEV)
    bench.ours("write", "default")(**write_args(pool, mode, slots_2d, ids))
    torch.cuda.synchronize()
    if pool.flagged():
        bench.warn(f"stamping {mode} {order} flagged violations")
    return slots_2d, ids


def verify_plans(slots_2d, n, order, sets):
    import tvm_canary as tc

    chains, length = slots_2d.shape
    plans = []
    for _ in range(sets):
        if order == "random":
            flat = torch.randperm(chains * length, device=DEV)[:n]
        else:
            flat = torch.arange(n, device=DEV) + torch.randint(0, chains * length - n + 1, (1,), device=DEV)
        r, p = flat // length, flat % length
        plan = tc.VerifyPlan.allocate(verify_capacity=n, device=DEV)
        plan.verify_slot_indices.copy_(slots_2d[r, p])
        plan.verify_prev_slot_indices.copy_(torch.where(p > 0, slots_2d[r, (p - 1).clamp(min=0)], -1))
        plan.verify_expected_positions.copy_(p)
        plan.verify_expected_tokens.fill_(-1)
        plan.verify_num_valid.fill_(n)
        plans.append(plan)
    return plans


# ------------------------------------------------------------------------------------------------
# Performance targets (docs/PERFORMANCE.md; for the default geometry)


def targets_for(row, rows) -> list[dict]:
    """The row's targets: ``{"what", "ratio", "limit"}`` (ratio = time / reference time)."""
    k, case = row["kernel"], row["case"]
    out = []
    if k == "verify":
        n = row["n"]
        if n >= 1 << 20:
            out.append({"what": "floor", "ratio": row["us"] / row["floor_us"], "limit": 1.10})
        elif n <= SMALL_VERIFY_ENTRIES:
            out.append({"what": "floor", "ratio": row["us"] / row["floor_us"], "limit": 1.25})
    elif k == "write":
        if row["mode"] == "NONE" and row["reqs"] == 1:
            out.append({"what": "chain", "ratio": row["us"] / row["chain_floor_us"], "limit": 1.15})
        if row["reqs"] > 1:
            out.append({"what": "floor", "ratio": row["us"] / row["floor_us"], "limit": 1.3})
        if row["mode"] != "NONE":
            # NONE's kernel on the row's own inputs in the same rounds (``Bench.timed``); a run from before
            # that arm existed compares with the NONE row of the same shape, timed in other rounds
            none_us = row.get("none_us") or next((r["us"] for r in rows
                                                  if r["kernel"] == "write" and r["mode"] == "NONE"
                                                  and r["shape"] == row["shape"]), None)
            if none_us is not None:
                out.append({"what": "NONE", "ratio": row["us"] / none_us, "limit": 1.10})
    elif k == "plan" and case.startswith("bs4096 "):
        out.append({"what": "floor", "ratio": row["us"] / row["floor_us"], "limit": 1.5})
    return out


# ------------------------------------------------------------------------------------------------
# Baselines


BASELINE_MODULES = {"original": "baselines.original_cuda", "triton": "baselines.triton_user"}


def baseline_launches(name: str) -> dict:
    """{kernel: launch taking the public launch function's keyword arguments} of a baseline."""
    if name == "torch":
        from tvm_canary import reference

        return reference.REFERENCE
    import importlib

    return importlib.import_module(BASELINE_MODULES[name]).LAUNCHES


def probe(name: str, kernels) -> dict:
    """{kernel: "ok" or "FAILED: <first difference>"} of a baseline against the reference (run in a
    child process by ``Bench.load_baselines``)."""
    from baselines import agreement

    launches = baseline_launches(name)
    out = {}
    for kernel in kernels:
        if kernel in launches:
            try:
                agreement.check(kernel, launches[kernel], DEV)
                out[kernel] = "ok"
            except AssertionError as e:
                out[kernel] = f"FAILED: {e}"
    return out


# ------------------------------------------------------------------------------------------------
# The benchmark


@dataclasses.dataclass
class Bench:
    quick: bool
    ab: bool
    baselines: tuple
    candidates: tuple
    plan_candidates: tuple = ()
    verify_sizes: tuple = ()  # verify's rows, entries per plan (empty: VERIFY_SIZES)
    verify_modes: tuple = ()  # verify's rows, launch modes (empty: MODES)
    verify_kept: frozenset = frozenset()  # (mode, order, entries) of the verify rows a resumed run holds: not timed
    launchers: Launchers = None
    arch: str = ""
    warnings: list = dataclasses.field(default_factory=list)
    agreement: dict = dataclasses.field(default_factory=dict)
    impls: dict = dataclasses.field(default_factory=dict)  # (baseline, kernel) -> launch
    floor_fns: dict = dataclasses.field(default_factory=dict)
    probes: dict = dataclasses.field(default_factory=dict)  # baseline -> (start time, child process)
    floor_makers: dict = dataclasses.field(default_factory=floor_makers)

    def warn(self, message):
        print(f"WARNING: {message}", flush=True)
        self.warnings.append(message)

    def ours(self, kernel, choice):
        return self.launchers.launch(kernel, choice)

    # -- baselines --------------------------------------------------------------------------------
    def start_probes(self, kernels):
        """Start checking each compiled baseline against the reference in a child process (a crashing
        kernel cannot take this run's CUDA context with it); the children build and check while this
        process compiles its floors. ``load_baselines`` collects them."""
        self.probes = {}
        for name in self.baselines:
            if name != "torch":
                cmd = [sys.executable, os.path.abspath(__file__), "--probe", name, "--kernels", *kernels]
                self.probes[name] = (time.time(), subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                                   text=True))

    def load_baselines(self, kernels):
        """Keep the baselines' kernels that agree with the reference (``start_probes``); check our own
        kernels the same way here."""
        from baselines import agreement

        if "torch" in self.baselines:
            for kernel, launch in baseline_launches("torch").items():
                if kernel in kernels:
                    self.impls[("torch", kernel)] = launch
                    self.agreement[f"torch {kernel}"] = "is the reference"
        for name, (t0, child) in self.probes.items():
            verdicts, reason = None, ""
            try:
                stdout, stderr = child.communicate(timeout=900)
                lines = stdout.strip().splitlines()
                if child.returncode == 0 and lines:
                    verdicts = json.loads(lines[-1])
                else:
                    tail = [ln for ln in (stderr or stdout).strip().splitlines() if ln.strip()]
                    reason = f"exit {child.returncode}: {tail[-1][:300] if tail else 'no output'}"
            except (subprocess.TimeoutExpired, json.JSONDecodeError) as e:
                child.kill()
                reason = type(e).__name__
            if verdicts is None:
                for kernel in kernels:
                    self.agreement[f"{name} {kernel}"] = f"unavailable ({reason})"
                self.warn(f"baseline {name} left out: {reason}")
                continue
            launches = baseline_launches(name)
            for kernel, verdict in verdicts.items():
                self.agreement[f"{name} {kernel}"] = (
                    f"identical to the reference (checked in a child process, {time.time() - t0:.0f} s incl. build)"
                    if verdict == "ok" else verdict)
                if verdict == "ok":
                    self.impls[(name, kernel)] = launches[kernel]
                else:
                    self.warn(f"baseline {name} {kernel} left out: {verdict}")
        for kernel in kernels:
            try:
                agreement.check(kernel, self.ours(kernel, "default"), DEV)
                self.agreement[f"tvm_canary {kernel}"] = "identical to the reference"
            except AssertionError as e:
                self.agreement[f"tvm_canary {kernel}"] = f"FAILED: {e}"
                self.warn(f"tvm_canary {kernel} differs from the reference: {e}")

    def baseline_times(self, kernel, calls_of, row, graphable=True):
        """Time every agreeing baseline on the row's inputs: ``calls_of(launch)`` -> zero-arg calls."""
        out = {}
        for name in self.baselines:
            launch = self.impls.get((name, kernel))
            if launch is None:
                continue
            calls = calls_of(launch)
            try:
                out[name] = (once_us(calls[0]) if name == "torch"
                             else graph_time_us(calls, iters=7 if not graphable else 15))
            except Exception as e:  # noqa: BLE001
                self.warn(f"{name} {kernel} {row['case']}: {type(e).__name__}: {e}")
                out[name] = float("nan")
        row["baselines"] = out

    # -- floors -----------------------------------------------------------------------------------
    def floor_kernel(self, name, geom):
        """Compiled floor kernel ``name`` (``floor_makers``) for one grid (cached)."""
        import floors

        key = (name, geom)
        if key not in self.floor_fns:
            self.floor_fns[key] = floors.compile_cuda(self.floor_makers[name](geom), self.arch)
        return self.floor_fns[key]

    def prebuild_floors(self, kernels):
        families = {verdicts.FLOOR_OF[k] for k in kernels}
        for name in self.floor_makers:  # the bounds' variants compile when first used (bounded_row)
            if name.split("-")[0] in families and not {"hash", "ticket"} & set(name.split("-")):
                for geom in floor_grids(name):
                    self.floor_kernel(name, geom)

    def floor_arms(self, names, calls_of) -> dict:
        """The floor kernels ``names`` over every floor grid, as arms to time: {(name, grid label): calls};
        ``calls_of(fn)`` -> zero-arg calls."""
        return {(name, geometry_label(geom)): calls_of(self.floor_kernel(name, geom))
                for name in names for geom in floor_grids(name)}

    def copy_arms(self, nbytes: int) -> dict:
        """The arms of a dense device-to-device copy of ``nbytes`` (half read, half written): torch's copy
        and a TIR copy kernel over the floor grids ({("copy", label): calls}). Each graph holds
        ``COPY_FLOOR_LAUNCHES`` copies alternating between two buffer pairs (like the kernels' two input
        sets): the graph's start weighs less per copy than per kernel launch, which can only lower
        the floor."""
        words = max(nbytes // 16, 2)
        pairs = [(torch.empty(words, dtype=torch.int64, device=DEV), torch.empty(words, dtype=torch.int64, device=DEV))
                 for _ in range(2)]
        rounds = COPY_FLOOR_LAUNCHES // len(pairs)
        arms = {("copy", "torch copy"): [lambda s=s, d=d: d.copy_(s) for s, d in pairs] * rounds}
        arms.update(self.floor_arms(["copy"], lambda fn: [lambda s=s, d=d: fn(s, d) for s, d in pairs] * rounds))
        return arms

    @staticmethod
    def fastest(times, name):
        """The fastest arm of floor ``name`` in ``times`` ({arm: µs}; a floor's arm is (name, grid label)):
        (µs, its label)."""
        return min((us, arm[1]) for arm, us in times.items() if isinstance(arm, tuple) and arm[0] == name)

    def fastest_memory(self, times, family, mode):
        """The fastest arm of ``family``'s memory floor in ``mode`` over its forms (``memory_floors``) in
        ``times``: (µs, label: the family, the grid and the form)."""
        forms = memory_floors(mode, family)
        (us, grid), name = min((self.fastest(times, name), name) for name in forms)
        return us, f"{family} {grid}{order_label(forms[name])}"

    def fastest_floor(self, name, calls_of):
        """Fastest grid of floor kernel ``name``, its grids timed interleaved: (µs, its geometry);
        ``calls_of(fn)`` -> zero-arg calls."""
        us, label = self.fastest(medians(interleaved_us(self.floor_arms([name], calls_of))), name)
        return us, next(geom for geom in floor_grids(name) if geometry_label(geom) == label)

    def fastest_copy(self, times):
        """The fastest of ``copy_arms`` in ``times`` ({arm: µs}): (µs, which)."""
        us, label = self.fastest(times, "copy")
        return us, label if label == "torch copy" else f"copy {label}"

    def copy_floor_us(self, nbytes: int):
        """The fastest of ``copy_arms``, timed interleaved: (µs, which)."""
        return self.fastest_copy(medians(interleaved_us(self.copy_arms(nbytes))))

    @staticmethod
    def bound_names(family, mode) -> list:
        """The floors that bound a row beyond its bytes (``bounds``; verify: ``bounded_row``): the ``hash``
        and ``ticket`` variants of ``family`` in ``mode``, per fold order."""
        return [f"{family}-{variant}-{infix}{mode}" for variant in ("hash", "ticket") for infix in fold_orders(mode)]

    def bounds(self, row, family, mode, times, empty_us):
        """What bounds a verify (``bounded_row``) or a many-request write beyond its bytes, from the
        row's interleaved ``times`` of ``bound_names`` (``family``: "gather" for verify, "store" for
        write): ``hash_floor_us``, the floor that also hashes as SPEC 1 requires (chain links, real-KV
        fold; the ordered floor when that ran faster), and ``ordered_floor_us``, the least a kernel that
        appends its rows in order pays on top: the faster of that floor with the single launch's clean
        protocol (a block barrier, a ticket per block, the last block counting the launch) and that
        floor plus one more launch (``empty_us``), the cost of emitting in a second kernel. Each is the
        fastest of the floor grids and, with two sources, of every fold order the family builds
        (``fold_orders``)."""
        orders = fold_orders(mode)

        def fastest_order(variant):
            (us, grid), infix = min((self.fastest(times, f"{family}-{variant}-{infix}{mode}"), infix)
                                    for infix in orders)
            return us, grid + order_label(orders[infix])

        hash_us, grid = fastest_order("hash")
        ticket_us, ticket_grid = fastest_order("ticket")
        row["ordered_floor_us"], row["ordered_floor"] = min(
            (ticket_us, f"hash + ticket {ticket_grid}"), (hash_us + empty_us, f"hash {grid} + launch"))
        # The ordered floor does the hash floor's work and more, so a hash floor measured above it was
        # inflated by noise (the forty-seventh session's run: write ALL 4096 x 1 hash 5.45 µs beside hash
        # + ticket 5.21 µs, and three rows more at 0.977-0.996x): the lower of the two bounds the row.
        row["hash_floor_us"], row["hash_floor"] = min((hash_us, f"hash {grid}"),
                                                      (row["ordered_floor_us"], row["ordered_floor"]))

    # -- rows -------------------------------------------------------------------------------------
    def timed(self, kernel, kw_sets, row, floor_arms, iters=7, none_sets=()):
        """Our kernel on the rotating sets, its default geometry (and with --ab its tuned one)
        interleaved with ``floor_arms`` ({(floor, label): calls}): AB_ROUNDS rounds of ``iters`` replays
        of each arm in turn, so the kernel and its floors see the same state of the GPU. ``none_sets``
        (a real-KV write row: its inputs in NONE mode): NONE's default kernel on them is one more arm,
        ``row["none_us"]``, so the row's NONE target compares times of the same rounds. Sets the row's
        times; returns the floors' {arm: median µs}."""
        def launches(sets, geometry="default"):
            return [lambda kw=kw: self.ours(kernel, geometry)(**kw) for kw in sets]

        arms = {"default": launches(kw_sets)}
        if none_sets:
            arms["none"] = launches(none_sets)
        if self.ab:
            same = self.launchers.same(kernel, kw_sets[0])
            arms["tuned"] = launches(kw_sets, "default" if same else "tuned")
        times = interleaved_us(arms | floor_arms, iters)
        times_us = medians(times)
        row["us"] = times_us["default"]
        if none_sets:
            row["none_us"] = times_us["none"]
        if self.ab:
            row.update(tuned_us=times_us["tuned"], tuned_same_geometry=same,
                       ab_rounds={"default": times["default"], "tuned": times["tuned"]},
                       tuned_geometry=geometry_label(self.launchers.tuned_geometry(kernel, kw_sets[0])))
        return {arm: us for arm, us in times_us.items() if arm in floor_arms}

    def verify_rows(self, pool, empty_us, timed=None):
        """Verify's rows: the chosen modes and sizes (``verify_modes``, ``verify_sizes``) in both orders, but
        those a resumed run holds (``verify_kept``); ``timed(rows so far)`` after each row."""
        rows = []
        sizes = self.verify_sizes or VERIFY_SIZES["quick" if self.quick else "full"]
        candidates = [(c, parse_geometry(c)) for c in self.candidates]
        words = pool.canary.view(torch.int64)
        for mode in self.verify_modes or MODES:
            for order in ORDERS:
                todo = [n for n in sizes if (mode, order, n) not in self.verify_kept]
                if not todo:
                    continue
                slots_2d, _ = stamp_chains(self, pool, mode, order)
                ctx = pool.context(mode)
                n_src = len(ctx.real_kv_sources)
                for n in todo:
                    plans = verify_plans(slots_2d, n, order, 4 if n <= (1 << 20) else 2)
                    kws = [{"context": ctx, "plan": p, "check_verify_expected_token": False} for p in plans]
                    row = {"kernel": "verify", "case": f"{mode} {order} {n}", "mode": mode, "order": order, "n": n}

                    def calls_of(fn, plans=plans):
                        return [lambda p=p: fn(words, p.verify_slot_indices, p.verify_expected_tokens,
                                               p.verify_expected_positions,
                                               p.verify_prev_slot_indices, p.verify_num_valid, pool.kv, pool.counters,
                                               pool.floor_flags, pool.floor_counter) for p in plans]

                    bounded = bounded_row(mode, n)
                    names = list(memory_floors(mode, "gather")) + (self.bound_names("gather", mode) if bounded else [])
                    floor_times = self.timed("verify", kws, row, self.floor_arms(names, calls_of))
                    if pool.flagged():
                        self.warn(f"verify {row['case']} flagged violations (the benchmark's verify is clean)")
                    row["floor_us"], row["floor"] = self.fastest_memory(floor_times, "gather", mode)
                    if bounded:
                        self.bounds(row, "gather", mode, floor_times, empty_us)
                    src_bytes = n_src * (32 if mode == "PARTIAL" else KV_BYTES) if n_src else 0
                    row["bytes"] = n * (24 + 32 + 32 + src_bytes)
                    if candidates:
                        row["candidates"] = {}
                        for name, geom in candidates:
                            launch = self.ours("verify", geom)
                            row["candidates"][name] = graph_time_us([lambda kw=kw, launch=launch: launch(**kw)
                                                                     for kw in kws])
                    self.baseline_times("verify", lambda launch, kws=kws: [lambda kw=kw: launch(**kw) for kw in kws],
                                        row)
                    if pool.flagged():
                        self.warn(f"a baseline flagged violations on verify {row['case']}")
                    rows.append(row)
                    self.progress(row)
                    if timed:
                        timed(rows)
        return rows

    def write_rows(self, pool, chain_ns, empty_us):

        rows = []
        n = pool.slots - 1
        words = pool.canary.view(torch.int64)
        for reqs, length in WRITE_SHAPES:
            for mode in MODES:
                inputs = [((torch.randperm(n, device=DEV)[: reqs * length] + 1).view(reqs, length),
                           torch.randint(0, 150000, (reqs, length), device=DEV)) for _ in range(4)]
                sets = [write_args(pool, mode, *slots_and_ids) for slots_and_ids in inputs]
                none_sets = ([write_args(pool, "NONE", *slots_and_ids) for slots_and_ids in inputs] if mode != "NONE"
                             else ())
                row = {"kernel": "write", "case": f"{mode} {reqs}x{length}", "mode": mode, "reqs": reqs,
                       "shape": f"{reqs}x{length}"}
                chain_floor = chain_ns * length / 1000 + empty_us

                def calls_of(fn, sets=sets):
                    return [lambda a=a: fn(words, a["plan"].write_offsets, a["plan"].write_seed_slot_indices,
                                           a["input_ids"], a["positions"], a["out_cache_loc"], pool.kv,
                                           pool.floor_flags, pool.floor_counter)
                            for a in sets]

                one_token = length == 1  # one-token requests: latency-bound, like small verifies
                names = list(memory_floors(mode, "store")) + (self.bound_names("store", mode) if one_token else [])
                floor_times = self.timed("write", sets, row, self.floor_arms(names, calls_of), iters=5,
                                         none_sets=none_sets)
                store_floor = self.fastest_memory(floor_times, "store", mode)
                row["chain_floor_us"], row["store_floor_us"] = chain_floor, store_floor[0]
                if one_token:
                    self.bounds(row, "store", mode, floor_times, empty_us)
                    # The hash floor does the store floor's work and more, so a store floor measured above
                    # it was inflated by noise (the eighth session's run: NONE 4096 x 1 store 4.49 µs beside
                    # hash 3.38 µs, the same work with anchor seeds): the lower of the two bounds the row's
                    # target; a kernel under the store floor still fails "floors as lower bounds".
                    store_floor = min(store_floor, (row["hash_floor_us"], row["hash_floor"]))
                row["floor_us"], row["floor"] = max((chain_floor, f"chain {chain_ns:.1f}ns/step"), store_floor)
                row["bytes"] = reqs * 16 + reqs * length * (56 + (2 * (16 if mode == "PARTIAL" else KV_BYTES)
                                                                  if mode != "NONE" else 0))
                self.check_write_bytes(sets[0], row)
                self.baseline_times("write", lambda launch, sets=sets: [lambda a=a: launch(**a) for a in sets], row,
                                    graphable=False)
                if pool.flagged():
                    self.warn(f"write {row['case']} flagged violations")
                rows.append(row)
                self.progress(row)
        return rows

    def check_write_bytes(self, args, row):
        """On the row's own inputs: every baseline stamps the bytes our kernel stamps."""
        slots = args["out_cache_loc"]
        canary = args["context"].canary_buf
        self.ours("write", "default")(**args)
        expected = canary[slots].clone()
        for name in self.baselines:
            launch = self.impls.get((name, "write"))
            if launch is None or name == "torch":
                continue
            canary[slots] = 0
            launch(**args)
            if not torch.equal(canary[slots], expected):
                self.warn(f"{name} write {row['case']}: stamped bytes differ from tvm_canary's")
                row.setdefault("byte_mismatch", []).append(name)

    def plan_rows(self):
        import tvm_canary as tc

        rows = []
        default_tile = self.launchers.geometry("plan", "default", 0, 0).tile
        for bs, prefix in PLAN_SHAPES:
            r2t = torch.randint(1, 1 << 24, (bs + 1, 4096), dtype=torch.int32, device=DEV)
            total = bs * prefix
            kw = {
                "req_pool_indices": torch.arange(1, bs + 1, device=DEV),
                "prefix_lens": torch.full((bs,), prefix, device=DEV),
                "extend_seq_lens": torch.ones(bs, dtype=torch.int64, device=DEV), "req_to_token": r2t,
                "swa_window_size": 0,
                "full_to_swa_index_mapping": None, "verify_capacity": total, "req_to_verify_expected_tokens": None,
                "req_to_verify_expected_tokens_valid_lens": None, "kv_token_id_vs_position_offset": 0,
            }
            sets = [dict(kw, verify_plan_out=tc.VerifyPlan.allocate(verify_capacity=total, device=DEV),
                         write_plan_out=tc.WritePlan.allocate(write_req_capacity=bs, device=DEV)) for _ in range(2)]
            row = {"kernel": "plan", "case": f"bs{bs} prefix{prefix}", "bytes": total * 36}
            row["floor_us"], row["floor"] = self.fastest_copy(self.timed("plan", sets, row,
                                                                         self.copy_arms(row["bytes"])))
            if self.plan_candidates:
                row["plan_candidates"] = {}
                for name in self.plan_candidates:
                    launch = self.ours("plan", parse_geometry(name, default_tile))
                    row["plan_candidates"][name] = graph_time_us([lambda a=a, launch=launch: launch(**a) for a in sets])
            self.baseline_times("plan", lambda launch, sets=sets: [lambda a=a: launch(**a) for a in sets], row)
            rows.append(row)
            self.progress(row)
        return rows

    def scatter_rows(self):
        rows = []
        for bs, length in SCATTER_SHAPES:
            flat = torch.randint(0, 150000, (bs * length,), device=DEV)
            offsets = torch.arange(bs + 1, device=DEV) * length
            rpi = torch.randperm(bs, device=DEV) + 1
            sets = [{"flat_in": flat, "offsets": offsets, "req_pool_indices": rpi,
                         "pool_out": torch.zeros(bs + 1, length, dtype=torch.int32, device=DEV)} for _ in range(2)]
            row = {"kernel": "scatter", "case": f"bs{bs}x{length}", "bytes": bs * length * 12}
            row["floor_us"], row["floor"] = self.fastest_copy(self.timed("scatter", sets, row,
                                                                         self.copy_arms(row["bytes"])))
            self.baseline_times("scatter", lambda launch, sets=sets: [lambda a=a: launch(**a) for a in sets], row)
            rows.append(row)
            self.progress(row)
        return rows

    def progress(self, row):
        extra = "".join(f"  {name} {us:.1f} us" for name, us in row.get("plan_candidates", {}).items())
        extra += "".join(f"  {key[:-9]} floor {row[key]:.1f} us" for key in ("hash_floor_us", "ordered_floor_us")
                         if key in row)
        print(f"  {row['kernel']:8} {row['case']:24} {row['us']:10.1f} us  floor {row['floor_us']:10.1f} us{extra}",
              flush=True)


def environment() -> dict:
    """GPU, driver and versions of everything that produced the numbers."""
    import tvm
    import tvm_ffi

    env = {"gpu": torch.cuda.get_device_name(0), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
               "torch": torch.__version__, "cuda": torch.version.cuda, "tvm": tvm.__version__,
               "tvm_ffi": tvm_ffi.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        env["driver"] = None
    return env


# What a resumed run must share with the file it continues (``resume_run``): the run's options, and
# GPU, driver and versions (``environment``) as they were when the file was written.
RESUME_KEYS = ("arch", "ab", "quick", "baselines", "candidates", "plan_candidates")


def code_files() -> list:
    """The sources that decide a row's times: what shapes the kernels' generated code
    (``compile.source_files``), the floors, this benchmark, the timing method (``tvm_canary.timing``) and
    the baselines (the torch reference among them); not the defaults or the tuning database."""
    from tvm_canary import _sources, reference, timing
    from tvm_canary.runtime import compile

    ours, references = pathlib.Path(HERE), pathlib.Path(reference.__file__).parent
    baselines = sorted(p for p in (ours / "baselines").iterdir() if p.suffix in (".py", ".cu") and p.name[0] != ".")
    return [*compile.source_files(), ours / "floors.py", ours / "bench_kernels.py", pathlib.Path(timing.__file__),
            *baselines, *_sources.python_files(references)]


def code_digest() -> str:
    """A part's ``code``: ``compile.files_hash`` of ``code_files``."""
    from tvm_canary.runtime import compile

    return compile.files_hash(code_files())


def verify_rows_problem(verify_sizes, verify_modes, quick: bool, kernels) -> str | None:
    """Why ``--verify-sizes`` / ``--verify-modes`` cannot apply to an invocation that times ``kernels``
    (after ``--resume``: those still to run), or None: a size outside the preset's ``VERIFY_SIZES``, or
    no verify rows to time."""
    known = VERIFY_SIZES["quick" if quick else "full"]
    if not set(verify_sizes) <= set(known):
        return f"--verify-sizes: verify's sizes are {', '.join(map(str, known))}"
    if (verify_sizes or verify_modes) and "verify" not in kernels:
        return ("--verify-sizes and --verify-modes choose verify's rows, and this invocation times none: give "
                "--kernels verify (with --resume, and --redo verify for rows the run holds)")
    return None


def verify_chosen(mode: str, n: int, verify_sizes=(), verify_modes=()) -> bool:
    """Whether verify's rows of ``mode`` at ``n`` entries are among those ``--verify-sizes`` and
    ``--verify-modes`` choose (each empty: all)."""
    return (not verify_sizes or n in verify_sizes) and (not verify_modes or mode in verify_modes)


REPLACED_VERIFY_KEYS = ("replaced_verify_sizes", "replaced_verify_rows")  # a part's record of them


def replaced_verify_rows(part: dict) -> set:
    """{(mode, entries)} of the verify rows a run's ``part`` timed that later invocations replaced:
    ``replaced_verify_sizes`` (every mode at those sizes) and ``replaced_verify_rows`` ("MODE ENTRIES")."""
    return ({(mode, n) for n in part.get("replaced_verify_sizes", ()) for mode in MODES}
            | {(case.split()[0], int(case.split()[1])) for case in part.get("replaced_verify_rows", ())})


def replaced_verify_keys(pairs: set) -> dict:
    """A part's record of the replaced verify rows ``pairs`` {(mode, entries)}: sizes replaced in every
    mode as ``replaced_verify_sizes``, the other rows as ``replaced_verify_rows`` ("MODE ENTRIES")."""
    whole = sorted({n for _, n in pairs if all((mode, n) in pairs for mode in MODES)})
    rest = sorted((p for p in pairs if p[1] not in whole), key=lambda p: (p[1], MODES.index(p[0])))
    return ({"replaced_verify_sizes": whole} if whole else {}) | (
        {"replaced_verify_rows": [f"{mode} {n}" for mode, n in rest]} if rest else {})


def row_order(row) -> tuple:
    """A run's row order: the kernels as in ``KERNELS``, verify's rows as its sweep makes them (mode, order,
    size), so rows timed again by a later part (``--redo``) stand where the sweep puts them."""
    sweep = ((MODES.index(row["mode"]), ORDERS.index(row["order"]), row["n"])
             if row["kernel"] == "verify" else ())
    return (KERNELS.index(row["kernel"]), *sweep)


def verify_default_of(labels: str, mode: str, n: int) -> str:
    """The geometry that ``default_labels("verify", ...)``'s text ``labels`` gives a verify launch in
    ``mode`` over ``n`` entries: the mode's size class of the highest bound at most ``n``, else the
    mode's default, else the kernel's (the first label)."""
    chosen, bound = labels.split(", ")[0], -1
    for words in (label.split(" ") for label in labels.split(", ")[1:]):
        at_least = int(words[2]) if len(words) == 4 else 0
        if words[0] == mode and bound < at_least <= n:
            chosen, bound = words[-1], at_least
    return chosen


def resume_run(prior: dict, now: dict, kernels: list[str], redo=(), verify_sizes=(),
               verify_modes=()) -> tuple[list, list[str], list]:
    """(rows kept, kernels of ``kernels`` still to run, ``prior``'s ``parts``) when the run ``prior`` (a
    ``--json`` file) is continued by an invocation whose environment, options and default geometries
    are ``now`` (keys ``env``, ``RESUME_KEYS``, ``default_geometries``, ``code``) for ``kernels``; ``ValueError``
    naming the first difference when it is not the same run (a kept kernel's defaults are those its
    rows ran, ``prior``'s ``default_geometries``). Every row is kept but those of the kernels ``redo``
    (``--redo``), which run again; a part that timed them names them ``replaced``. Verify runs again
    while the rows kept lack one it would time (``verify_cases``): a sweep cut short goes on. With
    ``verify_sizes`` / ``verify_modes`` (``--verify-sizes`` / ``--verify-modes``) a redone verify drops
    only its rows of those sizes and modes, which a part that timed them names (``replaced_verify_keys``);
    each verify row kept must have run the default this checkout gives it (``verify_default_of``), and when
    verify runs again beside rows kept, every part that timed one of them must have run ``now``'s ``code``."""
    for key in ("env", *RESUME_KEYS):
        if prior.get(key) != now[key]:
            raise ValueError(f"--resume: the run in --json has {key} {prior.get(key)!r}, this invocation {now[key]!r}")
    done = {row["kernel"] for row in prior["rows"]} - set(redo)
    for kernel in done & set(kernels):
        if prior["default_geometries"].get(kernel) != now["default_geometries"][kernel]:
            raise ValueError(f"--resume: the run in --json timed {kernel}'s defaults "
                             f"{prior['default_geometries'].get(kernel)!r}, "
                             f"this checkout's are {now['default_geometries'][kernel]!r} (--redo {kernel} times "
                             "its rows again)")
    partial = "verify" in redo and bool(verify_sizes or verify_modes)

    def kept(row) -> bool:
        return row["kernel"] in done or (partial and row["kernel"] == "verify"
                                         and not verify_chosen(row["mode"], row["n"], verify_sizes, verify_modes))

    rows = [row for row in prior["rows"] if kept(row)]
    for row in rows:
        if row["kernel"] == "verify" and partial:
            then, current = (verify_default_of(d["default_geometries"]["verify"], row["mode"], row["n"])
                             for d in (prior, now))
            if then != current:
                add = " and ".join(flag for flag, chosen in (
                    (f"--verify-sizes {row['n']}", verify_chosen(row["mode"], row["n"], verify_sizes)),
                    (f"--verify-modes {row['mode']}", verify_chosen(row["mode"], row["n"], (), verify_modes)))
                    if not chosen)
                raise ValueError(f"--resume: the run in --json timed verify {row['case']} at {then}, this checkout's "
                                 f"default there is {current}: give {add} too")

    def marked(part) -> dict:  # the part, naming the kernels (and rows) whose rows a later invocation timed again
        redone = [k for k in part["kernels"] if k in redo]
        pairs = replaced_verify_rows(part)
        if partial and "verify" in redone:
            redone.remove("verify")  # some of its rows
            pairs |= {(mode, n) for mode, _, n in part_verify_cases(part, now["quick"])
                      if verify_chosen(mode, n, verify_sizes, verify_modes)}
        replaced = [k for k in part["kernels"] if k in redone or k in part.get("replaced", ())]
        part = {k: v for k, v in part.items() if k not in REPLACED_VERIFY_KEYS}
        if "verify" not in replaced:  # else all of them
            part |= replaced_verify_keys(pairs)
        return {**part, "replaced": replaced} if replaced else part

    parts = [marked(part) for part in prior.get("parts", [])]
    missing = verify_cases(verify_sizes, verify_modes, now["quick"]) - verify_row_cases(rows)
    to_run = [k for k in kernels if k not in done or (k == "verify" and missing)]

    def holds_kept_rows(part) -> bool:  # some of verify's rows the run keeps were timed by ``part``
        gone = replaced_verify_rows(part)
        return "verify" not in part.get("replaced", ()) and any(
            (mode, n) not in gone for mode, _, n in part_verify_cases(part, now["quick"]))

    if "verify" in to_run:
        other = {part.get("code") for part in parts if holds_kept_rows(part)} - {now["code"]}
        if other:
            raise ValueError(f"--resume: the run in --json timed verify's rows it keeps with code "
                             f"{', '.join(sorted(code or 'none recorded' for code in other))}, this checkout's is "
                             f"{now['code']}: --redo verify (without --verify-sizes and --verify-modes) times them "
                             "all again")
    return rows, to_run, parts


def verify_cases(verify_sizes=(), verify_modes=(), quick: bool = False) -> set:
    """{(mode, order, entries)} of the verify rows an invocation times, ``--verify-sizes`` and
    ``--verify-modes`` (each empty: all of the preset's) in both orders."""
    return {(mode, order, n) for mode in verify_modes or MODES for order in ORDERS
            for n in verify_sizes or VERIFY_SIZES["quick" if quick else "full"]}


def part_verify_cases(part: dict, quick: bool) -> set:
    """{(mode, order, entries)} of the verify rows a run's ``part`` timed (none when it timed no verify)."""
    if "verify" not in part["kernels"]:
        return set()
    return ({(mode, order, int(n)) for mode, order, n in map(str.split, part["verify_rows"])}
            if "verify_rows" in part else verify_cases(part.get("verify_sizes"), part.get("verify_modes"), quick))


def verify_row_cases(rows) -> set:
    """{(mode, order, entries)} of the verify rows among a run's ``rows``."""
    return {(row["mode"], row["order"], row["n"]) for row in rows if row["kernel"] == "verify"}


def part_record(done: list[str], wall_s: float, empty_us: float, chain_ns: float, verify_sizes=(),
                verify_modes=(), cut: str | None = None, verify_rows=None, code: str | None = None) -> dict:
    """One invocation's entry in a run's ``parts``: the kernels it timed (``done``), its wall time, empty
    launch and register-only chain, verify's sizes and modes when ``--verify-sizes`` / ``--verify-modes``
    chose them and it timed verify, ``cut``: the last of ``done`` when its sweep was still under way as
    the run was written (verify's, written row by row), and ``verify_rows``: the cases of the verify rows
    it timed when they are not all that its sizes and modes choose (cut short, or a resumed sweep that
    timed only the rows the run lacked); ``code``: ``code_digest`` of the checkout that ran it (none in
    parts written before the sixty-seventh session)."""
    chosen = {key: list(values) for key, values in (("verify_sizes", verify_sizes), ("verify_modes", verify_modes))
              if values and "verify" in done}
    return ({"kernels": list(done), "wall_s": wall_s, "empty_us": empty_us, "chain_ns": chain_ns, **chosen}
            | ({"cut": cut} if cut else {}) | ({"verify_rows": list(verify_rows)} if verify_rows is not None else {})
            | ({"code": code} if code else {}))


def run_timing(parts: list[dict]) -> dict:
    """A run's top-level ``empty_us`` and ``chain_ns``: those of the part whose write rows it holds
    (write's targets were measured against them), the last part that timed write and whose write rows
    no later part replaced (``resume_run``); the last part's when none did."""
    timing = next((p for p in reversed(parts) if "write" in p["kernels"] and "write" not in p.get("replaced", ())),
                  parts[-1])
    return {"empty_us": timing["empty_us"], "chain_ns": timing["chain_ns"]}


def complete(rows: list[dict], quick: bool = False) -> bool:
    """Whether a run holds rows of every kernel (``KERNELS``) and verify's rows of every mode, order and
    size of its preset (``verify_cases``), however its parts were asked for: the reports mark any other
    run incomplete (a cut-short run, one part not yet resumed, or verify timed at some sizes or modes
    alone)."""
    return set(KERNELS) <= {row["kernel"] for row in rows} and verify_cases(quick=quick) <= verify_row_cases(rows)


def finish(rows):
    """Derived columns: GB/s, ratio to floor, speedups over baselines, targets with PASS/FAIL."""
    for r in rows:
        r["gbps"] = r["bytes"] / r["us"] / 1e3
        r["ratio"] = r["us"] / r["floor_us"]
        r["floor_ratios"] = verdicts.floor_ratios(r)  # per arm: time / its highest floor
        r["below_floor"] = bool(verdicts.below_floor(r))  # a floor that is not a lower bound
        r["speedup"] = {name: t / r["us"] for name, t in r.get("baselines", {}).items()}
        r["targets"] = targets_for(r, rows)
        r["status"] = ("PASS" if all(t["ratio"] <= t["limit"] for t in r["targets"])
                       else "FAIL") if r["targets"] else ""


def print_table(meta, rows, baselines):
    print(f"\n{meta['env']['gpu']} ({meta['arch']}, driver {meta['env']['driver']}); "
          f"empty launch {meta['empty_us']:.2f} us; "
          f"register-only chain {meta['chain_ns']:.1f} ns/step; default geometries")
    head = f"{'kernel':8} {'case':24} {'us':>9} {'floor':>22} {'floor us':>9} {'ratio':>6} {'target':>14} {'':4}"
    head += "".join(f" {b + ' us':>10} {'x':>6}" for b in baselines)
    if any("tuned_us" in r for r in rows):
        head += f" {'tuned us':>9} {'t/d':>6}"
    print(head)
    for r in rows:
        tg = " ".join(f"{t['what']}<={t['limit']:.2f}" for t in r["targets"])
        line = (f"{r['kernel']:8} {r['case']:24} {r['us']:9.1f} {r['floor']:>22} {r['floor_us']:9.1f} "
                f"{r['ratio']:6.2f} {tg:>14} {r['status']:4}")
        for b in baselines:
            t = r.get("baselines", {}).get(b)
            line += f" {t:10.1f} {t / r['us']:6.2f}" if t is not None else f" {'-':>10} {'-':>6}"
        if "tuned_us" in r:
            line += f" {r['tuned_us']:9.1f} {r['tuned_us'] / r['us']:6.3f}"
        if "ordered_floor_us" in r:
            line += f"  ordered floor {r['ordered_floor_us']:.1f} ({r['us'] / r['ordered_floor_us']:.2f})"
        if r["below_floor"]:
            line += f"  BELOW FLOOR: {verdicts.below_floor_arms(r)}"
        print(line)
    failed = [f"{r['kernel']} {r['case']}" for r in rows if r["status"] == "FAIL"]
    print(f"targets: {sum(r['status'] == 'PASS' for r in rows)} PASS, {len(failed)} FAIL")
    slower = verdicts.tuned_slower_labels(rows)
    if any("tuned_us" in r for r in rows):
        print(f"tuned more than {verdicts.TUNED_SLOWER_PERCENT} slower than default (interleaved A/B): "
              f"{', '.join(slower) if slower else 'none'}." + verdicts.aa_note(rows))
    print("agreement with the reference: " + "; ".join(f"{k}: {v}" for k, v in meta["agreement"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    ap.add_argument("--ab", action="store_true", help="also time the tuned geometry, interleaved with the default "
                    "(with TVM_CANARY_TUNED=0 the tuned geometry is the default: an A/A run)")
    ap.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    ap.add_argument("--baselines", nargs="*", choices=("original", "triton", "torch"),
                    default=["original", "triton", "torch"])
    ap.add_argument("--candidates", nargs="*", default=[],
                    help="extra verify geometries to time, e.g. 1056x512m1 528x128m2wp (w: thin, p: paired folds)")
    ap.add_argument("--plan-candidates", nargs="*", default=[],
                    help="extra plan geometries to time, BLOCKSxTHREADS[kTILE] (tile: the default's), "
                         "e.g. 528x512 2112x512k1024")
    ap.add_argument("--json", help="write the rows and the run's environment here")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --json: keep its rows, time the rest (of verify, the rows it lacks)")
    ap.add_argument("--redo", nargs="+", default=[], choices=KERNELS, metavar="KERNEL",
                    help="with --resume: drop these kernels' rows and time them again (after a change to them "
                         "alone; not to continue a call cut short, which would time its rows again)")
    ap.add_argument("--verify-sizes", nargs="+", type=int, default=[], metavar="ENTRIES",
                    help="verify's rows of these sizes only (of bench_kernels.VERIFY_SIZES); with --resume "
                         "--redo verify, only they are timed again")
    ap.add_argument("--verify-modes", nargs="+", default=[], choices=MODES, metavar="MODE",
                    help="verify's rows of these launch modes only (NONE, PARTIAL, ALL); with --resume "
                         "--redo verify, only they are timed again")
    ap.add_argument("--probe", choices=tuple(BASELINE_MODULES), help=argparse.SUPPRESS)  # child of load_baselines
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        return fail("bench_kernels.py needs a CUDA GPU and torch sees none (torch "
                    f"{torch.__version__}, CUDA build {torch.version.cuda}); run it on a GPU host")
    sys.path.insert(0, HERE)
    if args.probe:
        print(json.dumps(probe(args.probe, args.kernels)))
        return 0
    for c in args.candidates:
        try:
            parse_geometry(c)
        except ValueError:
            return fail(f"--candidates {c!r}: expected BLOCKSxTHREADS[mMIN_BLOCKS][w][p], e.g. 1056x512m1")
    for c in args.plan_candidates:
        try:
            parse_geometry(c)
        except ValueError:
            return fail(f"--plan-candidates {c!r}: expected BLOCKSxTHREADS[kTILE], e.g. 528x512k1024")
    if args.resume and not (args.json and os.path.exists(args.json)):
        return fail("--resume continues the run in --json: give --json a run's file")
    if args.redo and not (args.resume and set(args.redo) <= set(args.kernels)):
        return fail("--redo times kernels of a run again: give --resume, and --kernels including them")
    if problem := verify_rows_problem(args.verify_sizes, args.verify_modes, args.quick, args.kernels):
        return fail(problem)

    sys.path.insert(0, HERE)
    import floors

    from tvm_canary.runtime import targets

    t_start = time.time()
    bench = Bench(quick=args.quick, ab=args.ab, baselines=tuple(args.baselines), candidates=tuple(args.candidates),
                  plan_candidates=tuple(args.plan_candidates), verify_sizes=tuple(sorted(set(args.verify_sizes))),
                  verify_modes=tuple(m for m in MODES if m in args.verify_modes))
    bench.launchers = Launchers()
    bench.arch = targets.cuda_arch(0)
    options = {"arch": bench.arch, "ab": args.ab, "quick": args.quick, "baselines": list(args.baselines),
               "candidates": list(args.candidates), "plan_candidates": list(args.plan_candidates)}
    defaults = {k: default_labels(k, bench.launchers.tag) for k in args.kernels}
    env, code = environment(), code_digest()
    rows: list = []
    prior = {"agreement": {}, "warnings": [], "parts": []}
    kernels = list(args.kernels)
    if args.resume:
        with open(args.json) as f:
            prior = json.load(f)
        try:
            now = {"env": env, "default_geometries": defaults, "code": code, **options}
            rows, kernels, prior["parts"] = resume_run(prior, now, kernels, args.redo, bench.verify_sizes,
                                                       bench.verify_modes)
        except ValueError as e:
            return fail(str(e))
        if not kernels:
            return fail(f"--resume: the run in --json has finished {', '.join(args.kernels)}; nothing is left to run "
                        "(a call cut short before its first row wrote nothing: repeat it as it was)")
        if problem := verify_rows_problem(args.verify_sizes, args.verify_modes, args.quick, kernels):
            return fail(problem)
        bench.agreement.update(prior["agreement"])
        bench.warnings += prior["warnings"]
    flag = torch.zeros(1, dtype=torch.int32, device=DEV)
    bench.start_probes(kernels)
    bench.prebuild_floors(kernels)  # while the children build and check the baselines
    bench.load_baselines(kernels)
    empty = floors.compile_cuda(floors.empty(), bench.arch)
    empty_us = graph_time_us([lambda: empty(flag)] * 8)
    chain = floors.compile_cuda(floors.chain(), bench.arch)
    acc = torch.zeros(1, dtype=torch.int64, device=DEV)
    chain_ns = (graph_time_us([lambda: chain(acc, 32768)]) - empty_us) * 1000 / 32768
    pool = Pool(POOL_SLOTS["quick" if args.quick else "full"])
    bench.verify_kept = frozenset(verify_row_cases(rows))
    sweeps = {"write": lambda: bench.write_rows(pool, chain_ns, empty_us),
              "plan": bench.plan_rows, "scatter": bench.scatter_rows}

    verify_timed: list = []  # the verify rows this invocation timed

    def report(done: list[str], cut=None) -> tuple[dict, list]:
        """(the run so far: environment, parts, ...; its rows with their derived columns), written to --json
        (whole: a file replaced, never truncated) after every kernel, and while ``cut`` (verify) is under
        way after each of its rows: a run cut short keeps its finished sweeps and verify's timed rows."""
        run_rows = sorted([*rows, *(verify_timed if cut else ())], key=row_order)
        finish(run_rows)
        # the part timed some of the verify rows its sizes and modes choose: name them
        some = "verify" in done and (cut or bench.verify_kept & verify_cases(bench.verify_sizes, bench.verify_modes,
                                                                             args.quick))
        parts = prior["parts"] + [part_record(done, time.time() - t_start, empty_us, chain_ns, bench.verify_sizes,
                                              bench.verify_modes, cut,
                                              [r["case"] for r in verify_timed] if some else None, code)]
        meta = {"env": env, **options, **run_timing(parts), "ab_rounds": AB_ROUNDS,
                "default_geometries": {**prior.get("default_geometries", {}), **defaults},
                "agreement": bench.agreement, "warnings": bench.warnings, "wall_s": sum(p["wall_s"] for p in parts),
                "parts": parts, "complete": complete(run_rows, args.quick)}
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(dict(meta, rows=run_rows), f, indent=1)
            os.replace(args.json + ".tmp", args.json)
        return meta, run_rows

    def verify_row_timed(so_far: list, done: list[str]) -> None:
        """Each verify row is written as soon as it is timed: a run cut short keeps it (``report``)."""
        verify_timed[:] = so_far
        report(done, cut="verify")

    for i, kernel in enumerate(kernels):
        if kernel == "verify":
            rows += bench.verify_rows(pool, empty_us, lambda so_far, i=i: verify_row_timed(so_far, kernels[:i + 1]))
        else:
            rows += sweeps[kernel]()
        meta, run_rows = report(kernels[:i + 1])
    print_table(meta, run_rows, args.baselines)
    print(f"wall time {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
