"""tvm_canary's own numbers beside the public ``consts`` (which keeps upstream's names only).

Derived layout sizes, the SplitMix64 multipliers, and the hash on Python ints (SPEC 1.3) that defines
the anchor hash. Everything here follows from SPEC 1.1-1.4; nothing is part of the public API.
"""

from __future__ import annotations

from .consts import CANARY_CHAIN_ANCHOR, CANARY_FIELDS_PER_SLOT

U64_MASK = (1 << 64) - 1

# Bytes of the canary fields at the start of every slot row (SPEC 2.1: four int64 words).
CANARY_SLOT_BYTES = CANARY_FIELDS_PER_SLOT * 8

# Bytes folded per source in PARTIAL mode (two 8-byte words, SPEC 1.4).
PARTIAL_READ_BYTES = 16

SPLITMIX64_MUL1 = 0xBF58476D1CE4E5B9
SPLITMIX64_MUL2 = 0x94D049BB133111EB


def to_signed_int64(x: int) -> int:
    """Two's-complement reinterpretation of a u64 as int64."""
    x &= U64_MASK
    return x - (1 << 64) if x >= (1 << 63) else x


def splitmix64(x: int) -> int:
    """SplitMix64 finalizer (no golden-ratio increment); returns a u64."""
    x &= U64_MASK
    x = ((x ^ (x >> 30)) * SPLITMIX64_MUL1) & U64_MASK
    x = ((x ^ (x >> 27)) * SPLITMIX64_MUL2) & U64_MASK
    return x ^ (x >> 31)


def splitmix64_mix3(a: int, b: int, c: int) -> int:
    """Ordered fold splitmix64(splitmix64(splitmix64(a) ^ b) ^ c); inputs taken mod 2^64."""
    h = splitmix64(a)
    h = splitmix64(h ^ (b & U64_MASK))
    return splitmix64(h ^ (c & U64_MASK))


# Chain hash of a slot with no predecessor (SPEC 1.3), as a u64.
ANCHOR_HASH = splitmix64(CANARY_CHAIN_ANCHOR)
