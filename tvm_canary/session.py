"""``CanarySession``: the engine host side of SPEC section 6, framework neutral.

A session owns, on one device: per buffer group (FULL, and SWA when configured) and half (K, and V
unless disabled) a zeroed head and tail canary buffer ``uint8[num_slots, 32]``; a plan pair per group;
the violation ring; the per-tag counters ``int64[12]`` (1-element views per launch); and the
chain-position-assert flag (0 until ``mark_init_finished()``).

Per engine step the caller runs ``before_forward(...)`` before the model writes KV (plan kernels, then
HEAD verify + write, no real-KV sources) and ``after_forward()`` after it (TAIL verify + write, the
group's real-KV sources). ``sweep(chains)`` verifies caller-given live chains on the SWEEP
endpoints (when ``sweep_due``, between steps); ``violations()`` reads the new ring rows and logs or raises them.
``capture_step(...)`` records a whole decode step in one CUDA graph (``StepGraph``).

The per-step path waits for the device only when the host runs ``SNAPSHOT_SLOTS`` snapshots ahead.
What the host needs (the ring's write index, each group's overflow flag, the health check's kernel
run counters) travels in a status snapshot: one non-blocking copy into pinned memory at the end of
each step (and at health-check points), decoded on arrival, normally by the next step. So overflow
warnings, health-check errors and violation rows surface a step late on CUDA (at once on CPU);
``flush()`` waits for everything launched and reports it (shutdown, tests).
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections.abc import Callable

import torch

from . import checks
from ._consts import CANARY_SLOT_BYTES
from .argtypes import RECORD, require_instance, require_non_negative, require_positive, require_tensor, type_name
from .consts import REQ_POOL_IDX_PADDING, RealKvHashMode
from .context import CanaryLaunchTag, RealKvSource, VerifyOrWriteContext, hash_mode, source_tuple
from .launch import (
    dispatch,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
)
from .plans import VerifyPlan, WritePlan
from .reference.swa import to_group_slots
from .runtime import packing, use_reference
from .violations import ViolationLog, ViolationReport, arrived, host_buffer, record_event

VIOLATION_MODES = ("log", "raise", "quiet")
OVERFLOW_WARNING = "kv-canary: per-forward verify skipped this step due to overflow"
NOT_EXECUTING = "canary path is not executing"
SNAPSHOT_SLOTS = 4  # status snapshots in flight before the host waits for the oldest


class CanaryViolationWarning(UserWarning):
    """A violation report in ``log`` mode."""


class CanaryViolationError(RuntimeError):
    """Raised once in ``raise`` mode; ``report`` holds the decoded rows."""

    def __init__(self, message: str, report: ViolationReport) -> None:
        super().__init__(message)
        self.report = report


@dataclasses.dataclass(**RECORD)
class CanaryGroup:
    """One KV buffer group.

    Fields:
        num_slots: canary slots = the group's KV pool slots, slot 0 the reserved dummy.
        k_sources, v_sources: real-KV sources of each half, folded at the TAIL and SWEEP endpoints.
        swa_window_size: 0 for the FULL group; the window length for the SWA group.
        full_to_swa_index_mapping: int64 full-slot -> SWA-slot LUT on the session device, required iff
            ``swa_window_size > 0``; read at every launch, so the caller updates it in place.

    The session checks them (``CanarySession._check_config``; the LUT is ``lut_tensor`` in messages).
    """

    num_slots: int
    k_sources: tuple[RealKvSource, ...] = ()
    v_sources: tuple[RealKvSource, ...] = ()
    swa_window_size: int = 0
    full_to_swa_index_mapping: torch.Tensor | None = None

    def __post_init__(self) -> None:
        """The fields' types (TypeError) and a non-negative window (the session checks the rest)."""
        for name in ("k_sources", "v_sources"):
            source_tuple(getattr(self, name), f"CanaryGroup.{name}", entry="each of {name}")
        require_non_negative(self.swa_window_size, "CanaryGroup.swa_window_size")
        if self.full_to_swa_index_mapping is not None:
            require_tensor(self.full_to_swa_index_mapping, "CanaryGroup.full_to_swa_index_mapping")

    def sources(self, half: str) -> tuple[RealKvSource, ...]:
        """The real-KV sources of ``half`` ("K" or "V")."""
        return self.k_sources if half == "K" else self.v_sources


@dataclasses.dataclass(frozen=True, slots=True)
class _Group:
    name: str  # "FULL" or "SWA"
    config: CanaryGroup
    verify_plan: VerifyPlan
    write_plan: WritePlan
    contexts: dict[tuple[str, str], VerifyOrWriteContext]  # (endpoint, half) -> context
    out_cache_loc: torch.Tensor  # int64 [write_entry_capacity]: this step's slots translated (SWA)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Batch:
    """One step's inputs on the session device (the static buffers of a ``StepGraph``)."""

    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    req_to_token: torch.Tensor
    token_ids: torch.Tensor | None
    token_lens: torch.Tensor | None
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    expected_input_tokens: torch.Tensor | None
    expected_input_positions: torch.Tensor | None
    token_offsets: torch.Tensor | None = None  # the scatter's offsets when given (StepGraph), else computed
    input_assert: bool = False  # the write input assert is on this step (``_step_input_assert``)
    head_tokens: int = 0  # input_ids' length at before_forward (the plans' token count; the TAIL's must match)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Snapshot:
    """A status copy in flight: ``host`` (pinned) holds the words of ``CanarySession._status`` once
    ``event`` has completed."""

    host: torch.Tensor
    event: object
    overflow_step: int | None  # taken at the end of this step: warn if a group's plan overflowed
    health_done: int | None  # taken for the health check after this many steps


