"""Decoding the violation ring into typed records and the report text of SPEC 6 item 8.

``ViolationLog`` owns the ring ``int64[capacity, 8]`` and its ``int32[1]`` write index (SPEC 2.2) and reads each row
once, through non-blocking copies (``read_new()``).
"""

from __future__ import annotations

import collections
import dataclasses

import torch

from . import _consts, consts
from .argtypes import require_positive
from .consts import FailReason
from .context import CanaryLaunchTag

_WRITE_BITS = FailReason.WRITE_TOKEN_MISMATCH | FailReason.WRITE_POSITION_MISMATCH
_TOKEN_BITS = FailReason.WRITE_TOKEN_MISMATCH | FailReason.VERIFY_TOKEN_MISMATCH
_SWEEP_TAGS = frozenset(t for t in CanaryLaunchTag if t.name.startswith("SWEEP_"))


def reason_label(bit: FailReason) -> str:
    """``VERIFY_CHAIN_HASH_MISMATCH`` -> ``verify_chain_hash``; ``INVALID_INDEX`` -> ``invalid_index``."""
    return bit.name.lower().removesuffix("_mismatch")


def _hex(value: int) -> str:
    return f"{value & _consts.U64_MASK:#018x}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One ring row (SPEC 2.2), fields named.

    ``kind`` is the raw kernel_kind column; ``tag`` its ``CanaryLaunchTag`` (None if unknown). For verify rows
    ``position`` is the stored position and ``expected_aux`` the expected chain hash; for write rows (``is_write``)
    ``stored_token``/``position`` are the written values, ``stored_chain_hash`` the running hash and ``expected_aux``
    the expected position.
    """

    kind: int
    reasons: FailReason
    slot: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain_hash: int
    expected_aux: int

    @classmethod
    def from_row(cls, row: list[int]) -> "Violation":
        return cls(
            kind=row[consts.VIOLATION_FIELD_KERNEL_KIND],
            reasons=FailReason(row[consts.VIOLATION_FIELD_FAIL_REASON_BITS]),
            slot=row[consts.VIOLATION_FIELD_SLOT_IDX],
            position=row[consts.VIOLATION_FIELD_POSITION],
            stored_token=row[consts.VIOLATION_FIELD_STORED_TOKEN],
            expected_token=row[consts.VIOLATION_FIELD_EXPECTED_TOKEN],
            stored_chain_hash=row[consts.VIOLATION_FIELD_STORED_CHAIN_HASH],
            expected_aux=row[consts.VIOLATION_FIELD_EXPECTED_AUX],
        )

    @property
    def tag(self) -> CanaryLaunchTag | None:
        return CanaryLaunchTag(self.kind) if self.kind in CanaryLaunchTag._value2member_map_ else None

    @property
    def tag_name(self) -> str:
        """The launch tag's name, or ``unknown(<kind>)``."""
        return self.tag.name if self.tag is not None else f"unknown({self.kind})"

    @property
    def reason_names(self) -> tuple[str, ...]:
        """Labels of the set fail bits in bit order, e.g. ``("verify_chain_hash", "verify_position")``."""
        return tuple(reason_label(bit) for bit in FailReason if bit in self.reasons)

    @property
    def is_write(self) -> bool:
        return bool(self.reasons & _WRITE_BITS)

    def line(self) -> str:
        """The stable one-line summary (SPEC 6 item 8)."""
        return (
            f"kv_canary violation: launch_tag={self.tag_name} fail_reason={'+'.join(self.reason_names) or 'none'} "
            f"slot_idx={self.slot} position={self.position} stored_token={self.stored_token} "
            f"expected_token={self.expected_token} stored_chain_hash={_hex(self.stored_chain_hash)} "
            f"expected_aux={_hex(self.expected_aux)}"
        )

    def message(self, *, total: int, ring_overflow: bool, step: int) -> str:
        """The one-line summary followed by the readable block of the original engine's reporter."""
        if self.tag is None:
            canary_kind = self.tag_name
        elif self.tag in _SWEEP_TAGS:
            canary_kind = self.tag.name.lower()
        else:
            canary_kind = f"per_forward_{self.tag.name.lower()}"
        actual = f"token_id={self.stored_token}   position={self.position} prev_hash={_hex(self.stored_chain_hash)}"
        if self.reasons == FailReason.INVALID_INDEX:  # a write's or a verify's: the row cannot say which
            body = ["  invalid_index: the slot, its predecessor or the request's seed slot is outside the canary "
                    "buffer or a real-KV source (SPEC D4); the fields are those of the line above"]
        elif self.is_write:
            expected = f"token_id={self.expected_token}   position={self.expected_aux}"
            body = [f"  actual:   {actual}", f"  expected: {expected}"]
        else:
            token = f"token_id={self.expected_token} " if self.reasons & _TOKEN_BITS else ""
            body = [f"  stored:   {actual}", f"  expected: {token}prev_hash={_hex(self.expected_aux)}"]
        return "\n".join([
            self.line(),
            f"KV cache canary violation detected (kernel_kind={self.tag_name}, slot_idx={self.slot}, "
            f"position={self.position})",
            f"canary_kind:       {canary_kind}",
            f"  fail_reasons: {' '.join(self.reason_names) or 'none'}",
            *body,
            f"  total_violations={total} ring_overflow={ring_overflow} step_when_pumped={step}",
        ])


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ViolationReport:
    """What one ``read_new()`` found.

    Fields:
        records: ring rows stored since the previous read, in ring order.
        total: violations counted since the ring was allocated (the write index, unwrapped past 2^31 - 1).
        dropped: violations counted since the previous read that did not fit in the ring.
        ring_capacity: rows the ring holds.
    """

    records: tuple[Violation, ...]
    total: int
    dropped: int
    ring_capacity: int

    def __bool__(self) -> bool:
        return bool(self.records) or self.dropped > 0

    def messages(self, step: int) -> list[str]:
        """One message per record, then the overflow note if violations were dropped."""
        overflow = self.total > self.ring_capacity
        out = [v.message(total=self.total, ring_overflow=overflow, step=step) for v in self.records]
        if self.dropped:
            out.append(
                f"kv_canary: {self.dropped} more violations were dropped (ring capacity {self.ring_capacity}, "
                f"total_violations={self.total})"
            )
        return out


