"""Constants and enums of the kv-canary contract (SPEC 1.1, 1.2): exactly upstream's public names.

The TensorIR kernels and the torch reference take their field and violation-row numbers from this
module. ``FailReason.INVALID_INDEX`` is tvm_canary's one addition (SPEC D4). Numbers derived from these
and the SplitMix64 hash on Python ints are tvm_canary's own and live in ``tvm_canary._consts``.
"""

import enum as _enum

CANARY_CHAIN_ANCHOR = 0xC0FFEE1234567890
REQ_POOL_IDX_PADDING = 0
TOKEN_TO_KV_SLOT_PADDING = 0

CANARY_FIELDS_PER_SLOT = 4
CANARY_FIELD_TOKEN = 0
CANARY_FIELD_POSITION = 1
CANARY_FIELD_PREV_HASH = 2
CANARY_FIELD_REAL_KV_HASH = 3

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


class FailReason(_enum.IntFlag):
    """Violation-row fail bits (SPEC 1.2); INVALID_INDEX is tvm_canary's addition (SPEC D4)."""

    VERIFY_CHAIN_HASH_MISMATCH = 1 << 0
    VERIFY_POSITION_MISMATCH = 1 << 1
    VERIFY_REAL_KV_HASH_MISMATCH = 1 << 2
    WRITE_TOKEN_MISMATCH = 1 << 3
    WRITE_POSITION_MISMATCH = 1 << 4
    VERIFY_TOKEN_MISMATCH = 1 << 5
    INVALID_INDEX = 1 << 6


class RealKvHashMode(_enum.IntEnum):
    NONE = 0
    PARTIAL = 1
    ALL = 2
