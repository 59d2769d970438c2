"""Torch reference of the expected-token scatter (SPEC 3.4; docs/SEMANTICS.md "Scatter")."""

from __future__ import annotations

import torch


def _wrap_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 -> int32 keeping the low 32 bits (two's complement)."""
    return (((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)).to(torch.int32)


def scatter_req_token_ids_ref(
    *, flat_in: torch.Tensor, offsets: torch.Tensor, req_pool_indices: torch.Tensor, pool_out: torch.Tensor
) -> None:
    """Copy request r's tokens ``flat_in[offsets[r] : offsets[r+1]]`` (int64) into columns
    ``0 .. L-1`` of int32 ``pool_out[req_pool_indices[r]]``, ``L = min(len_r, pool_out.shape[1])``.

    Rows whose pool index is outside ``pool_out`` are skipped; column c is written iff
    ``0 <= offsets[r] + c < len(flat_in)``; every other element of ``pool_out`` is untouched.
    Rows are applied in order (a later row wins when two share a pool row).
    """
    bs = req_pool_indices.shape[0]
    n = flat_in.shape[0]
    if bs == 0 or n == 0:
        return
    flat = flat_in.cpu()
    offs = offsets.tolist()
    rps = req_pool_indices.tolist()
    num_rows, width = pool_out.shape
    for r in range(bs):
        start = offs[r]
        length = min(offs[r + 1] - start, width)
        if length <= 0 or not 0 <= rps[r] < num_rows:
            continue
        c0 = min(max(-start, 0), length)
        c1 = min(max(n - start, c0), length)
        if c1 > c0:
            pool_out[rps[r], c0:c1] = _wrap_int32(flat[start + c0 : start + c1]).to(pool_out.device)
