"""Plan kernel (SPEC 3.3 + D4, D6): fill a VerifyPlan and a WritePlan from the engine's tables.

Arguments (in order): verify plan ``slots/expected_tokens/expected_positions/prev_slots int64[vcap]``,
``num_valid int32[1]``, ``enable int32[1]``; write plan ``offsets int64[wcap+1]``, ``seeds
int64[wcap]``, ``num_valid_reqs int32[1]`` (all written); ``req_pool_indices/prefix_lens/
extend_seq_lens int64[bs]``, ``req_to_token int32[rows, L]``, ``lut int64[nl]``, ``pool int32[pr,
pc]``, ``valid_lens int64[bs]`` (read; lut/pool/valid_lens only in their specializations);
``scratch int64[bs+1]`` (verify offsets, written then read); ``window`` and ``token_offset`` ints.

Two launches:
1. *offsets* (one block of ``tile`` lanes): per-row verify and write lengths, both exclusive prefix
   sums (lane t owns a contiguous run of rows; the lanes' sums are scanned in log2(tile) barrier
   steps), the write offsets ``[0, bs]``, the verify offsets (``scratch``) and the scalar outputs.
2. *entries* (up to ``blocks`` x ``threads``): each block owns a contiguous range of the verify
   entries, walked ``threads`` entries per step, so every store is coalesced and consecutive entries
   of a row sit in neighbouring lanes. A thread finds the row of its first entry once (guessed by
   interpolation, then a galloping search over the offsets) and afterwards only compares each entry
   with the end of its current row: no per-entry search or division; the row's table offset is
   computed once per row. The same grid also writes the seeds and zeroes the write offsets past ``bs``.
Any ``bs <= wcap``.
"""

from __future__ import annotations

from tvm.script import tirx as T

from .. import consts
from .common import INT32_ALIGN, INT64_ALIGN, Geometry, block_sync, blocks_for, grid, lanes, require

# Fields of the entries phase's per-thread row state (a local int64 vector, see ``enter_row``).
ROW, ROW_START, ROW_END, ROW_REQ, ROW_BASE, ROW_TOKENS, ROW_POOL_END = range(7)
ROW_FIELDS = ROW_POOL_END + 1


def window_start(p, window):
    """First verified position of a row with prefix ``p``: ``max(0, p - window)`` for ``window > 0``,
    else 0 (so positions stay below ``min(p, L)``), formed as ``max(max(p, 0) - max(window, 1), 0)``,
    whose difference no int64 ``p`` and ``window`` make wrap (both operands in ``[0, 2^63)``). Guarding
    ``p - window`` with ``p > window`` is not enough: NVRTC turns ``p > window ? p - window : 0`` into
    ``max(p - window, 0)`` (signed overflow is undefined in CUDA C), which wraps for ``p`` near -2^63,
    and TVM's simplifier rewrites ``p - min(p, window)`` the same way."""
    clamped = T.max(T.max(p, T.int64(0)) - T.max(window, T.int64(1)), T.int64(0))
    return T.Select(window > T.int64(0), clamped, T.int64(0))


