"""Constants, enums and the splitmix64 hash on Python ints (SPEC section 1).

This module is the single source of truth: the TensorIR kernels and the torch reference import
their numbers from here.
"""

from __future__ import annotations

import enum

U64_MASK = (1 << 64) - 1

CANARY_CHAIN_ANCHOR = 0xC0FFEE1234567890
REQ_POOL_IDX_PADDING = 0
TOKEN_TO_KV_SLOT_PADDING = 0

CANARY_FIELDS_PER_SLOT = 4
CANARY_FIELD_TOKEN = 0
CANARY_FIELD_POSITION = 1
CANARY_FIELD_PREV_HASH = 2
CANARY_FIELD_REAL_KV_HASH = 3
CANARY_SLOT_BYTES = CANARY_FIELDS_PER_SLOT * 8

VIOLATION_FIELDS = 8
VIOLATION_FIELD_KERNEL_KIND = 0
VIOLATION_FIELD_SLOT_IDX = 1
VIOLATION_FIELD_POSITION = 2
VIOLATION_FIELD_STORED_TOKEN = 3
VIOLATION_FIELD_EXPECTED_TOKEN = 4
VIOLATION_FIELD_STORED_CHAIN_HASH = 5
VIOLATION_FIELD_EXPECTED_AUX = 6
VIOLATION_FIELD_FAIL_REASON_BITS = 7

MAX_REAL_KV_SOURCES = 4
REAL_KV_SOURCE_FIELDS_PER_ENTRY = 3
REAL_KV_SOURCE_FIELD_PAGE_SIZE = 0
REAL_KV_SOURCE_FIELD_NUM_BYTES_PER_TOKEN = 1
REAL_KV_SOURCE_FIELD_READ_BYTES = 2

# Bytes folded per source in PARTIAL mode (two 8-byte words).
PARTIAL_READ_BYTES = 16

SPLITMIX64_MUL1 = 0xBF58476D1CE4E5B9
SPLITMIX64_MUL2 = 0x94D049BB133111EB


class FailReason(enum.IntFlag):
    """Violation-row fail bits (SPEC 1.2); INVALID_INDEX is tvm_canary's addition (SPEC D4)."""

    VERIFY_CHAIN_HASH_MISMATCH = 1 << 0
    VERIFY_POSITION_MISMATCH = 1 << 1
    VERIFY_REAL_KV_HASH_MISMATCH = 1 << 2
    WRITE_TOKEN_MISMATCH = 1 << 3
    WRITE_POSITION_MISMATCH = 1 << 4
    VERIFY_TOKEN_MISMATCH = 1 << 5
    INVALID_INDEX = 1 << 6


class RealKvHashMode(enum.IntEnum):
    NONE = 0
    PARTIAL = 1
    ALL = 2


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


ANCHOR_HASH = splitmix64(CANARY_CHAIN_ANCHOR)
