"""Benchmark scripts without a GPU: a one-line error; plot.py's tables and report.py's target summary from
a run's JSON (no matplotlib needed)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
@pytest.mark.parametrize("script, args", [("bench_kernels.py", []), ("ab_kernels.py", ["--base", "HEAD"]),
                                          ("hold_probe.py", []), ("bench_embedding.py", [])])
def test_gpu_benchmarks_without_gpu_fail_in_one_line(script, args):
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 2
    assert res.stderr.startswith(f"kv-canary: {script} needs a CUDA GPU")
    assert len(res.stderr.strip().splitlines()) == 1


def _row(kernel, case, us, floor_us, **extra):
    return dict(kernel=kernel, case=case, us=us, floor="gather 1056x128", floor_us=floor_us, bytes=1000, **extra)


def _render(tmp_path, rows, empty_us=1.0) -> tuple[str, list[str]]:
    """plot.py's tables (text), report.py's summary (lines) of a complete run of ``rows``."""
    import plot
    import report

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"env": {"gpu": "test GPU"}, "arch": "sm_90", "empty_us": empty_us, "chain_ns": 100.0,
                                "rows": rows, "complete": True}))
    tables, summary = tmp_path / "tables.md", tmp_path / "summary.md"
    assert plot.main([str(path), "--markdown", str(tables), "--no-png"]) == 0
    assert report.main([str(path), "--markdown", str(summary)]) == 0
    return tables.read_text(), summary.read_text().splitlines()


def test_plot_tables_and_targets(tmp_path, capsys):
    import bench_kernels
    import plot
    import report

    rows = [
        _row("verify", "NONE chain 1048576", 30.0, 20.0, mode="NONE", order="chain", n=1 << 20,
             baselines={"original": 60.0}),
        _row("verify", "ALL random 4096", 11.0, 10.0, mode="ALL", order="random", n=4096, baselines={"original": 40.0}),
        _row("write", "NONE 1x32768", 4000.0, 3400.0, mode="NONE", reqs=1, shape="1x32768", chain_floor_us=3400.0),
        _row("write", "PARTIAL 1x32768", 4800.0, 3400.0, mode="PARTIAL", reqs=1, shape="1x32768",
             chain_floor_us=3400.0),
    ]
    bench_kernels.finish(rows)
    status = {r["case"]: (r["status"], [round(t["ratio"], 3) for t in r["targets"]]) for r in rows}
    assert status == {
        "NONE chain 1048576": ("FAIL", [1.5]),  # 1.10 x floor at >= 1M entries
        "ALL random 4096": ("PASS", [1.1]),  # 1.25 x floor at <= 64K
        "NONE 1x32768": ("FAIL", [1.176]),  # 1.15 x the register-only chain
        "PARTIAL 1x32768": ("FAIL", [1.2]),  # real-KV modes 1.10 x NONE
    }
    run = {"env": {"gpu": "test GPU"}, "arch": "sm_90", "empty_us": 2.0, "chain_ns": 100.0, "rows": rows,
           "complete": True}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    out = tmp_path / "tables.md"
    assert plot.main([str(path), "--markdown", str(out), "--no-png"]) == 0
    text = out.read_text()
    assert ("| NONE chain 1048576 | 30.0 | gather 1056x128 | 20.0 | 1.50 | floor 1.50 <= 1.10 | FAIL | "
            "60.0 (2.00) |") in text
    assert "Targets: 1 PASS, 3 FAIL" in text
    summary = tmp_path / "summary.md"
    assert report.main([str(path), "--markdown", str(summary)]) == 0
    lines = summary.read_text().splitlines()
    assert "| verify, >= 1M entries: <= 1.10 x floor | 0 | 1 | NONE chain 1048576 (1.50) |" in lines
    assert "| verify, <= 64K entries: <= 1.25 x floor | 1 | 0 | - |" in lines
    assert "| write, real-KV modes: <= 1.10 x NONE | 0 | 1 | PARTIAL 1x32768 (1.20) |" in lines
    # compare.py: rows of both runs and of one; an incomplete run's summary says so
    import compare

    path.write_text(json.dumps({**run, "rows": rows[2:], "complete": False}))
    (tmp_path / "whole.json").write_text(json.dumps(run))
    assert compare.main([str(tmp_path / "whole.json"), str(path)]) == 0
    assert "only in " + str(tmp_path / "whole.json") + ": verify ALL random 4096, verify NONE chain 1048576" in (
        capsys.readouterr().out)
    assert report.main([str(path), "--markdown", str(summary)]) == 0
    assert summary.read_text().startswith(plot.INCOMPLETE)
    (tmp_path / "old.json").write_text(json.dumps({"gpu": "old GPU", "rows": []}))  # a run of the earlier bench
    assert compare.main([str(path), str(tmp_path / "old.json")]) == 2
    assert report.main([str(tmp_path / "no.json")]) == 2 and "no.json: No such file" in capsys.readouterr().err
    (tmp_path / "3.json").write_text("3")
    assert report.main([str(tmp_path / "3.json")]) == 2
    assert "Rows with targets: 1 PASS, 3 FAIL." in lines
    assert "Floors as lower bounds: PASS, no row faster than a floor by more than 5% (default or tuned arm)." in lines


def test_bounded_rows_and_their_reference_lines_per_size_range(tmp_path):
    """Verify rows up to 64K entries and ALL's at any size get hash and ordered floors (``bounded_row``);
    reference lines group them by size range, each with its limit (1M: 1.10x)."""
    import bench_kernels
    import report

    cases = (("NONE", 1 << 16), ("PARTIAL", 1 << 10), ("ALL", 1 << 24), ("NONE", 1 << 20), ("PARTIAL", 1 << 24))
    assert [bench_kernels.bounded_row(mode, n) for mode, n in cases] == [True] * 3 + [False] * 2
    bounds = {"ordered_floor": "hash + ticket 2112x32"}
    rows = [_row("verify", "ALL random 4096", 5.0, 4.0, mode="ALL", order="random", n=4096, hash_floor_us=4.5,
                 ordered_floor_us=4.6, **bounds),
            # 1.12x its gather floor, SPEC hashing alone 1.11x: past the hardware at 1.10x
            _row("verify", "ALL random 1048576", 460.0, 410.0, mode="ALL", order="random", n=1 << 20,
                 hash_floor_us=455.0, ordered_floor_us=458.0, **bounds),
            _row("verify", "NONE random 1048576", 60.0, 58.0, mode="NONE", order="random", n=1 << 20)]
    bench_kernels.finish(rows)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"env": {"gpu": "test GPU"}, "rows": rows, "complete": True}))
    summary = tmp_path / "summary.md"
    assert report.main([str(path), "--markdown", str(summary)]) == 0
    lines = [line for line in summary.read_text().splitlines() if line.startswith("| verify") or "reference" in line]
    ordered, hashed = "ordered floor (gather + SPEC hashing + ordered append)", "hash floor (gather + SPEC hashing)"
    past = "over it the target is past the hardware"
    assert lines == [
        "| verify, <= 64K entries: <= 1.25 x floor | 1 | 0 | - |",
        "| verify, >= 1M entries: <= 1.10 x floor | 1 | 1 | ALL random 1048576 (1.12) |",
        f"| (for reference) verify, <= 64K entries: <= 1.25 x {ordered} | 1 | 0 | - |",
        f"| (for reference) verify, <= 64K entries: {hashed} <= 1.25 x floor; {past} | 1 | 0 | - |",
        f"| (for reference) verify, >= 1M entries: <= 1.10 x {ordered} | 1 | 0 | - |",
        f"| (for reference) verify, >= 1M entries: {hashed} <= 1.10 x floor; {past} | 0 | 1 | "
        "ALL random 1048576 (1.110) |",
    ]


def test_plots_take_a_row_without_a_tuned_time(tmp_path):
    """A null tuned time drops the tuned series from the PNGs, not failing them."""
    pytest.importorskip("matplotlib")
    import bench_kernels
    import plot

    rows = [_row("verify", f"NONE random {n}", 3.0, 2.5, mode="NONE", order="random", n=n) for n in (1024, 4096)]
    rows += [_row("write", "NONE 4096x1", 3.2, 2.8, mode="NONE", reqs=4096, shape="4096x1")]
    for r in rows:
        r["tuned_us"] = None
    bench_kernels.finish(rows)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"env": {"gpu": "test GPU"}, "arch": "sm_90", "empty_us": 1.0, "chain_ns": 100.0,
                                "rows": rows, "complete": False}))
    assert plot.main([str(path), "--out", str(tmp_path), "--dpi", "20"]) == 0
    assert (tmp_path / "perf-verify.png").stat().st_size > 0 and (tmp_path / "perf-write.png").stat().st_size > 0


def test_real_kv_write_rows_compare_with_none_in_their_own_rounds():
    """A real-KV write row's NONE target uses NONE of its rounds (``none_us``), else its shape's NONE row."""
    import bench_kernels

    shape = dict(reqs=4096, shape="4096x1", chain_floor_us=1.0)
    rows = [_row("write", "NONE 4096x1", 3.0, 2.8, mode="NONE", **shape),
            _row("write", "PARTIAL 4096x1", 3.4, 2.9, mode="PARTIAL", none_us=3.2, **shape),
            _row("write", "ALL 4096x1", 3.4, 2.9, mode="ALL", **shape)]
    ratios = {r["case"]: [(t["what"], round(t["ratio"], 4)) for t in bench_kernels.targets_for(r, rows)] for r in rows}
    assert ratios["PARTIAL 4096x1"] == [("floor", 1.1724), ("NONE", 1.0625)]
    assert ratios["ALL 4096x1"] == [("floor", 1.1724), ("NONE", 1.1333)]


def test_the_agreement_check_reaches_every_write_size_class_and_passes_on_the_cpu():
    """Pre-timing ``baselines/agreement.py`` launches write in each CUDA size class and mode (its default);
    CPU kernels pass it."""
    from baselines import agreement

    import tvm_canary as tc
    from tvm_canary.runtime import packing, targets

    reached, cpu = set(), torch.device("cpu")
    for tokens in agreement.WRITE_TOKENS:
        gen = torch.Generator().manual_seed(1234)
        kw = agreement._write_kwargs(agreement._context(cpu, tc.consts.RealKvHashMode.ALL, gen), gen, cpu, False,
                                     tokens)
        point = packing.write_call(**kw).size  # the point choosing the launch's geometry
        reached |= {(mode, targets.size_class("write", "cuda-sm_90", mode, point)) for mode in (0, 1, 2)}
    assert reached == {(mode, c) for mode in (0, 1, 2) for c in range(len(targets.size_classes("write", "cuda", mode)))}
    assert len(targets.size_classes("write", "cuda", 1)) == 3
    launches = {"verify": tc.launch_canary_verify_kernel, "write": tc.launch_canary_write_kernel,
                "plan": tc.launch_canary_plan_kernels, "scatter": tc.launch_scatter_req_token_ids_kernel}
    for kernel, launch in launches.items():
        agreement.check(kernel, launch, cpu)


def test_a_run_resumes_only_where_it_is_the_same_run(tmp_path):
    """``--resume`` keeps finished kernels' rows, runs the rest; another GPU, driver, version, option set or default is
    refused by name; tables say how it was made."""
    import bench_kernels
    import plot

    options = {"arch": "sm_90", "ab": True, "quick": False, "baselines": ["original"], "candidates": [],
               "plan_candidates": []}
    env = {"gpu": "test GPU", "driver": "580.1", "tvm": "0.27"}
    defaults = {"verify": "2112x128m16", "write": "528x64u2", "plan": "2112x512", "scatter": "1056x256"}
    verify_row = _row("verify", "NONE chain 1048576", 30.0, 20.0, mode="NONE", order="chain", n=1 << 20)
    prior = {"env": env, **options, "default_geometries": {"verify": defaults["verify"]}, "rows": [verify_row]}
    now = {"env": env, **options, "default_geometries": defaults, "code": None}
    kernels = ["verify", "write", "plan", "scatter"]
    # verify goes on while its sweep lacks a row; finished kernels' rows kept
    assert bench_kernels.resume_run(prior, now, kernels) == ([verify_row], kernels, [])
    assert bench_kernels.resume_run(prior, now, ["write"]) == ([verify_row], ["write"], [])
    assert bench_kernels.resume_run(prior, now, ["verify", "write"], (), (1 << 20,), ("NONE",)) == (
        [verify_row], ["verify", "write"], [])  # NONE random 1048576 is missing
    whole = {**prior, "rows": [_row("verify", f"{m} {o} {n}", 30.0, 20.0, mode=m, order=o, n=n)
                               for m, o, n in sorted(bench_kernels.verify_cases())]}
    assert bench_kernels.resume_run(whole, now, kernels) == (whole["rows"], ["write", "plan", "scatter"], [])
    # --redo re-times a finished kernel's rows, even at other defaults; the part says so
    parts = [{"kernels": ["verify", "write"], "wall_s": 400.0, "empty_us": 1.3, "chain_ns": 101.0}]
    write_row = _row("write", "NONE 4096x1", 3.2, 2.8, mode="NONE", n=4096)
    both = {**prior, "rows": [*whole["rows"], write_row], "parts": parts,
            "default_geometries": {"verify": defaults["verify"], "write": "528x64u4"}}
    assert bench_kernels.resume_run(both, now, kernels, ["write"]) == (
        whole["rows"], ["write", "plan", "scatter"], [{**parts[0], "replaced": ["write"]}])
    with pytest.raises(ValueError, match="timed write's defaults"):
        bench_kernels.resume_run(both, now, kernels)
    refused = [({**now, "env": {**env, "driver": "575.0"}}, "env"), ({**now, "ab": False}, "ab"),
               ({**now, "baselines": []}, "baselines"),
               ({**now, "default_geometries": {**defaults, "verify": "1056x128m8"}}, "verify's defaults")]
    for other, what in refused:
        with pytest.raises(ValueError, match=f"--resume: the run in --json (has|timed) {what}"):
            bench_kernels.resume_run(prior, other, kernels)
    run = {"env": env, "arch": "sm_90", "empty_us": 1.2, "chain_ns": 100.9, "rows": [verify_row], "complete": False,
           "parts": [{"kernels": ["verify"], "wall_s": 378.0, "empty_us": 1.3, "chain_ns": 101.0},
                     {"kernels": ["write"], "wall_s": 186.0, "empty_us": 1.2, "chain_ns": 100.9}]}
    bench_kernels.finish(run["rows"])
    text = plot.markdown(run)
    assert ("The run was made in 2 invocations (`bench_kernels.py --resume`), each timing its rows' floors in its own "
            "process: verify in 378 s (empty launch 1.30 µs, register-only chain 101.0 ns/step); "
            "write in 186 s") in text
    run["parts"][0] = {**run["parts"][0], "kernels": ["verify", "write"], "replaced": ["write"]}
    assert ("verify, write in 378 s (empty launch 1.30 µs, register-only chain 101.0 ns/step; "
            "its write rows replaced by a later invocation's); write in 186 s") in plot.markdown(run)


class _StandInPool:
    """A KV pool for ``Bench.verify_rows`` (timing stood in: ``_stand_in_verify_work``)."""

    canary = torch.zeros(4, 32, dtype=torch.uint8)

    def __init__(self, slots=None):
        pass

    def context(self, mode):
        return type("Context", (), {"real_kv_sources": ()})()

    def flagged(self):
        return False


def _stand_in_verify_work(monkeypatch, progress) -> None:
    """``Bench.verify_rows`` GPU-less: rows 30 µs, floors 20 µs; ``progress(bench, row)`` after each."""
    import bench_kernels

    monkeypatch.setattr(bench_kernels, "stamp_chains", lambda *args: (0, 0))
    monkeypatch.setattr(bench_kernels, "verify_plans", lambda *args: [])
    for name, stand_in in (("floor_arms", lambda self, *a: {}), ("fastest_memory", lambda self, *a: (20.0, "gather")),
                           ("timed", lambda self, kernel, kws, row, arms: row.update(us=30.0) or {}),
                           ("bounds", lambda self, *a: None), ("baseline_times", lambda self, *a: None),
                           ("progress", progress)):
        monkeypatch.setattr(bench_kernels.Bench, name, stand_in)


def test_the_code_digest_covers_what_decides_a_rows_times(tmp_path, monkeypatch):
    """``code_digest`` follows kernel sources, floors, benchmark, timing, baselines (not defaults, database)."""
    import bench_kernels

    from tvm_canary import reference, timing
    from tvm_canary.runtime import compile

    files = [pathlib.Path(f).resolve() for f in bench_kernels.code_files()]
    here = pathlib.Path(bench_kernels.HERE).resolve()
    assert {*compile.source_files(), here / "floors.py", here / "bench_kernels.py", here / "baselines/original_cuda.cu",
            pathlib.Path(timing.__file__).resolve(), pathlib.Path(reference.verify.__file__).resolve()} <= set(files)
    assert all(f.is_file() for f in files) and not any({"schedules", "tune_logs"} & set(f.parts) for f in files)
    assert re.fullmatch("[0-9a-f]{16}", bench_kernels.code_digest())
    copies = [tmp_path / f"{i}.py" for i in range(len(files))]
    for copy, f in zip(copies, files):
        copy.write_bytes(f.read_bytes())
    monkeypatch.setattr(bench_kernels, "code_files", lambda: copies)
    digests = {bench_kernels.code_digest()}
    for copy in copies:
        copy.write_bytes(copy.read_bytes() + b"#")
        digests.add(bench_kernels.code_digest())
    assert len(digests) == len(copies) + 1


def test_a_run_cut_short_in_verify_goes_on_where_it_stopped(monkeypatch):
    """Verify rows saved as timed (part ``cut`` till the sweep ends); a resume times the rest; tables say so."""
    import bench_kernels
    import plot

    options = {"arch": "sm_90", "ab": True, "quick": False, "baselines": [], "candidates": [], "plan_candidates": []}
    env = {"gpu": "test GPU", "driver": "580.1", "tvm": "0.27"}
    sizes, modes = (1 << 16, 1 << 20), ("ALL",)
    wanted = bench_kernels.verify_cases(sizes, modes)
    assert wanted == {("ALL", order, n) for order in ("random", "chain") for n in sizes}
    timed = [("ALL", "random", 1 << 16), ("ALL", "random", 1 << 20), ("ALL", "chain", 1 << 16)]
    rows = [_row("verify", f"{m} {o} {n}", 30.0, 20.0, mode=m, order=o, n=n) for m, o, n in timed]
    cut = bench_kernels.part_record(["verify"], 330.0, 1.1, 100.9, sizes, modes, "verify", [r["case"] for r in rows])
    assert cut == {"kernels": ["verify"], "wall_s": 330.0, "empty_us": 1.1, "chain_ns": 100.9,
                   "verify_sizes": list(sizes), "verify_modes": list(modes), "cut": "verify",
                   "verify_rows": ["ALL random 65536", "ALL random 1048576", "ALL chain 65536"]}
    prior = {"env": env, **options, "default_geometries": {"verify": "2112x128m4"}, "rows": rows, "parts": [cut]}
    now = {"env": env, **options, "default_geometries": {"verify": "2112x128m4"}, "code": None}
    assert bench_kernels.resume_run(prior, now, ["verify"], (), sizes, modes) == (rows, ["verify"], [cut])
    # the sweep goes on only with its kept rows' code; --redo verify re-times all
    coded, stamped_cut = {**now, "code": "0123abcd4567"}, {**cut, "code": "0123abcd4567"}
    with pytest.raises(ValueError, match="rows it keeps with code none recorded, this checkout's is 0123abcd4567"):
        bench_kernels.resume_run(prior, coded, ["verify"], (), sizes, modes)
    assert bench_kernels.resume_run({**prior, "parts": [stamped_cut]}, coded, ["verify"], (), sizes, modes)[1] == [
        "verify"]
    assert bench_kernels.resume_run(prior, coded, ["verify"], ["verify"])[:2] == ([], ["verify"])
    # a part whose verify rows were all replaced (partial redo, other code) does not count
    older = {**cut, "verify_sizes": [1 << 16], "verify_rows": ["ALL random 65536"],
             "replaced_verify_sizes": [1 << 16]}
    assert bench_kernels.resume_run({**prior, "parts": [older, stamped_cut]}, coded, ["verify"], (), sizes,
                                    modes)[1] == ["verify"]
    done = [*rows, _row("verify", "ALL chain 1048576", 30.0, 20.0, mode="ALL", order="chain", n=1 << 20)]
    assert bench_kernels.resume_run({**prior, "rows": done}, now, ["verify"], (), sizes, modes)[1] == []
    # the continuing part names its row; a later redo marks each part for its rows
    went_on = bench_kernels.part_record(["verify"], 60.0, 1.1, 100.9, sizes, modes, verify_rows=["ALL chain 1048576"])
    both = {**prior, "rows": done, "parts": [cut, went_on]}
    assert bench_kernels.resume_run(both, now, ["verify"], ["verify"], (1 << 16,), modes)[2] == [
        {**cut, "replaced_verify_rows": ["ALL 65536"]}, went_on]
    assert bench_kernels.resume_run(both, now, ["verify"], ["verify"], (1 << 20,), modes)[2] == [
        {**cut, "replaced_verify_rows": ["ALL 1048576"]}, {**went_on, "replaced_verify_rows": ["ALL 1048576"]}]

    # the sweep times missing rows, handing ``timed`` each with those before it
    _stand_in_verify_work(monkeypatch, lambda self, row: None)
    stamped = []
    monkeypatch.setattr(bench_kernels, "stamp_chains", lambda bench, pool, mode, order: stamped.append(order) or (0, 0))
    bench = bench_kernels.Bench(quick=False, ab=False, baselines=(), candidates=(), verify_sizes=sizes,
                                verify_modes=modes, verify_kept=frozenset(timed))
    seen = []
    swept = bench.verify_rows(_StandInPool(), 1.0, lambda so_far: seen.append([r["case"] for r in so_far]))
    assert [r["case"] for r in swept] == ["ALL chain 1048576"] and stamped == ["chain"]
    assert seen == [["ALL chain 1048576"]]
    bench.verify_kept = frozenset()
    seen.clear()
    assert len(bench.verify_rows(_StandInPool(), 1.0, lambda so_far: seen.append(len(so_far)))) == 4
    assert seen == [1, 2, 3, 4]
    assert plot.part_text(cut).startswith("verify (ALL random 65536, 1048576; ALL chain 65536) in 330 s, "
                                          "cut short in its verify sweep (empty launch 1.10 µs")
    assert plot.part_text(went_on).startswith("verify (ALL chain 1048576) in 60 s (empty launch")
    assert plot.part_text(stamped_cut).endswith("register-only chain 100.9 ns/step, code 0123abcd4567)")


def test_main_writes_each_verify_row_and_a_resume_times_only_the_rest(tmp_path, monkeypatch, capsys):
    """``bench_kernels.main``, GPU stood in: a run cut after five verify rows keeps them, part cut;
    ``--resume`` times the rest once; a partial redo marks only the parts whose rows it replaced."""
    import bench_kernels as bk
    import floors

    from tvm_canary.runtime import targets

    class Cut(Exception):
        pass

    timed_cases, limit = [], []

    def progress(self, row):
        timed_cases.append(row["case"])
        if limit and len(timed_cases) > limit[0]:
            raise Cut

    _stand_in_verify_work(monkeypatch, progress)
    for name, stand_in in (("Launchers", lambda: type("Launchers", (), {"tag": "t"})()), ("Pool", _StandInPool),
                           ("environment", lambda: {"gpu": "test GPU", "driver": "580.1"}),
                           ("default_labels", lambda kernel, tag: "2112x128m4"), ("graph_time_us", lambda fns: 2.0),
                           ("finish", lambda rows: None), ("print_table", lambda *args: None)):
        monkeypatch.setattr(bk, name, stand_in)
    monkeypatch.setattr(bk.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bk, "DEV", bk.torch.device("cpu"))
    monkeypatch.setattr(targets, "cuda_arch", lambda index: "sm_90")
    for name, stand_in in (("compile_cuda", lambda *args: lambda *a, **kw: None), ("empty", lambda: None),
                           ("chain", lambda: None)):
        monkeypatch.setattr(floors, name, stand_in)
    for name in ("start_probes", "prebuild_floors", "load_baselines"):
        monkeypatch.setattr(bk.Bench, name, lambda self, *a: None)
    for kernel in ("write", "plan", "scatter"):
        monkeypatch.setattr(bk.Bench, f"{kernel}_rows", lambda self, *a, kernel=kernel: [
            {"kernel": kernel, "case": kernel, "us": 1.0}])
    out = str(tmp_path / "run.json")

    def run(*argv, cut_after=None):
        timed_cases.clear()
        limit[:] = [cut_after] if cut_after else []
        with contextlib.suppress(Cut):
            return bk.main(["--quick", "--baselines", "--json", out, *argv])

    def saved():
        with open(out) as f:
            return json.load(f)

    run("--kernels", "verify", cut_after=5)
    first = saved()
    assert [r["case"] for r in first["rows"]] == timed_cases[:5] and not first["complete"]
    (cut,) = first["parts"]
    assert cut["kernels"] == ["verify"] and cut["cut"] == "verify" and cut["verify_rows"] == timed_cases[:5]
    assert cut["code"] == bk.code_digest()
    with monkeypatch.context() as changed:  # another checkout does not continue the sweep
        changed.setattr(bk, "code_digest", lambda: "0" * 16)
        assert run("--kernels", "verify", "--resume") == 2 and saved() == first
        assert "rows it keeps with code " + cut["code"] in capsys.readouterr().err
    assert run("--kernels", "verify", "write", "plan", "scatter", "--resume") == 0
    whole = saved()
    cases = sorted(f"{m} {o} {n}" for m, o, n in bk.verify_cases(quick=True))
    assert sorted(r["case"] for r in whole["rows"] if r["kernel"] == "verify") == cases and whole["complete"]
    assert sorted(cut["verify_rows"] + timed_cases) == sorted(cases)  # each row timed once
    assert whole["parts"][0] == cut and whole["parts"][1]["verify_rows"] == timed_cases
    assert run("--kernels", "verify", "--resume", "--redo", "verify", "--verify-modes", "ALL", "--verify-sizes",
               "1024") == 0
    redone = saved()["parts"]
    assert timed_cases == ["ALL random 1024", "ALL chain 1024"] and "verify_rows" not in redone[2]
    marked = [p.get("replaced_verify_rows") for p in redone[:2]]
    assert marked == [["ALL 1024"] if any(c.startswith("ALL ") and c.endswith(" 1024") for c in p["verify_rows"])
                      else None for p in (cut, whole["parts"][1])]
    assert not os.path.exists(out + ".tmp")


def test_a_run_redoes_only_the_verify_sizes_asked_for():
    """``--redo verify --verify-sizes``: those sizes only; a kept row of a changed default is refused naming
    the size to add; parts and tables name them."""
    import bench_kernels
    import plot

    options = {"arch": "sm_90", "ab": True, "quick": False, "baselines": [], "candidates": [], "plan_candidates": []}
    env = {"gpu": "test GPU", "driver": "580.1", "tvm": "0.27"}
    old = "2112x128m4, PARTIAL 2112x128m2wp, PARTIAL >= 16385 1056x128m8, PARTIAL >= 262145 1056x512m2"
    new = "2112x128m4, PARTIAL 2112x128m2wp, PARTIAL >= 16385 1056x128m8, PARTIAL >= 262145 2112x512m2"
    assert [bench_kernels.verify_default_of(new, mode, n) for mode, n in
            (("NONE", 1 << 24), ("PARTIAL", 4096), ("PARTIAL", 16385), ("PARTIAL", 262144), ("PARTIAL", 262145))] == [
        "2112x128m4", "2112x128m2wp", "1056x128m8", "1056x128m8", "2112x512m2"]
    rows = [_row("verify", f"{mode} chain {n}", 3.0, 2.0, mode=mode, order="chain", n=n)
            for mode in ("NONE", "PARTIAL") for n in (1 << 16, 1 << 20, 1 << 22)]
    write_row = _row("write", "NONE 4096x1", 3.2, 2.8, mode="NONE", n=4096)
    parts = [{"kernels": ["verify", "write"], "wall_s": 400.0, "empty_us": 1.3, "chain_ns": 101.0}]
    prior = {"env": env, **options, "default_geometries": {"verify": old, "write": "528x64u2"},
             "rows": [*rows, write_row], "parts": parts}
    now = {"env": env, **options, "default_geometries": {"verify": new}, "code": None}
    kept, kernels, marked = bench_kernels.resume_run(prior, now, ["verify"], ["verify"], (1 << 20, 1 << 22))
    assert kept == [rows[0], rows[3], write_row] and kernels == ["verify"]
    assert marked == [{**parts[0], "replaced_verify_sizes": [1 << 20, 1 << 22]}]
    with pytest.raises(ValueError, match="rows it keeps with code none recorded, this checkout's is 5db6"):
        bench_kernels.resume_run(prior, {**now, "code": "5db6"}, ["verify"], ["verify"], (1 << 20, 1 << 22))
    with pytest.raises(ValueError, match="timed verify PARTIAL chain 4194304 at 1056x512m2, this checkout's default "
                                         "there is 2112x512m2: give --verify-sizes 4194304 too"):
        bench_kernels.resume_run(prior, now, ["verify"], ["verify"], (1 << 20,))
    # a whole verify redo names the kernel, not sizes
    assert bench_kernels.resume_run({**prior, "parts": marked}, now, ["verify"], ["verify"])[2] == [
        {**parts[0], "replaced": ["verify"]}]
    # a part of some sizes alone is marked for those; earlier marks stay
    later = {"kernels": ["verify"], "wall_s": 60.0, "empty_us": 1.2, "chain_ns": 100.9, "verify_sizes": [1 << 22]}
    again = {**prior, "default_geometries": {**prior["default_geometries"], "verify": new}, "parts": [*marked, later]}
    assert bench_kernels.resume_run(again, now, ["verify"], ["verify"], (1 << 20,))[2] == [*marked, later]
    assert bench_kernels.resume_run(again, now, ["verify"], ["verify"], (1 << 22,))[2] == [
        *marked, {**later, "replaced_verify_sizes": [1 << 22]}]
    assert bench_kernels.resume_run(again, now, ["verify"], ["verify"], (1 << 16,))[2] == [
        {**parts[0], "replaced_verify_sizes": [1 << 16, 1 << 20, 1 << 22]}, later]
    # a part names verify's sizes only if it timed verify
    assert bench_kernels.part_record(["verify"], 90.0, 1.2, 100.9, (1 << 20,)) == {
        "kernels": ["verify"], "wall_s": 90.0, "empty_us": 1.2, "chain_ns": 100.9, "verify_sizes": [1 << 20]}
    assert "verify_sizes" not in bench_kernels.part_record(["write"], 90.0, 1.2, 100.9, (1 << 20,))
    assert "verify_sizes" not in bench_kernels.part_record(["verify"], 90.0, 1.2, 100.9)
    # --verify-sizes/--verify-modes need verify rows to time, of preset sizes
    assert bench_kernels.verify_rows_problem([1 << 20], [], False, ["verify", "write"]) is None
    assert "sizes are 1024, 4096, 65536, 1048576" in bench_kernels.verify_rows_problem([1 << 22], [], True, ["verify"])
    for sizes, modes in (([1 << 20], []), ([], ["ALL"])):
        assert "this invocation times none" in bench_kernels.verify_rows_problem(sizes, modes, False, ["write"])
    # rows in the sweeps' order, wherever a later part put them
    shuffled = [write_row, rows[4], rows[0], rows[3], rows[1]]
    assert sorted(shuffled, key=bench_kernels.row_order) == [rows[0], rows[1], rows[3], rows[4], write_row]
    run = {"env": env, "arch": "sm_90", "empty_us": 1.2, "chain_ns": 100.9, "rows": kept[:2], "complete": False,
           "parts": [*marked, {"kernels": ["verify"], "wall_s": 90.0, "empty_us": 1.2, "chain_ns": 100.9,
                               "verify_sizes": [1 << 20, 1 << 22]}]}
    bench_kernels.finish(run["rows"])
    assert ("verify, write in 400 s (empty launch 1.30 µs, register-only chain 101.0 ns/step; its verify (1048576, "
            "4194304 entries) rows replaced by a later invocation's); verify (1048576, 4194304 entries) in 90 s"
            ) in plot.markdown(run)


def test_a_run_redoes_only_the_verify_modes_and_sizes_asked_for():
    """``--redo verify --verify-modes ALL --verify-sizes ...``: ALL's rows of those sizes only; a kept row of
    a changed default is refused naming mode or size; parts and tables record it."""
    import bench_kernels
    import plot

    options = {"arch": "sm_90", "ab": True, "quick": False, "baselines": [], "candidates": [], "plan_candidates": []}
    env = {"gpu": "test GPU", "driver": "580.1", "tvm": "0.27"}
    old = "2112x128m4, ALL 528x32m2wpp, ALL >= 16385 528x128m2w"
    new = "2112x128m4, ALL 528x32m2wpp, ALL >= 16385 2112x256m4p"
    rows = {(mode, n): _row("verify", f"{mode} random {n}", 3.0, 2.0, mode=mode, order="random", n=n)
            for mode in ("NONE", "ALL") for n in (1 << 12, 1 << 16, 1 << 20)}
    first = {"kernels": ["verify"], "wall_s": 300.0, "empty_us": 1.3, "chain_ns": 101.0}
    second = {**first, "wall_s": 200.0, "verify_sizes": [1 << 20]}
    first_marked = {**first, "replaced_verify_sizes": [1 << 20]}
    prior = {"env": env, **options, "default_geometries": {"verify": old}, "rows": list(rows.values()),
             "parts": [first_marked, second]}
    now = {"env": env, **options, "default_geometries": {"verify": new}, "code": None}
    kept, _, marked = bench_kernels.resume_run(prior, now, ["verify"], ["verify"], (1 << 16, 1 << 20), ("ALL",))
    assert kept == [rows[k] for k in (("NONE", 1 << 12), ("NONE", 1 << 16), ("NONE", 1 << 20), ("ALL", 1 << 12))]
    assert marked == [{**first, "replaced_verify_sizes": [1 << 20], "replaced_verify_rows": ["ALL 65536"]},
                      {**second, "replaced_verify_rows": ["ALL 1048576"]}]
    for sizes, modes, add in (((1 << 20,), ("ALL",), "--verify-sizes 65536"),
                              ((1 << 16, 1 << 20), ("NONE",), "--verify-modes ALL"),
                              ((1 << 20,), ("NONE",), "--verify-sizes 65536 and --verify-modes ALL")):
        with pytest.raises(ValueError, match=f"timed verify ALL random 65536 at 528x128m2w, this checkout's default "
                                             f"there is 2112x256m4p: give {add} too"):
            bench_kernels.resume_run(prior, now, ["verify"], ["verify"], sizes, modes)
    # a quick run's part timed quick sizes: a redo of ALL replaces only those rows
    quick_marked = bench_kernels.resume_run({**prior, "quick": True, "parts": [first]}, {**now, "quick": True},
                                            ["verify"], ["verify"], (), ("ALL",))[2]
    quick_rows = [f"ALL {n}" for n in bench_kernels.VERIFY_SIZES["quick"]]
    assert quick_marked == [{**first, "replaced_verify_rows": quick_rows}]
    # rows replaced in every mode make a whole size; a part names its modes
    assert bench_kernels.replaced_verify_keys({(m, 1 << 16) for m in bench_kernels.MODES} | {("NONE", 1 << 12)}) == {
        "replaced_verify_sizes": [1 << 16], "replaced_verify_rows": ["NONE 4096"]}
    later = bench_kernels.part_record(["verify"], 90.0, 1.2, 100.9, (1 << 16, 1 << 20), ("ALL",))
    assert later == {**first, "wall_s": 90.0, "empty_us": 1.2, "chain_ns": 100.9, "verify_sizes": [1 << 16, 1 << 20],
                     "verify_modes": ["ALL"]}
    run = {"env": env, "arch": "sm_90", "empty_us": 1.2, "chain_ns": 100.9, "rows": kept, "complete": False,
           "parts": [*marked, later]}
    bench_kernels.finish(run["rows"])
    assert ("verify in 300 s (empty launch 1.30 µs, register-only chain 101.0 ns/step; its verify (1048576 entries; "
            "ALL 65536) rows replaced by a later invocation's); verify (1048576 entries) in 200 s (empty launch "
            "1.30 µs, register-only chain 101.0 ns/step; its verify (ALL 1048576) rows replaced by a later "
            "invocation's); verify (ALL; 65536, 1048576 entries) in 90 s") in plot.markdown(run)


def test_a_resumed_run_reports_the_timing_of_the_write_rows_it_holds():
    """Empty launch and register-only chain come from the part of the kept write rows; every kernel's
    rows (verify's of each mode and size) make a run complete."""
    import bench_kernels

    first = {"kernels": ["write", "plan", "scatter"], "wall_s": 250.0, "empty_us": 1.34, "chain_ns": 100.9,
             "replaced": ["write"]}
    redone = {"kernels": ["write"], "wall_s": 300.0, "empty_us": 1.17, "chain_ns": 101.0}
    verify = {"kernels": ["verify"], "wall_s": 200.0, "empty_us": 1.14, "chain_ns": 101.1}
    assert bench_kernels.run_timing([first, redone, verify]) == {"empty_us": 1.17, "chain_ns": 101.0}
    assert bench_kernels.run_timing([{**first, "replaced": []}, verify]) == {"empty_us": 1.34, "chain_ns": 100.9}
    assert bench_kernels.run_timing([verify]) == {"empty_us": 1.14, "chain_ns": 101.1}
    rows = [{"kernel": k, "n": n, "mode": m, "order": o} for k in ("verify", "write", "plan")
            for n in bench_kernels.VERIFY_SIZES["full"] for m in bench_kernels.MODES for o in bench_kernels.ORDERS]
    assert not bench_kernels.complete(rows) and bench_kernels.complete([*rows, {"kernel": "scatter"}])
    cut = [r for r in rows if (r["kernel"], r["mode"], r["order"], r["n"]) != ("verify", "ALL", "chain", 1 << 24)]
    assert not bench_kernels.complete([*cut, {"kernel": "scatter"}])  # cut in ALL chain: every (mode, size) there
    some_sizes = [r for r in rows if r["kernel"] != "verify" or r["n"] == 1 << 20] + [{"kernel": "scatter"}]
    assert not bench_kernels.complete(some_sizes)  # verify at some sizes alone (--verify-sizes)
    some_modes = [r for r in rows if r["kernel"] != "verify" or r["mode"] == "ALL"] + [{"kernel": "scatter"}]
    assert not bench_kernels.complete(some_modes)  # verify in some modes alone (--verify-modes)
    quick = [r for r in rows if r["kernel"] != "verify" or r["n"] in bench_kernels.VERIFY_SIZES["quick"]]
    assert bench_kernels.complete([*quick, {"kernel": "scatter"}], quick=True)
    assert not bench_kernels.complete([*quick, {"kernel": "scatter"}])


def test_a_ratio_is_printed_on_its_side_of_the_limit():
    """Two decimals, more where a ratio just over its limit would read as it."""
    import verdicts

    assert [verdicts.ratio_text(r, 1.10) for r in (1.0951, 1.10, 1.1004, 1.109, 1.10004)] == [
        "1.10", "1.10", "1.1004", "1.11", "1.10004"]
    assert [verdicts.ratio_text(r, 1.25, 3) for r in (1.3333, 1.25004)] == ["1.333", "1.25004"]
    assert verdicts.ratio_text(1.2, 1.25, 17) == f"{1.2:.17f}"


def test_ratios_just_over_a_limit_do_not_read_as_the_limit(tmp_path):
    """A row 1.2505x its floors prints 1.2505 in plot.py and report.py, not 1.25 (read as passing)."""
    import bench_kernels

    rows = [_row("verify", "NONE chain 1024", 2.5010, 2.0, mode="NONE", order="chain", n=1024, hash_floor_us=2.0,
                 hash_floor="hash 2112x32", ordered_floor_us=2.0, ordered_floor="hash + ticket 2112x32")]
    bench_kernels.finish(rows)
    text, lines = _render(tmp_path, rows)
    assert "| NONE chain 1024 | 2.5 | gather 1056x128 | 2.0 | 1.2505 | floor 1.2505 <= 1.25 | FAIL |" in text
    assert "| NONE chain 1024 | 2.5 | 2.0 (1.2505) | 2.0 (1.2505) | hash + ticket 2112x32 | 2.0 (1.2505) |" in text
    assert ("| (for reference) verify, <= 64K entries: <= 1.25 x ordered floor (gather + SPEC hashing + ordered "
            "append) | 0 | 1 | NONE chain 1024 (1.2505) |") in lines


def test_checks_failing_just_past_their_limit_do_not_read_as_the_limit():
    """The tuning check fails over 1.03 and the floor check under 0.95: 1.0304 and 0.9496 print so, not 1.030 and
    0.950 (plot.py, report.py and compare.py take these texts)."""
    import verdicts

    assert verdicts.ratio_text(0.9496, 0.95, 3, fails_below=True) == "0.9496"
    assert verdicts.ratio_text(0.9504, 0.95, 3, fails_below=True) == "0.950"
    row = _row("verify", "NONE random 65536", 1.0304, 1.0, tuned_us=1.0304 ** 2, tuned_geometry="264x128")
    assert verdicts.tuned_slower_labels([row]) == ["verify NONE random 65536 (1.0304)"]
    assert verdicts.below_floor_arms(_row("verify", "NONE chain 65536", 0.9496, 1.0)) == "default 0.9496"


def test_reports_say_first_what_a_reader_must_know_of_the_run(tmp_path):
    """An older bench's part stored as complete (a kernel's rows missing), a quick run, the run's warnings, a baseline
    whose stamped bytes differ (its cell says so, not a time); a row without a tuned time is no A/B row; an
    ab_kernels.py run (an env, rows of times per arm) is refused in one line."""
    import plot
    import report

    rows = [_row(k, "c", 2.0, 1.0, baselines={"original": 3.0, "triton": 4.0}, tuned_us=None)
            for k in plot.verdicts.FLOOR_OF]
    rows[1]["byte_mismatch"] = ["triton"]
    run = {"env": {}, "rows": rows, "complete": True, "quick": True, "warnings": ["triton write c: bytes differ"]}
    assert plot.caveats(run) == [plot.QUICK, "Warning from the run: triton write c: bytes differ"]
    assert plot.caveats({**run, "rows": rows[:1], "quick": False, "warnings": []}) == [plot.INCOMPLETE]
    tables, summary = plot.markdown(run), report.summary(run)
    assert "| 3.0 (1.50) | bytes differ |" in tables and tables.count("bytes differ") == 2  # the cell, the warning
    assert all(caveat in text for caveat in plot.caveats(run) for text in (tables, summary))
    assert "Tuned vs default" not in summary and "tuned µs" not in tables
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps({"env": {"gpu": "test GPU"}, "rows": [{"us": {"A": 1.0, "B": 1.1}}]}))
    assert plot.load(str(ab), "report.py") is None


