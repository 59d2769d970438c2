"""``tvm-canary selftest``: plan -> write -> verify on a synthetic batch with injected faults.

Three requests prefill 8 tokens each and decode one (recording nothing); four faults are injected; one more decode step
must report each at its expected launch, slot and fail reason, nothing else (else exit 1).
"""

from __future__ import annotations

import argparse

import torch

from .cliargs import default_device, summary, torch_device
from .consts import CANARY_FIELD_POSITION, CANARY_FIELD_TOKEN, FailReason
from .session import CanaryGroup, CanarySession
from .testing import KvPool

PROMPT = 8
REQS = 3


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("selftest", help="detect a few injected faults on a synthetic batch",
                              description=summary(__doc__))
    p.add_argument("--device", type=torch_device, choices=("cpu", "cuda"), default=default_device(),
                   help="where the canary buffers and kernels run (default: cuda when torch sees a GPU, else cpu)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    num_slots = 64
    kv = KvPool.paged(num_slots, gen=torch.Generator().manual_seed(0), device=device)
    session = CanarySession(
        full=CanaryGroup(num_slots=num_slots, k_sources=kv.sources("K"), v_sources=kv.sources("V")),
        device=device, write_req_capacity=REQS, write_entry_capacity=REQS * PROMPT,
        expected_token_pool_shape=(REQS + 1, 2 * PROMPT), violation_mode="quiet",
    )
    session.mark_init_finished()
    rows = list(range(1, REQS + 1))
    slots = {r: list(range(1 + (r - 1) * PROMPT, 1 + r * PROMPT)) for r in rows}  # prompt slots of row r
    tokens = {r: [100 * r + p for p in range(PROMPT + 2)] for r in rows}  # prompt + two output tokens
    table = torch.zeros(REQS + 1, 2 * PROMPT, dtype=torch.int32)
    for r in rows:
        table[r, :PROMPT + 2] = torch.tensor([*slots[r], 3 * PROMPT + r, 3 * PROMPT + REQS + r])

    def step(prefix: list[int], start: int, out: list[int]) -> list:
        """Each row writes positions ``start``.. to ``out`` after ``prefix``; the rows recorded."""
        span = range(start, start + len(out) // REQS)
        session.before_forward(
            req_pool_indices=rows, prefix_lens=prefix, extend_seq_lens=[len(span)] * REQS,
            input_ids=[tokens[r][p] for r in rows for p in span], positions=[p for _ in rows for p in span],
            out_cache_loc=out, req_to_token=table.to(device),
            token_ids=[t for r in rows for t in tokens[r]], token_lens=[PROMPT + 2] * REQS,
        )
        kv.write(out)
        session.after_forward()
        return list(session.flush().records)

    clean = step([0] * REQS, 0, [s for r in rows for s in slots[r]])
    clean += step([PROMPT] * REQS, PROMPT, [3 * PROMPT + r for r in rows])
    if clean:
        print(f"selftest: FAILED, {len(clean)} rows on a clean batch, e.g. {clean[0].line()}")
        return 1

    def field(endpoint: str, half: str, slot: int, f: int) -> None:
        session.canary_buffer(endpoint, half).view(torch.int64)[slot, f] += 1

    seed = 3 * PROMPT + 3 + REQS
    expected = [  # (fault, tag, slot, reason)
        ("token overwrite, HEAD K buffer", "HEAD_K_FULL", slots[1][2], FailReason.VERIFY_TOKEN_MISMATCH),
        ("position overwrite, TAIL V buffer", "TAIL_V_FULL", slots[2][5], FailReason.VERIFY_POSITION_MISMATCH),
        ("KV byte flip, K layer 1", "TAIL_K_FULL", slots[3][4], FailReason.VERIFY_REAL_KV_HASH_MISMATCH),
        ("wrong seed (prefix one short)", "HEAD_K_FULL", seed, FailReason.WRITE_POSITION_MISMATCH),
    ]
    field("HEAD", "K", slots[1][2], CANARY_FIELD_TOKEN)
    field("TAIL", "V", slots[2][5], CANARY_FIELD_POSITION)
    kv.flip("K", 1, slots[3][4], 3, 0x40)
    # the faults' rows, a chain-hash row at an overwritten slot's successor, the seed's on every endpoint
    explained = {(t, s, r) for _, t, s, r in expected}
    explained |= {(t, s + 1, FailReason.VERIFY_CHAIN_HASH_MISMATCH) for _, t, s, _ in expected[:2]}
    explained |= {(f"{e}_{h}_FULL", seed, expected[3][3]) for e in ("HEAD", "TAIL") for h in "KV"}
    found = step([PROMPT + 1, PROMPT + 1, PROMPT], PROMPT + 1, [seed - REQS + r for r in rows])  # row 3: one short
    missed = 0
    for name, tag, slot, reason in expected:
        hit = next((v for v in found if v.tag_name == tag and v.slot == slot and reason in v.reasons), None)
        missed += hit is None
        print(f"{name:36s} " + (f"detected: {hit.line()}" if hit else f"MISSED (expected {tag} at slot {slot})"))
    extra = [v for v in found if (v.tag_name, v.slot, v.reasons) not in explained]
    if extra:
        print(f"selftest: FAILED, {len(extra)} rows no fault explains, e.g. {extra[0].line()}")
        return 1
    print(f"selftest: {len(expected) - missed}/{len(expected)} faults detected, {len(found)} rows recorded")
    return 1 if missed else 0
