"""Faults injected into the simulated engine, and the attribution of violation rows to them.

Each injector runs between two steps and returns a ``Fault`` naming its victims (the requests or
cache entries whose chains it breaks), or raises ``NoTarget`` saying why no target suits yet. Most
faults are in place at once; ``double_alloc`` and ``stale_chain`` once the engine hands their slot to
a new owner (``Fault.active_from``, set by ``FaultTracker.after_schedule``). Which check catches each
fault (SPEC 3.1 / 3.2):

* ``kv_flip``: a K/V byte of a written slot is flipped in the pool -> the next TAIL verify's real-KV
  fold differs from the stored real_kv_hash (``verify_real_kv_hash``).
* ``token_overwrite`` / ``position_overwrite``: a field of a written slot is changed in a HEAD or TAIL
  canary buffer -> the next verify of that endpoint (``verify_token`` / ``verify_position``, and
  ``verify_chain_hash`` at the successor).
* ``double_alloc``: the allocator hands a slot a request still uses to the next allocation -> the new
  owner's KV bytes fail the victim's next TAIL verify (``verify_real_kv_hash``), then its HEAD verify
  sees the new owner's stamp.
* ``stale_chain``: a cache entry's slot is freed (and reused next step) while the entry stays in the
  cache -> the SWEEP of live chains finds the new owner's stamp (``verify_position`` /
  ``verify_chain_hash``).
* ``wrong_seed``: one request's prefix length is reported one short, so its write chains from the slot
  before its last -> the chain-position assert of the HEAD and TAIL writes (``write_position``).

A fault only touches slots its victim alone holds, at positions the victim's next verify covers; a slot handed out twice
is never a seed of the next step's write, so no launch aliases (SPEC D7).
"""

from __future__ import annotations

import dataclasses
import random

import torch

from .._consts import PARTIAL_READ_BYTES
from ..consts import CANARY_FIELD_POSITION, CANARY_FIELD_TOKEN, RealKvHashMode
from ..session import CanarySession
from ..violations import ViolationReport
from .engine import Engine, Holder, Request

KINDS = ("kv_flip", "token_overwrite", "position_overwrite", "double_alloc", "stale_chain", "wrong_seed")
PER_GROUP_KINDS = ("kv_flip", "token_overwrite", "position_overwrite")  # act on one group's buffers


class NoTarget(Exception):
    """No slot, request or cache entry suits the fault now; the message says what is missing."""


@dataclasses.dataclass(eq=False)
class Fault:
    """One injected fault and what caught it."""

    kind: str
    group: str  # FULL or SWA for PER_GROUP_KINDS; the others act on the full slot (both groups)
    injected_at: int  # injected between steps injected_at and injected_at + 1
    target: str
    victims: list[Holder]
    slot: int | None = None  # the full slot the fault corrupts or hands out again (None: wrong_seed)
    reuses_slot: bool = False  # the fault takes effect when the engine hands ``slot`` out again
    active_from: int | None = None  # first step the fault is in place (None: not yet)
    detected_at: int | None = None
    tags: set[str] = dataclasses.field(default_factory=set)
    reasons: set[str] = dataclasses.field(default_factory=set)

    def covers(self, slot: int) -> bool:
        """Whether a live victim's chain holds ``slot`` (a victim that left undetected explains nothing)."""
        return any(v.live and slot in v.slots for v in self.victims)

    def explains(self, slot: int) -> tuple[bool, bool]:
        """How closely the fault explains a row at ``slot`` it covers, as a sort key: it corrupted that
        slot and a live victim still holds it (the owner was hit), and it corrupted that slot."""
        hit = self.slot == slot
        return hit and any(v.live and slot in v.held for v in self.victims), hit


def _owned_positions(engine: Engine, group: str, back: int) -> list[tuple[Request, int]]:
    """(request, position) pairs at positions ``<= cached - back`` whose slot only that request holds
    and that its next per-forward verify of ``group`` covers (for SWA: inside the window, SWA slot live)."""
    out = []
    for req in engine.running:
        if req.pinned:
            continue
        lo = max(0, req.cached - engine.cfg.swa_window) if group == "SWA" else 0
        for pos in range(lo, req.cached - back + 1):
            slot = req.slots[pos]
            if engine.refs[slot] == 1 and (group == "FULL" or engine.lut_host[slot]):
                out.append((req, pos))
    return out


def _canary_slot(engine: Engine, group: str, slot: int) -> int:
    return slot if group == "FULL" else int(engine.lut_host[slot])


