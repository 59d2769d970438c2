"""scripts/gpu_validate.sh reports failed stages in its exit status, with fake ``python3`` and
``nvidia-smi`` on PATH (runs on any machine; the real run is on a GPU host)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_PYTHON = """#!/bin/sh
case "$*" in
  *"tvm_canary conformance"*) exit "${FAKE_CONFORMANCE_RC:-0}";;
  *"bench_kernels.py"*) echo "bench_kernels.py args: $*"; exit 0;;
  "-m pytest"*) echo "pytest $FAKE_PYTEST_RC"
    if [ "${FAKE_PYTEST_RC:-0}" != 0 ]; then echo "FAILED tests/test_fake.py::test_one[cuda] - RuntimeError: boom"; fi
    for i in 1 2 3 4 5 6 7 8; do echo "warning line $i"; done
    echo "1 failed, 2 passed in 0.1s"; exit "${FAKE_PYTEST_RC:-0}";;
esac
exit "${FAKE_ENV_RC:-0}"
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(tmp_path: Path, *stages: str, **env: str) -> subprocess.CompletedProcess:
    """The script copied into a scratch tree (no .gpu-bundle), run with fake tools first on PATH."""
    tree, bin_dir = tmp_path / "tree", tmp_path / "bin"
    shutil.copytree(ROOT / "scripts", tree / "scripts", dirs_exist_ok=True)  # a second run keeps OUT
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("python3", FAKE_PYTHON), ("nvidia-smi", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    full_env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", **env)
    return subprocess.run(
        ["bash", "scripts/gpu_validate.sh", str(tmp_path / "out"), *stages],
        cwd=tree, env=full_env, capture_output=True, text=True, timeout=60, check=False,
    )


def test_failed_stage_fails_the_run_and_is_named(tmp_path):
    done = run(tmp_path, "tests", FAKE_PYTEST_RC="1")
    assert done.returncode == 1
    assert "== tests: FAILED (exit status 1)" in done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith("gpu_validate: FAILED stages: tests ")


def test_a_failing_suite_names_its_failed_tests(tmp_path):
    """The failed tests' names reach the stage's log and output however long pytest's output after them;
    the whole output is kept beside it."""
    done = run(tmp_path, "tests", FAKE_PYTEST_RC="1")
    name = "FAILED tests/test_fake.py::test_one[cuda] - RuntimeError: boom"
    assert name in done.stdout
    assert name in (tmp_path / "out" / "pytest.log").read_text()
    assert "warning line 8" in (tmp_path / "out" / "tests-pytest.log").read_text()


def test_passing_stages_exit_zero(tmp_path):
    done = run(tmp_path, "tests", FAKE_PYTEST_RC="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("gpu_validate: all stages passed: tests ")


def test_broken_environment_stops_before_any_stage(tmp_path):
    done = run(tmp_path, "tests", FAKE_ENV_RC="1")
    assert done.returncode == 1
    assert "gpu_validate: FAILED: environment (scripts/gpu-env.sh, exit status 1); no stage ran" in done.stderr
    assert "pytest" not in done.stdout


def test_unknown_stage_is_refused(tmp_path):
    done = run(tmp_path, "tests", "sanity")
    assert done.returncode == 2
    assert "unknown stage 'sanity'" in done.stderr


@pytest.mark.parametrize("stage", ["conformance", "embedding", "bench"])
def test_every_stage_is_accepted_and_runs(tmp_path, stage):
    """The validation record's stages beyond the test suite run their commands (faked here), passing when they do."""
    done = run(tmp_path, stage)
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == f"gpu_validate: all stages passed: {stage} (logs in {tmp_path / 'out'})"


def test_bench_times_default_and_tuned_interleaved_and_continues_its_run(tmp_path):
    """``bench`` is the run of record's command (``--ab``); rerun on an OUT holding its JSON, it continues
    that run (``--resume``)."""
    first = run(tmp_path, "bench", BENCH_ARGS="--kernels write plan scatter")
    call = next(line for line in first.stdout.splitlines() if line.startswith("bench_kernels.py args:"))
    assert " --ab --kernels write plan scatter --json " in call and "--resume" not in call
    (tmp_path / "out" / "bench.json").write_text("{}")
    again = run(tmp_path, "bench")
    call = next(line for line in again.stdout.splitlines() if line.startswith("bench_kernels.py args:"))
    assert " --ab --resume --json " in call
    assert run(tmp_path, "bench-tuned").returncode == 2  # removed: its sweep timed the default arms only


def test_a_failing_conformance_run_fails_its_stage(tmp_path):
    done = run(tmp_path, "conformance", FAKE_ENV_RC="0", FAKE_CONFORMANCE_RC="1")
    assert done.returncode == 1
    assert "== conformance: FAILED (exit status 1)" in done.stdout