def test_a_row_at_its_limit_passes_its_reference_lines_as_its_target(tmp_path):
    """Reference lines compare as targets: 1.8 / 1.44 is 1.25, passing (1.8 > 1.25 * 1.44 rounds up: failed)."""
    import bench_kernels

    rows = [_row("verify", "NONE chain 1024", 1.8, 1.44, mode="NONE", order="chain", n=1024, hash_floor_us=1.44,
                 hash_floor="hash 2112x32", ordered_floor_us=1.44, ordered_floor="hash + ticket 2112x32")]
    bench_kernels.finish(rows)
    _, lines = _render(tmp_path, rows)
    assert rows[0]["status"] == "PASS"
    assert [line.split(" | ")[1:3] for line in lines if line.startswith("| (for reference)")] == [["1", "0"]] * 2


def test_a_write_kernel_under_its_store_floor_is_a_floor_bug():
    """One-token write: target floor min(store, hash); over 5% under store fails "floors as lower bounds"."""
    import bench_kernels

    shape = dict(mode="NONE", reqs=4096, shape="4096x1", chain_floor_us=1.0, hash_floor_us=2.80,
                 ordered_floor_us=2.85)
    rows = [_row("write", "NONE 4096x1", 2.82, 2.80, store_floor_us=3.0, **shape),
            _row("write", "NONE 4096x1", 2.9, 2.80, store_floor_us=3.0, **shape)]
    bench_kernels.finish(rows)
    assert [r["below_floor"] for r in rows] == [True, False]
    assert rows[0]["floor_ratios"] == pytest.approx({"default": 2.82 / 3.0})


