"""Verify kernel (SPEC 3.2 + D2-D4): check each active plan entry against the canary buffer.

Arguments (in order): canary ``int64[S, F]`` (the uint8 buffer viewed as int64, read only); plan
``slots/expected_tokens/expected_positions/prev_slots int64[cap]``, ``num_valid int32[1]``,
``enable int32[1]``; ``ring int64[R, 8]``, ``write_index int32[1]``, ``slot_counter int64[1]``,
``kernel_counter int64[1]`` (written); ``flags int32[NF >= 2 + ceil(cap / FLAG_CHUNK)]`` (scratch, zero on
entry and on exit: ``[0]`` the any-mark on CPU, the marking blocks' ranks on CUDA, ``[1 + c]`` the
mark of chunk ``c`` (FLAG_CHUNK entries), ``[NF - 1]`` the ticket's arrivals on CUDA); ``kind`` (int); four
source views ``int64[rows, row_words]`` and their ``(page_size, token_words, fold_words)`` scalars.

ONE launch of ``nb`` blocks of ``threads`` lanes, ``block_lanes`` of which check entries
(``common.work_grid`` of ``cap``: up to ``blocks`` blocks of ``threads`` entries, or a warp of entries per
block for a small plan when the geometry is ``thin``; ``cap`` is a shape, so the grid needs no host sync):
1. *check* (every block, grid-stride: entry ``b * block_lanes + t`` for lanes ``t < block_lanes``,
   stride ``nb * block_lanes``): computes each entry's fail bits and marks the FLAG_CHUNK-sized chunk of every failing
   entry in ``flags``. Nothing else is written.
2. *ticket* (``common.single_launch``): at a barrier each block learns whether it marked; thread 0
   draws the block's ticket (``common.LAST_BLOCK_TICKET``): a clean block adds its arrival and is
   done; the first marking block becomes the *emitter* and waits until every block has arrived. On
   CPU (serial blocks, ``threads = 1``) the last block emits if any block marked.
3. *emit* (the emitting block, its ``threads`` lanes): walks the marked chunks
   in order, recomputes their entries ``threads`` at a time, and each lane stores its own row from
   registers at its rank (prefix count of the failing lanes before it), so rows land in entry order
   (SPEC D3); rows outside the ring (past its capacity, or before it when the write index has
   wrapped) are dropped but counted in ``write_index``. It then clears the marks and publishes the
   write index. The counters are added by block 0 right after its ticket (atomic adds), on CPU by
   the last block (``common.count_launch``).
A clean launch therefore reads every entry once, writes only the counters and the arrivals, and no
block waits after its work. The geometry's ``tile`` is not used by verify (the emit phase runs with
the block's own lanes).
"""

from __future__ import annotations

import collections

from tvm.script import tirx as T

from .. import consts
from .common import (
    FRONTS_PER_SLOT,
    INT32_ALIGN,
    INT64_ALIGN,
    INVALID_INDEX,
    Geometry,
    Tally,
    block_sync,
    check_slot,
    emit_scratch,
    fold_sources,
    grid,
    head_loads,
    in_ring,
    lane_pairs,
    lanes,
    load_batches,
    require_context,
    single_launch,
    slot_hash,
    source_buffers,
    source_params,
    split_fold,
    splits_sources,
    work_grid,
)

