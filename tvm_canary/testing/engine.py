"""The simulated serving engine: the KV bookkeeping of a real one, with random bytes for a model.

It has a paged K/V pool per group (random bytes per token, exposed as RealKvSources), a
request-to-token table, refcounted slots with a free list, a prefix cache of finished requests new
requests share prefixes from, chunked prefill, decode, completion with slot reuse, and an optional
SWA group (its own pool, a full->SWA LUT, out-of-window slots released).

A correct engine never makes the canary fire: a slot returns to the free list only when no request or cache entry holds
it, and its next owner writes (re-stamps) it before any verify covers it.
"""

from __future__ import annotations

import collections
import dataclasses
import random

import numpy as np
import torch

from .kv_pool import KvPool


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Sizes and workload of the simulation."""

    num_slots: int = 512  # FULL KV pool slots, slot 0 being the reserved dummy
    max_running: int = 8  # concurrent requests (req_to_token rows 1..max_running)
    max_context: int = 64  # req_to_token columns
    chunk_size: int = 8  # prefill tokens per request and step
    page_size: int = 4  # slots per row of a KV tensor
    layers: int = 2  # KV tensors per half = RealKvSources per endpoint
    bytes_per_token: int = 64  # one slot's strip in one layer
    swa_window: int = 0  # > 0 adds the SWA group
    prompt_lens: tuple[int, int] = (4, 24)
    new_tokens: tuple[int, int] = (2, 12)
    share_prob: float = 0.5  # chance a new request starts with a cached prefix
    admit_per_step: int = 2
    vocab: int = 50_000


@dataclasses.dataclass(eq=False)
class Holder:
    """A request or a prefix-cache entry: a chain of full slots (slot of position p at ``slots[p]``)
    and the references it holds (``held``, normally the same slots)."""

    slots: list[int]
    held: list[int]
    pinned: bool = False  # victim of an undetected fault: not evicted, shared or cached
    live: bool = True  # False once finished, aborted or evicted


@dataclasses.dataclass(eq=False)
class Request(Holder):
    rid: int = 0
    row: int = 0
    tokens: list[int] = dataclasses.field(default_factory=list)  # prompt + sampled output
    prompt_len: int = 0
    max_new: int = 0
    reserved: int = 0  # slots still to allocate

    @property
    def cached(self) -> int:
        return len(self.slots)

    @property
    def done(self) -> bool:
        return self.cached == len(self.tokens) == self.prompt_len + self.max_new


@dataclasses.dataclass(eq=False)
class CacheEntry(Holder):
    tokens: tuple[int, ...] = ()
    last_used: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """One step's rows and tokens, in the canary's input format (full-pool slots)."""

    requests: list[Request]
    prefix_lens: list[int]
    extend_lens: list[int]
    input_ids: list[int]
    positions: list[int]
    out_cache_loc: list[int]


class Engine:
    """Scheduling and KV bookkeeping; the run loop calls ``schedule``, ``forward``, ``commit``,
    ``abort`` and ``end_step`` in that order every step."""

    def __init__(self, cfg: EngineConfig, *, seed: int, device: torch.device) -> None:
        self.cfg = cfg
        self.rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        self.full_kv = self._pool(gen, device)
        self.swa_kv = self._pool(gen, device) if cfg.swa_window else None
        self.req_to_token_host = np.zeros((cfg.max_running + 1, cfg.max_context), dtype=np.int32)
        self.req_to_token = torch.zeros(self.req_to_token_host.shape, dtype=torch.int32, device=device)
        self.lut_host = np.zeros(cfg.num_slots, dtype=np.int64)  # full slot -> SWA slot (0: none)
        self.lut = torch.zeros(cfg.num_slots, dtype=torch.int64, device=device)
        self.swa_owner = np.zeros(cfg.num_slots, dtype=np.int64)  # SWA slot -> full slot
        self.refs = np.zeros(cfg.num_slots, dtype=np.int64)
        self.free = collections.deque(range(1, cfg.num_slots))
        self.swa_free = collections.deque(range(1, cfg.num_slots))
        self.free_rows = collections.deque(range(1, cfg.max_running + 1))
        self.running: list[Request] = []
        self.cache: list[CacheEntry] = []
        self.step = 0
        self.next_rid = 0
        # Fault hooks (set by the fault injectors, consumed once).
        self.handout: int | None = None  # the next allocation returns this live slot
        self.short_prefix: Request | None = None  # this request's prefix length is reported one short

    def _pool(self, gen: torch.Generator, device: torch.device) -> KvPool:
        cfg = self.cfg
        return KvPool.paged(cfg.num_slots, gen=gen, device=device, page_size=cfg.page_size, layers=cfg.layers,
                            bytes_per_token=cfg.bytes_per_token)

    # -- slots

    @property
    def reserved(self) -> int:
        return sum(r.reserved for r in self.running)

    def _alloc(self, req: Request) -> int:
        if self.handout is not None:
            slot, self.handout = self.handout, None
        else:
            slot = self.free.popleft()
        self.refs[slot] += 1
        if self.swa_kv is not None and self.lut_host[slot] == 0:
            swa = self.swa_free.popleft()
            self.lut_host[slot], self.swa_owner[swa] = swa, slot
        req.reserved -= 1
        return slot

    def free_slot(self, slot: int, *, front: bool = False) -> None:
        """Return ``slot`` (and its SWA slot) to the free list; ``front`` makes it the next one handed out."""
        self.refs[slot] = 0
        (self.free.appendleft if front else self.free.append)(slot)
        self.release_swa(slot)

    def release_swa(self, slot: int) -> None:
        swa = self.lut_host[slot]
        if swa:
            self.lut_host[slot], self.swa_owner[swa] = 0, 0
            self.swa_free.append(swa)

    def release(self, holder: Holder) -> None:
        """``holder`` leaves: drop every reference it holds; slots nobody holds any more are freed."""
        for slot in holder.held:
            self.refs[slot] -= 1
            if self.refs[slot] == 0:
                self.free_slot(slot)
        holder.held = []
        holder.live = False

    # -- requests

    def _shareable(self, entry: CacheEntry) -> list[int]:
        """Prefix lengths k a new request may share from ``entry``: with SWA, the k-th window must be live."""
        w = self.cfg.swa_window
        return [k for k in range(1, len(entry.slots) + 1)
                if not w or all(self.lut_host[s] for s in entry.slots[max(0, k - w):k])]

    def _admit(self) -> None:
        """Admit up to ``admit_per_step`` requests, some starting with a prefix of a cache entry."""
        cfg, rng = self.cfg, self.rng
        for _ in range(cfg.admit_per_step):
            if not self.free_rows:
                return
            entry, k = None, 0
            entries = [e for e in self.cache if not e.pinned]
            if entries and rng.random() < cfg.share_prob:
                entry = rng.choice(entries)
                ks = self._shareable(entry)
                k = rng.choice(ks) if ks else 0
            max_new = rng.randint(*cfg.new_tokens)
            prompt_len = min(k + rng.randint(*cfg.prompt_lens), cfg.max_context - max_new)
            if prompt_len <= k:
                continue
            need = prompt_len - k + max_new
            while len(self.free) - self.reserved < need and self._evict_one(keep=entry):
                pass
            if len(self.free) - self.reserved < need:
                continue
            shared = entry.slots[:k] if k else []
            tokens = list(entry.tokens[:k]) if k else []
            tokens += [rng.randrange(1, cfg.vocab) for _ in range(prompt_len - k)]
            for slot in shared:
                self.refs[slot] += 1
            if k:
                entry.last_used = self.step
            req = Request(slots=list(shared), held=list(shared), rid=self.next_rid, row=self.free_rows.popleft(),
                          tokens=tokens, prompt_len=prompt_len, max_new=max_new, reserved=need)
            self.req_to_token_host[req.row, :k] = shared
            self.next_rid += 1
            self.running.append(req)

    def _evict_one(self, keep: CacheEntry | None) -> bool:
        """Drop the least recently used unpinned cache entry other than ``keep``; False if none."""
        entries = [e for e in self.cache if not e.pinned and e is not keep]
        if not entries:
            return False
        entry = min(entries, key=lambda e: e.last_used)
        self.cache.remove(entry)
        self.release(entry)
        return True

    # -- step

    def schedule(self) -> Batch:
        """Admit requests, then give every running one its next prefill chunk or decode token."""
        self.step += 1
        self._admit()
        batch = Batch(requests=list(self.running), prefix_lens=[], extend_lens=[], input_ids=[], positions=[],
                      out_cache_loc=[])
        for req in batch.requests:
            if req.cached == len(req.tokens):  # the model sampled the next token last step
                req.tokens.append(self.rng.randrange(1, self.cfg.vocab))
            extend = min(self.cfg.chunk_size, len(req.tokens) - req.cached)
            batch.prefix_lens.append(req.cached - 1 if req is self.short_prefix else req.cached)
            batch.extend_lens.append(extend)
            for pos in range(req.cached, req.cached + extend):
                slot = self._alloc(req)
                self.req_to_token_host[req.row, pos] = slot
                batch.input_ids.append(req.tokens[pos])
                batch.positions.append(pos)
                batch.out_cache_loc.append(slot)
        self.short_prefix = None
        self.req_to_token.copy_(torch.from_numpy(self.req_to_token_host))
        self.lut.copy_(torch.from_numpy(self.lut_host))
        return batch

    def forward(self, batch: Batch) -> None:
        """The model writes K/V for the step's tokens (FULL slots, and their SWA slots)."""
        self.full_kv.write(batch.out_cache_loc)
        if self.swa_kv is not None:
            self.swa_kv.write([int(self.lut_host[s]) for s in batch.out_cache_loc])

    def commit(self, batch: Batch) -> None:
        """After the forward: the written tokens are now cached KV of their requests."""
        loc = iter(batch.out_cache_loc)
        for req, extend in zip(batch.requests, batch.extend_lens):
            new = [next(loc) for _ in range(extend)]
            req.slots += new
            req.held += new

    def canary_inputs(self, batch: Batch) -> dict:
        """Keyword arguments of ``CanarySession.before_forward`` for ``batch``."""
        return dict(
            req_pool_indices=[r.row for r in batch.requests],
            prefix_lens=batch.prefix_lens,
            extend_seq_lens=batch.extend_lens,
            input_ids=batch.input_ids,
            positions=batch.positions,
            out_cache_loc=batch.out_cache_loc,
            req_to_token=self.req_to_token,
            token_ids=[t for r in batch.requests for t in r.tokens],
            token_lens=[len(r.tokens) for r in batch.requests],
        )

    def live_chains(self) -> list[tuple[int, int, int]]:
        """Distinct (slot, position, prev slot) links of every cached and running chain."""
        return list(dict.fromkeys(
            (slot, pos, holder.slots[pos - 1] if pos else -1)
            for holder in [*self.cache, *self.running] for pos, slot in enumerate(holder.slots)
        ))

    def abort(self, holder: Holder) -> None:
        """Drop a request or cache entry without caching anything (what an engine does on a violation)."""
        if isinstance(holder, Request):
            self.running.remove(holder)
            self.free_rows.append(holder.row)
        else:
            self.cache.remove(holder)
        self.release(holder)

    def end_step(self) -> None:
        """Finish completed requests into the prefix cache, then release out-of-window SWA slots."""
        for req in [r for r in self.running if r.done]:
            self.running.remove(req)
            self.free_rows.append(req.row)
            if not req.pinned:
                entry = CacheEntry(slots=list(req.slots), held=list(req.slots), tokens=tuple(req.tokens),
                                   last_used=self.step)
                for slot in entry.held:
                    self.refs[slot] += 1
                self.cache.append(entry)
            self.release(req)
        if self.swa_kv is not None:
            for req in self.running:
                for slot in req.slots[: max(0, req.cached - self.cfg.swa_window)]:
                    if self.refs[slot] == 1:
                        self.release_swa(slot)

    def owner_slot(self, group: str, slot: int) -> int:
        """The full slot behind a canary slot of ``group`` (0 for an unowned SWA slot)."""
        return slot if group == "FULL" else int(self.swa_owner[slot])
