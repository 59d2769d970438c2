"""Physical floors measured beside the kernels: small TensorIR kernels that move the same bytes with
the same access pattern and compute (almost) nothing. A floor is a lower bound only if nothing about
the kernel's own choices is built in, so every memory floor is compiled for each grid of
``FLOOR_GRIDS`` and the benchmark keeps the fastest (``best of``).

* ``gather``: reads exactly the bytes verify reads, with the same indices (plan vectors, the slot's
  four fields, the predecessor's three, the folded source words) and only XORs them; grid-stride,
  ``max(1, min(blocks, ceil(cap / threads)))`` blocks; with two sources also split, two lanes an entry
  each reading one source (``FOLD_ORDERS``). Two variants bound more than the bytes: with
  ``hashing`` it hashes them as SPEC 1 requires of any verify (chain link, real-KV fold: two sources
  together, in turn, or split over two lanes an entry, ``FOLD_ORDERS``), and with ``ticket`` it adds
  the clean launch of a single launch that appends rows in entry order.
* ``store``: what write moves for a shape with all its tokens independent, through the plan's
  indirections: reads each request's offsets and seed (and the seed slot's three fields), then each of
  its tokens' id, position and slot (and its folded source words), and stores the slot's four fields;
  as many lanes per request as the grid affords (``max(1, lanes // requests)``), so one long request
  is stored as widely as many short ones. Locating a request's tokens through its offsets is the
  plan's layout, so every write must pay that dependent load. With many short chains this bounds write
  from below; with long chains ``chain`` does. With two sources also split, two lanes a token each
  reading one source (``FOLD_ORDERS``). Its ``hashing`` and ``ticket`` variants bound more than
  the bytes, as the gather's do.
* ``copy``: a dense int64 device-to-device copy (the plan and scatter bound), beside torch's copy;
  timed over more launches per graph than the kernels (``COPY_FLOOR_LAUNCHES`` in the benchmark) so
  that the graph's start is spread thinner than in the kernel's own timing.
* ``chain``: one thread runs ``steps`` chained mix3 hashes in registers (the write chain's arithmetic).
* ``empty``: a one-warp kernel that does nothing (the launch cost).
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm.script import tirx as T

from tvm_canary.kernels.common import (
    Geometry,
    Tally,
    block_any,
    block_ticket,
    blocks_for,
    count_launch,
    exchange_in_pair,
    lane_pairs,
    mix3,
    slot_hash,
    split_fold,
    splitmix64,
)

# (blocks, threads) of the memory floors: small blocks spread few entries over many SMs (32 lanes: as
# a thin geometry spreads a small plan, ``kernels.common.work_grid``), large ones give every SM a full
# complement of threads. The others are grids in which a verify kernel once ran below the best of the
# rest (1056 x 512: ALL random 1M-16M; 1056 x 1024, 2112 x 256, 2112 x 512: PARTIAL chain order; H200,
# fifteenth to twentieth sessions, in full: ``git show 3d28698:benchmarks/floors.py``).
FLOOR_GRIDS = ((2112, 32), (2112, 64), (1056, 128), (1056, 256), (2112, 256), (528, 512), (1056, 512), (2112, 512),
               (1056, 1024))
# The hashing floors' fold orders with two sources, each timed, the fastest counting: "together" and
# "in turn" (``fold_hash``), and "split" (``split_fold_hash``, two lanes an entry or token). The memory
# floors (gather, store) are timed in one lane an entry and split (their source order does not matter).
FOLD_ORDERS = {"": "together", "seq-": "in turn", "split-": "split"}  # name infix -> fold order
# (blocks, threads, min_blocks) in which the gather's floors (memory, hash and ticket forms) are also timed,
# declared ``__launch_bounds__(threads, min_blocks)`` as verify's kernels are (``gather``): declared with the
# threads alone, ptxas builds the gather in 32 registers with at most 4 loads in flight, where verify's
# kernels keep 6 (sm_90, fifty-sixth session; at (512, 2) the gather keeps 11). The grids: verify's that
# ran chain order below or near the floors, 2112 x 512 and 1056 x 512 at (512, 2) and 2112 x 256 at
# (256, 4); and 528 x 256, one wave of four blocks an SM on 132 SMs whatever the registers (verify ALL's
# split default, 2112 x 256 (256, 4), runs four full waves in 62 registers; a floor in 48 or fewer packs
# five or more an SM, with a tail wave).
BOUNDED_GATHER_GRIDS = ((2112, 512, 2), (1056, 512, 2), (2112, 256, 4), (528, 256, 4))
# Bounded grids the gather's floors also run holding registers (``HeldGeometry``): in 2112 x 256 ``(256, 4)``
# ALL's split hash floors (47 registers) pack five blocks an SM where its default runs four (62-63), and the
# kernel ran 0.98x them; held to four, 0.993-1.004x (H100, sixty-sixth session, ALL 1M-16M, interleaved).
HELD_GATHER_GRIDS = ((2112, 256, 4),)
# int64 values a held floor keeps live through its loop: ALL's floors reach 56-64 registers (sm_90, four blocks)
HELD_VALUES = 6


@dataclasses.dataclass(frozen=True)
class HeldGeometry(Geometry):
    """A bounded grid whose floors keep ``HELD_VALUES`` values live (``gather``), so that fewer blocks fit an
    SM, as in verify's kernels, with L1 whole (a shared-memory pad would shrink it): ALL's floors four of
    256; NONE's and PARTIAL's split hash floors still five. Its ``key`` is told from the plain grid's."""

    held = True  # read by ``gather`` and by the benchmark's grid labels (``bench_kernels.geometry_label``: "h")

    def key(self) -> str:
        return super().key() + "-h"


