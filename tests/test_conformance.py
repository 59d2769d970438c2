"""``tvm-canary conformance`` on the CPU: one process, two gloo ranks under torchrun, injected faults (test-only
``launches``) caught, named and replayable. Few cases, the differential tests' seeds (no new specializations)."""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tvm_canary import cases as C
from tvm_canary import conformance
from tvm_canary.cli import build_parser
from tvm_canary.consts import VIOLATION_FIELD_EXPECTED_AUX
from tvm_canary.runtime import packing

ROOT = Path(__file__).resolve().parents[1]


def corrupt_ring(kernel: str) -> dict:
    """``cases.LAUNCH``, ``kernel``'s then flipping a bit of the ring's last word (a stray write)."""

    def launch(**kw):
        C.LAUNCH[kernel](**kw)
        kw["context"].violation_ring.view(-1)[-1] ^= 1

    return {**C.LAUNCH, kernel: launch}


def conform(tmp_path, *argv, launches=None) -> tuple[int, dict]:
    out = tmp_path / "conformance.json"
    args = build_parser().parse_args(["conformance", *argv, "--json", str(out)])
    status = conformance.run(args, launches=launches)
    return status, json.loads(out.read_text())


def test_cpu_matches_reference(tmp_path, capsys):
    status, report = conform(tmp_path, "--devices", "cpu", "--cases", "2")
    assert status == 0, capsys.readouterr()
    assert report["mismatches"] == 0 and len(report["ranks"]) == 1
    assert [d["device"] for d in report["devices"]] == ["reference", "cpu"]
    assert set(report["kernels"]) == set(C.KERNELS)
    assert report["kernels"]["write"]["cases"] == ["golden:write-anchor", "diff:0", "diff:1", "garbage:50000",
                                                   "garbage:50001"]
    for kernel, entry in report["kernels"].items():
        combined = {row["combined"] for row in entry["combined"]}
        assert len(combined) == 1, (kernel, entry["combined"])  # device and reference agree
    assert "conformance: OK" in capsys.readouterr().out


def test_corrupted_kernel_is_named_with_a_replay_command(tmp_path, capsys):
    status, report = conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "verify",
                             launches=corrupt_ring("verify"))
    assert status == 1
    assert report["mismatches"] == 3  # golden, diff:0, garbage:50000
    first = report["failures"][0]
    assert (first["device"], first["kernel"], first["case"]) == ("cpu", "verify", "golden:verify-anchor")
    assert first["replay"] == ("python -m tvm_canary conformance --devices cpu --kernels verify "
                               "--case golden:verify-anchor")
    err = capsys.readouterr().err
    assert "conformance: FAILED, 3 mismatching cases" in err and "replay: " + first["replay"] in err

    # The replay command runs just that case: it fails with the fault and passes without it.
    replay = first["replay"].split("conformance ", 1)[1].split()
    assert conform(tmp_path, *replay, launches=corrupt_ring("verify"))[0] == 1
    status, report = conform(tmp_path, *replay)
    assert status == 0 and report["kernels"]["verify"]["cases"] == ["golden:verify-anchor"]


@contextlib.contextmanager
def flags_left_dirty(kernel: str):
    """``cases.LAUNCH``, ``kernel``'s leaving its ring's last scratch word (CUDA's last-block ticket) at 1:
    digests skip scratch; the next launch would misread it. Zeroed on exit (scratch is keyed by ring address)."""

    def launch(**kw):
        C.LAUNCH[kernel](**kw)
        packing.flags_of(kw["context"].violation_ring)[-1][-1] = 1

    try:
        yield {**C.LAUNCH, kernel: launch}
    finally:
        for owned in packing._flags.values():
            for flags in owned:
                flags.zero_()


def test_scratch_flags_left_non_zero_fail_the_case(tmp_path):
    with flags_left_dirty("write") as launches:
        status, report = conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "write",
                                 launches=launches)
    assert status == 1 and report["mismatches"] == 3  # golden, diff:0, garbage:50000
    # the scratch list may hold an earlier ring's at the same address too (packing keys it by address)
    assert re.search(r"scratch flags \[\d+\] of the violation ring left non-zero", report["failures"][0]["why"])