def record_event(device: torch.device):
    """A CUDA event recorded on the current stream (None on CPU, where work is already done)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def arrived(event) -> bool:
    """True when the work before ``event`` has finished (never waits)."""
    return event is None or event.query()


def host_buffer(like: torch.Tensor) -> torch.Tensor:
    """An empty host tensor shaped like ``like``: pinned when ``like`` is on CUDA, so device-to-host
    copies into it are asynchronous."""
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=like.device.type == "cuda")


class ViolationLog:
    """The violation ring and write index of one session, read incrementally without waiting for the device.

    The host learns the write index from the session's snapshots (``fetch(total)``); ``fetch`` starts a non-blocking
    copy of the new rows into a pinned mirror of the ring, and ``read_new`` decodes the rows whose
    copies arrived (every fetched row with ``wait=True``). Rows are final once the write index counts them (the ring is
    fill-once), so copying them later is safe.
    """

    def __init__(self, *, ring_capacity: int, device: torch.device, write_index: torch.Tensor) -> None:
        """``write_index``: a zeroed int32 ``[1]`` tensor on ``device``, the write index (the session
        keeps it in its status buffer)."""
        ring_capacity = require_positive(ring_capacity, "ring_capacity")
        self.violation_ring = torch.zeros(ring_capacity, consts.VIOLATION_FIELDS, dtype=torch.int64, device=device)
        self.violation_write_index = write_index
        self._mirror = host_buffer(self.violation_ring)
        self._copied = 0  # ring rows whose copy has been started
        self._in_flight: collections.deque = collections.deque()  # (event, stored rows, total) per fetch
        self._arrived_rows = 0  # ring rows whose copies have arrived
        self._total = 0  # violations counted (the write index unwrapped) at the last arrived fetch
        self._fetched = 0  # violations counted at the last fetch
        self._read = 0  # ring rows already returned
        self._dropped = 0  # dropped violations already reported

    def fetch(self, write_index: int) -> None:
        """The write index was ``write_index`` at the current point of the stream: copy the new rows.

        The int32 index wraps negative after 2^31 - 1 violations and keeps counting (SPEC D4): the count
        is the previous fetch's plus the index's advance modulo 2^32 (fewer than 2^32 between fetches)."""
        self._collect(wait=False)
        total = self._fetched + (write_index - self._fetched) % 2**32
        self._fetched = total
        capacity = self.violation_ring.shape[0]
        stored = min(total, capacity)
        if stored > self._copied:
            self._mirror[self._copied : stored].copy_(self.violation_ring[self._copied : stored], non_blocking=True)
            self._copied = stored
        self._in_flight.append((record_event(self.violation_ring.device), stored, total))

    def _collect(self, *, wait: bool) -> None:
        """Account the fetches whose copies have arrived (all of them, blocking, when ``wait``)."""
        while self._in_flight and (wait or arrived(self._in_flight[0][0])):
            event, rows, total = self._in_flight.popleft()
            if wait and event is not None:
                event.synchronize()
            self._arrived_rows, self._total = max(self._arrived_rows, rows), max(self._total, total)

    def read_new(self, *, wait: bool = False) -> ViolationReport:
        """Rows stored since the previous read whose copies arrived (all fetched ones when ``wait``,
        which blocks on the copies), and the newly dropped count."""
        self._collect(wait=wait)
        capacity = self.violation_ring.shape[0]
        stored, total = self._arrived_rows, self._total
        rows = self._mirror[self._read : stored].tolist() if stored > self._read else []
        dropped = max(0, total - capacity) - self._dropped
        self._read = stored
        self._dropped += dropped
        return ViolationReport(
            records=tuple(Violation.from_row(r) for r in rows), total=total, dropped=dropped, ring_capacity=capacity
        )
