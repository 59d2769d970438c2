"""Write kernel (SPEC 3.1 + D2-D4): stamp each request's tokens as one hash chain.

Arguments (in order): canary ``int64[S, F]`` (written: fields 0..3 of each written slot, read at seed
slots); plan ``offsets int64[cap+1]``, ``seeds int64[cap]``, ``num_valid_reqs int32[1]``;
``input_ids/positions/out_cache_loc int64[N]``; ``expected_tokens/expected_positions int64[N]``
(read only when the input assert is on); ``chain_assert int32[1]``; ``ring int64[R, 8]``,
``write_index int32[1]``, ``slot_counter int64[1]``, ``kernel_counter int64[1]`` (written);
``flags int32[NF >= 2 + ceil(cap / CHUNK) + SEED_SAVE_WORDS * cap]`` (scratch, zero on entry and exit:
``[0]`` the any-mark on CPU, the marking blocks' ranks on CUDA, ``[1 + c]`` the mark of chunk ``c``
(CHUNK requests), then a seed save per request, ``[NF - 1]`` the ticket's arrivals on CUDA);
``kind``; four sources with their ``(page_size, token_words, fold_words)``.

ONE launch of ``stamp_blocks`` blocks of ``threads`` lanes, ``block_lanes`` of which take work
(``common.work_grid`` of ``max(N, cap)``: up to ``blocks`` blocks of ``threads`` lanes, or a warp of
work per block for a small plan when the geometry is ``thin``), twice that on CUDA in real-KV modes
(``N`` and ``cap`` are shapes, so the grid needs no host sync):
0. *fold* (real-KV modes only; on CUDA in the second ``stamp_blocks`` blocks, concurrently with phase 1;
   on CPU every lane before its phase 1): ``width = max(1, lanes // active)`` of the phase's
   ``stamp_blocks * block_lanes`` working lanes per request stride the request's entries: field 3 of
   every slot the request stamps := the slot's real-KV fold. The fold depends on the slot alone, so
   it runs in parallel, off the serial chain, and phase 1 need not wait for it (it writes fields 0-2
   and reads only seed slots). Split folds (``common.splits_sources``: CUDA, ``pairs`` 2) take twice
   the blocks, and a pair of neighbouring lanes does what one lane does otherwise, a source each.
1. *stamp* (the first ``stamp_blocks`` blocks): each request gets a warp of its own when there are
   fewer requests than warps (warp w of block b takes requests w * stamp_blocks + b + k * warps), else
   a lane of its own (lane t of block b takes request t * stamp_blocks + b when the requests fill at
   most half the lanes, else consecutive lanes); it walks the chain, writes fields 0-2 (and 3 := 0 in
   NONE mode), adds the written count to the slot counter and marks the request's chunk in ``flags`` if any
   entry of it produces violation rows. When every slot of the request is known valid beforehand (its
   warp checks them all and votes, on CUDA when the request has a warp of its own; the thread itself on
   CPU), its full batches of 32 entries (one on CPU) are stamped by the whole warp in lockstep: each
   lane loads one entry, every lane runs the batch's chain steps on tokens and positions shuffled from
   their lanes, and each lane then stores its own entry (unless a later entry of the batch stores the
   same slot), so the serial chain carries no loads, stores or checks. The rest (every entry
   otherwise) is walked by one thread, lane 0 of the request's warp or the request's lane, U entries
   at a time with the next U loaded ahead; each group's slots are checked and a group with an invalid
   slot takes a guarded step (every entry's mix3 computed, kept only if the entry is stamped).
   A request that stores its own seed slot (found by ``check_request``'s vote, or by the group about
   to store it) first saves the seed's chain hash and position in ``flags`` and marks its chunk.
2. *ticket* (``common.single_launch``): if some request marked, one block (the first marking block on
   CUDA, the last block on CPU) emits, after every block's share; clean blocks do not wait.
3. *emit* (the emitting block, its ``threads`` lanes): for marked chunks, counts each request's rows,
   ranks them (request order) and walks again to append the rows to the ring in reference order (SPEC
   D3); then publishes the write index. Block 0 bumps the kernel counter right after its ticket (the
   last block on CPU, when it closes the launch: ``common.count_launch``).
Phases 1 and 3 walk a request with the same ``walk`` macro and re-read only seed slots: phase 3 starts
from the request's seed save when it has one (clearing it), so a request storing its own seed slot
gets the reference's rows; another request's seed slot must not be stored (plans that do not alias,
SPEC D7). The geometry's ``tile`` is not used.
"""

from __future__ import annotations

import collections

from tvm.script import tirx as T

from .. import consts
from .common import FLAG_CHUNK as CHUNK
from .common import (
    FRONTS_PER_SLOT,
    INT32_ALIGN,
    INT64_ALIGN,
    INVALID_INDEX,
    SEED_SAVE_WORDS,
    Geometry,
    Tally,
    block_sync,
    check_slot,
    counter_add,
    emit_scratch,
    fold_sources,
    grid,
    head_loads,
    in_ring,
    lane_pairs,
    lanes,
    load_batches,
    mix3,
    require,
    require_context,
    single_launch,
    slot_hash,
    source_buffers,
    source_params,
    split_fold,
    splits_sources,
    work_grid,
)

TOKEN = int(consts.FailReason.WRITE_TOKEN_MISMATCH)
POSITION = int(consts.FailReason.WRITE_POSITION_MISMATCH)
STAMP, COUNT, EMIT = "stamp", "count", "emit"
# Slots each lane of a warp loads at once when checking a request's slots (check_request).
CHECK_UNROLL = 16
# The fold phase's lane mapping (fold_lanes) in one int32 local of 4 elements, by index: lanes per
# request, request stride, the lane's first request, its rank among its request's lanes.
FOLD_WIDTH, FOLD_STRIDE, FOLD_FIRST, FOLD_RANK = range(4)
# An int32 the CUDA compiler must materialize where it is written (an empty volatile asm): the fold
# lanes' capacity mapping, so that NVVM cannot merge its divisions with the remap's, after the branch
# (measured in docs/PERFORMANCE-HISTORY.md, "What the fortieth session changed and measured", retired:
# `git show a3a1d5d:docs/PERFORMANCE-HISTORY.md`).
PIN = """
__device__ __forceinline__ int canary_pin(int x) {
  asm volatile("" : "+r"(x));
  return x;
}
"""