CHAIN = int(consts.FailReason.VERIFY_CHAIN_HASH_MISMATCH)
POSITION = int(consts.FailReason.VERIFY_POSITION_MISMATCH)
REAL_KV = int(consts.FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
TOKEN = int(consts.FailReason.VERIFY_TOKEN_MISMATCH)


# The launch-wide arguments the macros read, as one bundle (a ``T.meta_var`` in the prim_func): the
# canary buffer, the plan vectors, the launch tag, and the four sources with their scalar triples.
Launch = collections.namedtuple("Launch", "buf slots etoks epos prevs kind srcs params")
# What the emit phase's per-entry macros use: the lane's verdict, row and hash scratch, the launch, the
# shared verdicts and the ring.
EmitState = collections.namedtuple("EmitState", "bits row launch h acc part ok sbits ring")


def make(num_sources: int, partial: bool, check_token: bool, fold_words: int, geom: Geometry):
    """TensorIR for one specialization: folded source count (0 = NONE mode), PARTIAL mode's built-in
    fold word count (``common.source_params``), the token check and ALL mode's built-in fold word count
    (0: each source's own, passed at launch)."""
    TH = geom.threads
    sync = block_sync(geom)
    fold = fold_sources(geom)  # batches loaded ahead, whatever fold_words (``fold_sources``)
    load_heads = head_loads(geom)
    pairs = geom.fold_pairs()
    # Split folds (``common.splits_sources``): in the check phase two lanes take each entry, both
    # checking it, each folding one source (``common.split_fold``, the fold in both lanes); the emit
    # phase, one lane an entry, folds paired.
    split = splits_sources(geom, num_sources, fold_words)
    fold_split = split_fold(geom, fold_words, both_lanes=True) if split else None
    to_entry, odd_lane = lane_pairs(split)  # the check phase's entries of grid lanes; a lane's parity

    @T.macro
    def entry(k, bits, row, launch, h, acc, part, ok, odd, lane):
        """bits[0], row := verdict and violation row (VIOLATION_FIELDS words) of entry k (bits 0: no row);
        with ``odd`` (not None: split folds) lanes ``lane`` and its neighbour (``odd`` 0 and 1) check the
        entry together, each folding one source.

        Loads are placed as early as their addresses are known (a warp issues in order, so a load
        placed after code that waits on another load costs one more round trip): the entry's plan words
        first; when the sources fold in pairs (``Geometry.fold_pairs``), as soon as the slot is checked,
        its sources' fronts (each strip's head words and first batch: ``common.head_loads`` /
        ``load_batches``), then its canary row, before the chain hash waits on the predecessor's row.
        Otherwise the heads are loaded when the fold starts, as few registers as possible staying live
        across the chain hash (PARTIAL's default caps them at 64)."""
        if odd is None:  # split lanes fold without fronts (``common.split_fold``)
            front = T.alloc_buffer((FRONTS_PER_SLOT,), "int64", scope="local")
        slot = launch.slots[k]
        prev = launch.prevs[k]
        ep = launch.epos[k]
        et = launch.etoks[k] if check_token else T.int64(-1)
        bits[0] = 0
        if slot != T.int64(consts.TOKEN_TO_KV_SLOT_PADDING):
            check_slot(ok, slot, launch.buf.shape[0], launch.srcs, launch.params, num_sources)
            row[consts.VIOLATION_FIELD_KERNEL_KIND] = launch.kind
            row[consts.VIOLATION_FIELD_SLOT_IDX] = slot
            row[consts.VIOLATION_FIELD_EXPECTED_TOKEN] = et
            if ok[0] == 0:
                bits[0] = INVALID_INDEX
                row[consts.VIOLATION_FIELD_POSITION] = T.int64(0)
                row[consts.VIOLATION_FIELD_STORED_TOKEN] = T.int64(0)
                row[consts.VIOLATION_FIELD_STORED_CHAIN_HASH] = T.int64(0)
                row[consts.VIOLATION_FIELD_EXPECTED_AUX] = T.int64(0)
            else:
                if pairs and odd is None:
                    load_heads(front, 0, launch.srcs, launch.params, num_sources, slot)
                    load_batches(front, 0, launch.srcs, launch.params, num_sources)
                st = launch.buf[slot, consts.CANARY_FIELD_TOKEN]
                sp = launch.buf[slot, consts.CANARY_FIELD_POSITION]
                sh = launch.buf[slot, consts.CANARY_FIELD_PREV_HASH]
                sr = launch.buf[slot, consts.CANARY_FIELD_REAL_KV_HASH]
                row[consts.VIOLATION_FIELD_POSITION] = sp
                row[consts.VIOLATION_FIELD_STORED_TOKEN] = st
                row[consts.VIOLATION_FIELD_STORED_CHAIN_HASH] = sh
                row[consts.VIOLATION_FIELD_EXPECTED_AUX] = sh
                if prev != T.int64(consts.TOKEN_TO_KV_SLOT_PADDING):
                    if prev >= launch.buf.shape[0]:
                        bits[0] = bits[0] | INVALID_INDEX
                    else:
                        slot_hash(h, launch.buf, prev)
                        row[consts.VIOLATION_FIELD_EXPECTED_AUX] = T.reinterpret("int64", h[0])
                        if sh != row[consts.VIOLATION_FIELD_EXPECTED_AUX]:
                            bits[0] = bits[0] | CHAIN
                if check_token:
                    if et != T.int64(-1) and st != et:
                        bits[0] = bits[0] | TOKEN
                if sp != ep:
                    bits[0] = bits[0] | POSITION
                if odd is None:
                    if not pairs:
                        load_heads(front, 0, launch.srcs, launch.params, num_sources, slot)
                    fold(acc, part, front, 0, launch.srcs, launch.params, num_sources)
                else:
                    fold_split(acc, part, slot, launch.srcs, launch.params, odd, lane)
                if sr != T.reinterpret("int64", acc[0]):
                    bits[0] = bits[0] | REAL_KV
        row[consts.VIOLATION_FIELD_FAIL_REASON_BITS] = T.Cast("int64", bits[0])

    @T.macro
    def count_entry(unit, t, active, st):
        """Emit phase A: the lane's verdict and row of entry ``unit`` into registers, its bits to shared."""
        st.bits[0] = 0
        if unit < active:
            entry(unit, st.bits, st.row, st.launch, st.h, st.acc, st.part, st.ok, None, t)
        st.sbits[t] = st.bits[0]

    @T.macro
    def emit_entry(unit, rank, active, st):
        """Emit phase B: the lane's row, if it has one, at ``rank`` (rows outside the ring are dropped: past
        its capacity, or before it when the write index has wrapped past 2**31 - 1)."""
        if st.bits[0] != 0 and in_ring(st.ring, rank):
            for f in T.serial(consts.VIOLATION_FIELDS):
                st.ring[rank, f] = st.row[f]

    mark, draw_ticket, emit, close = single_launch(geom, TH, count_entry, emit_entry,
                                                   lambda sbits, q: T.Cast("int64", sbits[q] != 0))

    # fmt: off
    @T.prim_func(private=False)
    def canary_verify(
        buf_h: T.handle, slots_h: T.handle, etoks_h: T.handle, epos_h: T.handle, prevs_h: T.handle,
        num_valid: T.Buffer((1,), "int32", align=INT32_ALIGN), enable: T.Buffer((1,), "int32", align=INT32_ALIGN),
        ring_h: T.handle, write_index: T.Buffer((1,), "int32", align=INT32_ALIGN),
        slot_counter: T.Buffer((1,), "int64", align=INT64_ALIGN),
        kernel_counter: T.Buffer((1,), "int64", align=INT64_ALIGN),
        flags_h: T.handle, kind: T.int64,
        src0_h: T.handle, ps0: T.int64, tw0: T.int64, fw0: T.int64,
        src1_h: T.handle, ps1: T.int64, tw1: T.int64, fw1: T.int64,
        src2_h: T.handle, ps2: T.int64, tw2: T.int64, fw2: T.int64,
        src3_h: T.handle, ps3: T.int64, tw3: T.int64, fw3: T.int64,
    ):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        S = T.int64()
        F = T.int64()
        cap = T.int64()
        R = T.int64()
        NF = T.int64()
        buf = T.match_buffer(buf_h, (S, F), "int64", align=INT64_ALIGN)
        slots = T.match_buffer(slots_h, (cap,), "int64", align=INT64_ALIGN)
        etoks = T.match_buffer(etoks_h, (cap,), "int64", align=INT64_ALIGN)
        epos = T.match_buffer(epos_h, (cap,), "int64", align=INT64_ALIGN)
        prevs = T.match_buffer(prevs_h, (cap,), "int64", align=INT64_ALIGN)
        ring = T.match_buffer(ring_h, (R, consts.VIOLATION_FIELDS), "int64", align=INT64_ALIGN)
        flags = T.match_buffer(flags_h, (NF,), "int32", align=INT32_ALIGN)
        srcs = T.meta_var(source_buffers([src0_h, src1_h, src2_h, src3_h]))
        params = T.meta_var(
            source_params([(ps0, tw0, fw0), (ps1, tw1, fw1), (ps2, tw2, fw2), (ps3, tw3, fw3)], partial, fold_words))
        require_context("verify", buf, flags, cap, 0, srcs, params, num_sources)
        launch = T.meta_var(Launch(buf, slots, etoks, epos, prevs, kind, srcs, params))
        # Blocks, and the lanes of each that check entries (shape expressions: no host sync). meta_vars
        # (the expressions themselves): a bound variable would not reach the host's launch code.
        nb, block_lanes = T.meta_var(work_grid(geom, cap * 2 if split else cap))  # split: two lanes an entry

        # One launch: nb blocks check the entries (grid-stride), then the block that finishes last
        # appends the rows of the marked chunks in entry order. Every lane keeps the ring base in a
        # register; branches around barriers are loops of uniform extent 0 or n.
        for b in grid(geom, nb):
            with T.attr(0, "tirx.launch_bounds_min_blocks_per_sm", geom.min_blocks):
                sflag, sbits, slast, last, base, marked, lane_marked, block_marked = T.meta_var(
                    emit_scratch(TH, "sbits", "int32"))
                bits = T.alloc_buffer((1,), "int32", scope="local")
                row = T.alloc_buffer((consts.VIOLATION_FIELDS,), "int64", scope="local")
                h = T.alloc_buffer((1,), "uint64", scope="local")
                acc = T.alloc_buffer((1,), "uint64", scope="local")
                part = T.alloc_buffer((1,), "uint64", scope="local")
                ok = T.alloc_buffer((1,), "int32", scope="local")
                k = T.alloc_buffer((1,), "int64", scope="local")
                active = T.max(T.min(T.Cast("int64", num_valid[0]), cap), T.int64(0))
                on = enable[0] != 0
                state = T.meta_var(EmitState(bits, row, launch, h, acc, part, ok, sbits, ring))
                tally = T.meta_var(Tally(kernel_counter, slot_counter, active, on))

                # Phase 1 (every block): check its share of the entries, mark the chunks holding violations.
                for t in lanes(geom, TH):
                    lane_marked[0] = 0
                    if on and T.Cast("int64", t) < block_lanes:
                        k[0] = to_entry(T.Cast("int64", b) * block_lanes + T.Cast("int64", t))
                        while k[0] < active:
                            entry(k[0], bits, row, launch, h, acc, part, ok, odd_lane(t), t)
                            if bits[0] != 0:
                                mark(flags, lane_marked, k[0])
                            k[0] = k[0] + to_entry(nb * block_lanes)
                # Phase 2: the ticket; one block emits if any block marked.
                for t in lanes(geom, TH):
                    draw_ticket(slast, flags, nb, b, t, lane_marked, block_marked, tally)
                sync()
                last[0] = slast[0]

                # Phase 3 (the emitting block only): emit the marked chunks'
                # rows in entry order, TH entries at a time; each lane stores its own row from registers
                # at its rank among the TH.
                emit(last, flags, write_index, base, marked, sflag, sbits, active, state)
                for t in lanes(geom, TH):
                    close(t, last, flags, write_index, base, tally)
    # fmt: on

    return canary_verify
