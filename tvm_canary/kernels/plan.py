"""Plan kernel (SPEC 3.3 + D4, D6): fill a VerifyPlan and a WritePlan from the engine's tables.

Arguments (in order): verify plan ``slots/expected_tokens/expected_positions/prev_slots int64[vcap]``,
``num_valid int32[1]``, ``enable int32[1]``; write plan ``offsets int64[wcap+1]``, ``seeds
int64[wcap]``, ``num_valid_reqs int32[1]`` (all written); ``req_pool_indices/prefix_lens/
extend_seq_lens int64[bs]``, ``req_to_token int32[rows, L]``, ``lut int64[nl]``, ``pool int32[pr,
pc]``, ``valid_lens int64[>= bs]`` (read; lut/pool/valid_lens only in their specializations);
``scratch int64[bs+1]`` (verify offsets, written then read); ``window`` and ``token_offset`` ints.

Two phases in one function:
1. *offsets* (one block): per-row verify and write lengths, both exclusive prefix sums (each lane
   owns a contiguous run of rows), write offsets, seeds and the scalar outputs. Any ``bs <= wcap``.
2. *entries* (grid-stride over the verify total): each entry finds its row by binary search in the
   verify offsets and writes its (slot, expected token, position, predecessor) at its reference index.
"""

from __future__ import annotations

from tvm.script import tirx as T

from .common import Geometry, block_sync, grid, lanes


