"""Vectorized hashing and byte access for the torch reference (SPEC 1.3, 1.4, 2.1, D4, D5).

All hash values are int64 tensors holding the two's-complement bit pattern of the u64 value.
torch's ``>>`` on int64 is arithmetic, so logical shifts are emulated by masking; int64 ``*`` wraps
modulo 2^64. Every function works on any device; index tensors are int64 on the data's device.
"""

from __future__ import annotations

import torch

from .. import _consts, consts
from ..consts import RealKvHashMode
from ..context import RealKvSource

_MUL1 = _consts.to_signed_int64(_consts.SPLITMIX64_MUL1)
_MUL2 = _consts.to_signed_int64(_consts.SPLITMIX64_MUL2)
ANCHOR_HASH_I64 = _consts.to_signed_int64(_consts.ANCHOR_HASH)


def _lsr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of the u64 bit pattern held in int64 ``x`` by ``0 < k < 64``."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64_t(x: torch.Tensor) -> torch.Tensor:
    """Elementwise SplitMix64 finalizer on an int64 tensor (same bits as ``_consts.splitmix64``)."""
    x = (x ^ _lsr(x, 30)) * _MUL1
    x = (x ^ _lsr(x, 27)) * _MUL2
    return x ^ _lsr(x, 31)


def mix3_t(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Elementwise ``splitmix64(splitmix64(splitmix64(a) ^ b) ^ c)`` on broadcastable int64 tensors."""
    return splitmix64_t(splitmix64_t(splitmix64_t(a) ^ b) ^ c)


def le_words(u8: torch.Tensor) -> torch.Tensor:
    """uint8 ``[m, 8w]`` -> int64 ``[m, w]``: each 8-byte group read as a little-endian word."""
    m, nbytes = u8.shape
    shifts = torch.arange(0, 64, 8, dtype=torch.int64, device=u8.device)
    return (u8.reshape(m, nbytes // 8, 8).to(torch.int64) << shifts).sum(dim=-1)


def le_bytes(words: torch.Tensor) -> torch.Tensor:
    """int64 ``[m, w]`` -> uint8 ``[m, 8w]``: inverse of :func:`le_words`."""
    m, w = words.shape
    shifts = torch.arange(0, 64, 8, dtype=torch.int64, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 0xFF).to(torch.uint8).reshape(m, 8 * w)


def read_slot_fields(canary_buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """int64 ``[m, 4]`` (token, position, prev_hash, real_kv_hash) of canary slots ``0 <= slots < S``.

    Reads bytes 0..31 of each row of the uint8 ``[S, stride]`` buffer (any stride >= 32).
    """
    return le_words(canary_buf[slots, : _consts.CANARY_SLOT_BYTES])


def chain_hash_t(canary_buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Chain-link hash of each slot: the anchor hash where ``slot < 0``, else
    ``mix3(prev_hash, token, position)`` of the stored fields. Requires ``slots < S``."""
    out = torch.full_like(slots, ANCHOR_HASH_I64)
    stored = slots >= 0
    f = read_slot_fields(canary_buf, slots[stored])
    out[stored] = mix3_t(
        f[:, consts.CANARY_FIELD_PREV_HASH], f[:, consts.CANARY_FIELD_TOKEN], f[:, consts.CANARY_FIELD_POSITION]
    )
    return out


def source_u8(src: RealKvSource) -> torch.Tensor:
    """The source viewed as 2-D uint8 ``[rows, row_bytes]``; row ``i`` starts ``i * stride(0)`` bytes in."""
    return src.tensor.view(torch.uint8)


def slot_readable(src: RealKvSource, slots: torch.Tensor) -> torch.Tensor:
    """bool mask: ``0 <= slot`` and ``slot // page_size < rows`` (SEMANTICS "Real-KV sources")."""
    return (slots >= 0) & (torch.div(slots, src.page_size, rounding_mode="floor") < source_u8(src).shape[0])


def valid_slot_mask(num_slots: int, sources: tuple[RealKvSource, ...], mode: RealKvHashMode,
                    slots: torch.Tensor) -> torch.Tensor:
    """bool mask ``slot_ok`` of SEMANTICS D4: in ``[0, num_slots)`` and, unless mode is NONE,
    readable for every source."""
    ok = (slots >= 0) & (slots < num_slots)
    if mode != RealKvHashMode.NONE:
        for src in sources:
            ok &= slot_readable(src, slots)
    return ok


def _fold_one(src: RealKvSource, mode: RealKvHashMode, slots: torch.Tensor) -> torch.Tensor:
    """Per-source fold of SPEC 1.4 for readable ``slots``: splitmix64 over the strip's LE words.
    Reads on the source's device, returns on ``slots.device``."""
    n = _consts.PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else src.read_bytes
    u8 = source_u8(src)
    s = slots.to(u8.device)
    rows = torch.div(s, src.page_size, rounding_mode="floor")
    cols = (s - rows * src.page_size) * src.num_bytes_per_token
    ks = torch.arange(n, dtype=torch.int64, device=u8.device)
    words = le_words(u8[rows.unsqueeze(1), cols.unsqueeze(1) + ks])
    acc = torch.zeros_like(s)
    for w in range(n // 8):
        acc = splitmix64_t(acc ^ words[:, w])
    return acc.to(slots.device)


# Slots ``real_kv_fold_t`` folds at once (bounds its temporaries: 2 KB per slot of 256 bytes).
FOLD_CHUNK = 1 << 20


def real_kv_fold_t(sources: tuple[RealKvSource, ...], mode: RealKvHashMode, slots: torch.Tensor) -> torch.Tensor:
    """``real_kv_fold_sources`` of SPEC 1.4 for each slot (int64 ``[m]``); 0 when mode is NONE or
    there are no sources. Requires every slot readable for every source (see :func:`valid_slot_mask`)."""
    if mode == RealKvHashMode.NONE or not sources:
        return torch.zeros_like(slots)
    # In chunks of FOLD_CHUNK slots: the byte gather's indices take 8 bytes per folded byte (4 GB for
    # 2M slots of 256 bytes), so a whole 16M-entry plan at once would need 32 GB beside the sources.
    folded = []
    for chunk in slots.split(FOLD_CHUNK):  # at least one chunk, empty for no slots
        acc = torch.zeros_like(chunk)
        for src in sources:
            acc = splitmix64_t(acc ^ _fold_one(src, mode, chunk))
        folded.append(acc)
    return torch.cat(folded)
