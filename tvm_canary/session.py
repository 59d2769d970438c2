"""``CanarySession``: the engine host side of SPEC section 6, framework neutral.

A session owns, on one device: per buffer group (FULL, and SWA when configured) and per half (K, and
V unless disabled) a zeroed head and tail canary buffer ``uint8[num_slots, 32]``; one plan pair per
group; the violation ring; the per-tag counters ``int64[12]`` (each launch gets 1-element views); and
the chain-position-assert flag (0 until ``mark_init_finished()``).

Per engine step the caller runs ``before_forward(...)`` before the model writes KV (plan kernels, then
HEAD verify + write with no real-KV sources) and ``after_forward()`` after it (TAIL verify + write with
the group's real-KV sources). ``sweep(chains)`` verifies caller-given live chains on the SWEEP
endpoints (when ``sweep_due``); ``violations()`` reads the new ring rows and logs or raises them.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from .consts import CANARY_SLOT_BYTES, RealKvHashMode
from .context import CanaryLaunchTag, RealKvSource, VerifyOrWriteContext
from .launch import (
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_scatter_req_token_ids_kernel,
)
from .plans import VerifyPlan, WritePlan
from .violations import ViolationLog, ViolationReport

VIOLATION_MODES = ("log", "raise", "quiet")
OVERFLOW_WARNING = "kv-canary: per-forward verify skipped this step due to overflow"
NOT_EXECUTING = "canary path is not executing"


class CanaryViolationWarning(UserWarning):
    """A violation report in ``log`` mode."""


class CanaryViolationError(RuntimeError):
    """Raised once in ``raise`` mode; ``report`` holds the decoded rows."""

    def __init__(self, message: str, report: ViolationReport) -> None:
        super().__init__(message)
        self.report = report


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CanaryGroup:
    """One KV buffer group.

    Fields:
        num_slots: canary slots = the group's KV pool slots, slot 0 being the reserved dummy.
        k_sources, v_sources: real-KV sources of each half, folded at the TAIL and SWEEP endpoints.
        swa_window_size: 0 for the FULL group; the window length for the SWA group.
        full_to_swa_index_mapping: int64 full-slot -> SWA-slot LUT on the session device, required iff
            ``swa_window_size > 0``; read at every launch, so the caller updates it in place.
    """

    num_slots: int
    k_sources: tuple[RealKvSource, ...] = ()
    v_sources: tuple[RealKvSource, ...] = ()
    swa_window_size: int = 0
    full_to_swa_index_mapping: torch.Tensor | None = None


def _translate(slots: torch.Tensor, lut: torch.Tensor | None) -> torch.Tensor:
    """Full-pool slots -> a group's canary slots: ``lut[x]`` for ``x >= 0``; identity without a LUT."""
    if lut is None:
        return slots
    return torch.where(slots < 0, slots, lut[slots.clamp(min=0)])


@dataclasses.dataclass(frozen=True, slots=True)
class _Group:
    name: str  # "FULL" or "SWA"
    config: CanaryGroup
    verify_plan: VerifyPlan
    write_plan: WritePlan
    contexts: dict[tuple[str, str], VerifyOrWriteContext]  # (endpoint, half) -> context


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    expected_input_tokens: torch.Tensor | None
    expected_input_positions: torch.Tensor | None