def floor_geometries(bounded: bool = False):
    """The grids a floor is timed in: ``FLOOR_GRIDS``; with ``bounded`` (the gather's floors) also
    ``BOUNDED_GATHER_GRIDS``, as geometries whose ``min_blocks`` ``gather`` declares, and
    ``HELD_GATHER_GRIDS`` as ``HeldGeometry``."""
    return ([Geometry(gpu=True, blocks=b, threads=t) for b, t in FLOOR_GRIDS]
            + [Geometry(gpu=True, blocks=b, threads=t, min_blocks=m) for b, t, m in BOUNDED_GATHER_GRIDS if bounded]
            + [HeldGeometry(gpu=True, blocks=b, threads=t, min_blocks=m) for b, t, m in HELD_GATHER_GRIDS if bounded])


def ticket_protocol(geom: Geometry):
    """The least a single launch that appends rows in order does in a clean launch (the floors' ``ticket``
    variants): a block barrier, one ticket per block (``kernels.common.block_ticket``: the block's share
    added to the arrivals counter ``flags[NF - 1]``, zero on entry and on exit) and block 0 counting the
    launch into ``counter`` right after its ticket (``kernels.common.count_launch``)."""
    any_of, draw_ticket, count = block_any(geom), block_ticket(geom), count_launch(geom)

    @T.macro
    def clean_append(block_done, drawn, flags, nb, b, t, counter):
        any_of(block_done, 0)  # the block barrier before its ticket
        if t == 0:
            draw_ticket(drawn, flags, nb, b, 0)
            if b == 0:
                count(Tally(counter))

    return clean_append


