"""``tvm-canary selftest``: plan -> write -> verify on a synthetic batch with injected faults.

Three requests prefill 8 tokens each (step 1); four faults are injected; one decode step (step 2)
must report each of them at the expected launch, slot and fail reason. Exit status 1 on a miss.
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
    tokens = {r: [100 * r + p for p in range(PROMPT + 1)] for r in rows}  # prompt + first output token
    table = torch.zeros(REQS + 1, 2 * PROMPT, dtype=torch.int32)
    for r in rows:
        table[r, :PROMPT] = torch.tensor(slots[r])

    def step(prefix: list[int], start: int, extend: int, out: list[int]) -> None:
        """Every row writes positions [start, start + extend) into ``out``; ``prefix`` is what is reported."""
        span = range(start, start + extend)
        session.before_forward(
            req_pool_indices=rows, prefix_lens=prefix, extend_seq_lens=[extend] * REQS,
            input_ids=[tokens[r][p] for r in rows for p in span], positions=[p for _ in rows for p in span],
            out_cache_loc=out, req_to_token=table.to(device),
            token_ids=[t for r in rows for t in tokens[r]], token_lens=[PROMPT + 1] * REQS,
        )
        kv.write(out)
        session.after_forward()

    step([0] * REQS, 0, PROMPT, [s for r in rows for s in slots[r]])
    clean = session.flush().records
    if clean:
        print("selftest: FAILED, violations on a clean batch:", *(v.line() for v in clean), sep="\n  ")
        return 1

    def field(endpoint: str, half: str, slot: int, f: int) -> None:
        session.canary_buffer(endpoint, half).view(torch.int64)[slot, f] += 1

    expected = [  # (fault, tag, slot, reason)
        ("token overwrite, HEAD K buffer", "HEAD_K_FULL", slots[1][2], FailReason.VERIFY_TOKEN_MISMATCH),
        ("position overwrite, TAIL V buffer", "TAIL_V_FULL", slots[2][5], FailReason.VERIFY_POSITION_MISMATCH),
        ("KV byte flip, K layer 1", "TAIL_K_FULL", slots[3][4], FailReason.VERIFY_REAL_KV_HASH_MISMATCH),
        ("wrong seed (prefix one short)", "HEAD_K_FULL", 3 * PROMPT + 3, FailReason.WRITE_POSITION_MISMATCH),
    ]
    field("HEAD", "K", slots[1][2], CANARY_FIELD_TOKEN)
    field("TAIL", "V", slots[2][5], CANARY_FIELD_POSITION)
    kv.flip("K", 1, slots[3][4], 3, 0x40)
    decode_slots = [3 * PROMPT + r for r in rows]
    for r, s in zip(rows, decode_slots):
        table[r, PROMPT] = s
    step([PROMPT, PROMPT, PROMPT - 1], PROMPT, 1, decode_slots)  # row 3 reports its prefix one short

    found = session.flush().records
    missed = 0
    for name, tag, slot, reason in expected:
        hit = next((v for v in found if v.tag_name == tag and v.slot == slot and reason in v.reasons), None)
        missed += hit is None
        print(f"{name:36s} " + (f"detected: {hit.line()}" if hit else f"MISSED (expected {tag} at slot {slot})"))
    print(f"selftest: {len(expected) - missed}/{len(expected)} faults detected, {len(found)} rows recorded")
    return 1 if missed else 0
