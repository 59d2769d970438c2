"""Scatter kernel (SPEC 3.4 + D4): copy each request's tokens into its row of the expected-token pool.

Arguments: ``flat_in int64[n]``, ``offsets int64[bs+1]``, ``req_pool_indices int64[bs]`` (read),
``pool_out int32[rows, width]`` (written: row ``req_pool_indices[r]``, columns ``[0, L_r)`` with
``L_r = min(offsets[r+1] - offsets[r], width)``; only elements whose source index lies in
``[0, n)``; rows outside ``[0, rows)`` are skipped). Blocks stride over requests, threads over columns,
so the work is proportional to the tokens copied, with no cap on bs.

Whatever the offsets hold, no int64 difference or sum wraps: a row is copied only when its start lies in
``[-width, n)`` (no other start has a column whose source is in ``[0, n)``), and ``L_r`` is formed from
comparisons first (``row_length``), so it is exact even for offsets at the ends of int64.
"""

from __future__ import annotations

from tvm.script import tirx as T

from .common import INT32_ALIGN, INT64_ALIGN, Geometry, grid, lanes, require


def row_length(start, end, width):
    """``min(end - start, width)``, at least 0, for a ``start`` in ``[-width, n)`` (both below 2^62 in
    size): ``end`` is first clamped to ``[-2^62, 2^62]``, which changes no result there and leaves
    ``end - start`` no room to wrap. Guarding ``end - start`` with ``end > start`` is not enough: NVRTC
    turns ``end > start ? end - start : 0`` into ``max(end - start, 0)`` (signed overflow is undefined
    in CUDA C), which wraps for ``end`` near -2^63 and gave a row longer than the pool's, and TVM's
    simplifier rewrites ``min(max(end, start), start + width) - start`` the same way."""
    near = T.min(T.max(end, T.int64(-(2**62))), T.int64(2**62))
    return T.min(T.max(near - start, T.int64(0)), width)


def make(geom: Geometry):
    """TensorIR of the scatter kernel (no specializations)."""
    G, TH = geom.blocks, geom.threads

    # fmt: off
    @T.prim_func(private=False)
    def canary_scatter(flat_h: T.handle, offsets_h: T.handle, rpi_h: T.handle, pool_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        n = T.int64()
        bs1 = T.int64()
        bs = T.int64()
        rows = T.int64()
        width = T.int64()
        flat = T.match_buffer(flat_h, (n,), "int64", align=INT64_ALIGN)
        offsets = T.match_buffer(offsets_h, (bs1,), "int64", align=INT64_ALIGN)
        rpi = T.match_buffer(rpi_h, (bs,), "int64", align=INT64_ALIGN)
        pool = T.match_buffer(pool_h, (rows, width), "int32", align=INT32_ALIGN)
        require("scatter", bs1 == bs + 1, "offsets must have one entry more than rpi")
        for b in grid(geom, G):
            for t in lanes(geom, TH):
                for it in T.serial((bs - b + G - 1) // G):
                    r = b + it * G
                    start = offsets[r]
                    rp = rpi[r]
                    if T.int64(0) <= rp and rp < rows and -width <= start and start < n:
                        length = row_length(start, offsets[r + 1], width)
                        for c in T.serial((length - t + TH - 1) // TH):
                            col = t + c * TH
                            src = start + col
                            if T.int64(0) <= src and src < n:
                                pool[rp, col] = T.Cast("int32", flat[src])
    # fmt: on

    return canary_scatter