class CanarySession:
    """Canary buffers, plans, ring and counters of one model runner, and the per-step launch sequence.

    Args:
        full, swa: the buffer groups (``swa`` optional, with a window and a LUT).
        device: where every buffer lives and inputs are moved.
        write_req_capacity, write_entry_capacity: most requests / tokens per step (RuntimeError above).
        verify_capacity: plan entries per group and step (default 3 x FULL slots); a step needing more
            skips its per-forward verify and warns (the plan's ``enable`` flag).
        ring_capacity: violation rows kept (fill-once; later ones are counted and reported dropped).
        real_kv_hash_mode: PARTIAL or ALL folds the sources at TAIL/SWEEP; NONE disables real-KV checks.
        enable_v: also run the V-half endpoints.
        expected_token_pool_shape: ``(rows, max_context_len)`` allocates the expected-token pool and turns
            on the per-forward verify-token check; ``before_forward`` then needs ``token_ids``/``token_lens``
            and a ``req_to_token`` no larger than the pool in either dimension (``_check_pool_covers``).
        enable_write_input_assert: ``before_forward`` then needs ``expected_input_tokens/positions``, but
            in a step passing ``write_input_assert=False`` (no oracle: an EAGLE draft-decode step).
        kv_token_id_vs_position_offset: 0 for target pools, 1 for EAGLE draft pools.
        sweep_interval: ``sweep_due`` every this many steps (0: sweeping off).
        health_warmup_steps, health_check_interval: after the warm-up, every interval steps each active
            tag's kernel_run_counter must have grown (interval 0: off; ``_health_check``). The three step
            counts are ints >= 0 (TypeError, ValueError).
        violation_mode: ``log`` (a CanaryViolationWarning a row; a filter making it an error raises the
            first row's, the rest are read and dropped), ``raise`` (one CanaryViolationError, every row) or ``quiet``.
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
        require_instance(full, CanaryGroup, "full")
        if swa is not None:
            require_instance(swa, CanaryGroup, "swa")
        for name, count in (("sweep_interval", sweep_interval), ("health_warmup_steps", health_warmup_steps),
                            ("health_check_interval", health_check_interval)):
            require_non_negative(count, name)
        if expected_token_pool_shape is not None and not hasattr(expected_token_pool_shape, "__len__"):
            raise TypeError(f"kv-canary: expected_token_pool_shape must be (rows, max_context_len), got "
                            f"{type_name(expected_token_pool_shape)}")
        if full.swa_window_size or full.full_to_swa_index_mapping is not None:
            raise ValueError("kv-canary: the FULL group takes no swa_window_size or full_to_swa_index_mapping")
        if swa is not None and (swa.swa_window_size <= 0 or swa.full_to_swa_index_mapping is None):
            raise ValueError("kv-canary: the SWA group needs swa_window_size > 0 and full_to_swa_index_mapping")
        if 0 < health_check_interval < sweep_interval:
            raise ValueError(
                f"kv-canary: sweep_interval={sweep_interval} exceeds health_check_interval={health_check_interval}, "
                "so the health check would flag the sweep tags"
            )
        for name, flag in (("enable_v", enable_v), ("enable_write_input_assert", enable_write_input_assert)):
            require_instance(flag, bool, name)
        for name, group in (("FULL", full), ("SWA", swa)):
            if group is not None:
                require_positive(group.num_slots, f"{name} group num_slots")
        require_positive(write_entry_capacity, "write_entry_capacity")
        if expected_token_pool_shape is not None:
            if len(expected_token_pool_shape) != 2:
                raise ValueError(f"kv-canary: expected_token_pool_shape must be (rows, max_context_len), got "
                                 f"{expected_token_pool_shape!r}")
            for size, what in zip(expected_token_pool_shape, ("rows", "max_context_len")):
                require_positive(size, f"expected_token_pool_shape {what}")
        self.device = torch.device(device)
        checks.require_supported_device(self.device)
        self.write_req_capacity = write_req_capacity
        self.write_entry_capacity = write_entry_capacity
        self.verify_capacity = verify_capacity if verify_capacity is not None else 3 * full.num_slots
        self.real_kv_hash_mode = hash_mode(real_kv_hash_mode)
        self.halves = ("K", "V") if enable_v else ("K",)
        mode, configs = self.real_kv_hash_mode, [g for g in (full, swa) if g]
        folded = any(g.sources(h) for g in configs for h in self.halves)
        given = any(g.sources(h) for g in configs for h in "KV")
        if mode != RealKvHashMode.NONE and not folded and (mode == RealKvHashMode.ALL or given):
            raise ValueError(f"kv-canary: real_kv_hash_mode={mode.name} folds real-KV sources but no group has any "
                             "in a half that runs; use RealKvHashMode.NONE for a session without sources")
        self.enable_write_input_assert = enable_write_input_assert
        self.kv_token_id_vs_position_offset = kv_token_id_vs_position_offset
        self.sweep_interval = sweep_interval
        self.health_warmup_steps = health_warmup_steps
        self.health_check_interval = health_check_interval
        self.violation_mode = violation_mode

        # The status the host reads after each step, one int64 buffer for one copy: [ring write index,
        # each group's plan enable, each tag's kernel run counter]; the int32 ones in their words' first 4 bytes.
        num_groups, num_tags = 1 + (swa is not None), len(CanaryLaunchTag)
        self._status = torch.zeros(1 + num_groups + num_tags, dtype=torch.int64, device=self.device)
        self.violation_log = ViolationLog(ring_capacity=ring_capacity, device=self.device,
                                          write_index=self._status_word(0))
        self.kernel_run_counters = self._status[1 + num_groups :]
        self.slot_run_counters = torch.zeros(num_tags, dtype=torch.int64, device=self.device)
        self.enable_chain_position_assert = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.expected_token_pool = (
            None if expected_token_pool_shape is None
            else torch.zeros(expected_token_pool_shape, dtype=torch.int32, device=self.device)
        )
        self._groups = [self._make_group("FULL", full, 0)] + ([self._make_group("SWA", swa, 1)] if swa else [])
        self._config_step = self._empty_step()
        self._check_config()
        if mode != RealKvHashMode.NONE:  # NONE reads no source row (D4)
            for g in self._groups:
                _check_source_rows(g.name, g.config, self.halves)
        self._scatter_offsets = torch.zeros(write_req_capacity + 1, dtype=torch.int64, device=self.device)
        # The byte ranges of every session-owned tensor a step writes (the write contexts' buffers and sinks,
        # the plans, the expected-token pool, the scatter's offsets), which its inputs must not overlap
        # (SPEC D10): checked before the step begins (``_check_step``), as each launch checks its own.
        written = [pair for g in self._groups for context in g.contexts.values()
                   for pair in checks.launch_tensors("write", {"context": context})[0]]
        written += [(t, f"{g.name} group {name}") for g in self._groups for t, name in checks.launch_tensors(
            "plan", {"verify_plan_out": g.verify_plan, "write_plan_out": g.write_plan})[0]]
        written += [(g.out_cache_loc, f"{g.name} group out_cache_loc") for g in self._groups]
        if self.expected_token_pool is not None:
            written += [(self.expected_token_pool, "expected_token_pool"), (self._scatter_offsets, "scatter offsets")]
        self._written_ranges = checks.WrittenRanges.of(
            checks.byte_ranges({id(t): (t, name) for t, name in written}.values()))
        self.step = 0  # steps begun so far (before_forward calls and graph replays)
        self._batch: _Batch | None = None
        self._health_snapshot: list[int] | None = None
        self._health_failures: list[str] = []  # decoded, not yet raised
        self._overflow_warnings: list[str] = []  # decoded, not yet warned
        self._raised = False
        # Allocated once: sweep plans (grown on demand), status snapshots.
        self._staging = torch.empty(0, dtype=torch.int64, device=self.device)  # host inputs of eager steps
        self._sweep_plans: dict[str, VerifyPlan] = {}
        self._free_snapshots = [host_buffer(self._status) for _ in range(SNAPSHOT_SLOTS)]
        self._snapshots: collections.deque[_Snapshot] = collections.deque()
        self._dirty = False  # launches since the last snapshot

    # -- construction

    def _status_word(self, i: int) -> torch.Tensor:
        """int32 ``[1]`` view of status word ``i``'s first 4 bytes, from a view of the whole buffer
        (torch.compile rebuilds ``status[i : i + 1].view(torch.int32)[:1]`` empty: ``ops``)."""
        return self._status.view(torch.int32)[2 * i : 2 * i + 1]

    def _make_group(self, name: str, config: CanaryGroup, index: int) -> _Group:
        contexts = {}
        for half in self.halves:
            head = torch.zeros(config.num_slots, CANARY_SLOT_BYTES, dtype=torch.uint8, device=self.device)
            tail = torch.zeros_like(head)
            sources = config.sources(half)
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
            verify_plan=dataclasses.replace(
                VerifyPlan.allocate(verify_capacity=self.verify_capacity, device=self.device),
                enable=self._status_word(1 + index).fill_(1),
            ),
            write_plan=WritePlan.allocate(write_req_capacity=self.write_req_capacity, device=self.device),
            contexts=contexts,
            out_cache_loc=torch.empty(self.write_entry_capacity, dtype=torch.int64, device=self.device),
        )

    def _check_config(self) -> None:
        """The launch checks (SPEC 4) that read the configuration (each group's plan checks: LUT, window,
        plans, pool, offset; each endpoint's real-KV sources), on the prebuilt empty step (``_empty_step``:
        a sweep allocates nothing): at construction (so a launch's refusal raises here, with its message)
        and before each sweep (whose SWA translation reads the LUT before any launch checks it)."""
        for g in self._groups:
            checks.check_plan(**self._plan_args(g, self._config_step))
            self._check_sources(g)

    @staticmethod
    def _check_sources(g: _Group, endpoints=("HEAD", "TAIL", "SWEEP")) -> None:
        """The real-KV source checks (SPEC 4) of the group's contexts at ``endpoints``."""
        for (endpoint, _), context in g.contexts.items():
            if endpoint in endpoints:
                checks.check_real_kv_sources(context)

    def _empty_step(self) -> _Batch:
        """A step of no requests or tokens with the session's inputs (its pool's, its input assert's)."""
        none, pool = torch.empty(0, dtype=torch.int64, device=self.device), self.expected_token_pool is not None
        expected = none if self.enable_write_input_assert else None
        return _Batch(req_pool_indices=none, prefix_lens=none, extend_seq_lens=none, input_ids=none, positions=none,
                      out_cache_loc=none, req_to_token=torch.zeros(1, 1, dtype=torch.int32, device=self.device),
                      token_ids=none if pool else None, token_lens=none if pool else None,
                      expected_input_tokens=expected, expected_input_positions=expected)

    # -- introspection

    def canary_buffer(self, endpoint: str, half: str, group: str = "FULL") -> torch.Tensor:
        """The canary buffer of an endpoint ("HEAD", "TAIL" or "SWEEP") and half ("K", or "V" when
        ``enable_v``)."""
        contexts = self._group(group).contexts
        if (endpoint, half) not in contexts:
            raise KeyError(f"kv-canary: no {endpoint} {half} canary buffer in this session (endpoints HEAD, TAIL, "
                           f"SWEEP; halves {', '.join(self.halves)})")
        return contexts[endpoint, half].canary_buf

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

    # -- per step

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
        write_input_assert: bool = True,
    ) -> None:
        """Plan every group, then verify + write on the HEAD endpoints.

        ``req_pool_indices``/``prefix_lens``/``extend_seq_lens`` have one entry per batch row (row 0 of ``req_to_token``
        = padding); ``input_ids``/``positions``/``out_cache_loc`` one per token, full-pool slots (negative = skip).
        ``token_ids`` is every row's known tokens (prompt + output) concatenated, ``token_lens`` their lengths, both
        needed iff the session has an expected-token pool. ``expected_input_tokens/positions`` are needed iff the
        write input assert is on this step: the session has ``enable_write_input_assert`` and ``write_input_assert``
        is true (False: no oracle, SPEC 6 item 4).
        Inputs already on the session device with the right dtype are used in place (no copy, no host
        synchronisation), so ``after_forward`` rereads ``input_ids``, ``positions``, ``out_cache_loc`` and the expected
        input tensors: they must not change before it runs (the TAIL would stamp other tokens than the HEAD).
        On a CUDA session, all-host inputs (lists, CPU tensors) are staged in pinned memory and reach the device
        with one non-blocking copy (a host ``req_to_token`` with another); mixed ones are converted one by one
        (host data through pinned memory too).
        Every input holds integers (int64; ``req_to_token`` int32). No input may share memory with a tensor the
        step writes (the session's buffers, plans and expected-token pool; SPEC D10).
        Raises before anything is counted or launched (a pending step stays pending): RuntimeError while a step
        awaits after_forward() or when the batch exceeds the write capacities; ValueError when ``req_to_token`` is
        larger than the expected-token pool, a host input holds values outside its dtype (uint64 values of 2**63
        and more included) or host ``extend_seq_lens`` (``token_lens``) count more tokens than ``input_ids``
        (``token_ids``) hold (``_check_token_totals``); TypeError for non-integer inputs (floats and booleans are
        refused, not truncated; Python ints outside int64 too) or a non-bool ``write_input_assert``; and the
        launches' errors (SPEC 4).
        """
        self._refuse_while_pending("before_forward()")
        input_assert = _step_input_assert(self.enable_write_input_assert, write_input_assert,
                                          (expected_input_tokens, expected_input_positions))
        given = _integer_inputs(dict(
            req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, extend_seq_lens=extend_seq_lens,
            token_lens=token_lens, input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc,
            expected_input_tokens=expected_input_tokens, expected_input_positions=expected_input_positions,
            token_ids=token_ids))
        self._check_expected_tokens(given["token_ids"], given["token_lens"], _batch_rows(given))
        batch = self._staged_batch(given, req_to_token, input_assert) if self._stages(given) else None
        if batch is None:
            batch = self._converted_batch(given, req_to_token, input_assert)
        require_tensor(batch.input_ids, "input_ids")  # the capacity check reads its length
        checks.require_same_length([(batch.input_ids, "input_ids")])
        self._check_capacities(batch.req_pool_indices.shape[0], batch.input_ids.shape[0])
        _check_token_totals(given)
        self._check_step(batch)
        self._begin_step()
        self._head(batch)
        self._batch = dataclasses.replace(batch, head_tokens=batch.input_ids.shape[0])

    def _stages(self, given: dict) -> bool:
        """Whether ``before_forward`` stages its inputs (``_staged_batch``): on a device session, when every
        input is host data."""
        return self.device.type != "cpu" and all(
            not isinstance(v, torch.Tensor) or v.device.type == "cpu" for v in given.values() if v is not None)

    def _staged_batch(self, given: dict, req_to_token, input_assert: bool) -> _Batch | None:
        """``before_forward``'s host inputs on the device with one non-blocking copy: converted and
        concatenated on the host with the scatter offsets, then copied into a staging buffer (grown to a
        power of two). None when an input is not 1-D (then converted and checked one by one)."""
        values = {name: v for name, v in given.items() if v is not None}
        if any(v.dim() != 1 for v in values.values()):
            return None
        lens = values.get("token_lens")
        if lens is not None:
            values["token_offsets"] = _host_offsets(lens)
        total = sum(v.shape[0] for v in values.values())
        if self._staging.shape[0] < total:
            self._staging = torch.empty(1 << (total - 1).bit_length(), dtype=torch.int64, device=self.device)
        on_device = self._staging[:total]
        _copy_from_host(list(values.values()), on_device)
        views = dict(zip(values, on_device.split([v.shape[0] for v in values.values()])))
        return _Batch(req_to_token=self._table_on_device(req_to_token), input_assert=input_assert,
                      **{name: views.get(name) for name in (*given, "token_offsets")})

    def _converted_batch(self, given: dict, req_to_token, input_assert: bool) -> _Batch:
        """``before_forward``'s inputs, each on the session device (``_on_device``)."""
        return _Batch(req_to_token=self._table_on_device(req_to_token), input_assert=input_assert,
                      **{name: None if v is None else self._on_device(v) for name, v in given.items()})

    def _refuse_while_pending(self, call: str) -> None:
        """Raise for ``call`` while a before_forward() step awaits after_forward(), whose TAIL reads the
        step's inputs (staged in place on CUDA), plans and SWA slots, which ``call`` would overwrite; the
        step stays pending."""
        if self._batch is not None:
            raise RuntimeError(f"kv-canary: {call} called while a step awaits after_forward()")

    def after_forward(self) -> None:
        """Verify + write on the TAIL endpoints (real-KV sources) with ``before_forward``'s batch (its
        per-token tensors as they are now).
        A group whose plan overflowed ``verify_capacity`` this step is warned of when the step's status
        snapshot arrives (on CPU: here). Then raises a decoded failed health check.
        First the per-token inputs and TAIL sources are checked again (the launches' checks; the token count
        against the HEAD's): one resized or re-strided in place since (changed values cannot be seen) is
        refused before any TAIL launch, ending the step (the next ``before_forward`` may begin; its status
        snapshot is still taken, so a HEAD overflow is warned)."""
        if self._batch is None:
            raise RuntimeError("kv-canary: after_forward() called without a matching before_forward()")
        batch, self._batch = self._batch, None
        try:
            self._check_write_inputs(batch)
            if batch.input_ids.shape[0] != batch.head_tokens:  # the plans are for the HEAD's tokens
                raise ValueError(f"kv-canary: input_ids length changed since before_forward(): "
                                 f"{batch.head_tokens}, now {batch.input_ids.shape[0]}")
            for g in self._groups:
                self._check_sources(g, ("TAIL",))
        except Exception:
            self._snapshot(overflow_step=self.step)
            raise
        self._tail(batch)
        self._end_step()

    def sweep(self, chains) -> None:
        """Verify live chains on the SWEEP endpoints (tail buffers, real-KV sources, no token check).

        ``chains`` is int64 ``[n, 3]`` of full-pool ``(slot, position, prev_slot)``; ``prev_slot`` -1 marks
        a chain head. SWA groups translate slots and predecessors through their LUT. A sweep runs between
        steps (SPEC 6 item 7): RuntimeError while a step awaits after_forward() (its slots, already in the
        live chains, lack their TAIL stamps: each would be reported).
        The configuration's launch checks (``_check_config``: an SWA LUT resized or replaced in place
        included) run before the first launch, so a refused sweep launches nothing.
        """
        self._refuse_while_pending("sweep()")
        self._check_config()
        chains = self._on_device(_integers(chains, "chains"))
        if chains.numel() and (chains.ndim != 2 or chains.shape[1] != 3):
            raise ValueError(f"kv-canary: sweep chains must be [n, 3] (slot, position, prev_slot), got shape "
                             f"{tuple(chains.shape)}")
        chains = chains.reshape(-1, 3)
        n = chains.shape[0]
        for g in self._groups:
            plan = self._sweep_plan(g.name, n)
            lut = g.config.full_to_swa_index_mapping
            for column, dst in ((0, plan.verify_slot_indices[:n]), (2, plan.verify_prev_slot_indices[:n])):
                if lut is None:
                    dst.copy_(chains[:, column])
                else:
                    to_group_slots(chains[:, column], lut, out=dst)
            plan.verify_expected_positions[:n].copy_(chains[:, 1])
            plan.verify_num_valid.fill_(n)
            for half in self.halves:
                launch_canary_verify_kernel(
                    context=g.contexts["SWEEP", half], plan=plan, check_verify_expected_token=False
                )
        self._dirty = True

    def violations(self) -> ViolationReport:
        """Rows recorded since the last call whose copies have reached the host (waits only as ``_snapshot``
        does; on CUDA normally all but the last step's), decoded; logged (``log``), raised once as
        CanaryViolationError (``raise``) or only returned (``quiet``)."""
        if self._dirty:
            self._snapshot()
        self._poll()
        self._report_decoded(stacklevel=2)
        return self._report(self.violation_log.read_new())

    def flush(self) -> ViolationReport:
        """Wait for every launch and report it all: overflow warnings, health-check errors, then the rows
        not yet returned, as ``violations()`` does. For shutdown and tests."""
        if self._dirty:
            self._snapshot()
        self._poll(wait=True)
        self._report_decoded(stacklevel=2)
        return self._report(self.violation_log.read_new(wait=True))

    def capture_step(self, *, batch_size: int, num_tokens: int | None = None, req_to_token: torch.Tensor,
                     forward: Callable[[], None] | None = None, write_input_assert: bool = True) -> "StepGraph":
        """A ``StepGraph`` for batches of up to ``batch_size`` rows and ``num_tokens`` tokens (default
        ``batch_size``); ``write_input_assert`` as ``before_forward``'s, for every replay."""
        if self.device.type != "cuda":
            raise ValueError(f"kv-canary: capture_step needs a CUDA session, this one is on {self.device}")
        return StepGraph(self, batch_size=batch_size, num_tokens=num_tokens or batch_size,
                         req_to_token=req_to_token, forward=forward, write_input_assert=write_input_assert)

    # -- the step's launches

    def _begin_step(self) -> None:
        """Count the step and take the health check's counter snapshot when due (SPEC 6 item 9: at the start
        of a step, every ``health_check_interval`` steps after the warm-up). Raises and warns nothing (what it
        decodes is reported at the step's end), so a counted step is launched whole."""
        self.step += 1
        done = self.step - 1
        interval, warmup = self.health_check_interval, self.health_warmup_steps
        if interval > 0 and done >= warmup and (done - warmup) % interval == 0:
            self._snapshot(health_done=done)
        self._poll()

    def _end_step(self) -> None:
        """Snapshot the step's status, decode what has arrived and report it (``_report_decoded``) at the
        user's call's frame (two levels up)."""
        self._snapshot(overflow_step=self.step)
        self._poll()
        self._report_decoded(stacklevel=3)

    def _step_work(self, batch: _Batch, forward: Callable[[], None] | None) -> None:
        """The device work of one whole step (what ``StepGraph`` captures): HEAD, ``forward()``, TAIL, after
        the batch's checks (``_check_step``)."""
        self._check_step(batch)
        self._head(batch)
        if forward is not None:
            forward()
        self._tail(batch)

    def _check_step(self, batch: _Batch) -> None:
        """The launch checks (SPEC 4) that read the step's inputs, before anything is launched (a rejected
        step changes nothing): the plan kernels' and scatter's in full (``_head`` dispatches them
        unchecked), write's per-step ones (``_check_write_inputs``)."""
        for g in self._groups:
            checks.check_plan(**self._plan_args(g, batch))
            if use_reference() and g.config.full_to_swa_index_mapping is not None:
                # the reference plan raises for a slot past the LUT, which the kernels clamp (SPEC D4): a dry
                # run into scratch plans raises it here, before the step begins
                dispatch("plan", self._plan_args(g, batch) | dict(
                    verify_plan_out=VerifyPlan.allocate(verify_capacity=self.verify_capacity, device=self.device),
                    write_plan_out=WritePlan.allocate(write_req_capacity=self.write_req_capacity,
                                                      device=self.device)))
        if self.expected_token_pool is not None:
            checks.check_scatter(**self._scatter_args(batch))
        self._check_pool_covers(batch.req_to_token)
        checks.require_apart(self._written_ranges, [
            (getattr(batch, name), name) for name in ("req_to_token", "req_pool_indices", "prefix_lens",
                                                      "extend_seq_lens", "token_lens", "token_ids", "token_offsets")
            if getattr(batch, name) is not None])
        self._check_write_inputs(batch)

    def _check_write_inputs(self, batch: _Batch) -> None:
        """Write's per-step checks of the batch's per-token inputs (each write launch repeats them)."""
        checks.check_write_inputs(self._groups[0].contexts["HEAD", "K"], batch.input_ids, batch.positions,
                                  batch.out_cache_loc, batch.input_assert, batch.expected_input_tokens,
                                  batch.expected_input_positions, self._written_ranges)

    def _plan_args(self, g: _Group, batch: _Batch) -> dict:
        """The arguments of the group's plan kernels for ``batch``."""
        return dict(verify_plan_out=g.verify_plan, write_plan_out=g.write_plan, req_to_token=batch.req_to_token,
                    req_pool_indices=batch.req_pool_indices, prefix_lens=batch.prefix_lens,
                    extend_seq_lens=batch.extend_seq_lens, swa_window_size=g.config.swa_window_size,
                    full_to_swa_index_mapping=g.config.full_to_swa_index_mapping, verify_capacity=self.verify_capacity,
                    req_to_verify_expected_tokens=self.expected_token_pool,
                    req_to_verify_expected_tokens_valid_lens=batch.token_lens,
                    kv_token_id_vs_position_offset=self.kv_token_id_vs_position_offset)

    def _scatter_args(self, batch: _Batch) -> dict:
        """The scatter's arguments for ``batch`` (offsets: the batch's, else the session's buffer that
        ``_scatter_expected_tokens`` fills)."""
        offsets = batch.token_offsets
        if offsets is None:
            offsets = self._scatter_offsets[: batch.token_lens.shape[0] + 1]
        return dict(flat_in=batch.token_ids, offsets=offsets, req_pool_indices=batch.req_pool_indices,
                    pool_out=self.expected_token_pool)

    def _head(self, batch: _Batch) -> None:
        """Scatter, plan every group, verify + write its HEAD endpoints (``batch`` passed ``_check_step``)."""
        self._scatter_expected_tokens(batch)
        for g in self._groups:
            dispatch("plan", self._plan_args(g, batch))
            self._verify_and_write(g, "HEAD", batch)
        self._dirty = True

    def _tail(self, batch: _Batch) -> None:
        for g in self._groups:
            self._verify_and_write(g, "TAIL", batch)
        self._dirty = True

    def _scatter_expected_tokens(self, batch: _Batch) -> None:
        """Fill the batch's expected-token pool rows (nothing without a pool). The offsets are the batch's,
        else the prefix sums of ``token_lens`` (one cumsum)."""
        if self.expected_token_pool is None:
            return
        args = self._scatter_args(batch)
        if batch.token_offsets is None:
            torch.cumsum(batch.token_lens, 0, out=args["offsets"][1:])
        dispatch("scatter", args)

    def _verify_and_write(self, g: _Group, endpoint: str, batch: _Batch) -> None:
        """The endpoint's verify + write of each half. An SWA group translates the step's slots once, at
        HEAD (into ``g.out_cache_loc``), for TAIL too: the LUT entries of the step's own slots are set
        before the step begins."""
        out_cache_loc, lut = batch.out_cache_loc, g.config.full_to_swa_index_mapping
        if lut is not None:
            group_slots = g.out_cache_loc[: out_cache_loc.shape[0]]
            out_cache_loc = to_group_slots(out_cache_loc, lut, out=group_slots) if endpoint == "HEAD" else group_slots
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
                enable_write_input_assert=batch.input_assert,
                expected_input_tokens=batch.expected_input_tokens,
                expected_input_positions=batch.expected_input_positions,
            )

    # -- host side: snapshots, reports

    def _snapshot(self, *, overflow_step: int | None = None, health_done: int | None = None) -> None:
        """Copy the status buffer to a pinned slot without waiting; if all SNAPSHOT_SLOTS are in flight,
        wait for the oldest first."""
        if not self._free_snapshots:
            self._poll(wait_for_one=True)
        host = self._free_snapshots.pop()
        host.copy_(self._status, non_blocking=True)
        self._snapshots.append(_Snapshot(host=host, event=record_event(self.device), overflow_step=overflow_step,
                                         health_done=health_done))
        self._dirty = False

    def _poll(self, *, wait: bool = False, wait_for_one: bool = False) -> None:
        """Decode the arrived snapshots in order (all when ``wait``; at least the oldest when
        ``wait_for_one``)."""
        while self._snapshots and (wait or wait_for_one or arrived(self._snapshots[0].event)):
            snap = self._snapshots.popleft()
            if snap.event is not None and (wait or wait_for_one):
                snap.event.synchronize()
            wait_for_one = False
            self._decode(snap)

    def _decode(self, snap: _Snapshot) -> None:
        groups = len(self._groups)
        flags = snap.host[: 1 + groups].view(torch.int32)[::2].tolist()  # the int32 in each word's first 4 bytes
        counters = snap.host[1 + groups :].tolist()
        self._free_snapshots.append(snap.host)
        self.violation_log.fetch(flags[0])
        if snap.overflow_step is not None and min(flags[1:]) == 0:
            # the step in the text: Python shows a repeated text once, and every such step is reported
            self._overflow_warnings.append(f"{OVERFLOW_WARNING} (step {snap.overflow_step})")
        if snap.health_done is not None:
            self._health_check(counters, snap.health_done)

    def _health_check(self, counts: list[int], done: int) -> None:
        """SPEC 6 item 9: each active tag's kernel_run_counter after ``done`` steps must exceed its value
        ``health_check_interval`` steps earlier. A failure is kept (decoding runs inside steps) for
        ``_report_decoded`` to raise once; ``counts`` is the next check's baseline either way."""
        if self._health_snapshot is not None:
            stalled = [t.name for t in self.active_tags if counts[t] <= self._health_snapshot[t]]
            if stalled:
                self._health_failures.append(
                    f"kv-canary: {NOT_EXECUTING}: kernel_run_counter of {', '.join(stalled)} did not advance "
                    f"over steps {done - self.health_check_interval + 1}..{done}"
                )
        self._health_snapshot = counts

    def _report_decoded(self, stacklevel: int) -> None:
        """Warn the pending decoded overflows, then raise the pending decoded health-check failures (one
        RuntimeError, a line each). Called where a step is whole (the end of ``after_forward`` or
        a replay, ``violations``, ``flush``), never inside one: a warning filter that raises cannot stop a step
        half done. ``stacklevel``: the caller's frame, as ``warnings.warn``'s."""
        pending, self._overflow_warnings = self._overflow_warnings, []  # a raising filter cannot warn one twice
        for message in pending:
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
        if self._health_failures:
            message = "\n".join(self._health_failures)
            self._health_failures.clear()
            raise RuntimeError(message)

    def _report(self, report: ViolationReport) -> ViolationReport:
        if not report or self.violation_mode == "quiet":
            return report
        messages = report.messages(self.step)
        if self.violation_mode == "log":
            for message in messages:
                warnings.warn(message, CanaryViolationWarning, stacklevel=3)
        elif not self._raised:
            self._raised = True
            raise CanaryViolationError("\n".join(messages), report)
        return report

    # -- helpers

    def _on_device(self, x: torch.Tensor) -> torch.Tensor:
        """An int64 tensor (``_integers``) on the session device, dense (itself when it already is)."""
        return _to_device(x, self.device).contiguous()

    def _table_on_device(self, req_to_token) -> torch.Tensor:
        """``req_to_token`` as the plan kernels take it: int32 on the session device, dense."""
        return _to_device(_integers(req_to_token, "req_to_token", torch.int32), self.device).contiguous()

    def _sweep_plan(self, group: str, entries: int) -> VerifyPlan:
        """The group's sweep plan, reallocated (to a power of two) only when ``entries`` outgrows it:
        growing sweeps meet few capacities (each may select another geometry)."""
        plan = self._sweep_plans.get(group)
        if plan is None or plan.verify_slot_indices.shape[0] < entries:
            capacity = 1 << max(0, entries - 1).bit_length()
            plan = self._sweep_plans[group] = VerifyPlan.allocate(verify_capacity=capacity, device=self.device)
        return plan

    def _check_expected_tokens(self, token_ids, token_lens, batch_size: int) -> None:
        """``token_ids`` and ``token_lens`` given exactly when the session has an expected-token pool, with
        one length per batch row (from shapes: no host synchronisation)."""
        if (token_ids is None) != (token_lens is None) or (token_ids is None) != (self.expected_token_pool is None):
            raise ValueError(
                "kv-canary: token_ids and token_lens are required exactly when the session has an "
                "expected-token pool (expected_token_pool_shape)"
            )
        if token_lens is None:
            return
        checks.require_same_length([(token_lens, "token_lens")])
        if len(token_lens) != batch_size:
            raise ValueError(
                f"kv-canary: token_lens has {len(token_lens)} entries for a batch of {batch_size} requests")

    def _check_pool_covers(self, req_to_token: torch.Tensor) -> None:
        """The expected-token pool has at least ``req_to_token``'s rows and columns (SPEC 6: it is
        ``[req_to_token rows, max_context_len]``): the plan gives no expected token past the pool
        (docs/SEMANTICS.md), so the token check would silently skip those rows and positions."""
        pool = self.expected_token_pool
        if pool is not None and (req_to_token.shape[0] > pool.shape[0] or req_to_token.shape[1] > pool.shape[1]):
            raise ValueError(
                f"kv-canary: the expected-token pool {tuple(pool.shape)} (expected_token_pool_shape) is smaller "
                f"than req_to_token {tuple(req_to_token.shape)}: the token check would skip the rows and "
                "positions past it")

    def _check_capacities(self, bs: int, num_tokens: int) -> None:
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


