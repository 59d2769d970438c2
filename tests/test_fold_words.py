"""ALL mode's built-in fold word counts (``runtime.specializations.fold_words``): seeded differential
cases of verify and write over a pair of sources of each listed count, against the torch reference.
A module of its own, so that ``--dist loadscope`` runs it beside test_differential.py."""

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
    """``prepare`` for ``run_differential``: the case's context := ALL mode over a pair of sources that
    each fold ``words`` words per token (random page sizes, row padding and bytes past the folded ones,
    drawn from ``seed`` alike on every device), the layout whose fold word count an ALL kernel builds in
    (``specializations.fold_words``); verify's canaries then hold the true folds. ``shift``: each source
    starts that many bytes into its rows (8: a start 8-byte but not 16-byte aligned, which a source may
    have, docs/SPEC.md D5)."""

    def prepare(case: dict, launch: int) -> None:
        ctx = case["context"]
        gen = torch.Generator().manual_seed(seed)
        device, slots = ctx.canary_buf.device, ctx.canary_buf.shape[0]
        sources = []
        for _ in range(2):
            page, pad = (int(x) for x in torch.randint(0, 3, (2,), generator=gen))
            page, extra = [1, 4, 16][page], 16 * pad
            nbpt = 8 * words + extra  # folded: the token's first 8 * words bytes
            source = random_source(gen, rows=slots // page + 1, page_size=page, nbpt=nbpt, read_bytes=8 * words,
                                   row_bytes=page * nbpt + shift, row_stride_bytes=page * nbpt + extra + 2 * shift,
                                   device=device)
            sources.append(dataclasses.replace(source, tensor=source.tensor[:, shift:]))
        case["context"] = dataclasses.replace(ctx, real_kv_sources=tuple(sources), real_kv_hash_mode=RealKvHashMode.ALL)
        assert packing.built_in_fold_words(case["context"]) == words  # the launch runs the built-in kernel
        if "check_verify_expected_token" in case:
            stamp_true_folds(case)

    return prepare


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("words", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_differential_built_in_fold_words(kernel, words, device):
    """ALL mode over two sources of one fold word count that a kernel builds in (``fold_words``): the
    reference's bytes and rows, on every listed count (test_differential.py's wide-token fuzz draws the
    other layouts)."""
    require(device)
    for seed in range(ITERATIONS[device] // 20):
        try:
            run_differential(kernel, device, seed, built_in_fold_layout(seed, words))
        except AssertionError as e:
            raise AssertionError(f"{kernel} on {device}, {words} words built in, seed {seed}: {e}") from e


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("words", [16, 32])
@pytest.mark.parametrize("kernel", ["verify", "write"])
def test_differential_built_in_fold_words_of_sources_not_16_byte_aligned(kernel, words, device):
    """The same over sources whose rows start 8 bytes past a 16-byte boundary, at the counts whose
    whole token rows write loads before its chain (``common.whole_row_pair``)."""
    require(device)
    for seed in range(ITERATIONS[device] // 20):
        try:
            run_differential(kernel, device, seed, built_in_fold_layout(seed, words, shift=8))
        except AssertionError as e:
            raise AssertionError(f"{kernel} on {device}, {words} words built in, 8-byte shift, seed {seed}: {e}") from e
