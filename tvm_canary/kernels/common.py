"""Pieces every kernel shares: loop binding by a geometry, hash steps, source folding, slot checks.

Hash steps are ``T.macro``s that update a ``uint64`` local buffer in place, so the generated code is
straight-line ``h ^= h >> 30; h *= C1; ...`` rather than duplicated expression trees.
"""

from __future__ import annotations

import collections
import functools

import tvm
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder

from .._consts import ANCHOR_HASH, PARTIAL_READ_BYTES, SPLITMIX64_MUL1, SPLITMIX64_MUL2, to_signed_int64
from ..consts import (
    CANARY_FIELD_POSITION,
    CANARY_FIELD_PREV_HASH,
    CANARY_FIELD_TOKEN,
    CANARY_FIELDS_PER_SLOT,
    MAX_REAL_KV_SOURCES,
    FailReason,
)
from ..geometry import FLAG_CHUNK, SEED_SAVE_WORDS, Geometry, flags_suffice  # noqa: F401  (re-exported for kernel files)

C1 = tvm.tirx.const(SPLITMIX64_MUL1, "uint64")
C2 = tvm.tirx.const(SPLITMIX64_MUL2, "uint64")
ANCHOR_HASH_I64 = tvm.tirx.const(to_signed_int64(ANCHOR_HASH), "int64")
INVALID_INDEX = int(FailReason.INVALID_INDEX)

# The alignment every argument buffer declares: its element's size, all that a torch tensor promises
# (a violation ring one word into a larger tensor starts 8 bytes past a 16-byte boundary). TVM's default
# (64 bytes) let LLVM store a violation row with aligned 16-byte moves, which fault on such a view.
INT64_ALIGN = 8
INT32_ALIGN = 4
# Words at the start of a slot's strip that every fold reads (PARTIAL reads exactly these).
HEAD_WORDS = PARTIAL_READ_BYTES // 8
# Strip words a fold keeps loaded ahead of its splitmix chain (``fold_rest``: one source's chain).
FOLD_PREFETCH = 8
# The same for each of two sources' chains advancing in lockstep (``fold_pair``). Half as many (4)
# needs fewer registers (158 against 215 on sm_90, ptxas) but ran verify ALL at 1K-4K entries 10-15%
# slower on the H200 (thirteenth session's GPU calls 6 and 7): each batch's steps no longer cover the
# next batch's loads.
PAIR_PREFETCH = FOLD_PREFETCH
# ALL mode's built-in fold word counts (``fold_words``) up to which write's paired fold loads a slot's
# whole token rows before its first step (``whole_row_pair``): 2 x 22 more live int64 words at 32 words
# (sm_90, write ALL 4096 x 1: 80 -> 95 registers, no spill).
WHOLE_ROW_WORDS = 32
# A fold's local scratch for one source, its *front*: the strip's row and first word (``strip_start``),
# its HEAD_WORDS head words (``load_head``), then, for a paired fold, the first PAIR_PREFETCH words after
# them (``load_batch``); FRONTS_PER_SLOT for all the sources of one slot. Filled ahead of the fold, so
# that these loads are in flight while the kernel does other work (on a GPU a warp issues in order: a
# load placed after code that waits on another load costs a second round trip): verify loads a paired
# fold's fronts as soon as the slot is checked, write the heads of all its unrolled slots first.
FRONT_ROW, FRONT_COL, FRONT_HEAD = 0, 1, 2
FRONT_BATCH = FRONT_HEAD + HEAD_WORDS
FRONT_WORDS = FRONT_BATCH + PAIR_PREFETCH
FRONTS_PER_SLOT = MAX_REAL_KV_SOURCES * FRONT_WORDS


def in_ring(ring, row):
    """Whether violation row ``row`` (an int64 rank: the write index plus the rows before it) lands in
    ``ring``: not past its capacity, nor before it, where an int32 write index that wrapped past
    2**31 - 1 ranks rows. Rows outside are dropped but counted (SPEC D4)."""
    return tvm.tirx.all(T.int64(0) <= row, row < ring.shape[0])


def grid(geom: Geometry, n):
    """Loop over ``n`` blocks: ``blockIdx.x`` on CUDA, a serial loop on CPU."""
    return T.thread_binding(n, thread="blockIdx.x") if geom.gpu else T.serial(n)


def lanes(geom: Geometry, n):
    """Loop over ``n`` lanes of a block: ``threadIdx.x`` on CUDA, a serial loop on CPU."""
    return T.thread_binding(n, thread="threadIdx.x") if geom.gpu else T.serial(n)