def test_write_between_a_sources_rows_is_caught(tmp_path):
    """A column-slice source is hashed by its whole storage: a write between its rows fails the case, naming it."""

    def into_row_padding(**kw):
        C.LAUNCH["write"](**kw)
        for source in kw["context"].real_kv_sources:
            t = source.tensor
            row_bytes, stride_bytes = t.shape[1] * t.element_size(), t.stride(0) * t.element_size()
            if stride_bytes > row_bytes:
                C.storage_bytes(t)[t.storage_offset() * t.element_size() + row_bytes] ^= 0x5A

    status, report = conform(tmp_path, "--devices", "cpu", "--cases", "2", "--kernels", "write",
                             launches={**C.LAUNCH, "write": into_row_padding})
    assert status == 1
    diff = [f for f in report["failures"] if f["case"].startswith("diff:")]
    assert diff and all(re.search(r"in context\.real_kv_sources\[\d\]\.tensor", f["why"]) for f in diff), diff


@pytest.mark.parametrize("kernel", ["write", "verify"])
def test_golden_case_pins_spec_hash_vectors(tmp_path, kernel):
    """A kernel whose chain link (write: slot 1's; verify: the one its row expects) differs from SPEC 1.5 fails
    its golden case by the pinned value (named), not only by its digest."""

    def wrong_anchor(**kw):
        C.LAUNCH[kernel](**kw)
        if kernel == "write":
            kw["context"].canary_buf[1].view(-1)[16] ^= 1  # slot 1's chain link
        else:
            kw["context"].violation_ring[0, VIOLATION_FIELD_EXPECTED_AUX] ^= 1

    status, report = conform(tmp_path, "--devices", "cpu", "--cases", "0", "--kernels", kernel,
                             launches={**C.LAUNCH, kernel: wrong_anchor})
    assert status == 1
    assert "SPEC 1.5 anchor hash" in report["failures"][0]["why"]


def test_rank_mismatch_fails(tmp_path):
    """A second rank (another host or GPU) with another digest: a mismatch of that rank."""
    _, report = conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "scatter")
    rank1 = copy.deepcopy(report["ranks"][0]) | {"rank": 1}
    rank1["devices"][1]["kernels"]["scatter"][0]["digest"] = "0" * 64
    verdict = conformance.compare([report["ranks"][0], rank1], ["scatter"])
    assert [(f["rank"], f["case"]) for f in verdict["failures"]] == [(1, "diff:0")]


def test_two_gloo_ranks_under_torchrun(tmp_path):
    out = tmp_path / "ranks.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "tvm_canary",
         "conformance", "--cases", "1", "--kernels", "scatter,write", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["mismatches"] == 0
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert [(d["rank"], d["device"]) for d in report["devices"]] == [(0, "reference"), (0, "cpu"),
                                                                     (1, "reference"), (1, "cpu")]
    assert proc.stdout.count("conformance: OK") == 1  # rank 0 alone reports