def test_small_verify_rows_report_their_bounds(tmp_path):
    """Small verify rows' hash and ordered floors: a plot.py table, report.py reference lines (target vs
    gather floor); over 5% faster than a floor is a floor bug."""
    import bench_kernels

    rows = [
        _row("verify", "NONE random 1024", 5.0, 3.0, mode="NONE", order="random", n=1024, hash_floor_us=3.2,
             hash_floor="hash 2112x64", ordered_floor_us=4.2, ordered_floor="hash 2112x64 + launch"),
        _row("verify", "ALL random 4096", 11.0, 6.0, mode="ALL", order="random", n=4096, hash_floor_us=8.0,
             hash_floor="hash 2112x64", ordered_floor_us=9.5, ordered_floor="hash + ticket 2112x64"),
        _row("verify", "PARTIAL chain 1024", 4.0, 3.5, mode="PARTIAL", order="chain", n=1024, hash_floor_us=3.6,
             hash_floor="hash 1056x128", ordered_floor_us=4.4, ordered_floor="hash + ticket 1056x128"),
    ]
    bench_kernels.finish(rows)
    assert [(r["status"], r["below_floor"]) for r in rows] == [("FAIL", False), ("FAIL", False), ("PASS", True)]
    tables, lines = _render(tmp_path, rows)
    assert "| NONE random 1024 | 5.0 | 3.0 (1.67) | 3.2 (1.56) | hash 2112x64 + launch | 4.2 (1.19) |" in tables
    assert ("| verify, <= 64K entries: <= 1.25 x floor | 1 | 2 | NONE random 1024 (1.67), ALL random 4096 (1.83) |"
            in lines)
    assert ("| (for reference) verify, <= 64K entries: <= 1.25 x ordered floor "
            "(gather + SPEC hashing + ordered append) | 3 | 0 | - |") in lines
    # ALL random 4096's hashing alone: 1.333x its gather floor, past the hardware at 1.25x
    assert ("| (for reference) verify, <= 64K entries: hash floor (gather + SPEC hashing) <= 1.25 x floor; over it the "
            "target is past the hardware | 2 | 1 | ALL random 4096 (1.333) |") in lines
    assert ("Floors as lower bounds: FAIL, rows faster than a floor by more than 5% (default or tuned arm): "
            "verify PARTIAL chain 1024 (default 0.909).") in lines