def inject(kind: str, group: str, engine: Engine, session: CanarySession, rng: random.Random) -> Fault:
    """Inject one fault of ``kind`` now (between steps ``engine.step`` and ``engine.step + 1``); NoTarget
    when nothing suits it yet."""
    if kind == "stale_chain":
        return _stale_chain(engine, rng)
    pending = {"wrong_seed": engine.short_prefix, "double_alloc": engine.handout}.get(kind)
    if pending is not None:  # the engine holds one of each: a second would replace the first, which then never acts
        raise NoTarget(f"a {kind} fault is already pending")
    if kind == "wrong_seed":
        reqs = [r for r in engine.running if not r.pinned and r.cached >= 2]
        if not reqs:
            raise NoTarget("no running request with 2 or more cached tokens")
        req = rng.choice(reqs)
        engine.short_prefix = req
        return _fault(kind, group, engine, f"req {req.rid}: seed = slot of pos {req.cached - 2}, not {req.cached - 1}",
                      req, None)
    cands = _owned_positions(engine, group, back=2 if kind == "double_alloc" else 1)
    if not cands:
        where = "inside the SWA window " if group == "SWA" else ""
        raise NoTarget(f"no cached position {where}held by one running request only")
    req, pos = rng.choice(cands)
    slot = req.slots[pos]
    where = f"req {req.rid} pos {pos} slot {slot}"
    if kind == "double_alloc":
        engine.handout = slot
        return _fault(kind, group, engine, f"{where} handed out again", req, slot, reuses_slot=True)
    cslot = _canary_slot(engine, group, slot)
    half = rng.choice(session.halves)
    if group == "SWA":
        where += f" (SWA slot {cslot})"
    if kind == "kv_flip":
        layer = rng.randrange(engine.cfg.layers)
        partial = session.real_kv_hash_mode == RealKvHashMode.PARTIAL
        byte = rng.randrange(PARTIAL_READ_BYTES if partial else engine.cfg.bytes_per_token)
        pool = engine.full_kv if group == "FULL" else engine.swa_kv
        pool.flip(half, layer, cslot, byte, rng.randrange(1, 256))
        return _fault(kind, group, engine, f"{where} {half} layer {layer} byte {byte}", req, slot)
    endpoint = rng.choice(("HEAD", "TAIL"))
    field = CANARY_FIELD_TOKEN if kind == "token_overwrite" else CANARY_FIELD_POSITION
    session.canary_buffer(endpoint, half, group).view(torch.int64)[cslot, field] += rng.randrange(1, 1000)
    return _fault(kind, group, engine, f"{where} {endpoint} {half} buffer", req, slot)


def _stale_chain(engine: Engine, rng: random.Random) -> Fault:
    """Free one slot of a cache entry to the front of the free list, keeping the entry."""
    cands = [(e, pos) for e in engine.cache if not e.pinned
             for pos in range(len(e.slots) - 1) if engine.refs[e.slots[pos]] == 1]
    if not cands:
        raise NoTarget("no prefix-cache entry with a slot only it holds")
    entry, pos = rng.choice(cands)
    slot = entry.slots[pos]
    entry.held.remove(slot)
    engine.free_slot(slot, front=True)
    return _fault("stale_chain", "FULL", engine, f"cache entry pos {pos} slot {slot} freed, entry kept", entry,
                  slot, reuses_slot=True)


def _fault(kind: str, group: str, engine: Engine, target: str, victim: Holder, slot: int | None,
           reuses_slot: bool = False) -> Fault:
    """The fault, its victim pinned; ``reuses_slot``: it takes effect when ``slot`` is handed out again."""
    victim.pinned = True
    return Fault(kind=kind, group=group, injected_at=engine.step, target=target, victims=[victim], slot=slot,
                 reuses_slot=reuses_slot, active_from=None if reuses_slot else engine.step + 1)


class FaultTracker:
    """Injected faults, attribution of each step's violation rows, and the rows nothing explains."""

    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self.false_positives: list[tuple[int, str]] = []  # (step, violation line)

    def after_schedule(self, engine: Engine) -> None:
        """Mark the faults whose slot the step just scheduled handed to a new owner as in place."""
        for f in self.faults:
            if f.active_from is None and engine.refs[f.slot] > 0 and engine.handout != f.slot:
                f.active_from = engine.step

    def attribute(self, report: ViolationReport, engine: Engine, step: int) -> list[Fault]:
        """Match each row to the undetected (or just detected) fault whose victim's chain holds the row's slot, the one
        explaining it best (``Fault.explains``; the oldest among equals): a victim may be handed another fault's slot,
        or a stale entry keep one a later fault hit, so the oldest covering fault could take a row another caused.
        Returns the faults first detected now. Unmatched and dropped rows are false positives."""
        newly = []
        for v in report.records:
            group = "SWA" if v.tag_name.endswith("_SWA") else "FULL"
            slot = engine.owner_slot(group, v.slot)
            covering = [f for f in self.faults if f.detected_at in (None, step) and f.covers(slot)]
            fault = max(covering, key=lambda f: f.explains(slot), default=None)  # max keeps the first of equals
            if fault is None:
                self.false_positives.append((step, v.line()))
                continue
            if fault.detected_at is None:
                fault.detected_at = step
                newly.append(fault)
            fault.tags.add(v.tag_name)
            fault.reasons.update(v.reason_names)
        if report.dropped:
            self.false_positives.append((step, f"{report.dropped} rows dropped (ring full), not attributable"))
        return newly