def make(has_lut: bool, has_pool: bool, geom: Geometry):
    """TensorIR for one specialization: SWA LUT present, expected-token pool present."""
    G, TH, TB = geom.blocks, geom.threads, geom.tile
    sync = block_sync(geom)

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
        active = T.int64(1) <= rp and rp < r2t.shape[0]
        p = prefix[r]
        ws = T.Select(window > T.int64(0), T.max(T.int64(0), p - window), T.int64(0))
        vlen[0] = T.Select(active, T.max(T.int64(0), T.min(p, r2t.shape[1]) - ws), T.int64(0))
        wlen[0] = T.Select(active and ext[r] > T.int64(0), ext[r], T.int64(0))

    # fmt: off
    @T.prim_func(private=False)
    def canary_plan(
        vslots_h: T.handle, vtoks_h: T.handle, vpos_h: T.handle, vprev_h: T.handle,
        v_num_valid: T.Buffer((1,), "int32"), v_enable: T.Buffer((1,), "int32"),
        woff_h: T.handle, wseeds_h: T.handle, w_num_valid_reqs: T.Buffer((1,), "int32"),
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
        vslots = T.match_buffer(vslots_h, (vcap,), "int64")
        vtoks = T.match_buffer(vtoks_h, (vcap,), "int64")
        vpos = T.match_buffer(vpos_h, (vcap,), "int64")
        vprev = T.match_buffer(vprev_h, (vcap,), "int64")
        woff = T.match_buffer(woff_h, (wcap1,), "int64")
        wseeds = T.match_buffer(wseeds_h, (wcap,), "int64")
        rpi = T.match_buffer(rpi_h, (bs,), "int64")
        prefix = T.match_buffer(prefix_h, (bs,), "int64")
        ext = T.match_buffer(ext_h, (bs,), "int64")
        r2t = T.match_buffer(r2t_h, (rows, L), "int32")
        lut = T.match_buffer(lut_h, (nl,), "int64")
        pool = T.match_buffer(pool_h, (pr, pc), "int32")
        vlens = T.match_buffer(vlens_h, (nv,), "int64")
        scratch = T.match_buffer(scratch_h, (bs1,), "int64")

        # Phase 1: one block computes both prefix sums; lane t owns rows [t * seg, (t + 1) * seg).
        for b in grid(geom, 1):
            sv = T.alloc_buffer((TB,), "int64", scope="shared")
            sw = T.alloc_buffer((TB,), "int64", scope="shared")
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
                sv[t] = accv[0]
                sw[t] = accw[0]
            sync()
            for t in lanes(geom, TB):
                vlen = T.alloc_buffer((1,), "int64", scope="local")
                wlen = T.alloc_buffer((1,), "int64", scope="local")
                runv = T.alloc_buffer((1,), "int64", scope="local")
                runw = T.alloc_buffer((1,), "int64", scope="local")
                totv = T.alloc_buffer((1,), "int64", scope="local")
                totw = T.alloc_buffer((1,), "int64", scope="local")
                seed = T.alloc_buffer((1,), "int64", scope="local")
                runv[0] = T.int64(0)
                runw[0] = T.int64(0)
                totv[0] = T.int64(0)
                totw[0] = T.int64(0)
                for q in T.serial(TB):
                    runv[0] = runv[0] + T.Select(q < t, sv[q], T.int64(0))
                    runw[0] = runw[0] + T.Select(q < t, sw[q], T.int64(0))
                    totv[0] = totv[0] + sv[q]
                    totw[0] = totw[0] + sw[q]
                for i in T.serial(T.max(T.int64(0), T.min(seg, bs - t * seg))):
                    r = t * seg + i
                    row_lengths(vlen, wlen, r, rpi, prefix, ext, r2t, window)
                    scratch[r] = runv[0]
                    woff[r] = runw[0]
                    runv[0] = runv[0] + vlen[0]
                    runw[0] = runw[0] + wlen[0]
                    rp = rpi[r]
                    p = prefix[r]
                    seed[0] = T.int64(-1)
                    if wlen[0] > T.int64(0) and p > T.int64(0):
                        translate(seed, T.Cast("int64", r2t[rp, T.min(p - 1, r2t.shape[1] - 1)]), lut)
                    wseeds[r] = seed[0]
                for i in T.serial((wcap1 - bs + TB - 1) // TB):
                    z = bs + i * TB + t
                    if z < wcap1:
                        woff[z] = T.int64(0)
                if t == 0:
                    scratch[bs] = totv[0]
                    woff[bs] = totw[0]
                    v_num_valid[0] = T.Cast("int32", T.min(totv[0], vcap))
                    v_enable[0] = T.Cast("int32", totv[0] <= vcap)
                    w_num_valid_reqs[0] = T.Cast("int32", bs)

        # Phase 2: every verify entry at its reference index (nothing when the plan overflows).
        for b in grid(geom, G):
            for t in lanes(geom, TH):
                total = scratch[bs]
                k = T.alloc_buffer((1,), "int64", scope="local")
                lo = T.alloc_buffer((1,), "int64", scope="local")
                hi = T.alloc_buffer((1,), "int64", scope="local")
                slot = T.alloc_buffer((1,), "int64", scope="local")
                prev = T.alloc_buffer((1,), "int64", scope="local")
                et = T.alloc_buffer((1,), "int64", scope="local")
                if total <= vcap:
                    k[0] = T.Cast("int64", b * TH + t)
                    while k[0] < total:
                        lo[0] = T.int64(0)
                        hi[0] = bs - 1
                        while lo[0] < hi[0]:
                            mid = (lo[0] + hi[0] + 1) // 2
                            if scratch[mid] <= k[0]:
                                lo[0] = mid
                            else:
                                hi[0] = mid - 1
                        r = lo[0]
                        rp = rpi[r]
                        p = prefix[r]
                        ws = T.Select(window > T.int64(0), T.max(T.int64(0), p - window), T.int64(0))
                        pos = ws + k[0] - scratch[r]
                        translate(slot, T.Cast("int64", r2t[rp, pos]), lut)
                        prev[0] = T.int64(-1)
                        if pos > T.int64(0):
                            translate(prev, T.Cast("int64", r2t[rp, pos - 1]), lut)
                        et[0] = T.int64(-1)
                        if has_pool:
                            q = pos + token_offset
                            if T.int64(0) <= q and q < vlens[r] and q < pool.shape[1] and rp < pool.shape[0]:
                                et[0] = T.Cast("int64", pool[rp, q])
                        vslots[k[0]] = slot[0]
                        vtoks[k[0]] = et[0]
                        vpos[k[0]] = pos
                        vprev[k[0]] = prev[0]
                        k[0] = k[0] + T.int64(G * TH)
    # fmt: on

    return canary_plan
