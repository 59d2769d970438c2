"""The benchmark scripts on a machine without a GPU: a one-line error instead of a traceback,
and plot.py's tables and report.py's target summary from a run's JSON (no GPU, no matplotlib needed)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_bench_without_gpu_fails_in_one_line():
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py")], capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 2
    assert res.stderr.startswith("kv-canary: bench_kernels.py needs a CUDA GPU")
    assert len(res.stderr.strip().splitlines()) == 1


def _row(kernel, case, us, floor_us, **extra):
    return dict(kernel=kernel, case=case, us=us, floor="gather 1056x128", floor_us=floor_us, bytes=1000, **extra)


def test_plot_tables_and_targets(tmp_path):
    import bench_kernels
    import plot
    import report

    rows = [
        _row("verify", "NONE chain 1048576", 30.0, 20.0, mode="NONE", order="chain", n=1 << 20, baselines={"original": 60.0}),
        _row("verify", "ALL random 4096", 11.0, 10.0, mode="ALL", order="random", n=4096, baselines={"original": 40.0}),
        _row("write", "NONE 1x32768", 4000.0, 3400.0, mode="NONE", reqs=1, shape="1x32768", chain_floor_us=3400.0),
        _row("write", "PARTIAL 1x32768", 4800.0, 3400.0, mode="PARTIAL", reqs=1, shape="1x32768", chain_floor_us=3400.0),
    ]
    bench_kernels.finish(rows)
    status = {r["case"]: (r["status"], [round(t["ratio"], 3) for t in r["targets"]]) for r in rows}
    assert status == {
        "NONE chain 1048576": ("FAIL", [1.5]),  # 1.10 x floor at >= 1M entries
        "ALL random 4096": ("PASS", [1.1]),  # 1.25 x floor at <= 64K
        "NONE 1x32768": ("FAIL", [1.176]),  # 1.15 x the register-only chain
        "PARTIAL 1x32768": ("FAIL", [1.2]),  # real-KV modes 1.10 x NONE
    }
    run = {"env": {"gpu": "test GPU"}, "arch": "sm_90", "empty_us": 2.0, "chain_ns": 100.0, "rows": rows, "complete": True}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    out = tmp_path / "tables.md"
    assert plot.main([str(path), "--markdown", str(out), "--no-png"]) == 0
    text = out.read_text()
    assert "| NONE chain 1048576 | 30.0 | gather 1056x128 | 20.0 | 1.50 | floor 1.50 <= 1.10 | FAIL | 60.0 (2.00) |" in text
    assert "Targets: 1 PASS, 3 FAIL" in text
    summary = tmp_path / "summary.md"
    assert report.main([str(path), "--markdown", str(summary)]) == 0
    lines = summary.read_text().splitlines()
    assert "| verify, >= 1M entries: <= 1.10 x floor | 0 | 1 | NONE chain 1048576 (1.50) |" in lines
    assert "| verify, <= 64K entries: <= 1.25 x floor | 1 | 0 | - |" in lines
    assert "| write, real-KV modes: <= 1.10 x NONE | 0 | 1 | PARTIAL 1x32768 (1.20) |" in lines
    assert "Rows with targets: 1 PASS, 3 FAIL." in lines
    assert "Floors as lower bounds: PASS, no row faster than its floor by more than 5%." in lines
