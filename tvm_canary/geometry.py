"""Launch geometry of a kernel: plain data, importable without the TVM compiler.

Every kernel is written once with *grid* loops (blocks) and *lane* loops (threads of a block). A
``Geometry`` says how to bind them: to ``blockIdx.x`` / ``threadIdx.x`` on CUDA, or to serial loops of
extent 1 on CPU, where the same code then runs in reference order. The TensorIR helpers that apply a
geometry (``grid``, ``lanes``, ``blocks_for``, ``block_sync``) live in ``kernels/common.py``.
"""

from __future__ import annotations

import dataclasses

# Entries (verify) or requests (write) per mark of the ordered ring emission; a multiple of every
# verify and write ``threads`` (CUDA).
FLAG_CHUNK = 1024
# int32 words of ``flags`` per write request for its seed save (a marker, then the seed's chain hash
# and position as two words each): the rows of a request that writes its own seed slot are counted
# and appended from the seed as it stood before the launch (SPEC D7).
SEED_SAVE_WORDS = 5


def flag_words(units, seed_saves=0):
    """int32 words of ``flags`` a launch needs (Python ints or TensorIR expressions): the any-mark, a mark
    per FLAG_CHUNK ``units`` (verify's entries; write's requests, at least ``seed_saves``), the seed saves
    (write: one per request of its capacity) and, last, the ticket's arrivals."""
    return 2 + (units + FLAG_CHUNK - 1) // FLAG_CHUNK + SEED_SAVE_WORDS * seed_saves


def flags_suffice(words, units, seed_saves=0):
    """``words >= flag_words(units, seed_saves)``, written without its rounded-up division (for the
    kernels' host-side check: TVM would share that division with the kernel's own seed-save offsets
    and pass it to the kernel as one more argument, changing the generated code)."""
    return units <= FLAG_CHUNK * (words - 2 - SEED_SAVE_WORDS * seed_saves)


# Threads per SM (``threads * min_blocks``) up to which a geometry's real-KV folds run in pairs
# (``Geometry.fold_pairs``): 65536 registers / 512 = 128 per thread.
FOLD_PAIRS_MAX_THREADS = 512


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Fields:
    gpu: bind grid/lane loops to CUDA blocks/threads (else serial CPU loops, extents 1).
    blocks: blocks of the parallel phase (grid-stride; independent of the active count).
    threads: threads per block of the parallel phase (a multiple of 32 on CUDA).
    tile: threads of plan's single-block offsets phase; verify and write ignore it (their emit phase
        runs in the last block of their grid, with ``threads`` lanes).
    unroll: entries a thread keeps in flight per step (write chain pipeline).
    min_blocks: blocks of ``threads`` that must fit on one SM at once: CUDA
        ``__launch_bounds__(threads, min_blocks)``, which caps registers per thread (with 1, ptxas may
        use up to 128 at 512 threads); verify only. With ``threads`` it also decides whether folds may
        run in pairs (``fold_pairs``); write, whose launch bound has no minimum of blocks, keeps 1, so
        there ``threads`` alone decides (CUDA's per-block register cap).
    thin: 1 spreads a small launch thin (CUDA; verify and write): each block takes a warp of work
        items, or the fewest warps that let ``blocks`` blocks hold them all, so a few thousand items
        run on many SMs instead of crowding a few in full blocks (``kernels.common.work_grid``); 0
        gives each block ``threads`` items. A launch of at least ``blocks * threads`` items is the same
        either way.
    pairs: 1 lets real-KV folds (verify, write) advance two sources' chains in lockstep where the
        register cap allows it (``fold_pairs``); 0 folds the sources one after another; 2 (CUDA write and
        verify) folds a slot's two sources in two lanes, a chain each, where the specialization allows it
        (``kernels.common.splits_sources``; elsewhere as 1).
    """

    gpu: bool
    blocks: int = 1
    threads: int = 1
    tile: int = 1
    unroll: int = 1
    min_blocks: int = 1
    thin: int = 0
    pairs: int = 0

    def fold_pairs(self) -> bool:
        """Whether real-KV folds advance two sources' chains in lockstep (``kernels.common.fold_sources``):
        with ``pairs`` 1 (or 2, where a fold is not split) and a register cap of at least 128 per thread
        (CUDA's 64K registers per SM over ``threads * min_blocks`` threads; with one lane per block on CPU,
        always). The paired fold
        takes 215 registers on sm_90 uncapped (ptxas, two sources, verify); at a cap of 128 it spills 252
        bytes (on the H200 ALL verifies then ran 0.93-1.09x the uncapped build's time, thirteenth
        session); under a lower cap (a tuned geometry of many threads per SM) it would spill more, so
        there the sources fold one after another."""
        return bool(self.pairs) and self.threads * self.min_blocks <= FOLD_PAIRS_MAX_THREADS

    def key(self) -> str:
        """Names the geometry in module cache keys and tuning records (its format is part of both; a thin
        geometry adds ``-w1`` and a paired one ``-p1`` (``-p2``: split), so every key of a geometry
        without them is as before)."""
        kind = "cuda" if self.gpu else "cpu"
        thin = "-w1" if self.thin else ""
        pairs = f"-p{self.pairs}" if self.pairs else ""
        return f"{kind}-b{self.blocks}-t{self.threads}-k{self.tile}-u{self.unroll}-m{self.min_blocks}{thin}{pairs}"

