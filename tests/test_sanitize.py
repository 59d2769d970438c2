"""scripts/sanitize.sh (the sanitizer stage of scripts/gpu_validate.sh) passes only on a zero summary from each tool
(memcheck's and synccheck's "ERROR SUMMARY: 0 errors", racecheck's "RACECHECK SUMMARY: 0 hazards displayed") and a
passing campaign; fake ``compute-sanitizer`` and ``python3`` on PATH (the real run is on a GPU host)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_PYTHON = """#!/bin/sh
[ -n "$FAKE_ARGS_LOG" ] && echo "$@" >> "$FAKE_ARGS_LOG"
echo "fuzz: 12 cases on 1 process, 0 failures"
exit "${FAKE_FUZZ_RC:-0}"
"""
# Passes the tool's options, runs the program, reports FAKE_ERRORS_<TOOL> errors like the real tool.
FAKE_SANITIZER = """#!/bin/bash
tool=$2
while [ "$1" != python3 ]; do shift; done
"$@"; rc=$?
var="FAKE_ERRORS_$tool"; n="${!var:-0}"
[ "$n" != 0 ] && echo "========= Invalid __global__ write of size 8 bytes"
if [ "$tool" = racecheck ]; then
  echo "========= RACECHECK SUMMARY: $n hazards displayed ($n errors, 0 warnings)"
else
  echo "========= ERROR SUMMARY: $n errors"
fi
[ "$n" != 0 ] && exit 86
exit $rc
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def sanitize(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", FAKE_PYTHON), ("compute-sanitizer", FAKE_SANITIZER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    full_env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SANITIZE_SECONDS="1", **env)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "sanitize.sh"), str(tmp_path / "out")], cwd=tmp_path,
                          env=full_env, capture_output=True, text=True, timeout=60, check=False)
    return done, (tmp_path / "out" / "sanitize.log").read_text()


def test_zero_errors_pass(tmp_path):
    done, log = sanitize(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "memcheck: ========= ERROR SUMMARY: 0 errors | fuzz: 12 cases" in log
    assert "racecheck: ========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" in log
    assert "synccheck: ========= ERROR SUMMARY: 0 errors | fuzz: 12 cases" in log


def test_tools_chosen(tmp_path):
    done, log = sanitize(tmp_path, SANITIZE_TOOLS="synccheck")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in log.splitlines()] == ["warm-up (no sanitizer)", "synccheck"]


@pytest.mark.parametrize("env", [{"FAKE_ERRORS_racecheck": "3"}, {"FAKE_ERRORS_memcheck": "1"},
                                 {"FAKE_ERRORS_synccheck": "2"}, {"FAKE_FUZZ_RC": "1"}])
def test_errors_or_a_failed_campaign_fail(tmp_path, env):
    done, log = sanitize(tmp_path, **env)
    assert done.returncode == 1
    assert ("warm-up: a process failed" in log) == ("FAKE_FUZZ_RC" in env)
    if "FAKE_FUZZ_RC" not in env:
        assert "Invalid __global__ write" in log


def test_warm_up_splits_the_campaign_over_processes(tmp_path):
    """Slices of whole 16-case rounds, each from where the previous one ended; the summary adds them up."""
    args_log = tmp_path / "args.log"
    done, log = sanitize(tmp_path, SANITIZE_TOOLS="synccheck", SANITIZE_WARM_JOBS="3", SANITIZE_WARM_CASES="100",
                         SANITIZE_SEED_BASE="500", FAKE_ARGS_LOG=str(args_log))
    assert done.returncode == 0, done.stdout + done.stderr
    assert log.splitlines()[0] == "warm-up (no sanitizer): fuzz: 36 cases on 3 processes, 0 failures"
    warm = sorted(line.split() for line in args_log.read_text().splitlines() if "--cases" in line)
    assert [(w[w.index("--cases") + 1], w[w.index("--seed-base") + 1]) for w in warm] == [
        ("48", "500"), ("48", "548"), ("48", "596")]  # ceil(100 / (3 x 16)) rounds of 16