def own_source_row(slot, rows, lane):
    """The row of ``slot`` in the source that a split pair's ``lane`` reads: ``src`` stacks the two
    sources ``rows // 2`` rows apart, lane 2i reads the first, lane 2i + 1 the second (the split
    memory floors)."""
    return slot + T.Cast("int64", T.bitwise_and(lane, 1)) * (rows // 2)


def stacked_sources(src, rows):
    """``(srcs, params)`` as ``kernels.common.split_fold`` takes its sources, for ``src``, which stacks two
    sources ``rows // 2`` rows apart, a slot's token row in each (page size 1, built in)."""

    class Half:
        def __init__(self, first_row):
            self.first_row = first_row

        def __getitem__(self, row_word):
            return src[row_word[0] + self.first_row, row_word[1]]

    cols = src.shape[1]
    return (Half(T.int64(0)), Half(rows // 2)), ((T.int64(1), cols, cols),) * 2


def split_fold_hash(geom: Geometry, fold_words: int):
    """Macro ``fold(h, part, src, rows, slot, t)``: the kernels' own split fold (``kernels.common.split_fold``)
    of the slot's two sources stacked in ``src`` (``stacked_sources``), lanes 2i and 2i + 1 of a warp (``t``'s
    low bit) each folding one; the even lane's h[0] is the fold. Its page size is built in (1), so nvcc
    loads the source rows before the chain link: in the kernels' order (a run-time page size, link first)
    it ran up to 1.026x slower (H100, sixty-fifth session, ALL 1M-16M)."""
    fold = split_fold(geom, fold_words)
    _, odd_lane = lane_pairs(True)

    @T.macro
    def fold_stacked(h, part, src, rows, slot, t):
        srcs, params = T.meta_var(stacked_sources(src, rows))
        fold(h, part, slot, srcs, params, odd_lane(t), t)

    return fold_stacked


@T.macro
def fold_hash(h, part, part2, src, rows, slot, fold_words, num_sources, together):
    """h[0] := the slot's real-KV fold as the hashing floors compute it: one ``splitmix64`` per folded word
    of each source (the first ``fold_words`` words of the slot's row in each of ``num_sources`` halves
    of ``src``) and one per source. ``together``: the two sources' chains advance in one loop (half as
    many dependent steps, more live registers); otherwise one after the other, in SPEC 1.4's order.
    Neither is faster everywhere (on the H200 the kernel, which folds in SPEC's order, beat the bound
    of the one-loop order by 5% at 64K ALL entries), so the benchmarks time both (``FOLD_ORDERS``) and
    keep the faster."""
    h[0] = T.uint64(0)
    part[0] = T.uint64(0)
    part2[0] = T.uint64(0)
    for q in T.serial(fold_words):
        if num_sources > 0:
            part[0] = part[0] ^ T.reinterpret("uint64", src[slot, q])
            splitmix64(part)
        if num_sources > 1 and together:
            part2[0] = part2[0] ^ T.reinterpret("uint64", src[slot + rows // 2, q])
            splitmix64(part2)
    if num_sources > 0:
        h[0] = h[0] ^ part[0]
        splitmix64(h)
    if num_sources > 1 and not together:
        for q in T.serial(fold_words):
            part2[0] = part2[0] ^ T.reinterpret("uint64", src[slot + rows // 2, q])
            splitmix64(part2)
    if num_sources > 1:
        h[0] = h[0] ^ part2[0]
        splitmix64(h)


def gather(geom: Geometry, fold_words: int, check_token: bool, num_sources: int, hashing: bool = False,
           ticket: bool = False, fold_order: str = "together"):
    """The ``gather`` floor: verify's bytes with verify's indices, XOR-ed (sources: the first
    ``fold_words`` words of the slot's row in each of ``num_sources`` halves of ``src``).

    ``hashing``: the bytes are hashed as SPEC 1 requires of every verify instead of XOR-ed: the
    predecessor's chain link (``mix3`` of its fields) and the real-KV fold (``fold_hash``), so in ALL
    mode (32 dependent steps per source) it also bounds the arithmetic; ``fold_order`` (``FOLD_ORDERS``):
    the fold's source order (``fold_hash``), or "split": two lanes an entry, both gathering its fields,
    each reading one source (XOR-ed, or with ``hashing`` folded: ``split_fold_hash``), as verify's split
    folds spread an entry's bytes (``kernels.common.split_fold``). ``ticket``: also the least a single
    launch that appends rows in entry order does in a clean launch (``ticket_protocol``). A ``geom``
    with ``min_blocks`` above 1 declares ``__launch_bounds__(threads, min_blocks)`` (ptxas's register
    budget, as verify's kernels declare theirs; ``BOUNDED_GATHER_GRIDS``); otherwise the threads alone. A
    ``HeldGeometry`` also keeps ``HELD_VALUES`` values live through each lane's loop.
    """
    assert num_sources <= 2 and fold_order in FOLD_ORDERS.values()
    TH = geom.threads
    split = num_sources == 2 and fold_order == "split"
    assert TH % 32 == 0 or not split  # a pair's lanes in one warp
    to_entry, _ = lane_pairs(split)
    clean_append = ticket_protocol(geom)
    fold_split = split_fold_hash(geom, fold_words) if split and hashing else None
    held = getattr(geom, "held", False)

    @T.macro
    def block_lanes(b, nb, buf, slots, etoks, epos, prevs, num_valid, src, rows, out, flags, counter):
        for t in T.thread_binding(TH, thread="threadIdx.x"):
            acc = T.alloc_buffer((1,), "int64", scope="local")
            k = T.alloc_buffer((1,), "int64", scope="local")
            h = T.alloc_buffer((1,), "uint64", scope="local")
            part = T.alloc_buffer((1,), "uint64", scope="local")
            part2 = T.alloc_buffer((1,), "uint64", scope="local")
            drawn = T.alloc_buffer((1,), "int32", scope="local")
            block_done = T.alloc_buffer((1,), "int32", scope="local")
            acc[0] = T.int64(0)
            if held:  # values the compiler cannot recompute (clock reads), each needed after the loop
                kept = T.alloc_buffer((HELD_VALUES,), "int64", scope="local")
                for i in T.unroll(HELD_VALUES):
                    kept[i] = T.call_extern("int64", "clock64")
            k[0] = to_entry(T.Cast("int64", b * TH + t))
            while k[0] < T.Cast("int64", num_valid[0]):
                slot = slots[k[0]]
                prev = prevs[k[0]]
                acc[0] = acc[0] ^ epos[k[0]] ^ buf[slot, 0] ^ buf[slot, 1] ^ buf[slot, 2] ^ buf[slot, 3]
                if check_token:
                    acc[0] = acc[0] ^ etoks[k[0]]
                if prev > T.int64(0):
                    if hashing:
                        slot_hash(h, buf, prev)
                        acc[0] = acc[0] ^ T.reinterpret("int64", h[0])
                    else:
                        acc[0] = acc[0] ^ buf[prev, 0] ^ buf[prev, 1] ^ buf[prev, 2]
                if hashing and split:
                    fold_split(h, part, src, rows, slot, t)
                    acc[0] = acc[0] ^ T.reinterpret("int64", h[0])
                elif hashing:
                    fold_hash(h, part, part2, src, rows, slot, fold_words, num_sources, fold_order == "together")
                    acc[0] = acc[0] ^ T.reinterpret("int64", h[0])
                elif split:  # the lane's own source
                    for q in T.serial(fold_words):
                        acc[0] = acc[0] ^ src[own_source_row(slot, rows, t), q]
                else:
                    for s in T.serial(num_sources):
                        for q in T.serial(fold_words):
                            acc[0] = acc[0] ^ src[slot + s * (rows // 2), q]
                k[0] = k[0] + to_entry(nb * TH)
            if held:  # each kept value folded in, in an order no algebra can undo
                for i in T.unroll(HELD_VALUES):
                    acc[0] = acc[0] ^ (kept[i] + acc[0])
            if acc[0] == T.int64(123456789):  # never true in practice; keeps the loads alive
                out[0] = acc[0]
            if ticket:
                clean_append(block_done, drawn, flags, nb, b, t, counter)

    @T.prim_func(private=False)
    def gather_floor(buf_h: T.handle, slots_h: T.handle, etoks_h: T.handle, epos_h: T.handle, prevs_h: T.handle,
                     num_valid: T.Buffer((1,), "int32"), src_h: T.handle, out_h: T.handle, flags_h: T.handle,
                     counter: T.Buffer((1,), "int64")):
        T.func_attr({"tirx.noalias": True})
        S = T.int64(); F = T.int64(); cap = T.int64(); rows = T.int64(); cols = T.int64(); n_out = T.int64()
        NF = T.int64()
        buf = T.match_buffer(buf_h, (S, F), "int64")
        slots = T.match_buffer(slots_h, (cap,), "int64")
        etoks = T.match_buffer(etoks_h, (cap,), "int64")
        epos = T.match_buffer(epos_h, (cap,), "int64")
        prevs = T.match_buffer(prevs_h, (cap,), "int64")
        src = T.match_buffer(src_h, (rows, cols), "int64")
        out = T.match_buffer(out_h, (n_out,), "int64")
        flags = T.match_buffer(flags_h, (NF,), "int32")
        nb = T.meta_var(blocks_for(geom, cap * 2 if split else cap))
        for b in T.thread_binding(nb, thread="blockIdx.x"):
            if geom.min_blocks > 1:
                with T.attr(0, "tirx.launch_bounds_min_blocks_per_sm", geom.min_blocks):
                    block_lanes(b, nb, buf, slots, etoks, epos, prevs, num_valid, src, rows, out, flags, counter)
            else:
                block_lanes(b, nb, buf, slots, etoks, epos, prevs, num_valid, src, rows, out, flags, counter)

    return gather_floor


def store(geom: Geometry, fold_words: int, num_sources: int, hashing: bool = False, ticket: bool = False,
          fold_order: str = "together"):
    """The ``store`` floor: write's bytes through the write plan's indirections, XOR-ed (sources: the first
    ``fold_words`` words of the slot's row in each of ``num_sources`` halves of ``src``).

    ``hashing``: the bytes are hashed as SPEC 1 requires of every write instead of XOR-ed: the seed
    slot's chain link (``mix3`` of its fields), each lane's chain steps over its own tokens only (one
    ``mix3`` before each of its tokens but the first: fewer and shorter chains than any write runs)
    and the real-KV fold as the gather floor hashes it (``fold_hash``, in ``fold_order``: "together" or
    "in turn"; or "split", ``split_fold_hash``). ``fold_order`` "split" with two sources, hashing or not:
    two lanes a token, both reading its plan words (and the seed's link), each reading one source, the
    odd lane's XOR or fold reaching the even lane by a shuffle, which alone stores the slot's fields, as
    write ALL's split folds spread a token's bytes. With a seed slot, a lane hashes
    the seed's link and then its first token's fold, one after the other, which a write may overlap
    (its folds run in other blocks): the benchmark's rows use anchor seeds (no link to hash), where
    this does not arise. ``ticket``: also the least a single launch that appends rows in request order
    does in a clean launch (``ticket_protocol``; ``flags`` and ``counter`` are unused otherwise)."""
    assert num_sources <= 2 and fold_order in FOLD_ORDERS.values()
    TH = geom.threads
    split = num_sources == 2 and fold_order == "split"
    assert TH % 32 == 0 or not split  # a pair's lanes in one warp
    to_unit, odd_lane = lane_pairs(split)
    clean_append = ticket_protocol(geom)
    fold_split = split_fold_hash(geom, fold_words) if split and hashing else None

    @T.prim_func(private=False)
    def store_floor(buf_h: T.handle, offsets_h: T.handle, seeds_h: T.handle, ids_h: T.handle, pos_h: T.handle,
                    ocl_h: T.handle, src_h: T.handle, flags_h: T.handle, counter: T.Buffer((1,), "int64")):
        T.func_attr({"tirx.noalias": True})
        S = T.int64(); F = T.int64(); cap = T.int64(); cap1 = T.int64(); n = T.int64(); rows = T.int64()
        cols = T.int64(); NF = T.int64()
        buf = T.match_buffer(buf_h, (S, F), "int64")
        offsets = T.match_buffer(offsets_h, (cap1,), "int64")
        seeds = T.match_buffer(seeds_h, (cap,), "int64")
        ids = T.match_buffer(ids_h, (n,), "int64")
        pos = T.match_buffer(pos_h, (n,), "int64")
        ocl = T.match_buffer(ocl_h, (n,), "int64")
        src = T.match_buffer(src_h, (rows, cols), "int64")
        flags = T.match_buffer(flags_h, (NF,), "int32")
        nb = T.meta_var(blocks_for(geom, T.max(n, cap) * 2 if split else T.max(n, cap)))
        for b in T.thread_binding(nb, thread="blockIdx.x"):
            for t in T.thread_binding(TH, thread="threadIdx.x"):
                acc = T.alloc_buffer((1,), "int64", scope="local")
                link = T.alloc_buffer((1,), "int64", scope="local")
                k = T.alloc_buffer((1,), "int64", scope="local")
                r = T.alloc_buffer((1,), "int64", scope="local")
                h = T.alloc_buffer((1,), "uint64", scope="local")
                part = T.alloc_buffer((1,), "uint64", scope="local")
                part2 = T.alloc_buffer((1,), "uint64", scope="local")
                drawn = T.alloc_buffer((1,), "int32", scope="local")
                block_done = T.alloc_buffer((1,), "int32", scope="local")
                g = to_unit(T.Cast("int64", b * TH + t))  # split: the pair's unit
                width = T.max(to_unit(nb * TH) // cap, T.int64(1))  # lanes (split: pairs) per request
                stride = to_unit(nb * TH) // width
                stores = T.meta_var(T.Not(odd_lane(t)) if split else True)  # split: the even lane stores
                if g < stride * width:
                    r[0] = g // width
                    while r[0] < cap:
                        seed = seeds[r[0]]
                        link[0] = seed
                        if g % width == 0 and seed >= T.int64(0) and seed < S and offsets[r[0]] < offsets[r[0] + 1]:
                            if hashing:
                                slot_hash(h, buf, seed)
                                link[0] = T.reinterpret("int64", h[0])
                            else:
                                link[0] = buf[seed, 0] ^ buf[seed, 1] ^ buf[seed, 2]
                        k[0] = offsets[r[0]] + g % width
                        while k[0] < offsets[r[0] + 1]:
                            slot = ocl[k[0]]
                            if hashing:
                                if split:
                                    fold_split(h, part, src, rows, slot, t)
                                else:
                                    fold_hash(h, part, part2, src, rows, slot, fold_words, num_sources,
                                              fold_order == "together")
                                acc[0] = T.reinterpret("int64", h[0])
                                if stores:
                                    buf[slot, 2] = link[0]
                                if k[0] + width < offsets[r[0] + 1]:  # the step the lane's next token needs
                                    h[0] = T.reinterpret("uint64", link[0])
                                    mix3(h, ids[k[0]], pos[k[0]])
                                    link[0] = T.reinterpret("int64", h[0])
                            elif split:  # the lane's own source, the odd lane's XOR to the even lane
                                acc[0] = T.int64(0)
                                for q in T.serial(fold_words):
                                    acc[0] = acc[0] ^ src[own_source_row(slot, rows, t), q]
                                exchange_in_pair(part2, T.reinterpret("uint64", acc[0]), t)
                                acc[0] = acc[0] ^ T.reinterpret("int64", part2[0])
                                if stores:
                                    buf[slot, 2] = link[0]
                            else:
                                acc[0] = T.int64(0)
                                for s in T.serial(num_sources):
                                    for q in T.serial(fold_words):
                                        acc[0] = acc[0] ^ src[slot + s * (rows // 2), q]
                                buf[slot, 2] = link[0]
                            if stores:
                                buf[slot, 0] = ids[k[0]]
                                buf[slot, 1] = pos[k[0]]
                                buf[slot, 3] = acc[0]
                            k[0] = k[0] + width
                        r[0] = r[0] + stride
                if ticket:
                    clean_append(block_done, drawn, flags, nb, b, t, counter)

    return store_floor


def copy(geom: Geometry):
    TH = geom.threads

    @T.prim_func(private=False)
    def copy_floor(src_h: T.handle, dst_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        src = T.match_buffer(src_h, (n,), "int64")
        dst = T.match_buffer(dst_h, (n,), "int64")
        nb = T.meta_var(blocks_for(geom, n))
        for b in T.thread_binding(nb, thread="blockIdx.x"):
            for t in T.thread_binding(TH, thread="threadIdx.x"):
                for it in T.serial((n - (b * TH + t) + nb * TH - 1) // (nb * TH)):
                    i = b * TH + t + it * nb * TH
                    dst[i] = src[i]

    return copy_floor


def chain():
    @T.prim_func(private=False)
    def chain_floor(out: T.Buffer((1,), "int64"), steps: T.int64):
        T.func_attr({"tirx.noalias": True})
        for b in T.thread_binding(1, thread="blockIdx.x"):
            for t in T.thread_binding(1, thread="threadIdx.x"):
                h = T.alloc_buffer((1,), "uint64", scope="local")
                h[0] = T.reinterpret("uint64", out[0])
                for i in T.serial(steps):
                    mix3(h, i, i + T.int64(1))
                out[0] = T.reinterpret("int64", h[0])

    return chain_floor


def empty():
    @T.prim_func(private=False)
    def empty_floor(x: T.Buffer((1,), "int32")):
        for b in T.thread_binding(1, thread="blockIdx.x"):
            for t in T.thread_binding(32, thread="threadIdx.x"):
                if x[0] == 123456789:
                    x[0] = 0

    return empty_floor


def compile_cuda(func, arch: str):
    target = tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")
    ex = tvm.compile(func, target=target)
    return ex[func.attrs["global_symbol"]]