def test_a_rank_whose_peers_never_join_stops_as_a_run_that_could_not_run(tmp_path):
    """One rank of two started alone waits --timeout, then stops with one kv-canary line, exit 2 (could not
    run), not 1 (a failing case) and a traceback."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "CUDA_VISIBLE_DEVICES": "", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    proc = subprocess.run([sys.executable, "-m", "tvm_canary", "conformance", "--devices", "cpu", "--cases", "1",
                           "--kernels", "scatter", "--timeout", "3"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(r"error: kv-canary: rank 0 of 2: joining the process group failed within --timeout 3 s: ",
                     proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv", [["--devices", "tpu"], ["--devices", "cuda:7"], ["--kernels", "nope"],
                                  ["--case", "diff:x"], ["--case", "golden:nope"], ["--case", "seed:3"]])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        args = build_parser().parse_args(["conformance", *argv])
        conformance.run(args)
    assert e.value.code not in (0, None)


@pytest.mark.parametrize(("text", "message"), [
    ("gpu", "kv-canary: unsupported device 'gpu' (cpu, cuda, cuda:N)"),
    ("cpu:1", "kv-canary: cpu:1: the CPU is one device (cpu)"),
    ("cpu,cpu:0", "kv-canary: device 'cpu' named twice"),
    ("cuda,cuda:0", "kv-canary: device 'cuda:0' named twice"),
    ("cuda:1", "kv-canary: cuda:1: torch sees 1 CUDA devices"),
], ids=["unknown", "cpu-index", "cpu-twice", "gpu-twice", "gpu-index"])  # no "cuda" id: it would mark them gpu
def test_devices_are_normalised_and_refused_once_each(monkeypatch, text, message):
    """Where torch sees one GPU (simulated), each device is named one way (cpu, cuda:N)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ValueError) as e:
        conformance.parse_devices(text)
    assert str(e.value) == message
    assert conformance.parse_devices("cuda,cpu:0") == ["cuda:0", "cpu"]


def test_torchrun_default_device_must_exist(monkeypatch, tmp_path):
    """Two ranks, one GPU (simulated): rank 1's default cuda:1 is refused as --devices cuda:1 is, before
    joining, by conformance and fuzz."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(conformance, "init_distributed", lambda *_: pytest.fail("joined the process group"))
    for argv in (["conformance", "--json", str(tmp_path / "c.json")],
                 ["fuzz", "--cases", "1", "--out", str(tmp_path / "f.json")]):
        args = build_parser().parse_args(argv)
        with pytest.raises(ValueError, match=r"^kv-canary: cuda:1: torch sees 1 CUDA devices$"):
            args.func(args)


def test_timeout_bounds_the_process_group(monkeypatch):
    """--timeout (default 600 s) is the group's: a rank that never arrives stops the others then, not in 30 min."""
    import torch.distributed as dist

    joined = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: joined.update(kw, backend=backend))
    for argv, seconds in ((["conformance"], 600), (["conformance", "--timeout", "42"], 42),
                          (["fuzz", "--cases", "1", "--timeout", "7.5"], 7.5)):
        args = build_parser().parse_args(argv)
        conformance.init_distributed(args.timeout)
        assert joined == {"backend": "gloo", "timeout": datetime.timedelta(seconds=seconds)}


def test_only_rank_0_checks_the_file_it_writes(monkeypatch, tmp_path):
    """--json and fuzz's --out are rank 0's: another rank's host need not have the folder (it would stop)."""
    missing = str(tmp_path / "no-such-folder" / "out.json")
    monkeypatch.setenv("RANK", "1")
    assert str(build_parser().parse_args(["conformance", "--json", missing]).json) == missing
    assert str(build_parser().parse_args(["fuzz", "--cases", "1", "--out", missing]).out) == missing
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["conformance", "--json", missing])


def test_golden_replay_runs_only_the_kernel_that_has_it(tmp_path):
    status, report = conform(tmp_path, "--case", "golden:write-anchor", "--devices", "cpu")
    assert status == 0 and list(report["kernels"]) == ["write"]


def test_plan_lut_index_past_the_end_has_the_clamped_reference(tmp_path):
    """garbage:50001's plan reads a LUT index past the end (the reference rejects it): compared with the
    reference on the clamped one (SPEC D4), not itself."""
    kw = C.CASES["plan"](torch.Generator().manual_seed(50001), "cpu", valid=False)
    with pytest.raises(ValueError, match="is outside full_to_swa_index_mapping"):
        C.REFERENCE["plan"](**kw)

    def enable_off_by_one(**kw):
        C.LAUNCH["plan"](**kw)
        kw["verify_plan_out"].enable.view(-1)[0] += 1

    argv = ("--devices", "cpu", "--kernels", "plan", "--case", "garbage:50001")
    assert conform(tmp_path, *argv)[0] == 0
    status, report = conform(tmp_path, *argv, launches={**C.LAUNCH, "plan": enable_off_by_one})
    assert status == 1 and report["failures"][0]["why"] == "digest differs from the reference in verify_plan_out.enable"


