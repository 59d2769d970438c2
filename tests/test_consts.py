"""The public ``tvm_canary.consts`` holds exactly upstream's names (SPEC 1.1, 1.2) and the contract's enum
values; its one addition is the fail bit ``FailReason.INVALID_INDEX`` (SPEC D4)."""

from __future__ import annotations

import inspect

from tvm_canary import consts

# SPEC 1.1: the integer constants of upstream's consts module (kept in sync with its consts.cuh).
UPSTREAM_INTEGERS = {
    "CANARY_CHAIN_ANCHOR": 0xC0FFEE1234567890,
    "REQ_POOL_IDX_PADDING": 0,
    "TOKEN_TO_KV_SLOT_PADDING": 0,
    "CANARY_FIELDS_PER_SLOT": 4,
    "CANARY_FIELD_TOKEN": 0,
    "CANARY_FIELD_POSITION": 1,
    "CANARY_FIELD_PREV_HASH": 2,
    "CANARY_FIELD_REAL_KV_HASH": 3,
    "VIOLATION_FIELDS": 8,
    "VIOLATION_FIELD_KERNEL_KIND": 0,
    "VIOLATION_FIELD_SLOT_IDX": 1,
    "VIOLATION_FIELD_POSITION": 2,
    "VIOLATION_FIELD_STORED_TOKEN": 3,
    "VIOLATION_FIELD_EXPECTED_TOKEN": 4,
    "VIOLATION_FIELD_STORED_CHAIN_HASH": 5,
    "VIOLATION_FIELD_EXPECTED_AUX": 6,
    "VIOLATION_FIELD_FAIL_REASON_BITS": 7,
    "MAX_REAL_KV_SOURCES": 4,
    "REAL_KV_SOURCE_FIELDS_PER_ENTRY": 3,
    "REAL_KV_SOURCE_FIELD_PAGE_SIZE": 0,
    "REAL_KV_SOURCE_FIELD_NUM_BYTES_PER_TOKEN": 1,
    "REAL_KV_SOURCE_FIELD_READ_BYTES": 2,
}
# SPEC 1.2: upstream's enums in consts (CanaryLaunchTag lives with the context, as upstream's in verify.py).
UPSTREAM_ENUMS = {"FailReason", "RealKvHashMode"}
UPSTREAM_FAIL_BITS = {
    "VERIFY_CHAIN_HASH_MISMATCH": 1,
    "VERIFY_POSITION_MISMATCH": 2,
    "VERIFY_REAL_KV_HASH_MISMATCH": 4,
    "WRITE_TOKEN_MISMATCH": 8,
    "WRITE_POSITION_MISMATCH": 16,
    "VERIFY_TOKEN_MISMATCH": 32,
}


def public_names(module) -> set[str]:
    return {name for name, value in vars(module).items() if not name.startswith("_") and not inspect.ismodule(value)}


def test_public_names_are_upstreams():
    assert public_names(consts) == set(UPSTREAM_INTEGERS) | UPSTREAM_ENUMS


def test_integer_values():
    assert {name: getattr(consts, name) for name in UPSTREAM_INTEGERS} == UPSTREAM_INTEGERS


def test_fail_reason_is_upstreams_plus_invalid_index():
    assert {m.name: int(m) for m in consts.FailReason} == {**UPSTREAM_FAIL_BITS, "INVALID_INDEX": 1 << 6}


def test_real_kv_hash_mode():
    assert {m.name: int(m) for m in consts.RealKvHashMode} == {"NONE": 0, "PARTIAL": 1, "ALL": 2}
