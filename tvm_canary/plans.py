"""Verify and write plans: device tensors filled by the plan kernels, read by verify/write.

docs/SPEC.md sections 2.4 and 2.5. A capacity not an int raises ``TypeError`` (SPEC D9, ``argtypes``) after the
contract's own "must be positive" check.
"""

from __future__ import annotations

import dataclasses

import torch

from .argtypes import RECORD, require_int64, require_positive


@dataclasses.dataclass(**RECORD)
class VerifyPlan:
    """Entries the verify kernel checks.

    Fields:
        verify_slot_indices: int64 ``[cap]``, canary slot of each entry (SWA-translated for SWA groups).
        verify_expected_tokens: int64 ``[cap]``, expected stored token, ``-1`` = do not check.
        verify_expected_positions: int64 ``[cap]``, expected stored position.
        verify_prev_slot_indices: int64 ``[cap]``, chain predecessor; negative = chain head (anchor),
            ``0`` = unknown (chain check skipped).
        verify_num_valid: int32 ``[1]``, active prefix length (clamped to ``[0, cap]``).
        enable: int32 ``[1]``, 0 skips the launch (plan overflow).
    """

    verify_slot_indices: torch.Tensor
    verify_expected_tokens: torch.Tensor
    verify_expected_positions: torch.Tensor
    verify_prev_slot_indices: torch.Tensor
    verify_num_valid: torch.Tensor
    enable: torch.Tensor

    @classmethod
    def allocate(cls, *, verify_capacity: int, device) -> "VerifyPlan":
        """Uninitialised vectors and ``verify_num_valid``; ``enable`` starts at 1."""
        verify_capacity = require_int64(require_positive(verify_capacity, "VerifyPlan verify_capacity"),
                                        "VerifyPlan verify_capacity")

        def vec():
            return torch.empty(verify_capacity, dtype=torch.int64, device=device)

        return cls(
            verify_slot_indices=vec(),
            verify_expected_tokens=vec(),
            verify_expected_positions=vec(),
            verify_prev_slot_indices=vec(),
            verify_num_valid=torch.empty(1, dtype=torch.int32, device=device),
            enable=torch.ones(1, dtype=torch.int32, device=device),
        )

    @staticmethod
    def allocation_bytes(verify_capacity: int) -> int:
        return 4 * verify_capacity * 8 + 2 * 4

    def zero_for_testing_(self) -> "VerifyPlan":
        """WARN: only for tests. Zero slots/positions/prev/num_valid, tokens -1, enable 0."""
        self.verify_slot_indices.zero_()
        self.verify_expected_tokens.fill_(-1)
        self.verify_expected_positions.zero_()
        self.verify_prev_slot_indices.zero_()
        self.verify_num_valid.zero_()
        self.enable.zero_()
        return self


@dataclasses.dataclass(**RECORD)
class WritePlan:
    """Request rows the write kernel stamps.

    Fields:
        write_offsets: int64 ``[cap + 1]``, exclusive prefix sum; request r owns flat token entries
            ``[off[r], off[r+1])``.
        write_seed_slot_indices: int64 ``[cap]``, canary slot just before request r's first token,
            negative = chain head (anchor).
        write_num_valid_reqs: int32 ``[1]``, request rows to process (clamped to ``[0, cap]``).
    """

    write_offsets: torch.Tensor
    write_seed_slot_indices: torch.Tensor
    write_num_valid_reqs: torch.Tensor

    @classmethod
    def allocate(cls, *, write_req_capacity: int, device) -> "WritePlan":
        """All tensors uninitialised."""
        write_req_capacity = require_positive(write_req_capacity, "WritePlan write_req_capacity")
        require_int64(write_req_capacity + 1, "WritePlan write_req_capacity + 1 (the offsets' length)")
        return cls(
            write_offsets=torch.empty(write_req_capacity + 1, dtype=torch.int64, device=device),
            write_seed_slot_indices=torch.empty(write_req_capacity, dtype=torch.int64, device=device),
            write_num_valid_reqs=torch.empty(1, dtype=torch.int32, device=device),
        )

    @staticmethod
    def allocation_bytes(write_req_capacity: int) -> int:
        return (2 * write_req_capacity + 1) * 8 + 4

    def zero_for_testing_(self) -> "WritePlan":
        """WARN: only for tests. Zero all three tensors."""
        self.write_offsets.zero_()
        self.write_seed_slot_indices.zero_()
        self.write_num_valid_reqs.zero_()
        return self


def plan_tensors(plan: VerifyPlan | WritePlan) -> tuple[torch.Tensor, ...]:
    """The plan's tensors in field order (the order the operators take them in)."""
    return tuple(getattr(plan, field.name) for field in dataclasses.fields(plan))
