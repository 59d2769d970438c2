"""ALL mode's built-in fold word counts (``runtime.specializations.fold_words``): seeded differential
cases of verify and write over a pair of sources of each listed count vs the torch reference. Its own
module, so ``--dist loadscope`` runs it beside test_differential.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_differential import ITERATIONS, run_differential, stamp_true_folds

from tvm_canary.cases import random_source
from tvm_canary.consts import RealKvHashMode
from tvm_canary.runtime import packing

from tree import devices, require


def built_in_fold_layout(seed: int, words: int, shift: int = 0):
    """``prepare`` for ``run_differential``: the case's context := ALL mode over a pair of sources each folding
    ``words`` words per token (``specializations.fold_words``'s built-in layout; random page sizes, row padding,
    bytes past the folded ones, drawn from ``seed`` alike on every device); verify's canaries hold the true folds.
    ``shift``: each source starts that many bytes into its rows (8: 8-byte but not 16-byte aligned, allowed by
    docs/SPEC.md section 2's launch-time rules)."""

    def prepare(case: dict, launch: int) -> None:
        ctx = case["context"]
        gen = torch.Generator().manual_seed(seed)
        device, slots = ctx.canary_buf.device, ctx.canary_buf.shape[0]
        sources = []
        for _ in range(2):
            page, pad = (int(x) for x in torch.randint(0, 3, (2,), generator=gen))
            page, extra = [1, 4, 16][page], 16 * pad
            nbpt = 8 * words + extra  # folded: the token's first 8 * words bytes
            # shifted: rows ``shift`` bytes wider, cut at the front; the stride keeps room and a multiple of 16
            source = random_source(gen, rows=slots // page + 1, page_size=page, nbpt=nbpt, read_bytes=8 * words,
                                   row_bytes=page * nbpt + shift, row_stride_bytes=page * nbpt + extra + 2 * shift,
                                   device=device)
            sources.append(dataclasses.replace(source, tensor=source.tensor[:, shift:]))
        case["context"] = dataclasses.replace(ctx, real_kv_sources=tuple(sources), real_kv_hash_mode=RealKvHashMode.ALL)
        assert packing.built_in_fold_words(case["context"]) == words  # the launch runs the built-in kernel
        if "check_verify_expected_token" in case:
            stamp_true_folds(case)

    return prepare


# (fold words, source start offset in bytes): every built-in count from 16-byte aligned starts; counts whose
# whole token rows write loads before its chain (``common.whole_row_pair``) also 8 bytes past a 16-byte boundary
LAYOUTS = [(16, 0), (32, 0), (64, 0), (128, 0), (256, 0), (16, 8), (32, 8)]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("words,shift", LAYOUTS)
@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_differential_built_in_fold_words(kernel, words, shift, device):
    """ALL mode over two sources of a built-in fold word count (``fold_words``): the reference's bytes and
    rows for every listed count and source start (test_differential.py's wide-token fuzz draws the rest)."""
    require(device)
    for seed in range(ITERATIONS[device] // 20):
        try:
            run_differential(kernel, device, seed, built_in_fold_layout(seed, words, shift))
        except AssertionError as e:
            where = f"{kernel} on {device}, {words} words built in, start +{shift} B, seed {seed}"
            raise AssertionError(f"{where}: {e}") from e