def test_a_failure_between_two_processes_replays_on_every_host():
    """A rank's reference differing from rank 0's replays under torchrun on every host (alone it would pass);
    a device differing from rank 0's reference replays alone."""
    def row(device, digest):
        case = {"case": "garbage:50001", "digest": digest, "tensors": {"x": digest}, "error": None}
        return {"device": device, "model": "m", "arch": "a", "kernels": {"plan": [case]}}

    ranks = [{"rank": 0, "host": "a", "devices": [row(conformance.REFERENCE_DEVICE, "r"), row("cuda:0", "r")]},
             {"rank": 8, "host": "b", "devices": [row(conformance.REFERENCE_DEVICE, "s"), row("cuda:0", "d")]}]
    failures = conformance.compare(ranks, ["plan"])["failures"]
    assert [(f["rank"], f["device"], f["replay"]) for f in failures] == [
        (8, conformance.REFERENCE_DEVICE, conformance.replay_across_ranks("plan", "garbage:50001")),
        (8, "cuda:0", "python -m tvm_canary conformance --devices cuda:0 --kernels plan --case garbage:50001"),
    ]
    assert failures[0]["replay"].startswith("torchrun <this run's options, on every host> -m tvm_canary conformance")


@pytest.mark.parametrize("other", [["--cases", "2"], ["--seed", "7"], ["--kernels", "plan"]])
def test_ranks_that_ran_other_cases_are_refused(tmp_path, other):
    """Cases compare by position: a rank started with another --cases, --seed or --kernels than rank 0 is a
    one-line error naming it and each kernel's first seeded case (not a golden one all ranks run)."""
    argv = ["--devices", "cpu", "--cases", "1", "--kernels", "verify"]
    _, first = conform(tmp_path, *argv)
    _, second = conform(tmp_path, *argv, *other)
    rank1 = second["ranks"][0] | {"rank": 1, "host": "b"}
    refused = conformance.other_cases([first["ranks"][0], rank1])
    assert re.match(r"kv-canary: rank 1 \(b\) runs \w+ \d+ cases from diff:\d+, rank 0 .* start every host", refused)
    assert conformance.other_cases([first["ranks"][0], first["ranks"][0] | {"rank": 1}]) is None


def test_case_set_identifies_the_generated_cases(monkeypatch, tmp_path):
    """The JSON records each kernel's case set; other cases under the same ids (another cases.py or torch)
    change it; a rank of another is refused before running."""
    _, report = conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "scatter")
    ids = report["kernels"]["scatter"]["cases"]
    assert report["kernels"]["scatter"]["case_set"] == conformance.case_set("scatter", ids)
    rank0 = {"rank": 0, "host": "a", "cases": {"scatter": ids},
             "case_set": {"scatter": conformance.case_set("scatter", ids)}}

    def other_pool(gen, device, valid=True):
        case = C.scatter_case(gen, device, valid)
        case["pool_out"].fill_(-6)
        return case

    monkeypatch.setitem(C.CASES, "scatter", other_pool)
    rank1 = rank0 | {"rank": 1, "host": "b", "case_set": {"scatter": conformance.case_set("scatter", ids)}}
    assert rank1["case_set"] != rank0["case_set"]
    assert conformance.other_cases([rank0, rank1]).startswith(
        "kv-canary: rank 1 (b) generates other scatter cases than rank 0 (a) under the same ids")


