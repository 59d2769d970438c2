"""Seeded random inputs for the differential and memory-safety fuzz tests: the generators live in
``tvm_canary.cases`` (shared with ``tvm-canary conformance`` and ``tvm-canary fuzz``)."""

from tvm_canary.cases import (
    CASES,
    context_for,
    plan_case,
    scatter_case,
    verify_case,
    write_case,
)

__all__ = ["CASES", "context_for", "plan_case", "scatter_case", "verify_case", "write_case"]
