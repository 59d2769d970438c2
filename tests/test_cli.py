"""The ``tvm-canary`` top level: --version, help with defaults, one-line errors (tvm_canary/cli.py,
tvm_canary/cliargs.py), and the selftest's --device check."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tvm_canary import cli, cliargs, selftest
from tvm_canary.runtime import compile as C

ROOT = Path(__file__).resolve().parents[1]


def run_main(argv, capsys):
    """(exit status, stdout, stderr) of ``cli.main(argv)``, whether it returns or exits."""
    try:
        status = cli.main(argv)
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def test_version(capsys):
    status, out, _ = run_main(["--version"], capsys)
    assert status == 0
    assert out == f"tvm-canary {cli.package_version()}\n"


def test_version_falls_back_to_the_source_tree(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert cli.package_version() == f"{declared} (source tree, not installed)"


def test_python_m_version():
    done = subprocess.run(
        [sys.executable, "-m", "tvm_canary", "--version"], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tvm-canary ")


def test_every_top_level_option_has_help():
    parser = cli.build_parser()
    options = [a for a in parser._actions if a.option_strings]
    assert {"--help", "--version"} <= {s for a in options for s in a.option_strings}
    assert all(a.help for a in options)


def test_help_shows_defaults_once():
    parser = cliargs.Parser(prog="p")
    parser.add_argument("--trials", type=int, default=32, help="candidates per workload")
    parser.add_argument("--steps", type=int, default=200, help="engine steps (default 200)")
    parser.add_argument("--kernels", nargs="+", default=["write"])
    parser.add_argument("--verbose", action="store_true", help="say more")
    parser.add_argument("--out", default=None, help="output folder")
    text = " ".join(parser.format_help().split())
    assert "candidates per workload (default: 32)" in text
    assert "engine steps (default 200)" in text and "(default: 200)" not in text
    assert "(default: ['write'])" in text  # an option without help still shows its default
    assert "say more" in text and "(default: False)" not in text
    assert "output folder" in text and "(default: None)" not in text


def test_usage_error_is_one_line(capsys):
    status, out, err = run_main(["no-such-command"], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("tvm-canary: error: argument COMMAND: invalid choice: 'no-such-command'")
    assert err.rstrip().endswith("(see tvm-canary --help)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's answer")
def test_selftest_cuda_without_gpu_is_a_one_line_usage_error(capsys):
    status, out, err = run_main(["selftest", "--device", "cuda"], capsys)
    assert status == 2 and out == ""
    assert err == (
        "tvm-canary selftest: error: argument --device: cuda: torch sees no CUDA device on this machine "
        "(torch.cuda.is_available() is False); use --device cpu (see tvm-canary selftest --help)\n"
    )


def test_selftest_rejects_unknown_device(capsys):
    status, _, err = run_main(["selftest", "--device", "tpu"], capsys)
    assert status == 2
    assert err.startswith("tvm-canary selftest: error: argument --device: invalid choice: 'tpu'")
    assert err.count("\n") == 1


def test_package_errors_while_running_are_one_line(monkeypatch, capsys):
    def fails(_args):
        raise RuntimeError("kv-canary: TVM sees no CUDA device (is libcudart.so.13 on LD_LIBRARY_PATH?)")

    monkeypatch.setattr(selftest, "run", fails)
    status, out, err = run_main(["selftest", "--device", "cpu"], capsys)
    assert status == 1 and out == ""
    assert err == (
        "tvm-canary selftest: error: kv-canary: TVM sees no CUDA device (is libcudart.so.13 on LD_LIBRARY_PATH?)\n"
    )


def test_conformance_and_fuzz_errors_exit_2_and_findings_1(capsys, tmp_path, monkeypatch):
    """A refused conformance or fuzz run exits 2 (their mismatching case gives 1; test_conformance and
    test_fuzz check it); other commands keep 1 for their kv-canary: errors."""
    status, out, err = run_main(["conformance", "--devices", "cpu", "--kernels", "verify", "--case",
                                 "golden:write-anchor", "--json", str(tmp_path / "c.json")], capsys)
    assert status == 2 and out == ""
    assert err == ("tvm-canary conformance: error: kv-canary: no kernel of --kernels verify has the case "
                   "golden:write-anchor\n")
    monkeypatch.setenv("LOCAL_RANK", "3")  # fuzz's default device cuda:3 on a host with one GPU (simulated)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    status, out, err = run_main(["fuzz", "--cases", "1", "--out", str(tmp_path / "f.json")], capsys)
    assert status == 2 and err == "tvm-canary fuzz: error: kv-canary: cuda:3: torch sees 1 CUDA devices\n"


@pytest.mark.parametrize("argv", [["tune", "--target", "llvm", "--rpc-key", "k"],
                                  ["build", "--target", "cuda", "-o", "x"]])
def test_runtime_only_tvm_refuses_tune_and_build(argv, monkeypatch, capsys):
    monkeypatch.setattr(C, "compiler_available", lambda: False)
    assert run_main(argv, capsys) == (1, "", f"tvm-canary {argv[0]}: error: kv-canary: tvm-canary {argv[0]} needs "
                                      "TVM's compiler, and this TVM is runtime-only\n")


def test_other_errors_keep_their_traceback(monkeypatch):
    def bug(_args):
        raise ValueError("an internal bug")

    monkeypatch.setattr(selftest, "run", bug)
    with pytest.raises(ValueError, match="an internal bug"):
        cli.main(["selftest", "--device", "cpu"])


BAD_VALUES = [
    (["fuzz", "--device", "cpu", "--cases", "0"], "argument --cases: must be at least 1, got 0"),
    (["fuzz", "--device", "cpu", "--seconds", "-1"], "argument --seconds: must be above 0, got -1"),
    (["fuzz", "--device", "cpu", "--cases", "1", "--out", "/nonexistent-folder/f.json"],
     "argument --out: /nonexistent-folder/f.json: folder /nonexistent-folder does not exist"),
    (["fuzz", "--device", "cpu", "--cases", "1", "--seed-base", str(2**64)],
     "argument --seed-base: must be below 2**62"),
    (["conformance", "--devices", "cpu,cpu"], "argument --devices: kv-canary: device 'cpu' named twice"),
    (["conformance", "--devices", ","], "argument --devices: kv-canary: no device in ','"),
    (["conformance", "--cases", "-1"], "argument --cases: must be at least 0, got -1"),
    (["conformance", "--json", "/"], "argument --json: / is a folder, not a file"),
    (["conformance", "--json", "/sys/c.json"], "argument --json: /sys/c.json: cannot write it"),
    (["conformance", "--json", "/" + "x" * 300], f"argument --json: /{'x' * 79}: File name too long"),
    (["conformance", "--case", f"diff:{2**64}"], f"argument --case: kv-canary: case id 'diff:{2**64}': the seed must "
     "fit in int64"),
    (["build", "--target", "cuda", "--arch", "sm_9", "-o", "x"], "argument --arch: expected a CUDA arch such as sm_90"),
    (["build", "--target", "cuda", "--arch", "sm_60", "-o", "x"], "argument --arch: sm_60 is older than sm_75"),
    (["demo", "--seed", str(2**64)], "argument --seed: must be below 2**62"),
    (["conformance", "--timeout", "inf"], "argument --timeout: must be at most 1e+07, got inf"),
    (["fuzz", "--device", "cpu", "--cases", "1", "--timeout", "1e15"], "argument --timeout: must be at most 1e+07"),
    (["tune", "--target", "llvm", "--time-limit", "-5"], "argument --time-limit: must be at least 0, got -5"),
    (["tune", "--target", "llvm", "--time-limit", "nan"], "argument --time-limit: must be at least 0, got nan"),
    (["tune", "--target", "llvm", "--rpc-key", "k", "--log-dir", "/etc/passwd"],
     "argument --log-dir: /etc/passwd is a file"),
    # found after parsing (cliargs.UsageError)
    (["build", "--target", "cuda", "-o", "x"], "--target cuda needs at least one --arch"),
    (["build", "--target", "llvm", "--arch", "sm_90", "-o", "x"], "--arch is for --target cuda"),
    (["build", "--target", "cuda", "--arch", "sm_90a", "-o", "x"], "--arch sm_90a: a GPU loads the modules of its "
     "compute capability (sm_90), never sm_90a's"),
    (["build", "--target", "llvm", "--tuning", "no-such-device", "-o", "x"], "no tuning database for no-such-device"),
    (["build", "--target", "llvm", "-o", "/proc/nope"],
     "argument -o/--out: /proc/nope: cannot write into /proc"),  # root too: a folder made there is the probe
    (["build", "--target", "llvm", "--tuning", "nvidia-h200-sm_90", "-o", "x"],
     "kv-canary: --tuning nvidia-h200-sm_90: not a database of llvm"),
    (["build", "--target", "cuda", "--arch", "sm_80", "--tuning", "amd-epyc", "-o", "x"],
     "kv-canary: --tuning amd-epyc: not a database of cuda-sm_80"),
    (["tune", "--target", "llvm", "--rpc-tracker", "127.0.0.1:9190"], "--rpc-tracker and --rpc-key go together"),
    (["demo", "--device", "cpu", "--cuda-graph"], "--cuda-graph needs --device cuda"),
    (["demo", "--device", "cpu", "--steps", "10"], "--steps 10 leaves too few steps for 6 faults with "
     "--sweep-interval 4: give at least 15 steps"),
    (["demo", "--device", "cpu", "--window", "8"], "--window needs --swa"),
]


@pytest.mark.parametrize("argv, message", BAD_VALUES, ids=[" ".join(a[:1] + a[-2:-1]) for a, _ in BAD_VALUES])
def test_bad_values_are_one_line_usage_errors(argv, message, capsys):
    """Counts, durations, seeds, devices, archs and output paths are checked before a command runs."""
    status, out, err = run_main(argv, capsys)
    assert status == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"tvm-canary {argv[0]}: error: {message}"), err


@pytest.mark.parametrize("script, args, message", [  # ids without "cuda" (conftest would mark them gpu)
    ("fleet_tune.py", ["--servers", "0"], "argument --servers: must be at least 1, got 0"),
    ("cuda_digest.py", ["OUT", "--against", "/nonexistent-folder"], "--against: cannot read /nonexistent-folder/dig"),
    ("cuda_digest.py", ["OUT", "--llvm", "--arch", "sm_80"], "kv-canary: --arch is for the CUDA builds"),
], ids=["fleet_tune", "digest", "digest-arch"])
def test_scripts_refuse_bad_arguments_first(script, args, message, tmp_path):
    argv = [tmp_path if a == "OUT" else a for a in args]
    done = subprocess.run([sys.executable, ROOT / "scripts" / script, *argv], capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") <= 1, done.stderr


def test_output_paths_must_be_of_the_right_kind(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    with pytest.raises(Exception, match="is a file, not a folder"):
        cliargs.output_folder(str(a_file))
    assert cliargs.output_folder(str(tmp_path / "new")) == tmp_path / "new"
    assert cliargs.output_file(str(tmp_path / "out.json")) == tmp_path / "out.json"
    assert cliargs.output_file(str(a_file)) == a_file and not (tmp_path / "out.json").exists()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "target")  # dangling: the file it names is written
    for name in ("fifo", "link"):
        assert cliargs.output_file(str(tmp_path / name)) == tmp_path / name
    assert not (tmp_path / "target").exists()


def test_tune_checks_its_log_folder_before_building(tmp_path, capsys):
    argv = ["tune", "--target", "llvm", "--kernels", "write", "--out", str(tmp_path), "--log-dir", "/proc/nope"]
    status, _, err = run_main(argv, capsys)
    assert status == 2 and err.count("\n") == 1 and "/proc/nope" in err, err


@pytest.mark.parametrize("argv", [["fuzz", "--device", "cpu", "--cases", "2"], ["conformance", "--devices", "cpu"]])
def test_a_host_that_can_build_no_module_is_refused_before_the_cases(argv, monkeypatch, capsys):
    """No C/C++ compiler and no ahead-of-time modules: one error line and status 2, not every case failing as a
    finding (status 1) with a replay command."""
    monkeypatch.setenv("CXX", "/nonexistent/cc")
    status, out, err = run_main(argv, capsys)
    assert (status, out) == (2, "") and err.startswith(f"tvm-canary {argv[0]}: error: kv-canary: building a kernel "
                                                       "module needs a C/C++ compiler"), err


@pytest.mark.parametrize("argv, status", [(["info"], 1),
                                          (["conformance", "--cases", "1", "--kernels", "scatter", "--json"], 2)])
def test_a_reader_that_goes_away_ends_the_command_quietly(argv, status, tmp_path):
    """``tvm-canary info | head -1``: the reader closes the pipe; status 1 (2 where 1 is a finding), no traceback;
    conformance's JSON report is still written (it goes before the table)."""
    report = tmp_path / "report.json"
    argv = [*argv, str(report)] if argv[-1] == "--json" else argv
    proc = subprocess.Popen([sys.executable, "-m", "tvm_canary", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == status and "Traceback" not in err, err
    assert report.is_file() == (argv[0] == "conformance")
