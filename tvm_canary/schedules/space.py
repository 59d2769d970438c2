"""Turning a kernel's knobs into a MetaSchedule design space, and a tuned trace back into a Geometry.

A tuning workload is a small schedulable stand-in function (one block named ``canary``) whose shape is the tuned size
bucket. The design space samples each knob with ``sample_categorical`` and records the draw as a block annotation
``canary.<knob>``; the builder reads the annotations back and builds the real kernel with that geometry. So
MetaSchedule's own search, builder, runner and database tune, and replaying a stored trace yields the geometry again.
"""

from __future__ import annotations

import dataclasses

KNOB_FIELDS = ("blocks", "threads", "tile", "unroll", "min_blocks", "thin", "pairs")


def make_space(knobs: dict[str, list[int]], fixed=None):
    """A ScheduleFn body sampling every knob with more than one choice (uniformly); with ``fixed`` (a
    ``Geometry``), every draw is decided to that geometry's value (the trace of one known candidate)."""

    def space(sch) -> None:
        block = sch.get_sblock("canary")
        for name, choices in knobs.items():
            if len(choices) > 1:
                decision = None if fixed is None else list(choices).index(getattr(fixed, name))
                value = sch.sample_categorical(candidates=list(choices), probs=[1.0 / len(choices)] * len(choices),
                                               decision=decision)
                sch.annotate(block, f"canary.{name}", value)

    return space


def knob_values_of(knobs: dict[str, list[int]], geom) -> bool:
    """True when every knob's choices include ``geom``'s value (so ``make_space(knobs, geom)`` works)."""
    return all(getattr(geom, name) in choices for name, choices in knobs.items())


def geometry_from(mod, default):
    """The geometry (a copy of the ``Geometry`` ``default``) a scheduled workload's annotations select;
    knobs not sampled keep ``default``'s values."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    block = sch.get(sch.get_sblock("canary"))
    ann = {k: int(v) for k, v in block.annotations.items() if k.startswith("canary.")}
    values = {f: ann[f"canary.{f}"] for f in KNOB_FIELDS if f"canary.{f}" in ann}
    return dataclasses.replace(default, **values)