def make(has_lut: bool, has_pool: bool, geom: Geometry):
    """TensorIR for one specialization: SWA LUT present, expected-token pool present."""
    G, TH, TB = geom.blocks, geom.threads, geom.tile
    sync = block_sync(geom)
    scan_steps = (TB - 1).bit_length()  # ceil(log2(TB)) doubling steps of the lanes' scan
    scan_out = scan_steps % 2  # which half of the scan buffers holds the inclusive sums at the end
    step_entries = G * TH  # entries per step of the whole (largest) grid

    @T.macro
    def translate(out, x, lut):
        """out[0] := T(x): x itself when negative or without a LUT, else lut[min(x, nl - 1)]."""
        out[0] = x
        if has_lut:
            if x >= T.int64(0):
                out[0] = lut[T.min(x, lut.shape[0] - 1)]

    @T.macro
    def row_lengths(vlen, wlen, r, rpi, prefix, ext, r2t, window):
        """vlen/wlen := verify entries and written tokens of batch row r (0 for inactive rows)."""
        rp = rpi[r]
        active = T.int64(consts.REQ_POOL_IDX_PADDING + 1) <= rp and rp < r2t.shape[0]  # past the padding row
        p = prefix[r]
        vlen[0] = T.Select(active, T.max(T.int64(0), T.min(p, r2t.shape[1]) - window_start(p, window)), T.int64(0))
        wlen[0] = T.Select(active and ext[r] > T.int64(0), ext[r], T.int64(0))

    @T.macro
    def seek(row, k, guess, scratch, bs):
        """row[ROW], row[ROW_START], row[ROW_END] := r, scratch[r], scratch[r + 1] for the row r holding
        entry k: the last r < bs with scratch[r] <= k. Needs 0 <= k < scratch[bs] and 0 <= guess < bs;
        scratch is non-decreasing with scratch[0] = 0. Gallops from the guess, then bisects (one or two
        reads when the guess is the row or the one before it); every index read is in [0, bs]."""
        lo = T.alloc_buffer((2,), "int64", scope="local")  # index, value: scratch[lo] <= k
        hi = T.alloc_buffer((2,), "int64", scope="local")  # index, value: scratch[hi] > k
        d = T.alloc_buffer((1,), "int64", scope="local")
        g = T.alloc_buffer((1,), "int64", scope="local")
        d[0] = T.int64(1)
        g[0] = guess
        if scratch[g[0]] <= k:
            lo[0] = g[0]
            lo[1] = scratch[g[0]]
            hi[0] = g[0] + T.int64(1)
            hi[1] = scratch[hi[0]]
            while hi[1] <= k:
                lo[0] = hi[0]
                lo[1] = hi[1]
                d[0] = d[0] * T.int64(2)
                hi[0] = T.min(lo[0] + d[0], bs)
                hi[1] = scratch[hi[0]]
        else:
            hi[0] = g[0]
            hi[1] = scratch[g[0]]
            lo[0] = T.max(g[0] - T.int64(1), T.int64(0))
            lo[1] = scratch[lo[0]]
            while lo[1] > k:
                hi[0] = lo[0]
                hi[1] = lo[1]
                d[0] = d[0] * T.int64(2)
                lo[0] = T.max(hi[0] - d[0], T.int64(0))
                lo[1] = scratch[lo[0]]
        while hi[0] - lo[0] > T.int64(1):
            mid = lo[0] + T.shift_right(hi[0] - lo[0], T.int64(1))
            if scratch[mid] <= k:
                lo[0] = mid
                lo[1] = scratch[mid]
            else:
                hi[0] = mid
                hi[1] = scratch[mid]
        row[ROW] = lo[0]
        row[ROW_START] = lo[1]
        row[ROW_END] = hi[1]

    @T.macro
    def enter_row(row, k, guess, scratch, bs, rpi, prefix, window, L, vlens, pool):
        """row := the entries phase's state for the row holding entry k (found by ``seek`` from
        ``guess``): ``row[ROW_END]`` its end; pos = k + row[ROW_BASE]; req_to_token index (flat) =
        k + row[ROW_TOKENS]; a pool hit iff 0 <= pos + token_offset < row[ROW_POOL_END]."""
        seek(row, k, guess, scratch, bs)
        row[ROW_REQ] = rpi[row[ROW]]
        row[ROW_BASE] = window_start(prefix[row[ROW]], window) - row[ROW_START]
        row[ROW_TOKENS] = row[ROW_REQ] * L + row[ROW_BASE]
        if has_pool:
            pool_end = T.min(vlens[row[ROW]], pool.shape[1])
            row[ROW_POOL_END] = T.Select(row[ROW_REQ] < pool.shape[0], pool_end, T.int64(0))

    # fmt: off
    @T.prim_func(private=False)
    def canary_plan(
        vslots_h: T.handle, vtoks_h: T.handle, vpos_h: T.handle, vprev_h: T.handle,
        v_num_valid: T.Buffer((1,), "int32", align=INT32_ALIGN), v_enable: T.Buffer((1,), "int32", align=INT32_ALIGN),
        woff_h: T.handle, wseeds_h: T.handle, w_num_valid_reqs: T.Buffer((1,), "int32", align=INT32_ALIGN),
        rpi_h: T.handle, prefix_h: T.handle, ext_h: T.handle, r2t_h: T.handle, lut_h: T.handle,
        pool_h: T.handle, vlens_h: T.handle, scratch_h: T.handle, window: T.int64, token_offset: T.int64,
    ):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        vcap = T.int64()
        wcap = T.int64()
        wcap1 = T.int64()
        bs = T.int64()
        bs1 = T.int64()
        rows = T.int64()
        L = T.int64()
        nl = T.int64()
        pr = T.int64()
        pc = T.int64()
        nv = T.int64()
        vslots = T.match_buffer(vslots_h, (vcap,), "int64", align=INT64_ALIGN)
        vtoks = T.match_buffer(vtoks_h, (vcap,), "int64", align=INT64_ALIGN)
        vpos = T.match_buffer(vpos_h, (vcap,), "int64", align=INT64_ALIGN)
        vprev = T.match_buffer(vprev_h, (vcap,), "int64", align=INT64_ALIGN)
        woff = T.match_buffer(woff_h, (wcap1,), "int64", align=INT64_ALIGN)
        wseeds = T.match_buffer(wseeds_h, (wcap,), "int64", align=INT64_ALIGN)
        rpi = T.match_buffer(rpi_h, (bs,), "int64", align=INT64_ALIGN)
        prefix = T.match_buffer(prefix_h, (bs,), "int64", align=INT64_ALIGN)
        ext = T.match_buffer(ext_h, (bs,), "int64", align=INT64_ALIGN)
        r2t = T.match_buffer(r2t_h, (rows, L), "int32", align=INT32_ALIGN)
        lut = T.match_buffer(lut_h, (nl,), "int64", align=INT64_ALIGN)
        pool = T.match_buffer(pool_h, (pr, pc), "int32", align=INT32_ALIGN)
        vlens = T.match_buffer(vlens_h, (nv,), "int64", align=INT64_ALIGN)
        scratch = T.match_buffer(scratch_h, (bs1,), "int64", align=INT64_ALIGN)
        require("plan", wcap1 == wcap + 1, "woff must have one entry more than wseeds")
        require("plan", bs <= wcap, "the batch (rpi's length) must not exceed the write capacity (wseeds' length)")
        require("plan", bs1 == bs + 1, "scratch must have one entry more than rpi")
        if has_lut:
            require("plan", nl >= 1, "lut must not be empty")
        if has_pool:
            require("plan", nv == bs, "vlens must have one entry per request (rpi's length)")
        # req_to_token as one vector: entries index it by (row offset + entry index), one add each.
        tokens = T.decl_buffer((rows * L,), "int32", data=r2t.data)

        # Launch 1: one block, both prefix sums; lane t owns rows [t * seg, (t + 1) * seg).
        for b in grid(geom, 1):
            # [half, lane]: the doubling scan reads one half and writes the other (one barrier a step).
            sv = T.alloc_buffer((2, TB), "int64", scope="shared")
            sw = T.alloc_buffer((2, TB), "int64", scope="shared")
            seg = (bs + TB - 1) // TB
            for t in lanes(geom, TB):
                vlen = T.alloc_buffer((1,), "int64", scope="local")
                wlen = T.alloc_buffer((1,), "int64", scope="local")
                accv = T.alloc_buffer((1,), "int64", scope="local")
                accw = T.alloc_buffer((1,), "int64", scope="local")
                accv[0] = T.int64(0)
                accw[0] = T.int64(0)
                for i in T.serial(T.max(T.int64(0), T.min(seg, bs - t * seg))):
                    row_lengths(vlen, wlen, t * seg + i, rpi, prefix, ext, r2t, window)
                    accv[0] = accv[0] + vlen[0]
                    accw[0] = accw[0] + wlen[0]
                sv[0, t] = accv[0]
                sw[0, t] = accw[0]
            for s in T.serial(scan_steps):
                sync()
                for t in lanes(geom, TB):
                    src = s % 2
                    d = T.shift_left(1, s)
                    sv[1 - src, t] = sv[src, t] + T.Select(t >= d, sv[src, T.max(t - d, 0)], T.int64(0))
                    sw[1 - src, t] = sw[src, t] + T.Select(t >= d, sw[src, T.max(t - d, 0)], T.int64(0))
            sync()
            for t in lanes(geom, TB):
                vlen = T.alloc_buffer((1,), "int64", scope="local")
                wlen = T.alloc_buffer((1,), "int64", scope="local")
                runv = T.alloc_buffer((1,), "int64", scope="local")
                runw = T.alloc_buffer((1,), "int64", scope="local")
                runv[0] = T.Select(t > 0, sv[scan_out, T.max(t - 1, 0)], T.int64(0))
                runw[0] = T.Select(t > 0, sw[scan_out, T.max(t - 1, 0)], T.int64(0))
                for i in T.serial(T.max(T.int64(0), T.min(seg, bs - t * seg))):
                    r = t * seg + i
                    row_lengths(vlen, wlen, r, rpi, prefix, ext, r2t, window)
                    scratch[r] = runv[0]
                    woff[r] = runw[0]
                    runv[0] = runv[0] + vlen[0]
                    runw[0] = runw[0] + wlen[0]
                if t == 0:
                    totv = sv[scan_out, TB - 1]
                    scratch[bs] = totv
                    woff[bs] = sw[scan_out, TB - 1]
                    v_num_valid[0] = T.Cast("int32", T.min(totv, vcap))
                    v_enable[0] = T.Cast("int32", totv <= vcap)
                    w_num_valid_reqs[0] = T.Cast("int32", bs)

        # Launch 2: seeds, the zero tail of the write offsets, and every verify entry at its reference
        # index (no entries when the plan overflows). Blocks: enough for one entry per thread, at most
        # G (a shape expression: no host sync; a meta_var so that it reaches the host's launch code).
        nb = T.meta_var(blocks_for(geom, T.max(vcap, wcap1)))
        for b in grid(geom, nb):
            for t in lanes(geom, TH):
                z = T.alloc_buffer((1,), "int64", scope="local")
                vlen = T.alloc_buffer((1,), "int64", scope="local")
                wlen = T.alloc_buffer((1,), "int64", scope="local")
                seed = T.alloc_buffer((1,), "int64", scope="local")
                row = T.alloc_buffer((ROW_FIELDS,), "int64", scope="local")
                k = T.alloc_buffer((1,), "int64", scope="local")
                end = T.alloc_buffer((1,), "int64", scope="local")
                slot = T.alloc_buffer((1,), "int64", scope="local")
                prev = T.alloc_buffer((1,), "int64", scope="local")
                et = T.alloc_buffer((1,), "int64", scope="local")
                z[0] = T.Cast("int64", b * TH + t)
                while z[0] < bs:
                    row_lengths(vlen, wlen, z[0], rpi, prefix, ext, r2t, window)
                    p = prefix[z[0]]
                    seed[0] = T.int64(-1)
                    if wlen[0] > T.int64(0) and p > T.int64(0) and r2t.shape[1] > T.int64(0):
                        translate(seed, T.Cast("int64", r2t[rpi[z[0]], T.min(p - 1, r2t.shape[1] - 1)]), lut)
                    wseeds[z[0]] = seed[0]
                    z[0] = z[0] + nb * TH
                z[0] = bs + T.int64(1) + T.Cast("int64", b * TH + t)
                while z[0] < wcap1:
                    woff[z[0]] = T.int64(0)
                    z[0] = z[0] + nb * TH

                total = scratch[bs]
                if total <= vcap:
                    # Entries [b * steps * TH, (b + 1) * steps * TH) of this block, TH per step; with
                    # steps = ceil(total / (G * TH)), nb blocks cover total (nb = G, or nb * TH >= vcap).
                    steps = (total + step_entries - 1) // step_entries
                    k[0] = (T.Cast("int64", b) * steps) * TH + T.Cast("int64", t)
                    end[0] = T.min(total, (T.Cast("int64", b) + T.int64(1)) * steps * TH)
                    if k[0] < end[0]:
                        # The first entry's row: guessed where rows of equal length would put it.
                        at = T.Cast("float64", k[0]) * T.Cast("float64", bs) / T.Cast("float64", total)
                        guess = T.min(T.max(T.Cast("int64", at), T.int64(0)), bs - T.int64(1))
                        enter_row(row, k[0], guess, scratch, bs, rpi, prefix, window, L, vlens, pool)
                    while k[0] < end[0]:
                        if k[0] >= row[ROW_END]:
                            nxt = row[ROW] + T.int64(1)
                            enter_row(row, k[0], nxt, scratch, bs, rpi, prefix, window, L, vlens, pool)
                        pos = k[0] + row[ROW_BASE]
                        translate(slot, T.Cast("int64", tokens[row[ROW_TOKENS] + k[0]]), lut)
                        prev[0] = T.int64(-1)
                        if pos > T.int64(0):
                            translate(prev, T.Cast("int64", tokens[row[ROW_TOKENS] + k[0] - T.int64(1)]), lut)
                        et[0] = T.int64(-1)
                        if has_pool:
                            q = pos + token_offset
                            if T.int64(0) <= q and q < row[ROW_POOL_END]:
                                et[0] = T.Cast("int64", pool[row[ROW_REQ], q])
                        vslots[k[0]] = slot[0]
                        vtoks[k[0]] = et[0]
                        vpos[k[0]] = pos
                        vprev[k[0]] = prev[0]
                        k[0] = k[0] + T.int64(TH)
    # fmt: on

    return canary_plan