# The launch-wide arguments the macros read, as one bundle (a ``T.meta_var`` in the prim_func): the
# canary buffer, the plan, the token vectors, the input-assert flag, the ring, the launch tag, and the
# four sources with their scalar triples.
Launch = collections.namedtuple("Launch", "buf offsets seeds ids pos_in ocl etoks epos cpa ring flags kind srcs params")
# Local registers holding U consecutive entries of a request: slot (-1 past the request's end), token,
# position and, with the input assert, expected token and position.
Group = collections.namedtuple("Group", "slot tok pos et ep")
# What the emit phase's per-request macros use: the lane's row count, the shared counts, the launch.
EmitState = collections.namedtuple("EmitState", "nrows scount launch")


def make(num_sources: int, partial: bool, input_assert: bool, fold_words: int, geom: Geometry):
    """TensorIR for one specialization: folded source count (0 = NONE mode), PARTIAL mode's built-in
    fold word count (``common.source_params``), the input assert and ALL mode's built-in fold word count
    (0: each source's own, passed at launch)."""
    TH, U = geom.threads, geom.unroll
    # Lanes that stamp one request in lockstep (stamp_lockstep): a warp on CUDA, the thread on CPU; the
    # chain steps of a batch are unrolled U at a time.
    WARP = 32 if geom.gpu else 1
    STEP_UNROLL = min(U, WARP)
    assert WARP % STEP_UNROLL == 0, f"write: unroll {U} must divide the warp's {WARP} lanes"
    sync = block_sync(geom)
    add = counter_add(geom)
    fold = fold_sources(geom, fold_words)
    load_heads = head_loads(geom)
    pairs = geom.fold_pairs()
    # Split folds (``common.splits_sources``): a lane pair per slot, one source's chain in each lane.
    split = splits_sources(geom, num_sources, fold_words)
    fold_split = split_fold(geom, fold_words) if split else None
    unit_of, odd_of = lane_pairs(split)  # the fold units of fold lanes; a lane's parity

    def stores_fold(odd):
        """Whether a fold lane stores the fold it computed: every lane, but split only the even one."""
        return T.Not(odd) if split else True

    # Blocks (per stamp block) that only fold: on CUDA in real-KV modes, so folds run beside the chains;
    # two when the folds are split, so that each pair of fold lanes takes what one lane would.
    FOLD_BLOCKS = (2 if split else 1) if geom.gpu and num_sources > 0 else 0

    def record_macro(mode):
        @T.macro
        def record(launch, nrows, base, slot, position, stored_token, expected_token, chain_hash, aux, bits):
            """Account one violation row; in EMIT mode store it at ring[base + nrows] if that row exists
            (not past the capacity, nor before the ring when the write index has wrapped past 2**31 - 1)."""
            if mode == EMIT:
                d = base + nrows[0]
                if in_ring(launch.ring, d):
                    launch.ring[d, consts.VIOLATION_FIELD_KERNEL_KIND] = launch.kind
                    launch.ring[d, consts.VIOLATION_FIELD_SLOT_IDX] = slot
                    launch.ring[d, consts.VIOLATION_FIELD_POSITION] = position
                    launch.ring[d, consts.VIOLATION_FIELD_STORED_TOKEN] = stored_token
                    launch.ring[d, consts.VIOLATION_FIELD_EXPECTED_TOKEN] = expected_token
                    launch.ring[d, consts.VIOLATION_FIELD_STORED_CHAIN_HASH] = chain_hash
                    launch.ring[d, consts.VIOLATION_FIELD_EXPECTED_AUX] = aux
                    launch.ring[d, consts.VIOLATION_FIELD_FAIL_REASON_BITS] = bits
            nrows[0] = nrows[0] + T.int64(1)

        return record

    @T.macro
    def load_fields(regs, u, i, launch):
        """regs[u] := entry i's token and position (and with input checks its expected ones); the
        caller loads the slot."""
        regs.tok[u] = launch.ids[i]
        regs.pos[u] = launch.pos_in[i]
        if input_assert:
            regs.et[u] = launch.etoks[i]
            regs.ep[u] = launch.epos[i]

    @T.macro
    def load_group(group, s0, s1, first, launch):
        """group := entries [s0 + first, s0 + first + U) of the request (slot -1 past s1)."""
        for u in T.unroll(U):
            i = T.min(s0 + first + u, s1 - 1)
            group.slot[u] = T.Select(s0 + first + u < s1, launch.ocl[i], T.int64(-1))
            load_fields(group, u, i, launch)

    def stamp_group_macro(guarded):
        @T.macro
        def stamp_group(h, hn, prev_pos, nrows, written, ok_u, group, check_pos, launch):
            """Stamp U loaded entries; nrows[0] counts entries that produce violation rows.

            guarded (some entry of the group is not stamped): every entry's mix3 is computed and
            kept only if the entry is stamped, and its stores sit behind a branch. Unguarded (every
            entry is live and passed its slot check, the common case): no branch at all, so the
            compiler interleaves the stores and bookkeeping with the serial chain."""
            for u in T.unroll(U):
                slot = group.slot[u]
                tok = group.tok[u]
                pos = group.pos[u]
                mismatch = (tok != group.et[u] or pos != group.ep[u]) if input_assert else T.bool(False)
                if guarded:
                    live = slot >= T.int64(0)
                    good = live and ok_u[u] != 0
                    seq = good and check_pos
                    bad = (live and ok_u[u] == 0) or (seq and pos != prev_pos[0] + T.int64(1)) or (good and mismatch)
                    nrows[0] = nrows[0] + T.Cast("int64", bad)
                    prev_pos[0] = T.Select(seq, pos, prev_pos[0])
                    if good:
                        stamp(launch.buf, slot, tok, pos, h)
                    written[0] = written[0] + T.Cast("int64", good)
                    hn[0] = h[0]
                    mix3(hn, tok, pos)
                    h[0] = T.Select(good, hn[0], h[0])
                else:
                    bad = (check_pos and pos != prev_pos[0] + T.int64(1)) or mismatch
                    nrows[0] = nrows[0] + T.Cast("int64", bad)
                    prev_pos[0] = T.Select(check_pos, pos, prev_pos[0])
                    stamp(launch.buf, slot, tok, pos, h)
                    mix3(h, tok, pos)
            if not guarded:
                written[0] = written[0] + T.int64(U)

        return stamp_group

    @T.macro
    def stamp(buf, slot, tok, pos, h):
        """The slot's fields 0-2 := token, position, chain hash (field 3 := 0 in NONE mode; the fold
        phase wrote it otherwise)."""
        buf[slot, consts.CANARY_FIELD_TOKEN] = tok
        buf[slot, consts.CANARY_FIELD_POSITION] = pos
        buf[slot, consts.CANARY_FIELD_PREV_HASH] = T.reinterpret("int64", h[0])
        if num_sources == 0:
            buf[slot, consts.CANARY_FIELD_REAL_KV_HASH] = T.int64(0)

    stamp_guarded, stamp_all = stamp_group_macro(True), stamp_group_macro(False)

    def record_group_macro(mode):
        record = record_macro(mode)

        @T.macro
        def record_group(h, prev_pos, nrows, base, ok_u, group, check_pos, launch):
            """Re-walk U loaded entries and account (COUNT) or append (EMIT) their rows in order."""
            for u in T.unroll(U):
                slot = group.slot[u]
                if slot >= T.int64(0):
                    tok = group.tok[u]
                    pos = group.pos[u]
                    hs = T.reinterpret("int64", h[0])
                    if ok_u[u] == 0:
                        record(launch, nrows, base, slot, pos, tok, tok, hs, pos, T.int64(INVALID_INDEX))
                    else:
                        if input_assert:
                            et = group.et[u]
                            ep = group.ep[u]
                            bits = (T.Select(tok != et, T.int64(TOKEN), T.int64(0))
                                    | T.Select(pos != ep, T.int64(POSITION), T.int64(0)))
                            if bits != T.int64(0):
                                record(launch, nrows, base, slot, pos, tok, et, hs, ep, bits)
                        if check_pos:
                            if pos != prev_pos[0] + T.int64(1):
                                record(launch, nrows, base, slot, pos, tok, tok, hs, prev_pos[0] + T.int64(1),
                                       T.int64(POSITION))
                            prev_pos[0] = pos
                        mix3(h, tok, pos)

        return record_group

    @T.macro
    def copy_group(dst, src, count):
        """dst := src, ``count`` entries (the next group's registers become the current group's)."""
        for u in T.unroll(count):
            dst.slot[u] = src.slot[u]
            dst.tok[u] = src.tok[u]
            dst.pos[u] = src.pos[u]
            if input_assert:
                dst.et[u] = src.et[u]
                dst.ep[u] = src.ep[u]

    @T.macro
    def load_entry(entry, i, launch):
        """entry := entry i of the token vectors (one register each)."""
        entry.slot[0] = launch.ocl[i]
        load_fields(entry, 0, i, launch)

    def lane_value(value, src):
        """``value`` as held by lane ``src`` of the warp (a shuffle on CUDA; on CPU the thread is its own
        and only lane, src 0)."""
        return T.cuda.__shfl_sync(T.uint32(0xFFFFFFFF), value, T.Cast("int32", src), WARP) if geom.gpu else value

    def warp_total(value):
        return T.cuda.warp_sum(value) if geom.gpu else value

    def later_lane_holds(slot, lane):
        """Whether a later lane of the warp holds ``slot`` too (CUDA: ``__match_any_sync``, the lanes
        holding the same value; on CPU there is no other lane). The later entry's store must stay, as
        the reference stores entry by entry; one store instruction of the warp keeps any of them,
        field by field."""
        if not geom.gpu:
            return T.bool(False)
        same = T.call_extern("uint32", "__match_any_sync", T.uint32(0xFFFFFFFF), T.reinterpret("uint64", slot))
        return T.shift_right(same, T.Cast("uint32", lane)) > T.uint32(1)

    @T.macro
    def order_warp_stores():
        """On CUDA, ``__syncwarp``: the lanes' stores so far are ordered before the warp's later ones (a
        slot stored by two entries of a request keeps the later entry's fields, as in the reference)."""
        if geom.gpu:
            T.evaluate(T.cuda.warp_sync())

    @T.macro
    def stamp_lockstep(h, prev_pos, nrows, written, s0, s1, batches, lane, check_pos, launch):
        """Stamp entries [s0, s0 + batches * WARP) of a request whose slots all pass ``check_slot``, by
        the WARP lanes of a warp in lockstep (one thread on CPU), lane ``lane`` (int64) of them: per
        batch, lane k holds entry base + k (the next batch's entry loaded ahead); every lane runs the
        batch's WARP chain steps on the tokens and positions shuffled from their lanes and keeps the
        hash before step k in lane k; then every lane stores its own entry (unless a later lane holds
        its slot: ``later_lane_holds``, asked before the chain steps so that they hide its latency)
        and counts whether it is a violation (input assert; position sequence, the predecessor's
        position taken from the lane before). So the serial chain carries no loads, stores or checks.
        On return every lane holds the chain hash and ``prev_pos`` after the batches, ``nrows[0]`` has
        grown by the batches' violating entries (warp total) and ``written[0]`` by the lane's own
        entries (stored or left to a later entry with the same slot: the reference counts entries).
        The caller has all the warp's lanes call it together (s1 > s0)."""
        slot_c = T.alloc_buffer((1,), "int64", scope="local")
        tok_c = T.alloc_buffer((1,), "int64", scope="local")
        pos_c = T.alloc_buffer((1,), "int64", scope="local")
        et_c = T.alloc_buffer((1,), "int64", scope="local")
        ep_c = T.alloc_buffer((1,), "int64", scope="local")
        slot_x = T.alloc_buffer((1,), "int64", scope="local")
        tok_x = T.alloc_buffer((1,), "int64", scope="local")
        pos_x = T.alloc_buffer((1,), "int64", scope="local")
        et_x = T.alloc_buffer((1,), "int64", scope="local")
        ep_x = T.alloc_buffer((1,), "int64", scope="local")
        mine = T.alloc_buffer((1,), "uint64", scope="local")
        shifted = T.alloc_buffer((1,), "int64", scope="local")
        bad = T.alloc_buffer((1,), "int64", scope="local")
        keep = T.alloc_buffer((1,), "int32", scope="local")
        cur = T.meta_var(Group(slot_c, tok_c, pos_c, et_c, ep_c))
        nxt = T.meta_var(Group(slot_x, tok_x, pos_x, et_x, ep_x))
        load_entry(cur, T.min(s0 + lane, s1 - 1), launch)
        bad[0] = T.int64(0)
        for g in T.serial(batches):
            load_entry(nxt, T.min(s0 + (g + 1) * WARP + lane, s1 - 1), launch)
            # Before the chain steps, which hide its latency (it does not depend on the hash).
            keep[0] = T.Cast("int32", not later_lane_holds(cur.slot[0], lane))
            pos = cur.pos[0]
            shifted[0] = lane_value(pos, lane - T.int64(1))  # every lane shuffles (outside the select)
            before = T.Select(lane == T.int64(0), prev_pos[0], shifted[0])
            mismatch = (cur.tok[0] != cur.et[0] or pos != cur.ep[0]) if input_assert else T.bool(False)
            bad[0] = bad[0] + T.Cast("int64", (check_pos and pos != before + T.int64(1)) or mismatch)
            for kk in T.serial(WARP // STEP_UNROLL):
                for k in T.unroll(STEP_UNROLL):
                    mine[0] = T.Select(lane == T.Cast("int64", kk * STEP_UNROLL + k), h[0], mine[0])
                    mix3(h, lane_value(cur.tok[0], kk * STEP_UNROLL + k), lane_value(pos, kk * STEP_UNROLL + k))
            if keep[0] != 0:
                stamp(launch.buf, cur.slot[0], cur.tok[0], pos, mine)
            order_warp_stores()
            prev_pos[0] = lane_value(pos, WARP - 1)
            copy_group(cur, nxt, 1)
        written[0] = written[0] + batches
        nrows[0] = nrows[0] + warp_total(bad[0])

    @T.macro
    def seed_state(h, prev_pos, seed, check_pos, launch):
        """h[0], prev_pos[0] := the chain hash and position a request's walk starts from: its seed slot's
        (seed < S; the anchor hash for seed < 0; the position only when ``check_pos``, else 0)."""
        slot_hash(h, launch.buf, seed)
        prev_pos[0] = T.int64(0)
        if check_pos:
            prev_pos[0] = launch.buf[seed, consts.CANARY_FIELD_POSITION]

    def seed_save_at(r, launch):
        """Where request r's seed save starts in ``flags`` (after the chunk marks), and whether flags has
        room for it (the ticket's arrivals word stays clear); without room it is neither saved nor used."""
        at = 1 + (launch.seeds.shape[0] + CHUNK - 1) // CHUNK + SEED_SAVE_WORDS * r
        return at, at + SEED_SAVE_WORDS < launch.flags.shape[0]

    def word(bits, half):
        """Half ``half`` (0 low, 1 high) of uint64 ``bits`` as an int32."""
        return T.Cast("int32", T.shift_right(bits, T.uint64(32 * half)))

    def joined(flags, at):
        """The uint64 whose low and high words are flags[at], flags[at + 1]."""
        return (T.shift_left(T.Cast("uint64", T.Cast("uint32", flags[at + 1])), T.uint64(32))
                | T.Cast("uint64", T.Cast("uint32", flags[at])))

    @T.macro
    def save_seed(saved, r, seed, check_pos, launch):
        """Request r's seed save := a marker and ``seed_state`` (read now: call before the request's
        first store to its seed slot); saved[0] := 1. The emit phase starts the request's walks from
        the save (SPEC D7: a request writing its own seed slot) and clears it."""
        h = T.alloc_buffer((1,), "uint64", scope="local")
        pos = T.alloc_buffer((1,), "int64", scope="local")
        at, fits = T.meta_var(seed_save_at(r, launch))
        if fits:
            seed_state(h, pos, seed, check_pos, launch)
            launch.flags[at + 1] = word(h[0], 0)
            launch.flags[at + 2] = word(h[0], 1)
            launch.flags[at + 3] = word(T.reinterpret("uint64", pos[0]), 0)
            launch.flags[at + 4] = word(T.reinterpret("uint64", pos[0]), 1)
            launch.flags[at] = 1
        saved[0] = 1

    @T.macro
    def clear_seed_save(r, launch):
        """Request r's seed save := zeros (the emit phase, after the request's last walk)."""
        at, fits = T.meta_var(seed_save_at(r, launch))
        if fits:
            for w in T.unroll(SEED_SAVE_WORDS):
                launch.flags[at + w] = 0

    def walk_macro(mode):
        record = record_macro(mode)
        record_group = record_group_macro(mode)

        @T.macro
        def walk(r, base, nrows, written, saved, launch, lane, leader, all_valid, holds_seed):
            """Walk request r in `mode`: nrows[0] := its violation rows (STAMP: violating entries),
            written[0] += slots written (STAMP).

            all_valid (STAMP only; a warp-uniform bool expression, or None): every slot of the request
            is known to pass ``check_slot`` (``check_request``). Then the WARP lanes of the warp (all
            of which call walk, lane ``lane`` of them) stamp its full batches of WARP entries in
            lockstep (``stamp_lockstep``). The rest of the request (every entry when not all_valid)
            is walked by the ``leader`` lane alone, U entries at a time, each group's slots checked;
            with all_valid None (COUNT, EMIT, and requests of a lane each) the caller's lane is the
            leader.

            Seed saves (SPEC D7): in STAMP, the leader saves the request's seed state before the
            request first stores its seed slot (up front when ``holds_seed``, a warp-uniform bool
            from ``check_request``: some entry stores the seed slot; else when a group holds it) and
            then has saved[0] = 1 (0 otherwise; the caller marks the request's chunk, so that the
            emit phase clears the save). COUNT and EMIT start from the save when there is one, and
            EMIT clears it."""
            h = T.alloc_buffer((1,), "uint64", scope="local")
            hn = T.alloc_buffer((1,), "uint64", scope="local")
            all_ok = T.alloc_buffer((1,), "int32", scope="local")
            ok = T.alloc_buffer((1,), "int32", scope="local")
            holds = T.alloc_buffer((1,), "int32", scope="local")
            prev_pos = T.alloc_buffer((1,), "int64", scope="local")
            start = T.alloc_buffer((1,), "int64", scope="local")
            slot_u = T.alloc_buffer((U,), "int64", scope="local")
            tok_u = T.alloc_buffer((U,), "int64", scope="local")
            pos_u = T.alloc_buffer((U,), "int64", scope="local")
            et_u = T.alloc_buffer((U,), "int64", scope="local")
            ep_u = T.alloc_buffer((U,), "int64", scope="local")
            ok_u = T.alloc_buffer((U,), "int32", scope="local")
            slot_n = T.alloc_buffer((U,), "int64", scope="local")
            tok_n = T.alloc_buffer((U,), "int64", scope="local")
            pos_n = T.alloc_buffer((U,), "int64", scope="local")
            et_n = T.alloc_buffer((U,), "int64", scope="local")
            ep_n = T.alloc_buffer((U,), "int64", scope="local")
            cur = T.meta_var(Group(slot_u, tok_u, pos_u, et_u, ep_u))
            nxt = T.meta_var(Group(slot_n, tok_n, pos_n, et_n, ep_n))
            n = launch.ids.shape[0]
            s0 = T.min(T.max(launch.offsets[r], T.int64(0)), n)
            s1 = T.min(T.max(launch.offsets[r + 1], s0), n)
            seed = launch.seeds[r]
            nrows[0] = T.int64(0)
            saved[0] = 0
            if s1 > s0:
                # The first group's loads are issued before the seed slot's (they are independent;
                # requests stamped in lockstep load theirs after the batches), and then a software
                # pipeline over groups of U entries issues the loads of group g + 1 before group g's
                # chain steps.
                if all_valid is None:
                    load_group(cur, s0, s1, T.int64(0), launch)
                else:
                    if not all_valid:
                        load_group(cur, s0, s1, T.int64(0), launch)
                if seed >= launch.buf.shape[0]:
                    record(launch, nrows, base, seed, T.int64(0), T.int64(0), T.int64(0), T.int64(0), T.int64(0),
                           T.int64(INVALID_INDEX))
                else:
                    check_pos = seed >= T.int64(0) and launch.cpa[0] != 0
                    if mode == STAMP:
                        seed_state(h, prev_pos, seed, check_pos, launch)
                    else:
                        at, fits = T.meta_var(seed_save_at(r, launch))
                        if fits:
                            saved[0] = launch.flags[at]
                        if saved[0] != 0:
                            h[0] = joined(launch.flags, at + 1)
                            prev_pos[0] = T.reinterpret("int64", joined(launch.flags, at + 3))
                        else:
                            seed_state(h, prev_pos, seed, check_pos, launch)
                    start[0] = T.int64(0)
                    if all_valid is not None:
                        if all_valid:
                            # The leader's save reads the seed slot before any lane stores it: its
                            # flags stores consume the loaded values before it reaches the batch's
                            # first warp-wide call (later_lane_holds), which the storing lanes wait at.
                            if leader and holds_seed:
                                save_seed(saved, r, seed, check_pos, launch)
                            stamp_lockstep(h, prev_pos, nrows, written, s0, s1, (s1 - s0) // WARP, lane, check_pos,
                                           launch)
                            start[0] = (s1 - s0) // WARP * WARP
                            load_group(cur, s0, s1, start[0], launch)
                    if leader:
                        for g in T.serial((s1 - s0 - start[0] + U - 1) // U):
                            load_group(nxt, s0, s1, start[0] + (g + 1) * U, launch)
                            all_ok[0] = 1
                            for u in T.unroll(U):
                                check_slot(ok, cur.slot[u], launch.buf.shape[0], launch.srcs, launch.params,
                                           num_sources)
                                ok_u[u] = ok[0]
                                all_ok[0] = all_ok[0] & ok[0]
                            if mode == STAMP:
                                if saved[0] == 0 and seed >= T.int64(0):
                                    holds[0] = 0
                                    for u in T.unroll(U):
                                        holds[0] = holds[0] | T.Cast("int32", cur.slot[u] == seed)
                                    if holds[0] != 0:
                                        save_seed(saved, r, seed, check_pos, launch)
                                if all_ok[0] != 0:
                                    stamp_all(h, hn, prev_pos, nrows, written, ok_u, cur, check_pos, launch)
                                else:
                                    stamp_guarded(h, hn, prev_pos, nrows, written, ok_u, cur, check_pos, launch)
                            else:
                                record_group(h, prev_pos, nrows, base, ok_u, cur, check_pos, launch)
                            copy_group(cur, nxt, U)
                        if mode == EMIT:
                            if saved[0] != 0:
                                clear_seed_save(r, launch)

        return walk

    @T.macro
    def fold_request(r, lane, width, launch, odd, warp_lane):
        """Fields 3 of the slots request r stamps := their real-KV folds; lane `lane` of `width` takes
        entries s0 + lane, s0 + lane + width, ..., U at a time: the head words of all U slots loaded
        first, then per slot its first batches (paired folds only: ``common.fold_sources``) and fold.
        Split (``split``): `lane` is a lane pair, whose lanes (``odd`` 0 and 1, ``warp_lane`` their lane
        in the warp) fold each slot together (``common.split_fold``) and the even lane stores it."""
        slot_u = T.alloc_buffer((U,), "int64", scope="local")
        ok_u = T.alloc_buffer((U,), "int32", scope="local")
        ok = T.alloc_buffer((1,), "int32", scope="local")
        if not split:  # split lanes fold without fronts (``common.split_fold``)
            front = T.alloc_buffer((U * FRONTS_PER_SLOT,), "int64", scope="local")
        acc = T.alloc_buffer((1,), "uint64", scope="local")
        part = T.alloc_buffer((1,), "uint64", scope="local")
        n = launch.ocl.shape[0]
        s0 = T.min(T.max(launch.offsets[r], T.int64(0)), n)
        s1 = T.min(T.max(launch.offsets[r + 1], s0), n)
        first = T.alloc_buffer((1,), "int64", scope="local")
        if launch.seeds[r] < launch.buf.shape[0]:
            # a loop on the group's first entry, not over a trip count: that count's 64-bit division
            # would sit between the offsets' load and the slots' on a short request's path
            first[0] = s0 + lane
            while first[0] < s1:
                for u in T.unroll(U):
                    i = first[0] + u * width
                    slot_u[u] = T.Select(i < s1, launch.ocl[T.min(i, s1 - 1)], T.int64(-1))
                for u in T.unroll(U):
                    check_slot(ok, slot_u[u], launch.buf.shape[0], launch.srcs, launch.params, num_sources)
                    ok_u[u] = ok[0]
                    if not split:
                        if ok[0] != 0:
                            load_heads(front, u * FRONTS_PER_SLOT, launch.srcs, launch.params, num_sources, slot_u[u])
                for u in T.unroll(U):
                    if ok_u[u] != 0:
                        if split:
                            fold_split(acc, part, slot_u[u], launch.srcs, launch.params, odd, warp_lane)
                        else:
                            if pairs:
                                load_batches(front, u * FRONTS_PER_SLOT, launch.srcs, launch.params, num_sources)
                            fold(acc, part, front, u * FRONTS_PER_SLOT, launch.srcs, launch.params, num_sources)
                        if stores_fold(odd):
                            launch.buf[slot_u[u], consts.CANARY_FIELD_REAL_KV_HASH] = T.reinterpret("int64", acc[0])
                first[0] = first[0] + width * U

    def pin(value):
        """``value`` itself; on CUDA kept where it is computed (``PIN``), on CPU the expression as is."""
        if geom.gpu:
            return T.cuda.func_call("canary_pin", value, source_code=PIN, return_type="int32")
        return value

    @T.macro
    def fold_lanes(fold_map, fold_lane, total, requests):
        """fold_map := the fold phase's lane mapping for ``requests`` requests over its ``total`` lanes:
        [FOLD_WIDTH] the lanes per request, ``max(1, total // requests)``; [FOLD_STRIDE] the request stride
        ``total // width``; [FOLD_FIRST] and [FOLD_RANK] lane ``fold_lane``'s first request
        ``fold_lane // width`` and its rank ``fold_lane % width``. (One array, not four locals: the
        committed tuning records are keyed by this TensorIR.)"""
        width = T.max(T.truncdiv(total, requests), 1)
        fold_map[FOLD_WIDTH] = pin(width)
        fold_map[FOLD_STRIDE] = pin(T.truncdiv(total, width))
        fold_map[FOLD_FIRST] = pin(T.truncdiv(fold_lane, width))
        fold_map[FOLD_RANK] = pin(T.truncmod(fold_lane, width))

    walk_stamp, walk_count, walk_emit = walk_macro(STAMP), walk_macro(COUNT), walk_macro(EMIT)

    @T.macro
    def check_request(all_valid, holds_seed, r, lane, width, launch):
        """all_valid[0] := 1 iff every slot of request r passes ``check_slot``; holds_seed[0] := 1 iff
        some entry's slot is the request's seed slot (seed >= 0). ``width`` lanes (a Python int: 32, a
        warp, on CUDA, whose lanes call it together with the same r; 1 on CPU) share the work: lane
        ``lane`` checks entries s0 + lane + width * k, CHECK_UNROLL loads in flight, and on CUDA the
        warp votes."""
        ok = T.alloc_buffer((1,), "int32", scope="local")
        mine = T.alloc_buffer((1,), "int32", scope="local")
        seen = T.alloc_buffer((1,), "int32", scope="local")
        slot_c = T.alloc_buffer((CHECK_UNROLL,), "int64", scope="local")
        n = launch.ocl.shape[0]
        s0 = T.min(T.max(launch.offsets[r], T.int64(0)), n)
        s1 = T.min(T.max(launch.offsets[r + 1], s0), n)
        seed = launch.seeds[r]
        mine[0] = 1
        seen[0] = 0
        for g in T.serial((s1 - s0 + width * CHECK_UNROLL - 1) // (width * CHECK_UNROLL)):
            for u in T.unroll(CHECK_UNROLL):
                slot_c[u] = launch.ocl[T.min(s0 + (g * CHECK_UNROLL + u) * width + lane, s1 - 1)]
            for u in T.unroll(CHECK_UNROLL):
                check_slot(ok, slot_c[u], launch.buf.shape[0], launch.srcs, launch.params, num_sources)
                past = s0 + (g * CHECK_UNROLL + u) * width + lane >= s1
                mine[0] = mine[0] & (ok[0] | T.Cast("int32", past))
                seen[0] = seen[0] | T.Cast("int32", slot_c[u] == seed and seed >= T.int64(0) and not past)
        if geom.gpu:
            all_valid[0] = T.cuda.warp_min(mine[0])
            holds_seed[0] = T.cuda.warp_max(seen[0])
        else:
            all_valid[0] = mine[0]
            holds_seed[0] = seen[0]

    @T.macro
    def add_written(counter, value, lane):
        """counter[0] += the block's written counts: warp sums, then one atomic per warp (CUDA)."""
        if geom.gpu:
            warp_total = T.cuda.warp_sum(value)
            if lane % 32 == 0 and warp_total != T.int64(0):
                add(counter, warp_total)
        else:
            add(counter, value)

    @T.macro
    def count_request(unit, t, active, st):
        """Emit phase A: request ``unit``'s violation rows, counted into shared."""
        unused = T.alloc_buffer((1,), "int64", scope="local")
        saved = T.alloc_buffer((1,), "int32", scope="local")
        st.nrows[0] = T.int64(0)
        if unit < active:
            walk_count(unit, T.int64(0), st.nrows, unused, saved, st.launch, T.int64(0), T.bool(True), None, None)
        st.scount[t] = st.nrows[0]

    @T.macro
    def emit_request(unit, rank, active, st):
        """Emit phase B: request ``unit``'s rows appended to the ring from ``rank`` on."""
        unused = T.alloc_buffer((1,), "int64", scope="local")
        saved = T.alloc_buffer((1,), "int32", scope="local")
        if unit < active:
            walk_emit(unit, rank, st.nrows, unused, saved, st.launch, T.int64(0), T.bool(True), None, None)

    mark, draw_ticket, emit, close = single_launch(geom, TH, count_request, emit_request,
                                                   lambda scount, q: scount[q])

    # fmt: off
    @T.prim_func(private=False)
    def canary_write(
        buf_h: T.handle, offsets_h: T.handle, seeds_h: T.handle,
        num_valid_reqs: T.Buffer((1,), "int32", align=INT32_ALIGN),
        ids_h: T.handle, pos_h: T.handle, ocl_h: T.handle, etoks_h: T.handle, epos_h: T.handle,
        cpa: T.Buffer((1,), "int32", align=INT32_ALIGN), ring_h: T.handle,
        write_index: T.Buffer((1,), "int32", align=INT32_ALIGN),
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
        cap1 = T.int64()
        N = T.int64()
        N2 = T.int64()
        R = T.int64()
        NF = T.int64()
        buf = T.match_buffer(buf_h, (S, F), "int64", align=INT64_ALIGN)
        offsets = T.match_buffer(offsets_h, (cap1,), "int64", align=INT64_ALIGN)
        seeds = T.match_buffer(seeds_h, (cap,), "int64", align=INT64_ALIGN)
        ids = T.match_buffer(ids_h, (N,), "int64", align=INT64_ALIGN)
        pos_in = T.match_buffer(pos_h, (N,), "int64", align=INT64_ALIGN)
        ocl = T.match_buffer(ocl_h, (N,), "int64", align=INT64_ALIGN)
        etoks = T.match_buffer(etoks_h, (N2,), "int64", align=INT64_ALIGN)
        epos = T.match_buffer(epos_h, (N2,), "int64", align=INT64_ALIGN)
        ring = T.match_buffer(ring_h, (R, consts.VIOLATION_FIELDS), "int64", align=INT64_ALIGN)
        flags = T.match_buffer(flags_h, (NF,), "int32", align=INT32_ALIGN)
        srcs = T.meta_var(source_buffers([src0_h, src1_h, src2_h, src3_h]))
        params = T.meta_var(
            source_params([(ps0, tw0, fw0), (ps1, tw1, fw1), (ps2, tw2, fw2), (ps3, tw3, fw3)], partial, fold_words))
        require_context("write", buf, flags, cap, cap, srcs, params, num_sources)
        require("write", cap1 == cap + 1, "offsets must have one entry more than seeds")
        if input_assert:
            require("write", N2 == N, "etoks and epos must have one entry per token (ids' length)")
        launch = T.meta_var(Launch(buf, offsets, seeds, ids, pos_in, ocl, etoks, epos, cpa, ring, flags, kind, srcs,
                                    params))

        # One launch. The stamp blocks (at most `blocks`, `block_lanes` working lanes each) give a lane
        # to each plan entry or request, whichever is more (N and cap are shapes, so a small plan gets a
        # small grid and the host never syncs). On CUDA in real-KV modes as many blocks again fold,
        # concurrently with the stamping; on CPU (serial) every lane folds, then stamps. meta_vars (the
        # expressions themselves): a bound variable would not reach the host's launch code.
        stamp_blocks, block_lanes = T.meta_var(work_grid(geom, T.max(N, cap)))
        nb = T.meta_var(stamp_blocks * (1 + FOLD_BLOCKS))
        fold_from = T.meta_var(stamp_blocks * min(FOLD_BLOCKS, 1))  # the first fold block (CPU: every block)
        for b in grid(geom, nb):
            sflag, scount, slast, last, base, marked, lane_marked, block_marked = T.meta_var(
                emit_scratch(TH, "scount", "int64"))
            r = T.alloc_buffer((1,), "int64", scope="local")
            nrows = T.alloc_buffer((1,), "int64", scope="local")
            written = T.alloc_buffer((1,), "int64", scope="local")
            all_valid = T.alloc_buffer((1,), "int32", scope="local")
            holds_seed = T.alloc_buffer((1,), "int32", scope="local")
            saved = T.alloc_buffer((1,), "int32", scope="local")
            if num_sources > 0:  # the fold phase's lane mapping (fold_lanes)
                fold_map = T.alloc_buffer((4,), "int32", scope="local")
            active = T.max(T.min(T.Cast("int64", num_valid_reqs[0]), cap), T.int64(0))
            tally = T.meta_var(Tally(kernel_counter))  # its slots are counted per warp (add_written)
            for t in lanes(geom, TH):
                total = T.Cast("int32", stamp_blocks * block_lanes)  # working lanes of each phase
                works = T.meta_var(T.Cast("int64", t) < block_lanes)
                # Phase 0 (real-KV modes): `width` lanes per request (as many as the grid affords, so a
                # few long requests fold in parallel) write field 3 of every slot it stamps. Fields 3
                # and 0-2 are disjoint and the chain reads only seed slots, so phase 1 need not wait.
                # The lanes are mapped first for the plan's capacity (a shape; active <= cap), which
                # depends on no load, and that is the mapping whenever the active count gives the same
                # width (a multiplication checks); only a launch whose active requests get more lanes
                # each maps them again. The width's division then runs while the active count loads
                # (sm_90: ptxas merges the request's and rank's divisions with the second mapping's, so
                # they still follow the load).
                # Split folds map lane pairs as the other folds map lanes (a pair's lanes are
                # neighbours in one warp: block_lanes is a multiple of 32).
                if num_sources > 0:
                    fold_lane = T.meta_var(T.Cast("int32", (T.Cast("int64", b) - fold_from) * block_lanes
                                                  + T.Cast("int64", t)))
                    fold_unit = T.meta_var(unit_of(fold_lane))
                    odd = T.meta_var(odd_of(fold_lane))
                    capacity = T.meta_var(T.Cast("int32", T.max(T.min(cap, T.Cast("int64", total)), T.int64(1))))
                    fold_lanes(fold_map, fold_unit, total, capacity)
                    if b >= fold_from and works:
                        if active * T.Cast("int64", fold_map[FOLD_WIDTH] + 1) <= T.Cast("int64", total):
                            fold_lanes(fold_map, fold_unit, total, T.max(T.Cast("int32", active), 1))
                        if fold_unit < fold_map[FOLD_STRIDE] * fold_map[FOLD_WIDTH]:
                            r[0] = T.Cast("int64", fold_map[FOLD_FIRST])
                            while r[0] < active:
                                fold_request(r[0], T.Cast("int64", fold_map[FOLD_RANK]),
                                             T.Cast("int64", fold_map[FOLD_WIDTH]), launch, odd, t)
                                r[0] = r[0] + T.Cast("int64", fold_map[FOLD_STRIDE])

                # Phase 1: each request's chain is stamped (fields 0-2; field 3 too in NONE mode) and
                # its chunk marked if it has violation rows (or a seed save). With fewer requests than warps, each
                # request gets a warp of its own, spreading the serial chains over the SMs'
                # schedulers: warp w of block b takes requests w * stamp_blocks + b + k * (lanes // 32),
                # so consecutive requests sit in different blocks whatever the block size (with a
                # warp index within the block, a 256-lane block would put 8 chains on one SM, two per
                # scheduler). Otherwise a request takes a lane: lane t of block b takes request
                # t * stamp_blocks + b when the requests fill at most half the lanes (a grid sized by
                # many tokens per request: the chains spread over every block, not the first few
                # blocks' SMs), else consecutive requests take consecutive lanes (their loads coalesce).
                lane = T.Cast("int32", T.Cast("int64", b) * block_lanes + T.Cast("int64", t))
                spread = T.meta_var(geom.gpu and active * 32 <= T.Cast("int64", total))
                # the request of a lane that is not spread (CUDA; the CPU's one lane takes every request)
                own = T.meta_var(T.Cast("int64", lane))
                interleaved = T.meta_var(T.Cast("int64", t) * stamp_blocks + T.Cast("int64", b))
                lane_request = T.meta_var(T.Select(active * 2 <= T.Cast("int64", total), interleaved, own)
                                          if geom.gpu else own)
                written[0] = T.int64(0)
                lane_marked[0] = 0
                # The request's slots are checked first (check_request: on CUDA by the warp of a
                # spread request, whose lanes then stamp its full batches in lockstep; on CPU by the
                # thread), so that all-valid requests take stamp_lockstep.
                warp_lane = T.meta_var(T.Cast("int64", T.truncmod(lane, WARP)))
                if b < stamp_blocks and works:
                    r[0] = T.Select(spread, T.Cast("int64", T.shift_right(t, 5)) * stamp_blocks + T.Cast("int64", b),
                                    lane_request)
                    while r[0] < active:
                        all_valid[0] = 0
                        holds_seed[0] = 0
                        if geom.gpu:
                            if spread:
                                check_request(all_valid, holds_seed, r[0], warp_lane, WARP, launch)
                        else:
                            check_request(all_valid, holds_seed, r[0], warp_lane, WARP, launch)
                        walk_stamp(r[0], T.int64(0), nrows, written, saved, launch, warp_lane,
                                   not spread or warp_lane == 0, all_valid[0] != 0, holds_seed[0] != 0)
                        # A request with a seed save is marked too: the emit phase clears the save.
                        if (not spread or warp_lane == 0) and (nrows[0] != T.int64(0) or saved[0] != 0):
                            mark(flags, lane_marked, r[0])
                        r[0] = r[0] + T.Cast("int64", T.Select(spread, T.shift_right(total, 5), total))
                add_written(slot_counter, written[0], t)
                # Phase 2: the ticket; one block emits if any request marked.
                draw_ticket(slast, flags, nb, b, t, lane_marked, block_marked, tally)
            sync()
            last[0] = slast[0]

            # Phase 3 (the emitting block only): the block's lanes append
            # the rows of the marked requests in request order, TH requests at a time.
            emit(last, flags, write_index, base, marked, sflag, scount, active, EmitState(nrows, scount, launch))
            for t in lanes(geom, TH):
                close(t, last, flags, write_index, base, tally)
    # fmt: on

    return canary_write