class CanarySession:
    """Canary buffers, plans, ring and counters of one model runner, and the per-step launch sequence.

    Args:
        full, swa: the buffer groups (``swa`` optional, with a window and a LUT).
        device: where every buffer lives; inputs are moved there.
        write_req_capacity, write_entry_capacity: most requests / tokens per step (RuntimeError above).
        verify_capacity: plan entries per group and step (default 3 x FULL slots); a step needing more
            skips its per-forward verify and warns (the plan's ``enable`` overflow signal).
        ring_capacity: violation rows kept (fill-once; later ones are counted and reported dropped).
        real_kv_hash_mode: PARTIAL or ALL folds the sources at TAIL/SWEEP; NONE disables real-KV checks.
        enable_v: also run the V-half endpoints.
        expected_token_pool_shape: ``(rows, max_context_len)`` allocates the expected-token pool and turns
            on the per-forward verify-token check; ``before_forward`` then needs ``token_ids``/``token_lens``.
        enable_write_input_assert: ``before_forward`` then needs ``expected_input_tokens/positions``.
        kv_token_id_vs_position_offset: 0 for target pools, 1 for EAGLE draft pools.
        sweep_interval: ``sweep_due`` every this many steps (0: sweeping off).
        health_warmup_steps, health_check_interval: after the warm-up, every interval steps each active
            tag's kernel_run_counter must have grown (0 interval: check off).
        violation_mode: ``log`` (warnings), ``raise`` (one CanaryViolationError) or ``quiet``.
    """

    def __init__(
        self,
        *,
        full: CanaryGroup,
        swa: CanaryGroup | None = None,
        device: torch.device | str,
        write_req_capacity: int,
        write_entry_capacity: int,
        verify_capacity: int | None = None,
        ring_capacity: int = 4096,
        real_kv_hash_mode: RealKvHashMode = RealKvHashMode.PARTIAL,
        enable_v: bool = True,
        expected_token_pool_shape: tuple[int, int] | None = None,
        enable_write_input_assert: bool = False,
        kv_token_id_vs_position_offset: int = 0,
        sweep_interval: int = 0,
        health_warmup_steps: int = 100,
        health_check_interval: int = 100,
        violation_mode: str = "log",
    ) -> None:
        if violation_mode not in VIOLATION_MODES:
            raise ValueError(f"kv-canary: violation_mode must be one of {VIOLATION_MODES}, got {violation_mode!r}")
        if full.swa_window_size or full.full_to_swa_index_mapping is not None:
            raise ValueError("kv-canary: the FULL group takes no swa_window_size or full_to_swa_index_mapping")
        if swa is not None and (swa.swa_window_size <= 0 or swa.full_to_swa_index_mapping is None):
            raise ValueError("kv-canary: the SWA group needs swa_window_size > 0 and full_to_swa_index_mapping")
        if 0 < health_check_interval < sweep_interval:
            raise ValueError(
                f"kv-canary: sweep_interval={sweep_interval} exceeds health_check_interval={health_check_interval}, "
                "so the health check would flag the sweep tags"
            )
        self.device = torch.device(device)
        self.write_req_capacity = write_req_capacity
        self.write_entry_capacity = write_entry_capacity
        self.verify_capacity = verify_capacity if verify_capacity is not None else 3 * full.num_slots
        self.real_kv_hash_mode = RealKvHashMode(real_kv_hash_mode)
        self.halves = ("K", "V") if enable_v else ("K",)
        self.enable_write_input_assert = enable_write_input_assert
        self.kv_token_id_vs_position_offset = kv_token_id_vs_position_offset
        self.sweep_interval = sweep_interval
        self.health_warmup_steps = health_warmup_steps
        self.health_check_interval = health_check_interval
        self.violation_mode = violation_mode

        self.violation_log = ViolationLog(ring_capacity=ring_capacity, device=self.device)
        num_tags = len(CanaryLaunchTag)
        self.kernel_run_counters = torch.zeros(num_tags, dtype=torch.int64, device=self.device)
        self.slot_run_counters = torch.zeros(num_tags, dtype=torch.int64, device=self.device)
        self.enable_chain_position_assert = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.expected_token_pool = (
            None if expected_token_pool_shape is None
            else torch.zeros(expected_token_pool_shape, dtype=torch.int32, device=self.device)
        )
        self._groups = [self._make_group("FULL", full)] + ([self._make_group("SWA", swa)] if swa else [])
        self.step = 0  # before_forward calls so far
        self._batch: _Batch | None = None
        self._health_snapshot: list[int] | None = None
        self._raised = False

    # ------------------------------------------------------------------ construction

    def _make_group(self, name: str, config: CanaryGroup) -> _Group:
        contexts = {}
        for half in self.halves:
            head = torch.zeros(config.num_slots, CANARY_SLOT_BYTES, dtype=torch.uint8, device=self.device)
            tail = torch.zeros_like(head)
            sources = config.k_sources if half == "K" else config.v_sources
            for endpoint, buf, srcs in (("HEAD", head, ()), ("TAIL", tail, sources), ("SWEEP", tail, sources)):
                tag = CanaryLaunchTag[f"{endpoint}_{half}_{name}"]
                contexts[endpoint, half] = VerifyOrWriteContext(
                    canary_buf=buf,
                    kernel_kind=tag,
                    violation_ring=self.violation_log.violation_ring,
                    violation_write_index=self.violation_log.violation_write_index,
                    slot_run_counter=self.slot_run_counters[tag : tag + 1],
                    kernel_run_counter=self.kernel_run_counters[tag : tag + 1],
                    real_kv_sources=tuple(srcs),
                    real_kv_hash_mode=self.real_kv_hash_mode if srcs else RealKvHashMode.NONE,
                    enable_chain_position_assert=self.enable_chain_position_assert,
                )
        return _Group(
            name=name,
            config=config,
            verify_plan=VerifyPlan.allocate(verify_capacity=self.verify_capacity, device=self.device),
            write_plan=WritePlan.allocate(write_req_capacity=self.write_req_capacity, device=self.device),
            contexts=contexts,
        )

    # ------------------------------------------------------------------ introspection

    def canary_buffer(self, endpoint: str, half: str, group: str = "FULL") -> torch.Tensor:
        """The canary buffer an endpoint ("HEAD", "TAIL" or "SWEEP") reads and writes."""
        return self._group(group).contexts[endpoint, half].canary_buf

    def _group(self, name: str) -> _Group:
        for g in self._groups:
            if g.name == name:
                return g
        raise KeyError(f"kv-canary: no {name} group in this session")

    @property
    def active_tags(self) -> tuple[CanaryLaunchTag, ...]:
        """Tags launched every step (HEAD, TAIL) or every sweep interval (SWEEP, when sweeping is on)."""
        endpoints = ("HEAD", "TAIL", "SWEEP") if self.sweep_interval > 0 else ("HEAD", "TAIL")
        return tuple(g.contexts[e, h].kernel_kind for g in self._groups for e in endpoints for h in self.halves)

    @property
    def sweep_due(self) -> bool:
        """True on steps that are a multiple of ``sweep_interval`` (never when it is 0)."""
        return self.sweep_interval > 0 and self.step > 0 and self.step % self.sweep_interval == 0

    # ------------------------------------------------------------------ per step

    def mark_init_finished(self) -> None:
        """Turn the write kernel's chain-position assert on (off during warm-up / graph capture)."""
        self.enable_chain_position_assert.fill_(1)

    def before_forward(
        self,
        *,
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        input_ids,
        positions,
        out_cache_loc,
        req_to_token: torch.Tensor,
        token_ids=None,
        token_lens=None,
        expected_input_tokens=None,
        expected_input_positions=None,
    ) -> None:
        """Plan every group, then verify + write on the HEAD endpoints.

        ``req_pool_indices``/``prefix_lens``/``extend_seq_lens`` have one entry per batch row (row 0 of
        ``req_to_token`` = padding); ``input_ids``/``positions``/``out_cache_loc`` one per token, full-pool
        slots (negative = skip). ``token_ids`` is every row's known tokens (prompt + output) concatenated
        and ``token_lens`` their lengths; both are needed iff the expected-token pool exists.
        Raises RuntimeError when the batch exceeds the write capacities or the health check fails.
        """
        self.step += 1
        self._health_check()
        dev = self._on_device
        rp, prefix, extend = dev(req_pool_indices), dev(prefix_lens), dev(extend_seq_lens)
        table = dev(req_to_token, torch.int32)
        batch = _Batch(
            input_ids=dev(input_ids),
            positions=dev(positions),
            out_cache_loc=dev(out_cache_loc),
            expected_input_tokens=None if expected_input_tokens is None else dev(expected_input_tokens),
            expected_input_positions=None if expected_input_positions is None else dev(expected_input_positions),
        )
        bs, num_tokens = rp.shape[0], batch.input_ids.shape[0]
        if bs > self.write_req_capacity:
            raise RuntimeError(
                f"kv-canary: batch of {bs} requests exceeds the session's write request capacity "
                f"{self.write_req_capacity}"
            )
        if num_tokens > self.write_entry_capacity:
            raise RuntimeError(
                f"kv-canary: batch of {num_tokens} tokens exceeds the session's write entry capacity "
                f"{self.write_entry_capacity}"
            )
        valid_lens = self._scatter_expected_tokens(rp, token_ids, token_lens)
        for g in self._groups:
            launch_canary_plan_kernels(
                verify_plan_out=g.verify_plan,
                write_plan_out=g.write_plan,
                req_pool_indices=rp,
                prefix_lens=prefix,
                extend_seq_lens=extend,
                req_to_token=table,
                swa_window_size=g.config.swa_window_size,
                full_to_swa_index_mapping=g.config.full_to_swa_index_mapping,
                verify_capacity=self.verify_capacity,
                req_to_verify_expected_tokens=self.expected_token_pool,
                req_to_verify_expected_tokens_valid_lens=valid_lens,
                kv_token_id_vs_position_offset=self.kv_token_id_vs_position_offset,
            )
            self._verify_and_write(g, "HEAD", batch)
        self._batch = batch

    def after_forward(self) -> None:
        """Verify + write on the TAIL endpoints (real-KV sources) with the batch of ``before_forward``;
        warns when a group's plan overflowed ``verify_capacity`` this step."""
        if self._batch is None:
            raise RuntimeError("kv-canary: after_forward() called without a matching before_forward()")
        batch, self._batch = self._batch, None
        for g in self._groups:
            self._verify_and_write(g, "TAIL", batch)
        if min(int(g.verify_plan.enable[0]) for g in self._groups) == 0:
            warnings.warn(OVERFLOW_WARNING, RuntimeWarning, stacklevel=2)

    def sweep(self, chains) -> None:
        """Verify live chains on the SWEEP endpoints (tail buffers, real-KV sources, no token check).

        ``chains`` is int64 ``[n, 3]`` of full-pool ``(slot, position, prev_slot)``; ``prev_slot`` -1 marks
        a chain head. SWA groups translate slots and predecessors through their LUT.
        """
        chains = self._on_device(chains).reshape(-1, 3)
        n = chains.shape[0]
        for g in self._groups:
            lut = g.config.full_to_swa_index_mapping
            plan = VerifyPlan.allocate(verify_capacity=max(1, n), device=self.device)
            plan.verify_slot_indices[:n] = _translate(chains[:, 0], lut)
            plan.verify_expected_positions[:n] = chains[:, 1]
            plan.verify_prev_slot_indices[:n] = _translate(chains[:, 2], lut)
            plan.verify_num_valid.fill_(n)
            for half in self.halves:
                launch_canary_verify_kernel(
                    context=g.contexts["SWEEP", half], plan=plan, check_verify_expected_token=False
                )

    def violations(self) -> ViolationReport:
        """Rows recorded since the last call, decoded; logged (``log``), raised once as
        CanaryViolationError (``raise``) or only returned (``quiet``)."""
        report = self.violation_log.read_new()
        if not report or self.violation_mode == "quiet":
            return report
        messages = report.messages(self.step)
        if self.violation_mode == "log":
            for message in messages:
                warnings.warn(message, CanaryViolationWarning, stacklevel=2)
        elif not self._raised:
            self._raised = True
            raise CanaryViolationError("\n".join(messages), report)
        return report

    # ------------------------------------------------------------------ helpers

    def _on_device(self, x, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.as_tensor(x, dtype=dtype, device=self.device).contiguous()

    def _scatter_expected_tokens(self, rp: torch.Tensor, token_ids, token_lens) -> torch.Tensor | None:
        """Fill the expected-token pool rows of this batch; returns the valid lengths (None without pool)."""
        if (token_ids is None) != (token_lens is None) or (token_ids is None) != (self.expected_token_pool is None):
            raise ValueError(
                "kv-canary: token_ids and token_lens are required exactly when the session has an "
                "expected-token pool (expected_token_pool_shape)"
            )
        if self.expected_token_pool is None:
            return None
        lens = self._on_device(token_lens)
        offsets = torch.zeros(lens.shape[0] + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(lens, 0, out=offsets[1:])
        launch_scatter_req_token_ids_kernel(
            flat_in=self._on_device(token_ids), offsets=offsets, req_pool_indices=rp, pool_out=self.expected_token_pool
        )
        return lens

    def _verify_and_write(self, g: _Group, endpoint: str, batch: _Batch) -> None:
        out_cache_loc = _translate(batch.out_cache_loc, g.config.full_to_swa_index_mapping)
        for half in self.halves:
            context = g.contexts[endpoint, half]
            launch_canary_verify_kernel(
                context=context, plan=g.verify_plan, check_verify_expected_token=self.expected_token_pool is not None
            )
            launch_canary_write_kernel(
                context=context,
                plan=g.write_plan,
                input_ids=batch.input_ids,
                positions=batch.positions,
                out_cache_loc=out_cache_loc,
                enable_write_input_assert=self.enable_write_input_assert,
                expected_input_tokens=batch.expected_input_tokens,
                expected_input_positions=batch.expected_input_positions,
            )

    def _health_check(self) -> None:
        """SPEC 6 item 9, run at the start of step ``self.step``: compares each active tag's
        kernel_run_counter with its value ``health_check_interval`` steps earlier."""
        done = self.step - 1
        interval, warmup = self.health_check_interval, self.health_warmup_steps
        if interval <= 0 or done < warmup or (done - warmup) % interval:
            return
        counts = self.kernel_run_counters.tolist()
        if self._health_snapshot is not None:
            stalled = [t.name for t in self.active_tags if counts[t] <= self._health_snapshot[t]]
            if stalled:
                raise RuntimeError(
                    f"kv-canary: {NOT_EXECUTING}: kernel_run_counter of {', '.join(stalled)} did not advance "
                    f"over steps {done - interval + 1}..{done}"
                )
        self._health_snapshot = counts