def test_tuned_arm_below_its_floor_and_slower_tuning_are_reported(tmp_path):
    """Both arms held to floors; tuned over 3% slower fails the tuning check in rows, plot.py, report.py;
    older runs without ``floor_ratios`` judged by times."""
    import bench_kernels

    rows = [
        _row("verify", "PARTIAL chain 16777216", 937.0, 915.0, mode="PARTIAL", order="chain", n=1 << 24,
             tuned_us=853.5, tuned_geometry="1056x1024"),
        _row("verify", "NONE random 65536", 9.0, 7.7, mode="NONE", order="random", n=1 << 16,
             tuned_us=9.6, tuned_geometry="264x128"),
        _row("verify", "NONE chain 65536", 5.2, 4.2, mode="NONE", order="chain", n=1 << 16,
             tuned_us=5.35, tuned_geometry="264x128"),
        # tuned to its default: one module in both arms (A/A), 4% apart by noise
        _row("verify", "NONE chain 1024", 2.5, 2.0, mode="NONE", order="chain", n=1 << 10,
             tuned_us=2.6, tuned_geometry="2112x128m4", tuned_same_geometry=True),
    ]
    bench_kernels.finish(rows)
    assert [r["below_floor"] for r in rows] == [True, False, False, False]
    assert rows[0]["floor_ratios"] == pytest.approx({"default": 937.0 / 915.0, "tuned": 853.5 / 915.0})
    for r in rows:
        del r["floor_ratios"], r["below_floor"]
    tables, lines = _render(tmp_path, rows, empty_us=2.0)
    assert "| PASS BELOW FLOOR |" in tables
    assert ("Rows faster than a floor by more than 5% (default or tuned arm): "
            "verify PARTIAL chain 16777216 (tuned 0.933).") in tables
    aa = (" 1 of 4 rows are tuned to their default geometry, so both arms launch one module (A/A): "
          "tuned / default 1.040-1.040, the method's noise, not judged.")
    assert ("Tuned more than 3% slower than default (A/B interleaved): verify NONE random 65536 (1.067)." + aa
            in tables)
    assert ("Floors as lower bounds: FAIL, rows faster than a floor by more than 5% (default or tuned arm): "
            "verify PARTIAL chain 16777216 (tuned 0.933).") in lines
    assert ("Tuned vs default (A/B interleaved, 4 rows, 3 of them tuned to a geometry of their own): FAIL, "
            "more than 3% slower: verify NONE random 65536 (1.067)." + aa) in lines


