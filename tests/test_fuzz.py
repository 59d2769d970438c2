"""``tvm-canary fuzz`` on the CPU: a clean campaign, and a fault injected via the test-only ``launches``
argument: caught, written to the failures JSON with its replay command, failing the run. Seed base 0:
the differential tests' seeds (no new specializations)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tvm_canary import cases as C
from tvm_canary import fuzz
from tvm_canary.cli import build_parser


def campaign(tmp_path, *argv, launches=None) -> tuple[int, dict]:
    out = tmp_path / "fails.json"
    args = build_parser().parse_args(["fuzz", "--device", "cpu", "--seed-base", "0", *argv, "--out", str(out)])
    return fuzz.run(args, launches=launches), json.loads(out.read_text())


def test_case_order_alternates_differential_and_garbage():
    kernels = ["write", "plan"]
    assert [fuzz.case_of(i, kernels, 100) for i in range(10)] == [
        ("write", "diff:100"), ("plan", "diff:101"), ("write", "garbage:102"), ("plan", "garbage:103"),
        ("write", "long:104"), ("plan", "diff:105"), ("write", "garbage:106"), ("plan", "garbage:107"),
        ("write", "diff:108"), ("plan", "diff:109"),
    ]


def test_clean_campaign(tmp_path, capsys):
    status, report = campaign(tmp_path, "--cases", "8")
    assert status == 0
    assert report["cases"] == 8 and report["failures"] == []
    assert report["ranks"][0]["device"] == "cpu" and report["ranks"][0]["cases_per_second"] > 0
    assert "fuzz: 8 cases on 1 process, 0 failures" in capsys.readouterr().out


def test_injected_fault_is_caught_and_replayable(tmp_path, capsys):
    """Plan's write count is off by one after every launch: the campaign reports each plan case (the
    reference defines both garbage:3's and diff:1's result)."""

    def stray_write(**kw):
        C.LAUNCH["plan"](**kw)
        kw["write_plan_out"].write_num_valid_reqs.view(-1)[0] += 1

    status, report = campaign(tmp_path, "--cases", "4", "--kernels", "scatter,plan",
                              launches={**C.LAUNCH, "plan": stray_write})
    assert status == 1
    fails = report["failures"]
    assert [(f["kernel"], f["case"]) for f in fails] == [("plan", "diff:1"), ("plan", "garbage:3")]
    assert fails[0]["replay"] == "python -m tvm_canary conformance --devices cpu --kernels plan --case diff:1"
    assert "digest differs from the reference" in fails[0]["why"]
    captured = capsys.readouterr()
    assert "FAIL plan diff:1" in captured.err and "2 failures" in captured.out


def test_scratch_flags_left_non_zero_are_caught(tmp_path):
    """Conformance's per-device check (``cases.scratch_left_dirty``) applies to every fuzz case."""
    from test_conformance import flags_left_dirty

    with flags_left_dirty("verify") as launches:
        status, report = campaign(tmp_path, "--cases", "2", "--kernels", "verify", launches=launches)
    assert status == 1 and [f["case"] for f in report["failures"]] == ["diff:0", "garbage:1"]
    assert all("scratch flags" in f["why"] for f in report["failures"])


def test_stray_write_into_a_guard_band_is_caught(tmp_path):
    """Scatter writes one byte just past ``pool_out``: harmless to the digests of a differential case
    (the byte is outside every tensor), caught by the guard band of each garbage case."""

    def past_the_end(**kw):
        C.LAUNCH["scatter"](**kw)
        pool = kw["pool_out"]
        storage = torch.empty(0, dtype=torch.uint8).set_(pool.untyped_storage())
        end = pool.storage_offset() * pool.element_size() + pool.numel() * pool.element_size()
        if end < storage.numel():
            storage[end] ^= 1

    status, report = campaign(tmp_path, "--cases", "4", "--kernels", "scatter",
                              launches={**C.LAUNCH, "scatter": past_the_end})
    assert status == 1
    assert [(f["case"], f["why"]) for f in report["failures"]] == [
        ("garbage:1", "guard band after pool_out was written"), ("garbage:3", "guard band after pool_out was written")
    ]


@pytest.mark.parametrize("merged", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_reader_gone_mid_campaign_stops_it_and_the_failures_json_keeps_what_ran(tmp_path, merged):
    """``tvm-canary fuzz ... | head -1`` (or ``2>&1 | head -1``): the first case's progress line (or its failure
    line) finds the reader gone; the campaign stops there with the closed-reader status (2), and the failures JSON
    holds the failing case it ran."""
    out = tmp_path / "fails.json"
    child = f"""
import sys
from tvm_canary import cases as C, cli, fuzz
fuzz.PROGRESS_SECONDS = 0  # a progress line after every case
plan = C.LAUNCH["plan"]
def stray_write(**kw):  # test_injected_fault_is_caught_and_replayable's fault
    plan(**kw)
    kw["write_plan_out"].write_num_valid_reqs.view(-1)[0] += 1
C.LAUNCH["plan"] = stray_write
sys.exit(cli.main(["fuzz", "--device", "cpu", "--seed-base", "1", "--cases", "50", "--kernels", "plan",
                   "--out", {str(out)!r}]))
"""
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merged else subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line
    err = "" if merged else proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 2 and "Traceback" not in err, err
    assert merged or "the output's reader went away after 1 case: the campaign stopped there" in err, err
    report = json.loads(out.read_text())
    assert report["cases"] == 1 and report["ranks"][0]["output_closed"]
    assert [(f["kernel"], f["case"]) for f in report["failures"]] == [("plan", "diff:1")]
