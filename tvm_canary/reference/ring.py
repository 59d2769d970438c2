"""Fill-once violation ring of SPEC 2.2 / 3.5 with the deterministic order of SPEC D3."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import consts


def append_violation_rows(
    violation_ring: torch.Tensor,
    violation_write_index: torch.Tensor,
    rows: torch.Tensor | Sequence[Sequence[int]],
) -> None:
    """Append one launch's rows, given in reference order.

    ``violation_ring`` int64 ``[cap, 8]`` and ``violation_write_index`` int32 ``[1]`` are mutated in
    place: row ``k`` of ``rows`` (int64 ``[n, 8]`` tensor or a list of 8-int rows) lands in ring row
    ``w + k`` iff ``0 <= w + k < cap`` (``w`` = write index before the launch); the write index grows
    by ``n`` whether or not the rows fit. Nothing happens when ``n == 0``.
    """
    rows = torch.as_tensor(rows, dtype=torch.int64).reshape(-1, consts.VIOLATION_FIELDS)
    n = rows.shape[0]
    if n == 0:
        return
    base = int(violation_write_index[0])
    lo = max(0, -base)
    hi = min(n, violation_ring.shape[0] - base)
    if lo < hi:
        violation_ring[base + lo : base + hi] = rows[lo:hi].to(violation_ring.device)
    violation_write_index.add_(n)