def test_a_row_is_timed_interleaved_with_every_grid_of_its_floors(monkeypatch):
    """Small verify rows interleave arms and floor grids: arm medians, each floor's fastest grid and order;
    ordered floor min(ticket, hash + a launch)."""
    import bench_kernels
    import floors

    from tvm_canary.geometry import Geometry

    class Launchers:
        def same(self, kernel, kw):
            return False

        def tuned_geometry(self, kernel, kw):
            return Geometry(gpu=True, blocks=1056, threads=128, min_blocks=8)

    # Rounds per arm: the kernel's; floor grids 10 us but one per floor family (split gather's bounded).
    fastest = {"gather-ALL": ("2112x64", 4.0), "gather-split-ALL": ("2112x512m2", 3.9),
               "gather-hash-ALL": ("1056x128", 5.5), "gather-hash-seq-ALL": ("528x512", 5.0),
               "gather-hash-split-ALL": ("2112x32", 4.8), "gather-ticket-ALL": ("1056x256", 6.4),
               "gather-ticket-seq-ALL": ("2112x32", 6.3), "gather-ticket-split-ALL": ("528x512", 6.6)}
    grids = {name: [bench_kernels.geometry_label(g) for g in bench_kernels.floor_grids(name)] for name in fastest}
    assert all(len(grids[name]) == len(floors.FLOOR_GRIDS) + len(floors.BOUNDED_GATHER_GRIDS)
               + len(floors.HELD_GATHER_GRIDS) for name in fastest)
    timed_arms = []

    def interleaved(arms, iters):
        timed_arms.append(set(arms))
        rounds = {"default": [7.0, 9.0, 8.0, 30.0], "tuned": [6.0, 6.5, 7.5, 7.0], "none": [5.0, 5.5, 4.0, 9.0]}
        for name, (grid, us) in fastest.items():
            for g in grids[name]:
                rounds[(name, g)] = [us if g == grid else 10.0] * 4
        return {arm: rounds[arm] for arm in arms}

    monkeypatch.setattr(bench_kernels, "interleaved_us", interleaved)
    bench = bench_kernels.Bench(quick=True, ab=True, baselines=(), candidates=())
    bench.launchers = Launchers()
    monkeypatch.setattr(bench, "ours", lambda kernel, choice: lambda **kw: None)
    monkeypatch.setattr(bench, "floor_kernel", lambda name, geom: None)
    names = list(bench_kernels.memory_floors("ALL", "gather")) + bench.bound_names("gather", "ALL")
    assert sorted(names) == sorted(fastest)
    assert bench.bound_names("store", "ALL") == ["store-hash-ALL", "store-hash-seq-ALL", "store-hash-split-ALL",
                                                 "store-ticket-ALL", "store-ticket-seq-ALL", "store-ticket-split-ALL"]
    row = {}
    times = bench.timed("verify", [{}, {}], row, bench.floor_arms(names, lambda fn: [lambda: fn] * 4))
    assert timed_arms == [{"default", "tuned"} | {(name, g) for name in names for g in grids[name]}]
    assert (row["us"], row["tuned_us"], row["tuned_geometry"],
            row["tuned_same_geometry"]) == (8.5, 6.75, "1056x128m8", False)
    assert "none_us" not in row
    none_row = {}
    bench.timed("write", [{}, {}], none_row, {}, none_sets=[{}, {}])  # a real-KV write row: NONE in its rounds
    assert timed_arms[-1] == {"default", "tuned", "none"} and none_row["none_us"] == 5.25
    assert bench.fastest(times, "gather-ALL") == (4.0, "2112x64")
    # memory floor: the faster of one lane an entry and split
    assert bench.fastest_memory(times, "gather", "ALL") == (3.9, "gather 2112x512m2 sources split")
    assert (bench.fastest_memory({**times, ("gather-split-ALL", "2112x512m2"): 4.1}, "gather", "ALL")
            == (4.0, "gather 2112x64"))
    assert list(bench_kernels.memory_floors("NONE", "gather")) == ["gather-NONE"]  # no sources to split
    assert list(bench_kernels.memory_floors("ALL", "store")) == ["store-ALL", "store-split-ALL"]
    assert list(bench_kernels.memory_floors("NONE", "store")) == ["store-NONE"]
    bench.bounds(row, "gather", "ALL", times, empty_us=1.0)
    assert (row["hash_floor_us"], row["hash_floor"]) == (4.8, "hash 2112x32 sources split")
    assert (row["ordered_floor_us"], row["ordered_floor"]) == (5.8, "hash 2112x32 sources split + launch")
    bench.bounds(row, "gather", "ALL", times, empty_us=1.6)
    assert (row["ordered_floor_us"], row["ordered_floor"]) == (6.3, "hash + ticket 2112x32 sources in turn")
    # the ordered floor does the hash floor's work and more: a hash floor above it is noise
    bench.bounds(row, "gather", "ALL", {**times, ("gather-ticket-seq-ALL", "2112x32"): 4.5}, empty_us=1.0)
    assert (row["hash_floor_us"], row["hash_floor"]) == (4.5, "hash + ticket 2112x32 sources in turn")


