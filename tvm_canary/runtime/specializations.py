"""The one enumeration of each kernel's specializations (compile-time variants).

A specialization is the tuple of leading arguments of ``tvm_canary.kernels.<kernel>.make(*spec, geom)``;
each element is one *axis* with a fixed set of values:

* write: ``num_sources`` (real-KV sources folded, 0 = NONE mode), ``partial`` (PARTIAL mode: each
  source's fold word count built in, ``kernels.common.source_params``), ``input_assert``;
* verify: ``num_sources``, ``partial``, ``check_token``;
* plan: ``has_lut`` (SWA translation table given), ``has_pool`` (expected-token pool given);
* scatter: none.

Packing (``spec``, ``launch_mode``), ahead-of-time builds and the codegen tests (``all_specs``,
``launch_mode``) and tuning (``spec``, ``launch_mode``) all take specializations from here, so a new
variant is added in one place.
"""

from __future__ import annotations

import itertools

from ..consts import MAX_REAL_KV_SOURCES, RealKvHashMode

_SOURCES = tuple(range(MAX_REAL_KV_SOURCES + 1))
_FLAG = (False, True)

# kernel -> ((axis name, allowed values), ...) in ``make``'s argument order
AXES: dict[str, tuple[tuple[str, tuple], ...]] = {
    "write": (("num_sources", _SOURCES), ("partial", _FLAG), ("input_assert", _FLAG)),
    "verify": (("num_sources", _SOURCES), ("partial", _FLAG), ("check_token", _FLAG)),
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
        raise ValueError(f"kv-canary: {kernel} specialization {values} folds no source in PARTIAL mode")
    return tuple(out)


def _axis_values(kernel: str, spec_: tuple) -> dict:
    """``spec_``'s values by axis name."""
    return dict(zip((name for name, _ in AXES[kernel]), spec_))


def valid(kernel: str, spec_: tuple) -> bool:
    """Whether the axis values go together: ``partial`` only where sources are folded (PARTIAL mode
    without sources folds nothing, as NONE does: SPEC 1.4)."""
    values = _axis_values(kernel, spec_)
    return not values.get("partial") or values["num_sources"] > 0


def all_specs(kernel: str) -> list[tuple]:
    """Every specialization of ``kernel`` (the product of its axes, less the combinations ``valid``
    rejects)."""
    return [s for s in itertools.product(*(allowed for _, allowed in AXES[kernel])) if valid(kernel, s)]


def spec_id(spec_: tuple) -> str:
    """A short name of a specialization for file names and test ids: ``2-1``, ``0-0``, ``none``."""
    return "-".join(str(int(x)) for x in spec_) or "none"


def launch_mode(kernel: str, spec_: tuple) -> int:
    """The tuning *mode* (``tuning.workloads.mode_of``) of every launch of this specialization: verify
    or write folding sources runs in PARTIAL mode (``partial``) or ALL mode, everything else in mode 0
    (NONE)."""
    values = _axis_values(kernel, spec_)
    if not values.get("num_sources"):
        return 0
    return int(RealKvHashMode.PARTIAL if values["partial"] else RealKvHashMode.ALL)