class StepGraph:
    """One decode step's canary work in one CUDA graph, for a batch-size bucket of a CUDA session.

    The graph holds, in order: the expected-token scatter, every group's plan and HEAD verify + write,
    ``forward()`` when given, then every group's TAIL verify + write: only ``before_forward``'s and
    ``after_forward``'s work (no torch operation but the SWA slot translation; tests/test_session_ops.py
    pins the list). Without ``forward`` the caller runs its model before ``replay``: HEAD reads no KV
    bytes, so the canary bytes are those of the eager order.

    Inputs live in static device buffers (``inputs``), slices of one int64 buffer that
    ``replay(**batch)`` refills with one operation (``_refill``): rows beyond the batch become padding rows
    (pool index 0, no tokens), tokens beyond it are skipped (slot -1). The scatter's offsets are an input
    too, computed by ``replay``. ``req_to_token`` and the session's state (canary buffers, plans, ring,
    counters, LUTs, real-KV sources) are read in place, so must keep their addresses. A step's host side
    (step count, health check, status snapshot) is ``replay``'s, outside the graph.

    Capture first runs the work once on an all-padding batch (planning nothing; the run counters it
    bumps restored), so no module is compiled or loaded in capture.
    """

    def __init__(self, session: CanarySession, *, batch_size: int, num_tokens: int, req_to_token: torch.Tensor,
                 forward: Callable[[], None] | None, write_input_assert: bool = True) -> None:
        session._refuse_while_pending("capture_step()")  # capturing runs a step's work: it re-plans every group
        session._check_capacities(batch_size, num_tokens)
        if req_to_token.dtype != torch.int32 or req_to_token.device.type != session.device.type:
            raise ValueError("kv-canary: capture_step needs req_to_token as an int32 tensor on the session's device "
                             "(the graph reads it in place)")
        self.session, self.batch_size, self.num_tokens, self.forward = session, batch_size, num_tokens, forward
        pool = session.expected_token_pool
        rows = ("req_pool_indices", "prefix_lens", "extend_seq_lens") + (() if pool is None else ("token_lens",))
        input_assert = _step_input_assert(session.enable_write_input_assert, write_input_assert, ())
        tokens = ("input_ids", "positions", "out_cache_loc") + (
            ("expected_input_tokens", "expected_input_positions") if input_assert else ())
        self._rows, self._tokens = rows, tokens  # each led by the input that sets their length
        # The refilled inputs in buffer order: (name, capacity, padding value). The buffer holds the scatter
        # offsets first (computed by replay), then these, then token_ids (any length up to its capacity).
        self._fields = [(name, batch_size, 0) for name in rows] + [
            (name, num_tokens, -1 if name == "out_cache_loc" else 0) for name in tokens]
        self._offsets_len = 0 if pool is None else batch_size + 1
        self._fields_end = self._offsets_len + sum(cap for _, cap, _ in self._fields)
        token_ids_cap = 0 if pool is None else batch_size * pool.shape[1]
        self._static = torch.zeros(self._fields_end + token_ids_cap, dtype=torch.int64, device=session.device)
        views, at = {}, self._offsets_len
        for name, cap, pad in self._fields:
            views[name] = self._static[at : at + cap].fill_(pad)
            at += cap
        longest = max(batch_size, num_tokens)
        self._pads = {  # padding runs to refill from, on the device and on the host
            where: {pad: torch.full((longest,), pad, dtype=torch.int64, device=where) for pad in (0, -1)}
            for where in (session.device, torch.device("cpu"))
        }
        self.inputs = _Batch(
            req_pool_indices=views["req_pool_indices"], prefix_lens=views["prefix_lens"],
            extend_seq_lens=views["extend_seq_lens"], req_to_token=req_to_token,
            token_ids=None if pool is None else self._static[self._fields_end :],
            token_lens=views.get("token_lens"),
            token_offsets=None if pool is None else self._static[: self._offsets_len],
            input_ids=views["input_ids"], positions=views["positions"], out_cache_loc=views["out_cache_loc"],
            expected_input_tokens=views.get("expected_input_tokens"),
            expected_input_positions=views.get("expected_input_positions"), input_assert=input_assert,
        )
        counters = (session.kernel_run_counters, session.slot_run_counters)
        saved = [c.clone() for c in counters]
        self._work()  # load every kernel and scratch buffer outside the capture
        for c, s in zip(counters, saved):
            c.copy_(s)
        torch.cuda.synchronize(session.device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._work()

    def _work(self) -> None:
        self.session._step_work(self.inputs, self.forward)

    def replay(self, *, req_pool_indices, prefix_lens, extend_seq_lens, input_ids, positions, out_cache_loc,
               req_to_token: torch.Tensor, token_ids=None, token_lens=None, expected_input_tokens=None,
               expected_input_positions=None) -> None:
        """One step: ``before_forward``'s arguments (``req_to_token`` must be the captured table), copied
        into the static buffers without waiting, then the graph. Inputs of inconsistent lengths (the refill
        would pad them) raise ``before_forward``'s errors before anything is copied or counted."""
        session = self.session
        session._refuse_while_pending("StepGraph.replay()")
        inputs = _integer_inputs(dict(
            req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, extend_seq_lens=extend_seq_lens,
            token_lens=token_lens, input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc,
            expected_input_tokens=expected_input_tokens, expected_input_positions=expected_input_positions,
            token_ids=token_ids))
        bs = _batch_rows(inputs)
        session._check_expected_tokens(inputs["token_ids"], inputs["token_lens"], bs)
        if req_to_token.data_ptr() != self.inputs.req_to_token.data_ptr():
            raise ValueError("kv-canary: StepGraph.replay() needs the req_to_token tensor it was captured with")
        _step_input_assert(session.enable_write_input_assert, self.inputs.input_assert,
                           (expected_input_tokens, expected_input_positions))
        checks.check_expected_inputs_given(self.inputs.input_assert, expected_input_tokens,
                                           expected_input_positions)
        checks.require_same_length([(inputs["input_ids"], "input_ids")])
        n = inputs["input_ids"].shape[0]
        if bs > self.batch_size or n > self.num_tokens:
            raise RuntimeError(
                f"kv-canary: batch of {bs} requests / {n} tokens exceeds the captured bucket of "
                f"{self.batch_size} requests / {self.num_tokens} tokens"
            )
        _check_token_totals(inputs)
        values = {name: inputs[name] for name, _, _ in self._fields}
        for names in (self._rows, self._tokens):
            checks.require_same_length([(values[name], name) for name in names])
        self._refill(list(values.values()), inputs["token_ids"])
        session._begin_step()  # after the refill, which may reject the inputs: a rejected call is not a step
        self.graph.replay()
        session._dirty = True
        session._end_step()

    @staticmethod
    def _stage_on_host(values: list[torch.Tensor]) -> bool:
        """Whether ``_refill`` stages on the host: when every value is host data."""
        return all(v.device.type == "cpu" for v in values)

    def _refill(self, values: list[torch.Tensor], token_ids: torch.Tensor | None) -> None:
        """Write ``values`` (one per field, each followed by its padding) and ``token_ids`` into the static
        buffer with one operation, and the scatter offsets (prefix sums of ``token_lens``): all-host inputs
        are staged and summed on the host and copied once, without waiting; else concatenated on the device
        (host data copied beside them), then one device cumsum."""
        if token_ids is not None and token_ids.shape[0] > self._static.shape[0] - self._fields_end:
            raise RuntimeError(f"kv-canary: {token_ids.shape[0]} values do not fit the captured buffer of "
                               f"{self._static.shape[0] - self._fields_end}")
        tail = [] if token_ids is None else [token_ids]
        end = self._fields_end + sum(t.shape[0] for t in tail)
        on_host = self._stage_on_host(values + tail)
        where = torch.device("cpu") if on_host else self.session.device
        pieces = []
        for (_, cap, pad), v in zip(self._fields, values):
            pieces += [_to_device(v, where), self._pads[where][pad][: cap - v.shape[0]]]
        lens = self.inputs.token_lens
        if on_host:
            if lens is not None:  # field i is pieces 2i (its values) and 2i + 1 (its padding)
                at = 2 * [name for name, _, _ in self._fields].index("token_lens")
                padded = torch.cat(pieces[at : at + 2])
                pieces = [_host_offsets(padded)] + pieces
            _copy_from_host(pieces + tail, self._static[:end])
            return
        torch.cat(pieces + [_to_device(t, where) for t in tail], out=self._static[self._offsets_len : end])
        if lens is not None:
            torch.cumsum(lens, 0, out=self.inputs.token_offsets[1:])


def _integers(value, name: str, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``value`` (a tensor, an array, a list or a number of integers) as a ``dtype`` tensor where it is
    (itself when it already is one). Non-integers (floats, booleans, complex),
    non-numbers and Python ints outside int64 are refused, not converted, as are host values
    outside a narrower ``dtype`` (``req_to_token``'s int32; reading a device tensor's values would
    synchronise the host, so its conversion wraps as torch's does); an empty list is an empty tensor."""
    wanted = f"kv-canary: {name} must hold {str(dtype).removeprefix('torch.')} values"
    if not isinstance(value, torch.Tensor):
        if min(getattr(value, "strides", None) or (0,)) < 0 and hasattr(value, "copy"):
            value = value.copy()  # a reversed numpy view: torch takes no negative strides
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:  # not numbers, or ints past int64
            raise TypeError(f"{wanted}, got {type_name(value)} ({error})") from None
    if value.dtype not in _INTEGER_DTYPES and value.numel():
        raise TypeError(f"{wanted}, got {value.dtype}")
    if value.dtype == dtype:
        return value
    if value.dtype in (torch.uint32, torch.uint64) and value.device.type == "cpu":
        # torch has no min or max of these on the CPU: uint32 widens as it is, uint64 reads as int64 once
        # no value is 2**63 or more (those would read as negative)
        if value.dtype == torch.uint64 and bool((value.view(torch.int64) < 0).any()):
            raise ValueError(f"kv-canary: {name} holds values outside torch.int64 (uint64 values of 2**63 and more)")
        value = value.view(torch.int64) if value.dtype == torch.uint64 else value.to(torch.int64)
    if value.numel() and value.device.type == "cpu":  # an empty list is float32: no bounds to compare
        bounds, held = torch.iinfo(dtype), torch.iinfo(value.dtype)
        narrowing = held.min < bounds.min or held.max > bounds.max  # widening needs no look at the values
        if narrowing and not bounds.min <= value.min() <= value.max() <= bounds.max:
            raise ValueError(f"kv-canary: {name} holds values outside {dtype}: "
                             f"{int(value.min())} .. {int(value.max())}")
    return value.to(dtype)


_INTEGER_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
                             torch.uint64})


def _check_source_rows(name: str, group: CanaryGroup, halves: tuple) -> None:
    """Each real-KV source of the group's ``halves`` (2-D, per the launch checks) has a row per slot: a
    slot past a source's rows would be reported invalid at every launch."""
    for half in halves:
        for i, source in enumerate(group.sources(half)):
            if (held := source.tensor.shape[0] * source.page_size) < group.num_slots:
                raise ValueError(f"kv-canary: the {name} group's {half.lower()}_sources[{i}] has rows for {held} "
                                 f"slots, fewer than its num_slots {group.num_slots}")


def _step_input_assert(session_assert: bool, write_input_assert: object, expected: tuple) -> bool:
    """Whether the write input assert runs in a step (or every replay of a captured step): the session's
    ``enable_write_input_assert`` unless the step passes ``write_input_assert=False`` (a bool: any other
    value is refused, not read as true or false). Expected inputs given to a step that turned the session's
    assert off are refused, naming the step's flag (SPEC 4's message names the session's)."""
    require_instance(write_input_assert, bool, "write_input_assert")
    if session_assert and not write_input_assert and any(e is not None for e in expected):
        raise ValueError("kv-canary: expected input tensors must be None in a step with write_input_assert=False")
    return session_assert and write_input_assert


def _integer_inputs(given: dict) -> dict:
    """A step's inputs (``given``, by name; None where not given) as ``_integers``."""
    return {name: None if value is None else _integers(value, name) for name, value in given.items()}


def _batch_rows(inputs: dict) -> int:
    """The batch size: the length of ``inputs["req_pool_indices"]``, which must be 1-D."""
    req_pool_indices = inputs["req_pool_indices"]
    checks.require_same_length([(req_pool_indices, "req_pool_indices")])
    return req_pool_indices.shape[0]


def _check_token_totals(inputs: dict) -> None:
    """Refuse a step whose host ``extend_seq_lens`` write more tokens (SPEC 3.3's ``write_offsets[bs]``: rows not
    padding, lengths above 0) than ``input_ids`` holds: the write kernel's offsets would run past it (read clamped,
    D4), stamping wrong tokens into the rows' slots, and the next step would report chain violations no KV bug
    caused. Likewise host ``token_lens`` that are negative or add up to more than ``token_ids`` (the scatter would
    fill requests' expected tokens from other rows, or leave them stale). Sums are taken in float64, which cannot
    wrap as int64 does. Values on a device are not read (a host synchronisation), nor inputs of other shapes
    (the launches refuse those)."""
    rows, extend, tokens = inputs["req_pool_indices"], inputs["extend_seq_lens"], inputs["input_ids"]
    if _host_vectors(rows, extend, tokens) and rows.shape == extend.shape:
        written = extend.clamp(min=0) * (rows != REQ_POOL_IDX_PADDING)
        if float(written.to(torch.float64).sum()) > tokens.shape[0]:
            raise ValueError(f"kv-canary: extend_seq_lens write {sum(written.tolist())} tokens, more than the "
                             f"{tokens.shape[0]} of input_ids")
    lens, known = inputs["token_lens"], inputs["token_ids"]
    if _host_vectors(lens, known):
        if lens.numel() and (lowest := int(lens.min())) < 0:
            raise ValueError(f"kv-canary: token_lens must not be negative, got {lowest}")
        if float(lens.to(torch.float64).sum()) > known.shape[0]:
            raise ValueError(f"kv-canary: token_lens add up to {sum(lens.tolist())} tokens, more than the "
                             f"{known.shape[0]} of token_ids")


def _host_vectors(*tensors: torch.Tensor) -> bool:
    """Whether every one of ``tensors`` is a 1-D host tensor (its values readable without synchronising)."""
    return all(t is not None and t.device.type == "cpu" and t.dim() == 1 for t in tensors)


def _host_offsets(lens: torch.Tensor) -> torch.Tensor:
    """The scatter's offsets of host ``lens``: ``[0, lens[0], lens[0] + lens[1], ...]``."""
    return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])


def _copy_from_host(pieces: list[torch.Tensor], dst: torch.Tensor) -> None:
    """``dst.copy_(torch.cat(pieces))`` for host ``pieces`` (1-D, as long together as the 1-D ``dst``),
    without waiting for the device: concatenated into page-locked memory (from pageable memory the driver
    may first wait for the stream), which torch's caching host allocator keeps until the copy has read it.
    While the stream is captured, pageable, so torch refuses the copy instead of capturing a block freed
    after the call. The caller may change ``pieces`` once this returns (the concatenation copied them)."""
    pinned = dst.device.type == "cuda" and not packing.capturing(dst.device)
    host = torch.empty(dst.shape, dtype=dst.dtype, pin_memory=pinned)
    dst.copy_(torch.cat(pieces, out=host), non_blocking=True)


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device`` (itself when it is there): host data to a CUDA device through ``_copy_from_host``."""
    if x.device.type != "cpu" or device.type != "cuda":
        return x.to(device)
    out = torch.empty(x.shape, dtype=x.dtype, device=device)
    _copy_from_host([x.reshape(-1)], out.view(-1))
    return out