def test_copy_and_lone_floors_take_their_fastest_arm(monkeypatch):
    """``copy_floor_us`` interleaves torch's and TIR copies, naming the fastest; ``fastest_floor``: its grid."""
    import bench_kernels
    import floors

    grids = floors.floor_geometries()
    fastest_grid = bench_kernels.geometry_label(grids[3])

    torch_copy_us = {}

    def interleaved(arms, iters=7):
        times = {arm: [1.0 if arm[1] == fastest_grid else 2.0] * 4 for arm in arms}
        if ("copy", "torch copy") in arms:
            times["copy", "torch copy"] = [torch_copy_us["us"]] * 4
        return times

    monkeypatch.setattr(bench_kernels, "interleaved_us", interleaved)
    monkeypatch.setattr(bench_kernels, "DEV", torch.device("cpu"))
    bench = bench_kernels.Bench(quick=True, ab=False, baselines=(), candidates=())
    monkeypatch.setattr(bench, "floor_kernel", lambda name, geom: lambda *args: None)
    for us, want in ((0.5, (0.5, "torch copy")), (1.5, (1.0, f"copy {fastest_grid}"))):
        torch_copy_us["us"] = us
        assert bench.copy_floor_us(1 << 10) == want
    assert bench.fastest_floor("gather-NONE", lambda fn: [fn]) == (1.0, grids[3])


