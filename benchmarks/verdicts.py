"""The two checks of a benchmark row that are not its targets, in one place for the benchmark's own table
(``bench_kernels.py``), the markdown tables (``plot.py``), the summary (``report.py``) and the comparison of two runs
(``compare.py``); ``bench_embedding.py``'s rows, of another layout, take ``BELOW_FLOOR_RATIO`` from here.

* **Floors are lower bounds.** A row whose time, in either arm of the A/B (the default geometry, and
  the tuned one where the run has it), is below one of its floors by more than the noise
  (``BELOW_FLOOR_RATIO``) says the floor is no lower bound: a floor bug, not a win. The fifteenth
  session's run found one only in the tuned arm (verify PARTIAL chain 16M in a 1024-lane grid, 0.933x
  a gather floor whose grids stopped at 512 lanes), which checking the default alone had missed.
* **Tuning never costs.** A row whose tuned geometry is not the default and whose tuned time is over
  ``TUNED_SLOWER`` times its default's. A row tuned to its default geometry launches one module in
  both arms: an A/A, whose difference is the method's noise, reported beside the check (``aa_note``).

Both are computed from a row's times, so a run recorded before a check existed is judged by it too. Needs neither a GPU
nor torch.
"""

from __future__ import annotations

BELOW_FLOOR_RATIO = 0.95  # time / floor under this: the floor is not a lower bound
TUNED_SLOWER = 1.03  # tuned / default above this fails the tuning check
# The floor family of each kernel's rows (``bench_kernels.floor_makers``; named here for the torch-free reports).
FLOOR_OF = {"verify": "gather", "write": "store", "plan": "copy", "scatter": "copy"}
# A row's floors: ``store_floor_us`` in write's rows (judged on its own: a one-token row's ``floor_us`` is the
# lower of it and the hash floor), the hash and ordered floors in bounded rows (small verifies, one-token writes).
FLOOR_KEYS = ("floor_us", "store_floor_us", "hash_floor_us", "ordered_floor_us")
# The two margins as the reports print them ("3%", "5%").
TUNED_SLOWER_PERCENT = f"{round((TUNED_SLOWER - 1) * 100)}%"
BELOW_FLOOR_PERCENT = f"{round((1 - BELOW_FLOOR_RATIO) * 100)}%"


def floor_ratios(row) -> dict:
    """Per arm of the row (``default``, and ``tuned`` where timed), its time over the highest of its
    floors: every floor must be a lower bound, so an arm must not beat the highest."""
    arms = {"default": row["us"]}
    if row.get("tuned_us"):
        arms["tuned"] = row["tuned_us"]
    floors = [row[k] for k in FLOOR_KEYS if row.get(k)]
    return {arm: min(us / f for f in floors) for arm, us in arms.items()} if floors else {}


def below_floor(row) -> dict:
    """The arms of ``row`` faster than a floor by more than the noise: arm -> ratio (empty: none)."""
    return {arm: ratio for arm, ratio in floor_ratios(row).items() if ratio < BELOW_FLOOR_RATIO}


def below_floor_arms(row) -> str:
    """``below_floor`` as text: ``default 0.910, tuned 0.930``; empty if no arm is below."""
    return ", ".join(f"{arm} {ratio_text(ratio, BELOW_FLOOR_RATIO, 3, fails_below=True)}"
                     for arm, ratio in below_floor(row).items())


def below_floor_label(row) -> str:
    """``below_floor`` as text for a list of rows: ``verify ALL chain 1024 (default 0.910, tuned 0.930)``;
    empty if no arm is below."""
    arms = below_floor_arms(row)
    return f"{row['kernel']} {row['case']} ({arms})" if arms else ""


def tuned_slower(row) -> float | None:
    """tuned / default of ``row`` if its tuned arm runs a geometry of its own and is over ``TUNED_SLOWER``
    times slower, else None (also for an A/A row: ``tuned_same_geometry``)."""
    if not row.get("tuned_us") or row.get("tuned_same_geometry"):
        return None
    ratio = row["tuned_us"] / row["us"]
    return ratio if ratio > TUNED_SLOWER else None


def aa_note(rows) -> str:
    """How many of ``rows`` were tuned to their default geometry (both arms one module, an A/A) and the
    range of their tuned / default, as a sentence to follow the tuning check's; "" if none."""
    ratios = [r["tuned_us"] / r["us"] for r in rows if r.get("tuned_us") and r.get("tuned_same_geometry")]
    if not ratios:
        return ""
    return (f" {len(ratios)} of {sum(bool(r.get('tuned_us')) for r in rows)} rows are tuned to their default "
            f"geometry, so both arms launch one module (A/A): tuned / default {min(ratios):.3f}-{max(ratios):.3f}, "
            f"the method's noise, not judged.")


def tuned_slower_labels(rows) -> list[str]:
    """``kernel case (tuned/default)`` of every row that fails the tuning check."""
    return [f"{r['kernel']} {r['case']} ({ratio_text(ratio, TUNED_SLOWER, 3)})" for r in rows
            if (ratio := tuned_slower(r)) is not None]


def ratio_text(ratio: float, limit: float, digits: int = 2, fails_below: bool = False) -> str:
    """``ratio`` to ``digits`` decimals, or as many more as put it on its side of ``limit`` (1.1004
    against 1.10 prints 1.1004, not 1.10, which reads as passing; with ``fails_below``, a check failing
    under the limit, 0.9496 against 0.95 prints 0.9496, not 0.950)."""
    def passes(x: float) -> bool:
        return x >= limit if fails_below else x <= limit

    places, text = digits, f"{ratio:.{digits}f}"
    while passes(float(text)) != passes(ratio) and places < 16:
        places += 1
        text = f"{ratio:.{places}f}"
    return text
