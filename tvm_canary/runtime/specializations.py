"""The one enumeration of each kernel's specializations (compile-time variants).

A specialization is the tuple of leading arguments of ``tvm_canary.kernels.<kernel>.make(*spec, geom)``;
each element is one *axis* with a fixed set of values:

* write: ``num_sources`` (real-KV sources folded, 0 = NONE mode), ``partial`` (PARTIAL mode: each
  source's fold word count built in, ``kernels.common.source_params``), ``input_assert``,
  ``fold_words`` (ALL mode: the word count every source folds, built in; 0 = each source's own count,
  passed at launch);
* verify: ``num_sources``, ``partial``, ``check_token``, ``fold_words``;
* plan: ``has_lut`` (SWA translation table given), ``has_pool`` (expected-token pool given);
* scatter: none.

Packing (``spec``, ``launch_mode``), ahead-of-time builds and the codegen tests (``all_specs``, ``launch_mode``) and
tuning (``spec``, ``launch_mode``) take specializations from here: a new variant is added in one place.
"""

from __future__ import annotations

import itertools

from ..consts import MAX_REAL_KV_SOURCES, RealKvHashMode

_SOURCES = tuple(range(MAX_REAL_KV_SOURCES + 1))
_FLAG = (False, True)
# ALL mode's fold word counts built in (``fold_words``): token rows of 128 B to 2 KiB (e.g. one to eight
# heads of 128 bf16 values). Built in, the fold's batch loops and index clamps compile away: on the H200
# (41st session's call 3, interleaved against the runtime count, rows of 16, 64, 128 and 256
# words) verify ALL ran 1K-4K entries 0.86-0.97x, 64K-1M 0.90-1.00x, write ALL 4096 one-token requests
# 0.85-1.02x (docs/PERFORMANCE-HISTORY.md, "What the forty-first session changed and measured", retired:
# `git show a3a1d5d:docs/PERFORMANCE-HISTORY.md`).
_FOLD_WORDS = (0, 16, 32, 64, 128, 256)
# Sources whose fold word count is built in: exactly a pair (K and V), every MHA and GQA cache's layout; other counts
# fold each source's own count (keeps the ahead-of-time build to 10 more specializations per kernel).
FOLD_WORDS_SOURCES = 2

# kernel -> ((axis name, allowed values), ...) in ``make``'s argument order
AXES: dict[str, tuple[tuple[str, tuple], ...]] = {
    "write": (("num_sources", _SOURCES), ("partial", _FLAG), ("input_assert", _FLAG), ("fold_words", _FOLD_WORDS)),
    "verify": (("num_sources", _SOURCES), ("partial", _FLAG), ("check_token", _FLAG), ("fold_words", _FOLD_WORDS)),
    "plan": (("has_lut", _FLAG), ("has_pool", _FLAG)),
    "scatter": (),
}
KERNELS = tuple(AXES)


def spec(kernel: str, **values) -> tuple:
    """The specialization tuple of ``kernel`` with the named axis values (every axis must be given)."""
    axes = AXES[kernel]
    if set(values) != {name for name, _ in axes}:
        raise TypeError(f"kv-canary: {kernel} specializations take {[n for n, _ in axes]}, got {sorted(values)}")
    out = []
    for name, allowed in axes:
        value = type(allowed[0])(values[name])
        if value not in allowed:
            raise ValueError(f"kv-canary: {kernel} specialization {name}={values[name]!r} not in {allowed}")
        out.append(value)
    if not valid(kernel, tuple(out)):
        raise ValueError(f"kv-canary: {kernel} specialization {values}: PARTIAL mode needs a source; a built-in "
                         f"fold word count needs ALL mode with {FOLD_WORDS_SOURCES} sources")
    return tuple(out)


def axis_values(kernel: str, spec_: tuple) -> dict:
    """``spec_``'s values by axis name."""
    return dict(zip((name for name, _ in AXES[kernel]), spec_))


def valid(kernel: str, spec_: tuple) -> bool:
    """Whether the axis values go together: ``partial`` only where sources are folded (PARTIAL mode without sources
    folds nothing, as NONE: SPEC 1.4); a built-in ``fold_words`` only in ALL mode with FOLD_WORDS_SOURCES sources."""
    values = axis_values(kernel, spec_)
    if values.get("partial") and not values["num_sources"]:
        return False
    return not values.get("fold_words") or (values["num_sources"] == FOLD_WORDS_SOURCES and not values["partial"])


def fold_words(num_sources: int, partial: bool, source_words: list[int]) -> int:
    """The ``fold_words`` axis value of a launch folding ``num_sources`` sources of fold word counts ``source_words``:
    their common count where a kernel builds it in, else 0 (each source's own count, passed at launch)."""
    common = set(source_words)
    if partial or num_sources != FOLD_WORDS_SOURCES or len(common) != 1:
        return 0
    return next(iter(common)) if common <= set(_FOLD_WORDS) else 0


def all_specs(kernel: str) -> list[tuple]:
    """Every specialization of ``kernel`` (the product of its axes, less the combinations ``valid`` rejects)."""
    return [s for s in itertools.product(*(allowed for _, allowed in AXES[kernel])) if valid(kernel, s)]


def spec_id(spec_: tuple) -> str:
    """A short name of a specialization for file names and test ids: ``2-1``, ``0-0``, ``none``."""
    return "-".join(str(int(x)) for x in spec_) or "none"


def launch_mode(kernel: str, spec_: tuple) -> int:
    """The tuning *mode* (``tuning.workloads.mode_of``) of every launch of this specialization: verify
    or write folding sources runs in PARTIAL mode (``partial``) or ALL mode, all else in mode 0 (NONE)."""
    values = axis_values(kernel, spec_)
    if not values.get("num_sources"):
        return 0
    return int(RealKvHashMode.PARTIAL if values["partial"] else RealKvHashMode.ALL)