def test_decode_step_floors_mirror_the_step(monkeypatch):
    """bench_embedding's decode-step floor: an eager step's canary operators in order, arguments binding
    their TensorIR signature; buildable floors only."""
    import bench_embedding
    import tvm

    from tvm_canary import session as session_module

    monkeypatch.setattr(bench_embedding, "DEV", torch.device("cpu"))
    w = bench_embedding.Workload(2, swa=True)
    launched = []

    def record(kind, kw):
        if kind == "plan":
            launched.append(("plan", "SWA" if kw["full_to_swa_index_mapping"] is not None else "FULL"))
        elif kind == "scatter":
            launched.append(("scatter",))
        else:
            endpoint, half, group = kw["context"].kernel_kind.name.split("_")
            launched.append((kind, endpoint, half, group))

    def recording(kind, launch):
        def run(**kw):
            record(kind, kw)
            return launch(**kw)
        return run

    def recording_dispatch(dispatch):  # the session's checked plan, scatter launches
        def run(kernel, kw):
            record(kernel, kw)
            return dispatch(kernel, kw)
        return run

    for kind, name in (("verify", "launch_canary_verify_kernel"), ("write", "launch_canary_write_kernel")):
        monkeypatch.setattr(session_module, name, recording(kind, getattr(session_module, name)))
    monkeypatch.setattr(session_module, "dispatch", recording_dispatch(session_module.dispatch))
    w.eager_step()
    operators = w.operators()
    assert [tuple(op.what.split()) for op in operators] == launched
    assert len(launched) == 1 + 2 * 9  # scatter; per group plan, HEAD and TAIL verify + write of K and V

    bench = bench_embedding.floor_bench("sm_90")
    for op in operators:
        if op.floor == "copy":
            assert op.nbytes > 0 and op.args == ()
            continue
        func = bench.floor_makers[op.floor](bench_embedding.floors.floor_geometries()[0])
        assert len(func.params) == len(op.args), op.what
        sizes = {}  # the signature's shape variables, bound as by the launch
        for param, arg in zip(func.params, op.args):
            assert (str(arg.dtype).removeprefix("torch.") == str(param.dtype)
                    and arg.dim() == len(param.ty.shape)), (op.what, param)
            for dim, size in zip(param.ty.shape, arg.shape):
                expected = int(dim) if isinstance(dim, tvm.tirx.IntImm) else sizes.setdefault(str(dim), size)
                assert expected == size, (op.what, param, dim)
    tail_verify = next(op for op in operators if op.what == "verify TAIL K FULL")
    assert (tail_verify.floor == "gather-token-PARTIAL"
            and tail_verify.args[0].data_ptr() == w.session.canary_buffer("TAIL", "K").data_ptr())
    tail_write = next(op for op in operators if op.what == "write TAIL K FULL")
    assert (tail_write.floor == "store-PARTIAL"
            and tail_write.args[0].data_ptr() != w.session.canary_buffer("TAIL", "K").data_ptr())


def test_the_gather_floors_also_run_bounded_grids():
    """Gather floors run in ``FLOOR_GRIDS``, ``BOUNDED_GATHER_GRIDS`` (``__launch_bounds__(threads,
    min_blocks)`` as verify) and ``HELD_GATHER_GRIDS`` (``HELD_VALUES`` clock reads live; labels end in "h");
    other floors ``FLOOR_GRIDS`` alone; a plain grid declares only the threads."""
    import bench_embedding
    import bench_kernels
    import floors
    import tvm

    from tvm_canary.geometry import Geometry

    plain = [(b, t, 1) for b, t in floors.FLOOR_GRIDS]
    gathers = {name for name in bench_kernels.floor_makers() if name.startswith("gather-")}
    assert {"gather-NONE", "gather-split-ALL", "gather-hash-split-ALL", "gather-ticket-seq-PARTIAL"} <= gathers
    # every floor of both benchmarks; the embedding's token-reading gathers keep plain grids
    makers = dict(bench_embedding.floor_bench("sm_90").floor_makers)
    assert {"gather-token-NONE", "gather-token-PARTIAL"} <= set(makers)
    for name in makers:
        grids = [(g.blocks, g.threads, g.min_blocks) for g in bench_kernels.floor_grids(name)]
        bounded = list(floors.BOUNDED_GATHER_GRIDS) + list(floors.HELD_GATHER_GRIDS) if name in gathers else []
        assert grids == plain + bounded, name
    labels = [bench_kernels.geometry_label(g) for g in bench_kernels.floor_grids("gather-hash-split-ALL")]
    assert labels[-1] == "2112x256m4h" and len(set(labels)) == len(labels)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
    held = floors.HeldGeometry(gpu=True, blocks=2112, threads=256, min_blocks=4)
    for geom in [Geometry(gpu=True, blocks=2112, threads=512, min_blocks=2),
                 Geometry(gpu=True, blocks=2112, threads=512), held]:
        for order in ("together", "split"):
            source = tvm.compile(floors.gather(geom, 2, False, 2, hashing=geom is held, fold_order=order),
                                 target=target).mod.imports[0].inspect_source("cuda")
            threads, min_blocks = geom.threads, geom.min_blocks
            bound = f"__launch_bounds__({threads}, {min_blocks})" if min_blocks > 1 else f"__launch_bounds__({threads})"
            assert bound in source and source.count("__launch_bounds__") == source.count(bound), (geom, order)
            assert source.count("clock64()") == (floors.HELD_VALUES if geom is held else 0), (geom, order)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_floor_kernels_compile_for_cuda(tmp_path):
    """Every benchmark floor kernel lowers for CUDA, compiles with nvcc for sm_90 (one grid: grids change
    constants): broken ones found here, not on a GPU."""
    import bench_embedding
    import bench_kernels
    import floors
    import tvm

    makers = dict(bench_embedding.floor_bench("sm_90").floor_makers)
    assert set(bench_kernels.floor_makers()) < set(makers)
    geom = floors.floor_geometries()[0]
    funcs = [(name, make(geom)) for name, make in makers.items()]
    bounded, held = floors.floor_geometries(bounded=True)[-2:]  # declares its min_blocks; holds values too
    funcs += [(f"{name}-{which}", makers[name](geom)) for which, geom in (("bounded", bounded), ("held", held))
              for name in bench_kernels.floor_makers() if name.startswith("gather-") and name.endswith("-ALL")]
    funcs += [("chain", floors.chain()), ("empty", floors.empty())]
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
    files = []
    for name, func in funcs:
        cu = tmp_path / f"{name}.cu"
        cu.write_text(tvm.compile(func, target=target).mod.imports[0].inspect_source("cuda"))
        files.append(cu.name)
    res = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", *files], capture_output=True, text=True,
                         cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    ticket = (tmp_path / "gather-ticket-ALL.cu").read_text()
    assert "canary_last_block_ticket" in ticket and "atomicAdd" in ticket
    assert "__shfl_xor_sync" in (tmp_path / "gather-hash-split-ALL.cu").read_text()  # two lanes an entry
    assert "__shfl_xor_sync" not in (tmp_path / "gather-split-ALL.cu").read_text()  # XOR-ed, nothing exchanged
    for name in ("store-split-ALL", "store-hash-split-ALL"):  # the odd lane's XOR or fold to the storing lane
        assert "__shfl_xor_sync" in (tmp_path / f"{name}.cu").read_text()
    assert "__shfl_xor_sync" not in (tmp_path / "store-ALL.cu").read_text()
    assert "__shfl_xor_sync" not in (tmp_path / "gather-hash-seq-ALL.cu").read_text()
    bound = f"__launch_bounds__({bounded.threads}, {bounded.min_blocks})"
    assert bound in (tmp_path / "gather-ALL-bounded.cu").read_text()


