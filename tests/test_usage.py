"""docs/USAGE.md runs as written: its ``python`` blocks, in order, as one program (on the CPU)."""

from __future__ import annotations

import re
from pathlib import Path

USAGE = Path(__file__).resolve().parents[1] / "docs" / "USAGE.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    return BLOCK.findall(USAGE.read_text())


def test_usage_guide_runs(capsys):
    blocks = python_blocks()
    assert len(blocks) == 4  # setup, steps, reading violations, CanarySession
    namespace: dict = {"__name__": "usage_example"}
    for i, code in enumerate(blocks, 1):
        # The guide is this repository's own code: run it as written.
        exec(compile(code, f"{USAGE}:python block {i}", "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out
    shown = re.search(r"^```text\n(kv_canary violation: .*?)\n```$", USAGE.read_text(), re.MULTILINE).group(1)
    assert printed.splitlines()[0] == shown  # the output the guide shows is the output it produces
    assert "launch_tag=HEAD_K_FULL fail_reason=verify_token slot_idx=2" in printed