def blocks_for(geom: Geometry, units):
    """Blocks a grid-stride loop over ``units`` one-thread work items uses: enough to give each a
    thread, at most ``geom.blocks``, at least 1 (``units`` is an int64 TIR expression, e.g. a capacity)."""
    return T.max(T.min((units + geom.threads - 1) // geom.threads, T.int64(geom.blocks)), T.int64(1))


def work_grid(geom: Geometry, units):
    """``(nb, block_lanes)`` of a grid-stride loop over ``units`` one-thread work items (an int64 TIR
    expression, e.g. a capacity): ``nb = max(1, min(blocks, ceil(units / block_lanes)))`` blocks, of
    which lanes ``t < block_lanes`` take items ``b * block_lanes + t`` (stride ``nb * block_lanes``).
    ``block_lanes`` is ``threads`` (``blocks_for``'s grid), or with ``geom.thin`` the fewest warps
    that let ``blocks`` blocks hold every item (at most ``threads``): a few thousand items then run a
    warp per block on as many SMs as there are blocks, where full blocks would crowd them on a few
    (verify ALL at 1K entries on the H200: 9.8, 12.9, 21.6 and 39 us with 128-, 256-, 512- and
    1024-item blocks; 8.7 us thin). With at least ``blocks * threads`` items both are the same grid.
    On CPU (one lane) ``block_lanes`` is 1."""
    if not (geom.gpu and geom.thin):
        return blocks_for(geom, units), T.int64(geom.threads)
    warp = 32
    per_block = (units + geom.blocks * warp - 1) // (geom.blocks * warp) * warp
    block_lanes = T.min(T.max(per_block, T.int64(warp)), T.int64(geom.threads))
    return T.max(T.min((units + block_lanes - 1) // block_lanes, T.int64(geom.blocks)), T.int64(1)), block_lanes


@T.macro
def barrier():
    T.tvm_storage_sync("shared")


@T.macro
def no_barrier():
    T.evaluate(0)


def block_sync(geom: Geometry):
    """A macro emitting a block barrier on CUDA and nothing on CPU (where lanes run serially)."""
    return barrier if geom.gpu else no_barrier


@T.macro
def splitmix64(h):
    """h[0] := splitmix64(h[0]) (finalizer only)."""
    h[0] = (h[0] ^ (h[0] >> T.uint64(30))) * C1
    h[0] = (h[0] ^ (h[0] >> T.uint64(27))) * C2
    h[0] = h[0] ^ (h[0] >> T.uint64(31))


@T.macro
def mix3(h, b, c):
    """h[0] := mix3(h[0], b, c) for int64 b, c (reinterpreted as u64)."""
    splitmix64(h)
    h[0] = h[0] ^ T.reinterpret("uint64", b)
    splitmix64(h)
    h[0] = h[0] ^ T.reinterpret("uint64", c)
    splitmix64(h)


@T.macro
def slot_hash(h, buf, s):
    """h[0] := chain-link hash of slot s of buf (int64 [S, F]); anchor hash when s < 0. s must be < S."""
    if s < T.int64(0):
        h[0] = T.reinterpret("uint64", ANCHOR_HASH_I64)
    else:
        h[0] = T.reinterpret("uint64", buf[s, CANARY_FIELD_PREV_HASH])
        mix3(h, buf[s, CANARY_FIELD_TOKEN], buf[s, CANARY_FIELD_POSITION])


# The row of a slot's strip on CUDA, ``slot / page_size``, without a division when the page holds one
# token. Written as ``page_size == 1 ? slot : slot / page_size`` (in TensorIR or in CUDA), the test is
# folded away: slot / 1 is slot, so the optimizer keeps the division alone, and every fold then divides
# (sm_90 SASS of the write PARTIAL and ALL kernels: an unsigned 32-bit division, about 20 dependent
# instructions, between the slot's load and the source's). The empty ``asm`` hides that the divisor is
# the page size, so the test stays, and so does the branch around the division (a division by an
# unknown value cannot be executed ahead of its test). Measured with the write fold lanes' divisions
# (kernels/write.py) in docs/PERFORMANCE-HISTORY.md, "What the thirty-seventh session changed and measured"
# (retired: git show f15890d:docs/PERFORMANCE-HISTORY.md).
STRIP_ROW = """
__device__ __forceinline__ long long canary_strip_row(long long slot, long long page_size) {
  if (page_size == 1) return slot;
  long long divisor = page_size;
  asm("" : "+l"(divisor));
  return slot / divisor;
}
"""


def after_head(front, at):
    """(row, word) of src where the strip whose front is at ``front[at:]`` continues after its head."""
    return front[at + FRONT_ROW], front[at + FRONT_COL] + HEAD_WORDS


@T.macro
def load_batch(front, at, src, fold_words):
    """The front's first batch := the PAIR_PREFETCH strip words after the head (indices clamped to the
    fold's last word; nothing when the fold reads only the head), given its strip start (``load_head``)."""
    if fold_words > T.int64(HEAD_WORDS):
        last = fold_words - HEAD_WORDS - 1
        row, col = after_head(front, at)
        for u in T.unroll(PAIR_PREFETCH):
            front[at + FRONT_BATCH + u] = src[row, col + T.min(T.int64(u), last)]


@T.macro
def fold_step(part, word):
    """One step of a source's fold chain (SPEC 1.4): part[0] := splitmix64(part[0] ^ word)."""
    part[0] = part[0] ^ T.reinterpret("uint64", word)
    splitmix64(part)


@T.macro
def fold_rest(part, src, front, at, start, rest):
    """part[0] := the source's fold chain continued over the words ``[start, rest)`` after the head,
    loaded here FOLD_PREFETCH at a time (the next batch's loads issued before the current batch's steps,
    so the serial chain does not wait on each load); nothing when ``start >= rest``."""
    if start < rest:
        words = T.alloc_buffer((2 * FOLD_PREFETCH,), "int64", scope="local")
        row, col = after_head(front, at)
        for u in T.unroll(FOLD_PREFETCH):
            words[u] = src[row, col + T.min(start + u, rest - 1)]
        for c in T.serial((rest - start) // FOLD_PREFETCH):
            for u in T.unroll(FOLD_PREFETCH):
                words[FOLD_PREFETCH + u] = src[row, col + T.min(start + (c + 1) * FOLD_PREFETCH + u, rest - 1)]
            for u in T.unroll(FOLD_PREFETCH):
                fold_step(part, words[u])
            for u in T.unroll(FOLD_PREFETCH):
                words[u] = words[FOLD_PREFETCH + u]
        for u in T.unroll(FOLD_PREFETCH):
            if start + (rest - start) // FOLD_PREFETCH * FOLD_PREFETCH + u < rest:
                fold_step(part, words[u])


@T.macro
def fold_one(acc, part, front, at, src, fold_words):
    """acc[0] := splitmix64(acc[0] ^ fold_one(src, slot)) (SPEC 1.4), given the source's front at
    ``front[at:]`` with its head (``load_head``); the words after the head are loaded here."""
    part[0] = T.reinterpret("uint64", front[at + FRONT_HEAD])
    splitmix64(part)
    fold_step(part, front[at + FRONT_HEAD + 1])
    fold_rest(part, src, front, at, T.int64(0), fold_words - HEAD_WORDS)
    acc[0] = acc[0] ^ part[0]
    splitmix64(acc)


@T.macro
def start_pair(part, part_b, front, at, at_b):
    """Two sources' fold chains started from their fronts' head words (``load_head``), in lockstep."""
    part[0] = T.reinterpret("uint64", front[at + FRONT_HEAD])
    part_b[0] = T.reinterpret("uint64", front[at_b + FRONT_HEAD])
    splitmix64(part)
    splitmix64(part_b)
    fold_step(part, front[at + FRONT_HEAD + 1])
    fold_step(part_b, front[at_b + FRONT_HEAD + 1])


@T.macro
def end_pair(acc, part, part_b):
    """acc[0] := the two finished chains folded into it, ``part`` first (SPEC 1.4's source order)."""
    acc[0] = acc[0] ^ part[0]
    splitmix64(acc)
    acc[0] = acc[0] ^ part_b[0]
    splitmix64(acc)


@T.macro
def fold_pair(acc, part, front, at, src_a, fold_words_a, src_b, fold_words_b):
    """acc[0] := splitmix64(acc[0] ^ fold_one(src_a, slot)), then the same with src_b (SPEC 1.4, in
    that order), given both sources' fronts at ``front[at:]`` and ``front[at + FRONT_WORDS:]``, heads
    and first batches (``load_head``, ``load_batch``).

    The two fold chains are independent until they are combined into acc, so they advance in
    lockstep, one step of each per word: a dependent chain half as long, which is what a launch of a
    few thousand entries waits on (one warp per SM). Over the words both sources fold (the shorter
    fold's length) the batches after the first are loaded PAIR_PREFETCH at a time ahead of their
    steps; the longer fold then finishes alone (``fold_rest``)."""
    part_b = T.alloc_buffer((1,), "uint64", scope="local")
    next_a = T.alloc_buffer((PAIR_PREFETCH,), "int64", scope="local")
    next_b = T.alloc_buffer((PAIR_PREFETCH,), "int64", scope="local")
    at_b = at + FRONT_WORDS
    start_pair(part, part_b, front, at, at_b)
    rest_a = fold_words_a - HEAD_WORDS
    rest_b = fold_words_b - HEAD_WORDS
    both = T.max(T.min(rest_a, rest_b), T.int64(0))
    row_a, col_a = after_head(front, at)
    row_b, col_b = after_head(front, at_b)
    for c in T.serial(both // PAIR_PREFETCH):
        for u in T.unroll(PAIR_PREFETCH):
            next_a[u] = src_a[row_a, col_a + T.min((c + 1) * PAIR_PREFETCH + u, rest_a - 1)]
            next_b[u] = src_b[row_b, col_b + T.min((c + 1) * PAIR_PREFETCH + u, rest_b - 1)]
        for u in T.unroll(PAIR_PREFETCH):
            fold_step(part, front[at + FRONT_BATCH + u])
            fold_step(part_b, front[at_b + FRONT_BATCH + u])
        for u in T.unroll(PAIR_PREFETCH):
            front[at + FRONT_BATCH + u] = next_a[u]
            front[at_b + FRONT_BATCH + u] = next_b[u]
    for u in T.unroll(PAIR_PREFETCH):
        if both // PAIR_PREFETCH * PAIR_PREFETCH + u < both:
            fold_step(part, front[at + FRONT_BATCH + u])
            fold_step(part_b, front[at_b + FRONT_BATCH + u])
    fold_rest(part, src_a, front, at, both, rest_a)
    fold_rest(part_b, src_b, front, at_b, both, rest_b)
    end_pair(acc, part, part_b)


def whole_row_pair(fold_words: int):
    """Macro with ``fold_pair``'s arguments for two sources whose fold word count is built in as
    ``fold_words`` (a Python int, ``source_params``; at most WHOLE_ROW_WORDS): the words after each
    front's first batch are all loaded, in the TensorIR, before the first step, with no batch loop, so
    neither chain waits on a later batch's round trip; the steps run in ``fold_pair``'s order. (In sm_90
    code NVVM sinks each of those loads to just before its step: the forty-third session's reading of
    the SASS, ``git show b5a7d63:docs/PERFORMANCE.md``, "Write real-KV vs NONE".)"""
    rest = fold_words - HEAD_WORDS
    first = min(rest, PAIR_PREFETCH)
    later = rest - first

    @T.macro
    def fold_pair_whole(acc, part, front, at, src_a, fold_words_a, src_b, fold_words_b):
        part_b = T.alloc_buffer((1,), "uint64", scope="local")
        later_a = T.alloc_buffer((max(later, 1),), "int64", scope="local")
        later_b = T.alloc_buffer((max(later, 1),), "int64", scope="local")
        at_b = at + FRONT_WORDS
        row_a, col_a = after_head(front, at)
        row_b, col_b = after_head(front, at_b)
        for w in T.unroll(later):
            later_a[w] = src_a[row_a, col_a + first + w]
            later_b[w] = src_b[row_b, col_b + first + w]
        start_pair(part, part_b, front, at, at_b)
        for u in T.unroll(first):
            fold_step(part, front[at + FRONT_BATCH + u])
            fold_step(part_b, front[at_b + FRONT_BATCH + u])
        for w in T.unroll(later):
            fold_step(part, later_a[w])
            fold_step(part_b, later_b[w])
        end_pair(acc, part, part_b)

    return fold_pair_whole


def strip_starts(geom: Geometry):
    """Macro ``strip_start(rc, slot, page_size, token_words)``: rc[0], rc[1] := row and first word of
    the slot's strip: ``slot // page_size`` and ``(slot % page_size) * token_words`` for slot >= 0,
    page_size >= 1 (one truncating division, none when page_size is 1 on CUDA, ``STRIP_ROW``: a 64-bit
    division is a slow subroutine call there)."""

    @T.macro
    def strip_start(rc, slot, page_size, token_words):
        if geom.gpu:
            rc[0] = T.cuda.func_call("canary_strip_row", slot, page_size, source_code=STRIP_ROW, return_type="int64")
        else:
            rc[0] = T.truncdiv(slot, page_size)
        rc[1] = (slot - rc[0] * page_size) * token_words

    return strip_start


def head_loads(geom: Geometry):
    """Macro ``load_heads(front, base, srcs, params, num_sources, slot)``: fronts ``front[base +
    FRONT_WORDS * j:]`` of sources j < num_sources := their strip starts (``strip_starts``) and head
    words (``load_head``)."""
    strip_start = strip_starts(geom)

    @T.macro
    def load_head(front, at, src, page_size, token_words, slot):
        """The front at ``front[at:]`` (FRONT_WORDS) := the slot's strip start in src and its HEAD_WORDS
        (two) head words, which every fold reads (PARTIAL reads exactly these).

        src is an int64 view ``[rows, row_words]``; the strip starts at word
        ``(slot % page_size) * token_words`` of row ``slot // page_size`` (the caller checked the row).
        """
        rc = T.alloc_buffer((2,), "int64", scope="local")
        strip_start(rc, slot, page_size, token_words)
        front[at + FRONT_ROW] = rc[0]
        front[at + FRONT_COL] = rc[1]
        front[at + FRONT_HEAD] = src[rc[0], rc[1]]
        front[at + FRONT_HEAD + 1] = src[rc[0], rc[1] + 1]

    @T.macro
    def load_heads(front, base, srcs, params, num_sources, slot):
        if num_sources > 0:
            load_head(front, base, srcs[0], params[0][0], params[0][1], slot)
        if num_sources > 1:
            load_head(front, base + FRONT_WORDS, srcs[1], params[1][0], params[1][1], slot)
        if num_sources > 2:
            load_head(front, base + 2 * FRONT_WORDS, srcs[2], params[2][0], params[2][1], slot)
        if num_sources > 3:
            load_head(front, base + 3 * FRONT_WORDS, srcs[3], params[3][0], params[3][1], slot)

    return load_heads


def splits_sources(geom: Geometry, num_sources: int, fold_words: int) -> bool:
    """Whether folds run split (``split_fold``): a CUDA geometry with ``pairs`` 2, two sources,
    and ALL mode's fold word count built in (``fold_words``, ``source_params``); otherwise a ``pairs`` 2
    geometry folds as ``pairs`` 1 does."""
    return geom.gpu and geom.pairs == 2 and num_sources == 2 and fold_words > HEAD_WORDS


def lane_pairs(split: bool):
    """``(unit, odd)`` for a grid whose lanes work in pairs when ``split`` (``split_fold``: lanes 2i and
    2i + 1 of a warp on one item): ``unit(lanes)``, the items of a lane index or a lane count (half as
    many split, the same expression otherwise), and ``odd(lane)``, whether ``lane`` is its pair's odd
    lane (None unsplit)."""

    def unit(lanes):
        return T.shift_right(lanes, 1) if split else lanes

    def odd(lane):
        return T.bitwise_and(lane, 1) != 0 if split else None

    return unit, odd


@T.macro
def exchange_in_pair(other, value, lane):
    """other[0] := ``value`` of the other lane of ``lane``'s pair (lanes 2i and 2i + 1 of a warp, both
    calling it; ``lane`` the caller's lane in its warp, or any index of the same low five bits)."""
    pair_mask = T.shift_left(T.uint32(3), T.Cast("uint32", T.bitwise_and(lane, 30)))
    other[0] = T.cuda.__shfl_xor_sync(pair_mask, value, 1, 32)


def split_fold(geom: Geometry, fold_words: int, both_lanes: bool = False):
    """Macro ``fold(acc, part, slot, srcs, params, odd, lane)`` for ``splits_sources``: lanes 2i and 2i + 1
    of a warp (``lane`` the caller's lane in its warp, ``odd`` 0 and 1), both calling it with the same
    checked slot, fold the slot's two sources of ``fold_words`` words (built in; at most WHOLE_ROW_WORDS
    or a multiple of FOLD_PREFETCH): the even lane source 0's chain, the odd lane source 1's. A lane
    loads its token row whole before the first step when it has at most WHOLE_ROW_WORDS words, else
    FOLD_PREFETCH words at a time, the next batch loaded before the current batch's steps. The odd
    lane's chain reaches the even lane by a shuffle within the pair, and the even lane's acc[0] :=
    real_kv_fold_sources(slot) (SPEC 1.4; the odd lane's acc[0] is not the fold, but with ``both_lanes``
    it is too: each lane gets the other's chain and combines the two in source order).

    Each lane loads one row and runs one chain, where a paired fold's lane loads two rows and runs both
    chains interleaved: in a probe of 4096 one-token requests of two 256-byte rows at random slots (H200,
    forty-fifth session's call B) the folds took 3.19 us a launch split, 4.17 us paired."""
    strip_start = strip_starts(geom)
    batch = fold_words if fold_words <= WHOLE_ROW_WORDS else FOLD_PREFETCH
    batches = fold_words // batch
    assert batches * batch == fold_words, f"split folds: {fold_words} words are not whole batches of {batch}"

    @T.macro
    def load_words(words, at, srcs, rc, odd, first):
        """words[at:at + batch] := the lane's source's strip words first, first + 1, ... (a divergent
        branch of loads only: the chain after it runs once for both lanes)."""
        if odd:
            for w in T.unroll(batch):
                words[at + w] = srcs[1][rc[0], rc[1] + first + w]
        else:
            for w in T.unroll(batch):
                words[at + w] = srcs[0][rc[0], rc[1] + first + w]

    @T.macro
    def fold(acc, part, slot, srcs, params, odd, lane):
        rc = T.alloc_buffer((2,), "int64", scope="local")
        words = T.alloc_buffer((2 * batch,), "int64", scope="local")
        other = T.alloc_buffer((1,), "uint64", scope="local")
        if odd:
            strip_start(rc, slot, params[1][0], params[1][1])
        else:
            strip_start(rc, slot, params[0][0], params[0][1])
        load_words(words, 0, srcs, rc, odd, T.int64(0))
        part[0] = T.reinterpret("uint64", words[0])
        splitmix64(part)
        for c in T.serial(batches):
            if batches > 1:  # the next batch (the last batch again after the last: in bounds, unused)
                load_words(words, batch, srcs, rc, odd, T.min(T.Cast("int64", c) + 1, batches - 1) * batch)
            # word 0's step is the splitmix64 above (a uniform chain from 0 gives other sm_90 code at 256
            # words, not measured)
            for w in T.unroll(batch):
                if c > 0 or w > 0:
                    fold_step(part, words[w])
            if batches > 1:
                for w in T.unroll(batch):
                    words[w] = words[batch + w]
        exchange_in_pair(other, part[0], lane)
        acc[0] = T.uint64(0)
        if both_lanes:
            first = T.alloc_buffer((1,), "uint64", scope="local")
            second = T.alloc_buffer((1,), "uint64", scope="local")
            first[0] = T.Select(odd, other[0], part[0])
            second[0] = T.Select(odd, part[0], other[0])
            end_pair(acc, first, second)
        else:
            end_pair(acc, part, other)

    return fold


def paired(j: int, num_sources: int) -> bool:
    """Whether source j of the first num_sources folds in a pair (``fold_sources`` with
    ``Geometry.fold_pairs``): sources 0 and 1, then 2 and 3; an odd last source folds alone."""
    return j < num_sources - num_sources % 2


@T.macro
def load_batches(front, base, srcs, params, num_sources):
    """The first batches of the fronts ``load_heads`` filled at ``front[base:]``, for the sources that
    fold in pairs (``paired``)."""
    if paired(0, num_sources):
        load_batch(front, base, srcs[0], params[0][2])
    if paired(1, num_sources):
        load_batch(front, base + FRONT_WORDS, srcs[1], params[1][2])
    if paired(2, num_sources):
        load_batch(front, base + 2 * FRONT_WORDS, srcs[2], params[2][2])
    if paired(3, num_sources):
        load_batch(front, base + 3 * FRONT_WORDS, srcs[3], params[3][2])


def fold_sources(geom: Geometry, whole_rows: int = 0):
    """Macro ``fold(acc, part, front, base, srcs, params, num_sources)``: acc[0] :=
    real_kv_fold_sources(slot) over the first num_sources (a Python int) sources, whose fronts start at
    ``front[base:]`` and hold their heads (``load_heads``); srcs: Python list of 4 source buffers;
    params: Python list of 4 (page_size, token_words, fold_words) scalar triples.

    With ``geom.fold_pairs()`` the sources that ``paired`` names fold in pairs (``fold_pair``; with
    ``whole_rows``, ALL mode's built-in fold word count, ``whole_row_pair`` when that count is at most
    WHOLE_ROW_WORDS), whose fronts must also hold their first batches (``load_batches``); a last source
    without a partner folds alone. Otherwise every source folds alone, one after another (``fold_one``:
    fewer live registers). Only write passes ``whole_rows``: on the H200 (forty-second session's call
    D, interleaved, same bytes) whole rows ran write ALL 4096 x 1 0.921x and verify ALL 1K-4K
    1.025-1.052x (A/A 0.976-1.019; verify loads a paired fold's fronts before its chain hash already).
    """
    pairs = geom.fold_pairs()
    pair = whole_row_pair(whole_rows) if HEAD_WORDS < whole_rows <= WHOLE_ROW_WORDS else fold_pair

    @T.macro
    def fold(acc, part, front, base, srcs, params, num_sources):
        acc[0] = T.uint64(0)
        if pairs:
            if paired(1, num_sources):
                pair(acc, part, front, base, srcs[0], params[0][2], srcs[1], params[1][2])
            elif num_sources > 0:
                fold_one(acc, part, front, base, srcs[0], params[0][2])
            if paired(3, num_sources):
                pair(acc, part, front, base + 2 * FRONT_WORDS, srcs[2], params[2][2], srcs[3], params[3][2])
            elif num_sources > 2:
                fold_one(acc, part, front, base + 2 * FRONT_WORDS, srcs[2], params[2][2])
        else:
            if num_sources > 0:
                fold_one(acc, part, front, base, srcs[0], params[0][2])
            if num_sources > 1:
                fold_one(acc, part, front, base + FRONT_WORDS, srcs[1], params[1][2])
            if num_sources > 2:
                fold_one(acc, part, front, base + 2 * FRONT_WORDS, srcs[2], params[2][2])
            if num_sources > 3:
                fold_one(acc, part, front, base + 3 * FRONT_WORDS, srcs[3], params[3][2])

    return fold


def source_params(scalars, partial: bool, fold_words: int) -> list:
    """The sources' ``(page_size, token_words, fold_words)`` triples from the kernel's scalars
    (``scalars``, one triple per source). A PARTIAL fold reads each source's first HEAD_WORDS words
    whatever its layout (SPEC 1.4; the host passes that count too): with ``partial`` the count is built
    in, so the general fold's batch loops and tails compile away (the twenty-ninth and thirty-first
    sessions: verify PARTIAL 4096's sm_90 kernel 5840 -> 1344 SASS instructions, 218 -> 67 registers).
    An ALL fold reads each source's whole token row: a nonzero ``fold_words`` is that count, the same
    for every source, built in likewise (``specializations.fold_words`` chooses it from the sources)."""
    if partial:
        return [(ps, tw, T.int64(HEAD_WORDS)) for ps, tw, _ in scalars]
    return [(ps, tw, T.int64(fold_words) if fold_words else fw) for ps, tw, fw in scalars]


def require(kernel: str, condition, message: str) -> None:
    """A check of the launch's shapes and scalar arguments at this point of the prim_func being parsed
    (call it as a statement, before the first grid loop): unless ``condition`` holds, the call raises
    ``ValueError("kv-canary: <kernel>: <message>")`` on the host before any block runs. The kernels'
    guards keep every access inside its tensor, whatever the tensors hold, given the shape relations
    that the launch checks establish (SPEC 4, D4) and given disjoint arguments (D10, which no kernel can
    check); these checks refuse a call that breaks a shape relation where no launch check ran (a Relax
    call, a direct call of a compiled function). Messages name the kernel's parameters."""
    frame = T.Assert(condition, f"kv-canary: {kernel}: {message}", error_kind="ValueError")
    frame.add_callback(functools.partial(frame.__exit__, None, None, None))
    frame.__enter__()


def require_context(kernel: str, buf, flags, units, seed_saves, srcs, params, num_sources: int) -> None:
    """``require`` what verify and write read of their context: canary rows of at least
    CANARY_FIELDS_PER_SLOT words, ``flags`` of ``geometry.flag_words(units, seed_saves)`` words, and each folded
    source's strips (``ps`` slots of ``tw`` words a row; every fold reads ``max(fw, HEAD_WORDS)`` words
    of its strip) inside its rows (``source_params``' triples, built-in word counts included)."""
    require(kernel, buf.shape[1] >= CANARY_FIELDS_PER_SLOT,
            f"buf rows must hold at least {CANARY_FIELDS_PER_SLOT} int64 fields")
    require(kernel, flags_suffice(flags.shape[0], units, seed_saves),
            "flags is shorter than the launch's marks need (runtime.packing.flags_for)")
    for i in range(num_sources):
        page_size, token_words, fold_words = params[i]
        require(kernel, page_size >= 1, f"ps{i} must be at least 1")
        require(kernel, token_words <= srcs[i].shape[1] // page_size, f"src{i} rows must hold ps{i} x tw{i} words")
        require(kernel, T.max(fold_words, T.int64(HEAD_WORDS)) <= token_words,
                f"tw{i} must hold the fold's words (fw{i}, at least {HEAD_WORDS})")


def source_buffers(handles):
    """The four real-KV source views ``src<i>`` (int64 ``[r<i>, c<i>]``, row stride ``s<i>``, unit inner
    stride, element offset ``o<i>``) matched from their handles; call at the top of a prim_func, inside
    ``T.meta_var`` (the kernels index them as a Python list)."""
    bufs = []
    for i, handle in enumerate(handles):
        rows, cols, stride, offset = (IRBuilder.name(f"{v}{i}", T.int64()) for v in "rcso")
        buf = T.match_buffer(handle, (rows, cols), "int64", align=INT64_ALIGN, strides=(stride, T.int64(1)),
                             elem_offset=offset)
        bufs.append(IRBuilder.name(f"src{i}", buf))
    return bufs


@T.macro
def check_slot(ok, slot, num_slots, srcs, params, num_sources):
    """ok[0] := 1 iff slot is in [0, num_slots) and its row ``slot // page_size`` exists in each of the
    first num_sources (tested as ``slot < rows * page_size``: no division)."""
    ok[0] = T.Select(T.int64(0) <= slot and slot < num_slots, 1, 0)
    if num_sources > 0:
        if slot >= srcs[0].shape[0] * params[0][0]:
            ok[0] = 0
    if num_sources > 1:
        if slot >= srcs[1].shape[0] * params[1][0]:
            ok[0] = 0
    if num_sources > 2:
        if slot >= srcs[2].shape[0] * params[2][0]:
            ok[0] = 0
    if num_sources > 3:
        if slot >= srcs[3].shape[0] * params[3][0]:
            ok[0] = 0


# Device helpers of the single-launch kernels, as CUDA source the kernels call by name.
#
# The single launch's ticket (one launch for "every block, then one ordered pass"), without a round trip
# in a clean launch. After its share of the work each block learns at a barrier whether any of its
# threads marked a chunk (``__syncthreads_or``), and its thread 0 adds the block's *share* of 2**32 to
# an unsigned 32-bit arrivals counter that is zero on entry. Each block but the last adds 1, the last
# 2**32 - (n - 1) (with one block that is 2**32, i.e. 0): the n shares add up to 2**32, so the counter
# is back at zero, ready for the next launch, exactly when every block has arrived, and never before (a
# proper subset adds up to 1 ... n - 1 without the last block's share, to 2**32 - j with it, j >= 1
# being the blocks missing). The earlier even shares, floor((2**32 - 1) / n), cost an integer
# division (``MUFU.RCP`` and its fix-up) on every block's path; without it, interleaved on the H200
# (``benchmarks/ab_kernels.py``, thirty-fifth session, three calls): verify 1K-4K and write 4096 x 1,
# 256 x 4 and 128 x 16 0.982-0.988x (geometric mean; rows 0.959-1.017, the A/A arm's mean
# 0.998-1.000 in the two calls that had one), every larger row 0.983-1.003x.
# * A clean block adds its share without waiting for the result (a fire-and-forget reduction) and is
#   done.
# * A marking block fences (publishing its marks, cumulative over the barrier), draws a rank among the
#   marking blocks on a second counter (zero on entry), fences again (so that the emitter's reset of
#   the ranks cannot precede the draw) and adds its share. The one that drew rank 0 is the *emitter*:
#   it waits until the arrivals counter is back at zero (its own share keeps it non-zero until every
#   block has arrived), fences, and returns 2 (TICKET_EMIT): every block's marks are visible to it,
#   and it resets the ranks when it closes the launch. Every other block gets 0.
# Only the emitter ever waits, and it waits for blocks that wait on nothing, so every block can still
# be scheduled (on any GPU that holds two blocks at once). Measured on the H200 against the earlier
# ticket, which every block drew with a round trip and the last one to arrive emitted: verify at
# 1K-64K entries 0.930-0.989x, write 4096 x 1 0.949-0.977x, verify NONE at 1M-4M entries 1.003-1.025x
# (docs/PERFORMANCE-HISTORY.md, twenty-sixth session).
# The clean block's arrival and the 64-bit counter additions are fire-and-forget: written as PTX
# ``red.relaxed.gpu`` reductions, which compile to ``REDG``; nvcc and NVRTC compile an ``atomicAdd``
# whose result is unused to ``ATOMG ... RZ``, a round trip that returns a value to no register. Measured
# on the H200, interleaved, reductions / atomicAdd: verify NONE 1K-64K 0.914-0.989x, write NONE 4096 x 1
# 0.950-0.961x, no row more than 0.1% slower (docs/PERFORMANCE-HISTORY.md, twenty-ninth and thirtieth
# sessions).
# (One string per function: the code generator emits each call's source once per function name.)
BLOCK_ANY = """
__device__ __forceinline__ int canary_block_any(int predicate) { return __syncthreads_or(predicate); }
"""
LAST_BLOCK_TICKET = """
__device__ __forceinline__ int canary_last_block_ticket(void* arrivals, void* ranks, int nblocks, int block,
                                                        int marked) {
  unsigned int share = block + 1 < nblocks ? 1u : 0u - static_cast<unsigned int>(nblocks - 1);
  unsigned int* counter = static_cast<unsigned int*>(arrivals);
  if (!marked) {
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" :: "l"(counter), "r"(share) : "memory");
    return 0;
  }
  __threadfence();
  unsigned int rank = atomicAdd(static_cast<unsigned int*>(ranks), 1u);
  __threadfence();
  unsigned int drawn = atomicAdd(counter, share);
  if (rank != 0u) return 0;
  if (drawn + share != 0u) {
    while (atomicAdd(counter, 0u) != 0u) {
    }
  }
  __threadfence();
  return 2;
}
"""
ATOMIC_ADD_I64 = """
__device__ __forceinline__ void canary_atomic_add_i64(void* counter, long long value) {
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" :: "l"(counter),
               "l"(static_cast<unsigned long long>(value)) : "memory");
}
"""
# Ticket values: a block that neither emits nor (on CPU) closes the launch; the CPU's last block when no
# block marked; the block that emits (on CPU, the last block when some block marked). The CUDA helper
# keeps the name of the earlier last-block ticket, ``canary_last_block_ticket``: the name is part of every
# verify and write kernel's code, so renaming it would stale every tuning record of both.
TICKET_DONE, TICKET_CLOSE, TICKET_EMIT = 0, 1, 2


def take_marks(geom: Geometry, width: int):
    """Macro ``take(sflag, flags, c, n_chunks)`` for an ordered emit phase of ``width`` lanes: between
    two barriers, ``sflag[t]`` := the mark of chunk ``c * width + t`` (0 past ``n_chunks``), and the
    marks taken are cleared in ``flags`` (chunk marks at ``[1 + chunk]``)."""
    sync = block_sync(geom)

    @T.macro
    def take(sflag, flags, c, n_chunks):
        sync()
        for t in lanes(geom, width):
            ci = c * width + t
            sflag[t] = T.if_then_else(ci < n_chunks, flags[T.min(1 + ci, flags.shape[0] - 1)], 0)
            if ci < n_chunks:
                flags[1 + ci] = 0
        sync()

    return take


def emit_scratch(width: int, count_name: str, count_dtype: str):
    """The buffers of a single launch's ticket and ordered emit, allocated at the top of a block (call
    inside ``T.meta_var`` and unpack): ``sflag`` (shared, a chunk mark per lane), the per-lane row
    counts ``count_name`` (shared, ``count_dtype``), ``slast`` (shared, the ticket), and the locals
    ``last`` (the ticket), ``base`` (the ring position), ``marked``, ``lane_marked``, ``block_marked``."""
    layout = (("sflag", width, "int32", "shared"), (count_name, width, count_dtype, "shared"),
              ("slast", 1, "int32", "shared"), ("last", 1, "int32", "local"), ("base", 1, "int64", "local"),
              ("marked", 1, "int32", "local"), ("lane_marked", 1, "int32", "local"),
              ("block_marked", 1, "int32", "local"))
    return tuple(IRBuilder.name(name, T.alloc_buffer((n,), dtype, scope=scope)) for name, n, dtype, scope in layout)


def ordered_emit(geom: Geometry, width: int, count_unit, emit_unit, rows_of):
    """Macro ``emit(last, flags, write_index, base, marked, sflag, scount, active, state)``: the ordered
    emit phase of a single launch (SPEC D3), run by the ``width`` lanes of the block whose ticket is
    TICKET_EMIT (a no-op in every other block).

    For every marked chunk of ``FLAG_CHUNK`` units (entries or requests) in order, ``width`` units at a
    time: lane ``t`` runs ``count_unit(unit, t, active, state)``, which puts the unit's row count (or
    mark) at ``scount[t]``; after a barrier it ranks its rows, ``rank := base[0]`` plus the rows of the
    lanes before it (``rows_of(scount, q)`` as an int64 expression), every lane advancing ``base[0]``
    over the whole tile, and runs ``emit_unit(unit, rank, active, state)`` to store them from ``rank``
    on. ``base[0]`` starts at the ring's write index and ends as the new one; the chunk marks are
    cleared as they are taken. ``state`` is the kernel's bundle of what its two macros need.
    """
    sync = block_sync(geom)
    take = take_marks(geom, width)

    @T.macro
    def emit(last, flags, write_index, base, marked, sflag, scount, active, state):
        for _ in T.serial(T.Select(last[0] == TICKET_EMIT, 1, 0)):
            base[0] = T.Cast("int64", write_index[0])
            n_chunks = (active + FLAG_CHUNK - 1) // FLAG_CHUNK
            for c in T.serial((n_chunks + width - 1) // width):
                take(sflag, flags, c, n_chunks)
                for j in T.serial(width):
                    marked[0] = sflag[j]
                    for tile in T.serial(T.Select(marked[0] != 0, FLAG_CHUNK // width, 0)):
                        for t in lanes(geom, width):
                            unit = (c * width + j) * FLAG_CHUNK + tile * width + t
                            count_unit(unit, t, active, state)
                        sync()
                        for t in lanes(geom, width):
                            rank = T.alloc_buffer((1,), "int64", scope="local")
                            rank[0] = base[0]
                            for q in T.serial(width):
                                rows_q = rows_of(scount, q)
                                base[0] = base[0] + rows_q
                                rank[0] = rank[0] + T.Select(q < t, rows_q, T.int64(0))
                            unit = (c * width + j) * FLAG_CHUNK + tile * width + t
                            emit_unit(unit, rank[0], active, state)
                        sync()
            sync()

    return emit


def block_any(geom: Geometry):
    """Macro ``any_of(out, predicate)``, called by every lane of a block: a block barrier after which
    ``out[0]`` (a local) := 1 in every lane iff ``predicate`` (int32) is non-zero in some lane. On CPU
    the kernels run one lane per block, so it is the lane's own predicate."""
    if geom.gpu:

        @T.macro
        def any_of(out, predicate):
            out[0] = T.cuda.func_call("canary_block_any", predicate, source_code=BLOCK_ANY, return_type="int32")

    else:

        @T.macro
        def any_of(out, predicate):
            out[0] = predicate

    return any_of


def block_ticket(geom: Geometry):
    """Macro ``ticket(out, flags, nblocks, b, marked)``: ``out[0] :=`` TICKET_DONE, TICKET_CLOSE or
    TICKET_EMIT, drawn by a block that has done its share of the launch; ``marked`` is the block's
    ``block_any`` of its lanes' marks. TICKET_EMIT goes to the one block that emits (some block of the
    launch set a mark, and every block's marks are visible to it); TICKET_CLOSE only on CPU.

    On CUDA (``LAST_BLOCK_TICKET``) the arrivals counter is the int32 ``flags[NF - 1]`` and the ranks
    of the marking blocks are counted in ``flags[0]``, both zero on entry; ``close_launch`` resets the
    ranks, the arrivals return to zero by themselves. Only a marking block waits, so a clean launch
    makes no round trip after its work; block 0 adds the launch's counts right after its ticket
    (``count_launch``). On CPU the blocks run serially, so the last block is ``b == nblocks - 1``
    (TICKET_EMIT or TICKET_CLOSE: it closes the launch) and the launch's any-mark ``flags[0]`` tells
    whether some block marked.

    Call it from ONE thread of each block after ``block_any``, and broadcast ``out`` (a shared buffer)
    with a barrier.
    """
    if geom.gpu:

        @T.macro
        def ticket(out, flags, nblocks, b, marked):
            out[0] = T.cuda.func_call(
                "canary_last_block_ticket", T.address_of(flags[flags.shape[0] - 1]), T.address_of(flags[0]),
                T.Cast("int32", nblocks), T.Cast("int32", b), marked, source_code=LAST_BLOCK_TICKET,
                return_type="int32",
            )

    else:

        @T.macro
        def ticket(out, flags, nblocks, b, marked):
            out[0] = T.Select(b == nblocks - 1, T.Select(flags[0] != 0, TICKET_EMIT, TICKET_CLOSE), TICKET_DONE)

    return ticket


def counter_add(geom: Geometry):
    """Macro ``add(counter, value)``: ``counter[0] += value`` for an int64 ``[1]`` counter: a relaxed
    atomic reduction on CUDA (safe from any number of threads), a plain update on CPU (serial)."""
    if geom.gpu:

        @T.macro
        def add(counter, value):
            T.evaluate(T.cuda.func_call("canary_atomic_add_i64", T.address_of(counter[0]), value,
                                        source_code=ATOMIC_ADD_I64))

    else:

        @T.macro
        def add(counter, value):
            counter[0] = counter[0] + value

    return add


# A launch's counter additions (``count_launch``): ``kernel_counter += 1`` and, when ``slot_counter`` is
# given and ``enabled`` holds, ``slot_counter += slots``.
Tally = collections.namedtuple("Tally", "kernel_counter slot_counter slots enabled", defaults=(None, None, None))


def count_launch(geom: Geometry):
    """Macro ``count(tally)``: the launch's additions of ``tally`` (a ``Tally``), made once per launch by
    its counting block: block 0 on CUDA, right after its ticket (its additions need not wait for the
    other blocks: a relaxed atomic each); the last block on CPU, when it closes the launch.

    Counted after the emit phase, these operands stayed live through the whole kernel: under verify
    NONE's 32-register cap the sm_90 code stored one of them to local memory at the kernel's entry,
    before the check loop (SASS; 20 bytes of spill, 16 when counting at the ticket). On the
    H200, interleaved against counting after the emit phase (``benchmarks/ab_kernels.py``, twenty-eighth
    session): verify NONE chain 1M / 4M / 16M entries 0.952 / 0.968 / 0.993x, random 1M 0.981x; every
    other verify and write row 0.972-1.015x."""
    add = counter_add(geom)

    @T.macro
    def count(tally):
        add(tally.kernel_counter, T.int64(1))
        if tally.slot_counter is not None:
            if tally.enabled:
                add(tally.slot_counter, tally.slots)

    return count


def close_launch(geom: Geometry, count):
    """Macro ``close(t, last, flags, write_index, base, tally)`` ending a single launch, called by every
    lane ``t`` of a block after the emit phase with the block's ticket ``last``: the emitting block
    (TICKET_EMIT) clears ``flags[0]`` and publishes the ring's new write index ``base[0]`` (a clean
    launch leaves both as they are). On CPU the last block also adds the launch's ``tally`` (``count``,
    ``count_launch``'s macro); on CUDA block 0 added it at its ticket."""

    @T.macro
    def publish(last, flags, write_index, base):
        if last[0] == TICKET_EMIT:
            flags[0] = 0
            write_index[0] = T.Cast("int32", base[0])

    if geom.gpu:

        @T.macro
        def close(t, last, flags, write_index, base, tally):
            if t == 0:
                publish(last, flags, write_index, base)

    else:

        @T.macro
        def close(t, last, flags, write_index, base, tally):
            if t == 0 and last[0] != TICKET_DONE:
                publish(last, flags, write_index, base)
                count(tally)

    return close


# The parts of the single-launch protocol a kernel calls (see ``single_launch``).
SingleLaunch = collections.namedtuple("SingleLaunch", "mark draw_ticket emit close")


def single_launch(geom: Geometry, width: int, count_unit, emit_unit, rows_of) -> SingleLaunch:
    """The single-launch protocol (every block does its share; one block, after every block's share,
    appends the violation rows in order) for blocks of ``width`` lanes:

    * ``mark(flags, lane_marked, unit)``: a lane's unit (entry or request) has rows to emit: the lane's
      ``lane_marked``, the unit's chunk mark and, on CPU, the launch's any-mark ``flags[0]`` (on CUDA
      the ticket counts the marking blocks there);
    * ``draw_ticket(slast, flags, nblocks, b, t, lane_marked, block_marked, tally)``: called by every lane
      ``t`` of block ``b`` after its share: the block's any-mark of its lanes' ``lane_marked`` (a
      barrier), then lane 0 draws the block's ticket into the shared ``slast`` (``block_ticket``;
      broadcast it with a barrier) and, on CUDA in block 0, adds the launch's ``tally``
      (``count_launch``);
    * ``emit``: the ordered emit phase (``ordered_emit`` with the kernel's per-unit macros);
    * ``close``: the end of the launch (``close_launch``).
    """
    assert FLAG_CHUNK % width == 0
    # The emit phase keeps each lane's state in registers across lane loops: on CPU (serial lanes)
    # that needs one lane per block. Serial CPU blocks are fine: the last one emits.
    assert geom.gpu or width == 1
    any_of = block_any(geom)
    ticket = block_ticket(geom)
    count = count_launch(geom)

    @T.macro
    def mark(flags, lane_marked, unit):
        lane_marked[0] = 1
        if not geom.gpu:
            flags[0] = 1
        flags[1 + unit // FLAG_CHUNK] = 1

    @T.macro
    def draw_ticket(slast, flags, nblocks, b, t, lane_marked, block_marked, tally):
        any_of(block_marked, lane_marked[0])
        if t == 0:
            ticket(slast, flags, nblocks, b, block_marked[0])
            if geom.gpu:
                if b == 0:
                    count(tally)

    return SingleLaunch(mark, draw_ticket, ordered_emit(geom, width, count_unit, emit_unit, rows_of),
                        close_launch(geom, count))