def test_kernel_ab_variants(capsys):
    import ab_kernels

    from tvm_canary.geometry import Geometry

    def refused(argv, message):  # status 2 and the message (a GPU-less host exits 2 too)
        assert ab_kernels.main(argv) == 2
        assert message in capsys.readouterr().err

    assert ab_kernels.parse_variant("m4:verify:ALL:min_blocks=4,pairs=0") == ("m4", ("verify", "ALL"),
                                                                             ({"min_blocks": 4, "pairs": 0}, None))
    assert ab_kernels.parse_variant("t32:verify:PARTIAL:threads=32:below") == ("t32", ("verify", "PARTIAL"),
                                                                              ({"threads": 32}, "below"))
    assert ab_kernels.parse_variant("u4:write:NONE:unroll=4:class")[2] == ({"unroll": 4}, "class")
    for bad in ("m4:verify:ALL", "m4:plan:ALL:min_blocks=4", "m4:verify:FULL:min_blocks=4", "head:verify:ALL:pairs=0",
                "m4:verify:ALL:fold=2", "m4:verify:ALL:min_blocks=x", "fl-gather:verify:ALL:pairs=0",
                "a/b:verify:ALL:pairs=0", "m4:verify:ALL:pairs=0:small", "m4:verify:ALL:pairs=0:below:class"):
        with pytest.raises(ValueError, match="--variant"):
            ab_kernels.parse_variant(bad)
    refused(["--base", "HEAD", "--variant", "m4:verify:ALL"], "kv-canary: --variant 'm4:verify:ALL': expected")
    # a variant of a kernel or mode not timed times nothing
    refused(["--base", "HEAD", "--modes", "NONE", "--variant", "m4:verify:ALL:min_blocks=4"],
            "kv-canary: --variant m4: verify ALL is not timed (--kernels verify write, --modes NONE)")
    refused(["--base", "HEAD", "--kernels", "write", "--variant", "m4:verify:NONE:min_blocks=4"],
            "kv-canary: --variant m4: verify NONE is not timed (--kernels write,")
    for too_many in ("0", str((1 << 24) + 1)):  # any size to the benchmark's largest (5000: not one of them)
        refused(["--base", "HEAD", "--verify-sizes", "5000", too_many],
                "kv-canary: --verify-sizes: each from 1 to 16777216 (the benchmark's largest size)")
    assert ab_kernels.parse_floor_grid("2112x512m2") == Geometry(gpu=True, blocks=2112, threads=512, min_blocks=2)
    assert ab_kernels.parse_floor_grid("1056x128") == Geometry(gpu=True, blocks=1056, threads=128)
    for bad in ("2112x48", "2112", "2112x512m", "0x32", "2112x512m2w", "64x2048"):
        with pytest.raises(ValueError, match="--floor-grids"):
            ab_kernels.parse_floor_grid(bad)
    refused(["--base", "HEAD", "--floor-grids", "2112x512m2", "64x40"], "kv-canary: --floor-grids '64x40': expected")
    assert ab_kernels.parse_write_shape("256x4") == (256, 4, 256)
    assert ab_kernels.parse_write_shape("8x16c256") == (8, 16, 256)  # 8 requests in a plan of capacity 256
    for bad in ("256", "256x0", "0x4", "256x4x2", "x4", "-1x4", "8x16c4", "8x16c0", "8x16c"):
        with pytest.raises(ValueError, match="--write-shapes"):
            ab_kernels.parse_write_shape(bad)
    refused(["--base", "HEAD", "--write-shapes", "256x4", "64"], "kv-canary: --write-shapes '64': expected")
    assert ab_kernels.parse_package(f"abl={ROOT}") == ("abl", ROOT)  # a folder holding tvm_canary
    for bad in (f"head={ROOT}", f"a/b={ROOT}", str(ROOT), "abl=/nonexistent"):
        with pytest.raises(ValueError, match="--package"):
            ab_kernels.parse_package(bad)
    refused(["--base", "HEAD", "--package", f"m4={ROOT}", "--variant", "m4:verify:ALL:min_blocks=4"],
            "kv-canary: each --package needs a name of its own")
    assert ab_kernels.resolve_base("HEAD") == "HEAD"
    assert ab_kernels.resolve_base(str(ROOT)) == ROOT  # a folder holding tvm_canary
    with pytest.raises(ValueError, match="--base"):
        ab_kernels.resolve_base("no-such-revision-or-folder")


def test_geometry_labels_round_trip():
    import bench_kernels

    for text, label in (("1056x512m1", "1056x512"), ("528x128m2w", "528x128m2w"), ("528x128m2wp", "528x128m2wp"),
                        ("2112x512m16", "2112x512m16"), ("528x128p", "528x128p"), ("264x32u16w", "264x32u16w"),
                        ("528x512k1024u1", "528x512"), ("528x32wpp", "528x32wpp")):
        assert bench_kernels.geometry_label(bench_kernels.parse_geometry(text)) == label
    assert bench_kernels.parse_geometry("528x128m2wp").pairs == 1
    assert bench_kernels.parse_geometry("528x32wpp").pairs == 2  # split folds
    assert bench_kernels.parse_geometry("528x512k1024").tile == 1024
    assert bench_kernels.parse_geometry("264x32u8m2w").unroll == 8
    with pytest.raises(ValueError, match="BLOCKSxTHREADS"):
        bench_kernels.parse_geometry("528x128q")
    with pytest.raises(ValueError, match="BLOCKSxTHREADS"):
        bench_kernels.parse_geometry("528x128ppp")


def test_ab_kernels_keys_rows_by_their_workload_point():
    """A row's functions are keyed by its launch's ``KernelCall.size``, as in the child."""
    import ab_kernels

    assert ab_kernels.point_key(1 << 20) == "1048576" and ab_kernels.point_key((64, 512)) == "[64, 512]"


def test_default_labels_name_modes_and_size_classes():
    """``default_geometries`` say which default each mode and size class launched."""
    import bench_kernels

    assert bench_kernels.default_labels("verify", "cuda-sm_90") == (
        "2112x128m4, NONE >= 262145 2112x128m16, PARTIAL 2112x128m2wp, PARTIAL >= 16385 1056x128m8, "
        "PARTIAL >= 262145 2112x512m2, ALL 528x32m2wpp, ALL >= 16385 2112x256m4pp")
    assert bench_kernels.default_labels("write", "cuda-sm_90") == (
        "528x64u2, NONE >= 1x23 528x64u8, PARTIAL 264x32p, PARTIAL >= 1x5 528x64u2, PARTIAL >= 1x23 528x64u8, "
        "ALL 528x32wpp, ALL >= 1x128 528x256u8p")


@pytest.mark.parametrize("capacity", [None, 16])
def test_write_args_plan_padded_to_a_capacity(monkeypatch, capacity):
    """``write_args`` capacity over requests (``--write-shapes RxTcC``): extra requests empty, invalid; the
    CPU kernel stamps only the requests' slots, as the reference."""
    import copy

    import bench_kernels

    from tvm_canary.cases import LAUNCH, REFERENCE, context_for
    from tvm_canary.runtime import use_backend

    from tree import assert_same_bytes, tensors

    monkeypatch.setattr(bench_kernels, "DEV", "cpu")
    gen = torch.Generator().manual_seed(5)
    context = context_for(gen, "cpu", 64)

    class Pool:
        def context(self, mode):
            return context

    slots = (torch.randperm(63, generator=gen)[:12] + 1).view(4, 3)
    got = bench_kernels.write_args(Pool(), "NONE", slots, torch.randint(0, 9, (4, 3), generator=gen), capacity)
    assert got["plan"].write_offsets.shape[0] == (capacity or 4) + 1
    assert int(got["plan"].write_num_valid_reqs) == 4
    before = context.canary_buf.clone()
    want = copy.deepcopy(got)
    REFERENCE["write"](**want)
    with use_backend("tvm"):
        LAUNCH["write"](**got)
    assert_same_bytes(tensors(got), tensors(want))
    changed = (context.canary_buf != before).any(1).nonzero().flatten()
    assert set(changed.tolist()) <= set(slots.flatten().tolist())
