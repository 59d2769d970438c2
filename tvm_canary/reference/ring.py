"""Fill-once violation ring of SPEC 2.2 / 3.5 with the deterministic order of SPEC D3."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import consts

# violation field name (``consts.VIOLATION_FIELD_<NAME>`` in lower case) -> its column
_COLUMN = {name.removeprefix("VIOLATION_FIELD_").lower(): getattr(consts, name)
           for name in dir(consts) if name.startswith("VIOLATION_FIELD_")}


def violation_row(**fields):
    """A violation row from its SPEC 1.2 fields, each placed in its ``consts.VIOLATION_FIELD_*`` column
    (keywords ``kernel_kind``, ``slot_idx``, ``position``, ``stored_token``, ``expected_token``,
    ``stored_chain_hash``, ``expected_aux``, ``fail_reason_bits``; all eight are needed). Ints give a
    list of 8 ints; int64 tensors of one length ``n`` give the ``[n, 8]`` tensor of ``n`` rows."""
    if set(fields) != set(_COLUMN):
        raise TypeError(f"kv-canary: a violation row takes the fields {sorted(_COLUMN)}, got {sorted(fields)}")
    columns = [None] * consts.VIOLATION_FIELDS
    for name, value in fields.items():
        columns[_COLUMN[name]] = value
    return torch.stack(columns, dim=1) if isinstance(columns[0], torch.Tensor) else columns


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
