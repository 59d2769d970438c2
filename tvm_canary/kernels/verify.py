"""Verify kernel (SPEC 3.2 + D2-D4): check each active plan entry against the canary buffer.

Arguments (in order): canary ``int64[S, F]`` (the uint8 buffer viewed as int64, read only); plan
``slots/expected_tokens/expected_positions/prev_slots int64[cap]``, ``num_valid int32[1]``,
``enable int32[1]``; ``ring int64[R, 8]``, ``write_index int32[1]``, ``slot_counter int64[1]``,
``kernel_counter int64[1]`` (written); ``flags int32[>= 1 + ceil(cap / CHUNK)]`` (``[0]``: any mark; zero on entry, zero on
exit); ``kind`` (int); four source views ``int64[rows, row_words]`` and their
``(page_size, token_words, fold_words)`` scalars.

Two phases in one function:
1. *check* (grid-stride over entries, any geometry): computes each entry's fail bits and marks the
   CHUNK-sized chunk of every failing entry in ``flags``. Nothing else is written.
2. *emit* (one block): walks the marked chunks in order, recomputes their entries, appends the rows to
   the ring in entry order (SPEC D3), clears the flags and bumps the counters.
A clean launch therefore reads every entry once and writes only the counters.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..consts import FailReason
from .common import FLAG_CHUNK as CHUNK
from .common import INVALID_INDEX, Geometry, check_slot, fold_sources, slot_hash

CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
POSITION = int(FailReason.VERIFY_POSITION_MISMATCH)
REAL_KV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
TOKEN = int(FailReason.VERIFY_TOKEN_MISMATCH)


def make(num_sources: int, check_token: bool, geom: Geometry):
    """TensorIR for one specialization: folded source count (0 = NONE mode) and the token check."""
    G, TH, TB = geom.blocks, geom.threads, geom.tile
    sync = geom.sync
    assert CHUNK % TB == 0

    @T.macro
    def entry(k, bits, row, buf, slots, etoks, epos, prevs, kind, srcs, params, h, acc, part, ok):
        """bits[0], row[0:8] := verdict and violation row of entry k (bits 0: no row)."""
        heads = T.alloc_buffer((8,), "int64", scope="local")
        slot = slots[k]
        bits[0] = 0
        if slot != T.int64(0):
            et = etoks[k] if check_token else T.int64(-1)
            check_slot(ok, slot, buf.shape[0], srcs, params, num_sources)
            row[0] = kind
            row[1] = slot
            row[4] = et
            if ok[0] == 0:
                bits[0] = INVALID_INDEX
                row[2] = T.int64(0)
                row[3] = T.int64(0)
                row[5] = T.int64(0)
                row[6] = T.int64(0)
            else:
                st = buf[slot, 0]
                sp = buf[slot, 1]
                sh = buf[slot, 2]
                sr = buf[slot, 3]
                prev = prevs[k]
                row[2] = sp
                row[3] = st
                row[5] = sh
                row[6] = sh
                if prev != T.int64(0):
                    if prev >= buf.shape[0]:
                        bits[0] = bits[0] | INVALID_INDEX
                    else:
                        slot_hash(h, buf, prev)
                        row[6] = T.reinterpret("int64", h[0])
                        if sh != row[6]:
                            bits[0] = bits[0] | CHAIN
                if check_token:
                    if et != T.int64(-1) and st != et:
                        bits[0] = bits[0] | TOKEN
                if sp != epos[k]:
                    bits[0] = bits[0] | POSITION
                fold_sources(acc, part, heads, srcs, params, num_sources, slot)
                if sr != T.reinterpret("int64", acc[0]):
                    bits[0] = bits[0] | REAL_KV
        row[7] = T.Cast("int64", bits[0])

    # fmt: off
    @T.prim_func(private=False)
    def canary_verify(
        buf_h: T.handle, slots_h: T.handle, etoks_h: T.handle, epos_h: T.handle, prevs_h: T.handle,
        num_valid: T.Buffer((1,), "int32"), enable: T.Buffer((1,), "int32"),
        ring_h: T.handle, write_index: T.Buffer((1,), "int32"),
        slot_counter: T.Buffer((1,), "int64"), kernel_counter: T.Buffer((1,), "int64"),
        flags_h: T.handle, kind: T.int64,
        src0_h: T.handle, ps0: T.int64, tw0: T.int64, fw0: T.int64,
        src1_h: T.handle, ps1: T.int64, tw1: T.int64, fw1: T.int64,
        src2_h: T.handle, ps2: T.int64, tw2: T.int64, fw2: T.int64,
        src3_h: T.handle, ps3: T.int64, tw3: T.int64, fw3: T.int64,
    ):
        T.func_attr({"tirx.noalias": True})
        S = T.int64(); F = T.int64(); cap = T.int64(); R = T.int64(); NF = T.int64()
        buf = T.match_buffer(buf_h, (S, F), "int64")
        slots = T.match_buffer(slots_h, (cap,), "int64")
        etoks = T.match_buffer(etoks_h, (cap,), "int64")
        epos = T.match_buffer(epos_h, (cap,), "int64")
        prevs = T.match_buffer(prevs_h, (cap,), "int64")
        ring = T.match_buffer(ring_h, (R, 8), "int64")
        flags = T.match_buffer(flags_h, (NF,), "int32")
        r0 = T.int64(); c0 = T.int64(); s0 = T.int64(); o0 = T.int64()
        r1 = T.int64(); c1 = T.int64(); s1 = T.int64(); o1 = T.int64()
        r2 = T.int64(); c2 = T.int64(); s2 = T.int64(); o2 = T.int64()
        r3 = T.int64(); c3 = T.int64(); s3 = T.int64(); o3 = T.int64()
        src0 = T.match_buffer(src0_h, (r0, c0), "int64", strides=(s0, T.int64(1)), elem_offset=o0)
        src1 = T.match_buffer(src1_h, (r1, c1), "int64", strides=(s1, T.int64(1)), elem_offset=o1)
        src2 = T.match_buffer(src2_h, (r2, c2), "int64", strides=(s2, T.int64(1)), elem_offset=o2)
        src3 = T.match_buffer(src3_h, (r3, c3), "int64", strides=(s3, T.int64(1)), elem_offset=o3)
        srcs = T.meta_var([src0, src1, src2, src3])
        params = T.meta_var([(ps0, tw0, fw0), (ps1, tw1, fw1), (ps2, tw2, fw2), (ps3, tw3, fw3)])

        # Phase 1: check every active entry, mark the chunks that hold violations.
        for b in geom.grid(G):
            for t in geom.lanes(TH):
                active = T.max(T.min(T.Cast("int64", num_valid[0]), cap), T.int64(0))
                on = enable[0] != 0
                bits = T.alloc_buffer((1,), "int32", scope="local")
                row = T.alloc_buffer((8,), "int64", scope="local")
                h = T.alloc_buffer((1,), "uint64", scope="local")
                acc = T.alloc_buffer((1,), "uint64", scope="local")
                part = T.alloc_buffer((1,), "uint64", scope="local")
                ok = T.alloc_buffer((1,), "int32", scope="local")
                k = T.alloc_buffer((1,), "int64", scope="local")
                if on:
                    k[0] = T.Cast("int64", b * TH + t)
                    while k[0] < active:
                        entry(k[0], bits, row, buf, slots, etoks, epos, prevs, kind, srcs, params, h, acc, part, ok)
                        if bits[0] != 0:
                            flags[0] = 1
                            flags[1 + k[0] // CHUNK] = 1
                        k[0] = k[0] + T.int64(G * TH)

        # Phase 2: one block appends the rows of the marked chunks in entry order. Every lane keeps
        # the ring base in a register; branches around barriers are loops of uniform extent 0 or n.
        for b in geom.grid(1):
            active = T.max(T.min(T.Cast("int64", num_valid[0]), cap), T.int64(0))
            on = enable[0] != 0
            sflag = T.alloc_buffer((TB,), "int32", scope="shared")
            sbits = T.alloc_buffer((TB,), "int32", scope="shared")
            srow = T.alloc_buffer((TB, 8), "int64", scope="shared")
            base = T.alloc_buffer((1,), "int64", scope="local")
            marked = T.alloc_buffer((1,), "int32", scope="local")
            base[0] = T.Cast("int64", write_index[0])
            n_chunks = T.Select(on and flags[0] != 0, (active + CHUNK - 1) // CHUNK, T.int64(0))
            for c in T.serial((n_chunks + TB - 1) // TB):
                sync()
                for t in geom.lanes(TB):
                    ci = c * TB + t
                    sflag[t] = T.if_then_else(ci < n_chunks, flags[T.min(1 + ci, NF - 1)], 0)
                    if ci < n_chunks:
                        flags[1 + ci] = 0
                sync()
                for j in T.serial(TB):
                    marked[0] = sflag[j]
                    for tile in T.serial(T.Select(marked[0] != 0, CHUNK // TB, 0)):
                        for t in geom.lanes(TB):
                            bits = T.alloc_buffer((1,), "int32", scope="local")
                            row = T.alloc_buffer((8,), "int64", scope="local")
                            h = T.alloc_buffer((1,), "uint64", scope="local")
                            acc = T.alloc_buffer((1,), "uint64", scope="local")
                            part = T.alloc_buffer((1,), "uint64", scope="local")
                            ok = T.alloc_buffer((1,), "int32", scope="local")
                            kk = (c * TB + j) * CHUNK + tile * TB + t
                            bits[0] = 0
                            if kk < active:
                                entry(kk, bits, row, buf, slots, etoks, epos, prevs, kind, srcs, params, h, acc, part, ok)
                            sbits[t] = bits[0]
                            for f in T.serial(8):
                                srow[t, f] = row[f]
                        sync()
                        for t in geom.lanes(TB):
                            rank = T.alloc_buffer((1,), "int64", scope="local")
                            mine = T.alloc_buffer((1,), "int32", scope="local")
                            mine[0] = sbits[t]
                            rank[0] = base[0]
                            for q in T.serial(TB):
                                mark = T.Cast("int64", sbits[q] != 0)
                                base[0] = base[0] + mark
                                rank[0] = rank[0] + T.Select(q < t, mark, T.int64(0))
                            if mine[0] != 0 and rank[0] < R:
                                for f in T.serial(8):
                                    ring[rank[0], f] = srow[t, f]
                        sync()
            sync()
            for t in geom.lanes(TB):
                if t == 0:
                    flags[0] = 0
                    write_index[0] = T.Cast("int32", base[0])
                    kernel_counter[0] = kernel_counter[0] + T.int64(1)
                    if on:
                        slot_counter[0] = slot_counter[0] + active
    # fmt: on

    return canary_verify
