"""``tvm-canary demo`` and ``selftest`` end to end on CPU (short runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tvm_canary import cli
from tvm_canary.demo.faults import KINDS

SHORT = ["--steps", "30", "--slots", "128", "--max-running", "6", "--device", "cpu", "--no-progress"]


@pytest.mark.parametrize("extra", [[], ["--swa", "--window", "4", "--real-kv", "all"]], ids=["full", "swa"])
def test_short_demo_detects_every_fault_kind(capsys, extra):
    assert cli.main(["demo", "--seed", "3", *SHORT, *extra]) == 0
    out = capsys.readouterr().out
    assert f"faults detected: {len(KINDS)}/{len(KINDS)}" in out
    assert "false positives: 0" in out
    for kind in KINDS:
        (line,) = [ln for ln in out.splitlines() if f"  {kind}  " in ln]
        assert "MISSED" not in line


def test_demo_is_repeatable(capsys):
    def table() -> list[str]:
        assert cli.main(["demo", "--seed", "5", *SHORT]) == 0
        return [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("canary time")]

    assert table() == table()


def test_selftest_via_python_m():
    done = subprocess.run([sys.executable, "-m", "tvm_canary", "selftest", "--device", "cpu"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "selftest: 4/4 faults detected" in done.stdout