def test_ranks_are_checked_before_running(monkeypatch, tmp_path):
    """Case ids and sets are compared first: a refused run runs nothing."""
    monkeypatch.setattr(conformance, "gather", lambda obj, group: [obj, obj | {"rank": 1, "cases": {}}])
    monkeypatch.setattr(conformance, "run_local", lambda *a: pytest.fail("ran cases"))
    args = build_parser().parse_args(["conformance", "--devices", "cpu", "--cases", "1", "--kernels", "scatter"])
    with pytest.raises(ValueError, match=r"^kv-canary: rank 1 \(.*\) runs no kernel, rank 0 \(.*\) scatter 2 cases"):
        conformance.run(args)


def _recombined(report: dict) -> dict:
    """``report`` with its combined digests and mismatch count recomputed from its per-case digests."""
    verdict = conformance.compare(report["ranks"], list(report["kernels"]))
    for kernel, entry in report["kernels"].items():
        entry["combined"] = [row for row in verdict["rows"] if row["kernel"] == kernel]
    report["mismatches"] = len(verdict["failures"])
    return report


def test_against_an_earlier_run(tmp_path, capsys):
    """``--against`` compares each case with an earlier run's reference: equal runs pass; a differing digest
    fails (exit 1), naming its tensors; an edited report, other case sets or a non-report (untyped,
    unreadable): refused before anything runs (exit 2)."""
    status, earlier = conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "verify,scatter")
    assert status == 0
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    capsys.readouterr()
    status, report = conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "verify,scatter",
                             "--against", str(path))
    assert status == 0 and report["against"] == {"file": str(path), "differences": []}
    cases = sum(len(entry["cases"]) for entry in earlier["kernels"].values())
    assert f"against: OK, {cases} cases x 2 rows (the references included) equal the reference of {path}" in (
        capsys.readouterr().out)

    changed = copy.deepcopy(earlier)
    for row in changed["ranks"][0]["devices"]:
        case = row["kernels"]["scatter"][1]
        case["digest"], case["tensors"]["pool_out"] = "0" * 64, "0" * 16
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_recombined(changed)))
    status, report = conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "verify,scatter",
                             "--against", str(other))
    assert status == 1 and report["mismatches"] == 0
    assert [(d["device"], d["kernel"], d["case"]) for d in report["against"]["differences"]] == [
        ("reference", "scatter", "garbage:50000"), ("cpu", "scatter", "garbage:50000")]
    assert report["against"]["differences"][0]["why"] == f"digest differs from {other}'s reference in pool_out"
    assert "against: FAILED, 2 cases differ from" in capsys.readouterr().err

    edited, surrogate, untyped = (copy.deepcopy(earlier) for _ in "123")
    case = [r["ranks"][0]["devices"][1]["kernels"]["verify"][0] for r in (edited, surrogate, untyped)]
    case[0]["digest"], case[1]["digest"] = "0" * 64, "\ud800"  # edited: its rows say otherwise
    del case[2]["tensors"]  # read if digests differ
    refusals = {"edited": (edited, "its combined digests or mismatch count are not those of its per-case digests"),
                "not a report": ({"kernels": []}, "not a conformance report"),
                "untyped": (untyped, "not a conformance report"), "deep": ("[" * 10**5, "cannot read"),
                "surrogate": (surrogate, "not a conformance report")}
    for name, (content, message) in refusals.items():
        bad = tmp_path / f"{name}.json"
        bad.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(SystemExit) as exit_status:
            build_parser().parse_args(["conformance", "--against", str(bad)])
        assert exit_status.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"kv-canary: cannot compare with .*earlier.json: its verify case set is "):
        conform(tmp_path, "--devices", "cpu", "--cases", "2", "--kernels", "verify", "--against", str(path))
    with pytest.raises(ValueError, match="kv-canary: cannot compare with .*: it ran no plan case"):
        conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "plan", "--against", str(path))
    del earlier["kernels"]["verify"]["case_set"]  # an older version's
    path.write_text(json.dumps(earlier))
    with pytest.raises(ValueError, match="it records no verify case set"):
        conform(tmp_path, "--devices", "cpu", "--cases", "1", "--kernels", "verify", "--against", str(path))
