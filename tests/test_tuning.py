"""Tuning without a GPU: a tiny llvm MetaSchedule run writes a database kernel load reloads, its kernels pass the
differential tests; stale records ignored; committed databases match the kernels; ``tune``'s errors, logs, summary."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import pathlib
import re

import pytest
import torch
from test_differential import run_differential

from tvm_canary.cases import write_case
from tvm_canary.cli import main
from tvm_canary.consts import RealKvHashMode
from tvm_canary.runtime import compile as C
from tvm_canary.runtime import packing
from tvm_canary.tuning import apply, keys, merge, store, workloads

from helpers import four_sources

TUNE_CI = ["tune", "--target", "llvm", "--kernels", "write", "verify", "--trials", "4", "--workloads", "ci"]


@pytest.fixture(scope="module")
def tuned_logs(tmp_path_factory):
    """A tiny tune's database folder, its summary beside it in ``tune-stdout.txt``."""
    out = tmp_path_factory.mktemp("tune_logs")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*TUNE_CI, "--out", str(out), "--log-dir", str(out.parent / "ms-logs")]) == 0
    (out.parent / "tune-stdout.txt").write_text(printed.getvalue())
    return out


@pytest.mark.slow
def test_metaschedule_logs_go_to_the_log_folder(tuned_logs):
    assert any((tuned_logs.parent / "ms-logs" / "logs").glob("*.log"))


@pytest.mark.slow
def test_tune_reports_each_workloads_time_and_the_total(tuned_logs):
    """Rows: each workload's wall seconds and build wait; last lines: their sums, a build's worker cost."""
    printed = (tuned_logs.parent / "tune-stdout.txt").read_text()
    header, *rest = printed[printed.index("kernel "):].splitlines()
    assert header.split()[8:12] == ["speedup", "seconds", "builds", "s"]
    rows = [line for line in rest if line.startswith(("write ", "verify "))]
    assert len(rows) == sum(len(workloads.PRESETS["ci"][k]) for k in ("write", "verify"))
    # speedup, seconds, builds s, tuned geometry's key
    seconds = [tuple(map(float, re.search(r" [\d.]+ +([\d.]+) +([\d.]+)  cpu-", row).groups())) for row in rows]
    # a one-point space (verify on llvm) builds only its default, up front
    assert all(0 <= built <= wall for wall, built in seconds) and any(built > 0 for _, built in seconds)
    total = re.search(r"(\d+) workloads in ([\d.]+) s \(the defaults built first: ([\d.]+) s; waiting on builds "
                      r"([\d.]+) s in all;", printed)
    assert total and int(total[1]) == len(rows)
    defaults, waited, rounding = float(total[3]), float(total[4]), 0.1 * (len(rows) + 1)
    assert defaults > 0  # empty database: all defaults built first
    assert float(total[2]) == pytest.approx(defaults + sum(w for w, _ in seconds), abs=rounding)
    # the wait counts the defaults' round (in their time) and each workload's
    assert sum(b for _, b in seconds) - rounding <= waited <= defaults + sum(b for _, b in seconds) + rounding
    # a build's worker cost tells a slow build from a pool building few at once
    builds = re.search(r"builds: (\d+) candidates? in (\d+) worker process(?:es)?, ([\d.]+) s of a worker's time",
                       printed)
    new = sum(int(re.search(r"\)\s+\d+\s+(\d+)", row)[1]) for row in rows)  # each measured record was built
    assert builds and int(builds[1]) >= max(new, 1) and int(builds[2]) >= 1
    assert 0 < float(builds[3]) * int(builds[1]) <= waited * int(builds[2])
    assert all(("nothing to tune" in row) == row.startswith("verify") for row in rows)  # verify: no knobs on llvm


def test_a_bucket_with_one_measured_geometry_and_knobs_is_not_said_to_have_none(tmp_path, capsys):
    """The "no knobs" note comes from the design space, not one measured candidate."""
    folder = tmp_path / keys.device_key(torch.device("cpu"))
    folder.mkdir()
    _, commit, default = write_bucket_database(folder)
    commit(default, [1e-3])
    assert main(["tune", "--target", "llvm", "--kernels", "write", "--workloads", "ci", "--trials", "1",
                 "--out", str(tmp_path), "--log-dir", str(tmp_path / "ms")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("write "))
    assert row.split()[3] == "1" and "nothing to tune" not in row, row


class _RecordingBuilder:
    """Records each round's workloads, builds nothing (no artifacts)."""

    build_seconds = 0.0

    def __init__(self):
        self.rounds = []

    def build(self, inputs):
        import types

        self.rounds.append([i.mod["main"] for i in inputs])
        return [types.SimpleNamespace(error_msg=None, artifact_path=None) for _ in inputs]


def test_defaults_are_built_in_one_round_for_the_workloads_whose_default_is_unmeasured(tmp_path):
    """``build_defaults``: one round of the defaults the database lacks, unless a whole-space search measures them."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.schedules import knobs as design_knobs
    from tvm_canary.tuning import driver

    jobs = [(k, b) for k in ("write", "verify", "scatter") for b in workloads.PRESETS["ci"][k]]
    builder = _RecordingBuilder()
    empty = ms.database.JSONDatabase(work_dir=str(tmp_path))
    built = driver.build_defaults(jobs, "llvm", empty, builder, trials=1)
    assert list(built) == jobs and len(builder.rounds) == 1 and len(builder.rounds[0]) == len(jobs)
    expected = [driver.workload_module(k, b, "llvm")["main"].script() for k, b in jobs]
    assert [f.script() for f in builder.rounds[0]] == expected
    (tmp_path / "measured").mkdir()
    db = ms.database.JSONDatabase(work_dir=str(tmp_path / "measured"))
    mod = driver.workload_module(*jobs[0], "llvm")
    knobs = design_knobs(jobs[0][0], False, workloads.mode_of(*jobs[0]))
    driver.commit_measurement(db, mod, knobs, workloads.default_of(*jobs[0], "llvm"), [1e-3], tvm.target.Target("llvm"))
    assert list(driver.build_defaults(jobs, "llvm", db, builder, trials=1)) == jobs[1:]  # its default is measured
    assert driver.build_defaults(jobs[:1], "llvm", db, builder, trials=1) == {}
    assert len(builder.rounds) == 2  # nothing to build: no round
    # enough trials measure write's few llvm points; one-point spaces unsearched
    whole = driver.build_defaults(jobs, "llvm", empty, builder, trials=10**6)
    assert list(whole) == [(k, b) for k, b in jobs if k != "write"]


@pytest.mark.slow
def test_a_default_built_up_front_and_not_run_is_removed(tmp_path, tuned_logs):
    """Not run (the database holds it): its artifact is removed."""
    import types

    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.tuning import driver

    artifact = tmp_path / "build" / "default.tar"
    artifact.parent.mkdir()
    artifact.write_bytes(b"")
    db = ms.database.JSONDatabase(work_dir=str(tuned_logs / keys.device_key(torch.device("cpu"))))
    kernel, bucket = "write", workloads.PRESETS["ci"]["write"][0]
    result = driver.tune_workload(kernel, bucket, "llvm", db, 4, tmp_path / "ms", _RecordingBuilder(), runner=None,
                                  default_build=types.SimpleNamespace(error_msg=None, artifact_path=str(artifact)))
    assert result.measured == 0 and result.candidates >= 1
    assert not artifact.parent.exists()


class _TimedBuilderRunner:
    """A builder and runner whose candidates take the time ``seconds`` gives their geometry (``geometry_from`` of
    the built stand-in, knobs the trace leaves at ``default``); ``built`` lists the geometries built."""

    build_seconds = 0.0

    def __init__(self, tmp_path, default, seconds: dict):
        self.tmp_path, self.default, self.seconds, self.built, self._artifacts = tmp_path, default, seconds, [], {}

    def build(self, inputs):
        import types

        from tvm_canary.schedules.space import geometry_from

        results = []
        for i in inputs:
            self.built.append(geometry_from(i.mod, self.default))
            artifact = self.tmp_path / "builds" / str(len(self.built)) / "module.tar"
            artifact.parent.mkdir(parents=True)
            artifact.write_bytes(b"")
            self._artifacts[str(artifact)] = self.built[-1]
            results.append(types.SimpleNamespace(error_msg=None, artifact_path=str(artifact)))
        return results

    def run(self, inputs):
        import types

        results = [types.SimpleNamespace(error_msg=None, run_secs=[self.seconds[self._artifacts[i.artifact_path]]] * 3)
                   for i in inputs]
        return [types.SimpleNamespace(result=lambda r=r: r) for r in results]


def _other_geometry(kernel: str, bucket: tuple):
    """(knobs, default, a geometry of the bucket's llvm design space other than its default)."""
    from tvm_canary.schedules import knobs as design_knobs

    knobs = design_knobs(kernel, False, workloads.mode_of(kernel, bucket))
    default = workloads.default_of(kernel, bucket, "llvm")
    other = dataclasses.replace(default, **{name: next(v for v in choices if v != getattr(default, name))
                                            for name, choices in knobs.items() if len(choices) > 1})
    assert other != default
    return knobs, default, other


def test_a_retune_measures_the_previous_pick_again(tmp_path, monkeypatch):
    """Re-tuning a bucket a kernel change staled measures its previous pick once, whatever the search draws,
    competing like any candidate (against the default measured again in the same run)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.tuning import driver

    kernel, bucket = "write", workloads.PRESETS["ci"]["write"][0]
    knobs, default, pick = _other_geometry(kernel, bucket)
    target = tvm.target.Target("llvm")
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    for geom, secs in ((default, 1e-3), (pick, 0.5e-3)):
        driver.commit_measurement(db, driver.workload_module(kernel, bucket, "llvm"), knobs, geom, [secs], target)
    assert apply.previous_pick(db, kernel, bucket, False) is None  # current records: nothing previous
    monkeypatch.setitem(workloads.CASE_VERSIONS, kernel, workloads.CASE_VERSIONS[kernel] + 1)
    assert apply.previous_pick(db, kernel, bucket, False) == pick and (kernel, bucket) not in apply.measured_records(db)
    mod = driver.workload_module(kernel, bucket, "llvm")
    driver.commit_measurement(db, mod, knobs, default, [1e-3], target)  # the default, measured at new code

    timed = _TimedBuilderRunner(tmp_path, default, {pick: 0.6e-3, default: 1e-3})
    # one trial, filled by the default's record: no search; the previous pick measured, then the default again
    result = driver.tune_workload(kernel, bucket, "llvm", db, 1, tmp_path / "ms", timed, timed)
    assert timed.built == [pick, default] and result.measured == 1 and result.geometry == pick.key()
    again = driver.tune_workload(kernel, bucket, "llvm", db, 1, tmp_path / "ms", timed, timed)
    assert timed.built == [pick, default] and again.measured == 0 and again.geometry == pick.key()


def _an_earlier_default_and_a_drawn_candidate(tmp_path, monkeypatch, default_seconds: float,
                                              candidate_seconds: float) -> tuple:
    """(kernel, bucket, default geometry, database) of write's first ci bucket: the database holds a default record
    of ``default_seconds`` a launch (an earlier run's), and MetaSchedule's search (stood in for) draws another
    geometry measured at ``candidate_seconds``."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.tuning import driver

    kernel, bucket = "write", workloads.PRESETS["ci"]["write"][0]
    knobs, default, candidate = _other_geometry(kernel, bucket)
    target = tvm.target.Target("llvm")
    (tmp_path / "db").mkdir()
    db = ms.database.JSONDatabase(work_dir=str(tmp_path / "db"))
    driver.commit_measurement(db, driver.workload_module(kernel, bucket, "llvm"), knobs, default,
                              [default_seconds] * 3, target)

    def search(mod, target, *args, database, **kwargs):
        driver.commit_measurement(database, mod, knobs, candidate, [candidate_seconds] * 3, target)

    monkeypatch.setattr(ms, "tune_tir", search)
    return kernel, bucket, default, db


def test_candidates_compete_with_the_default_measured_in_the_same_run(tmp_path, monkeypatch):
    """The database's default was measured slow in an earlier run (another host start); this run's search adds a
    candidate 1% faster than the default measures now: the default is measured again in this run, and the
    candidate, not 3% faster than it, is not chosen. The default's earlier build round covers it."""
    from tvm_canary.tuning import driver

    kernel, bucket, default, db = _an_earlier_default_and_a_drawn_candidate(tmp_path, monkeypatch, 1.0, 0.99e-3)
    timed = _TimedBuilderRunner(tmp_path, default, {default: 1e-3})
    built = driver.build_defaults([(kernel, bucket)], "llvm", db, timed, trials=2)
    assert timed.built == [default]  # a search will add candidates: its default is built up front
    result = driver.tune_workload(kernel, bucket, "llvm", db, 2, tmp_path / "ms", timed, timed,
                                  default_build=built[(kernel, bucket)])
    assert timed.built == [default] and result.measured == 1 and result.candidates == 2
    assert result.default_us == pytest.approx(1e3) and result.geometry == default.key()
    assert apply.chosen(kernel, bucket, apply.measured_records(db)[(kernel, bucket)], False)[1] == default


@pytest.mark.parametrize("this_run", [1e-3, None], ids=["measured", "failed"])
def test_the_table_gives_the_default_time_the_candidates_were_weighed_against(tmp_path, monkeypatch, this_run):
    """An earlier default record of 0.9 ms beside this run's 1 ms (or a failed measurement): the row's default time
    is 0.9 ms, the record ``chosen`` weighs against (a 0.95 ms candidate loses: speedup not above 1); a failed
    measurement is named in the row."""
    from tvm_canary.tuning import driver

    kernel, bucket, default, db = _an_earlier_default_and_a_drawn_candidate(tmp_path, monkeypatch, 0.9e-3, 0.95e-3)
    timed = _TimedBuilderRunner(tmp_path, default, {default: this_run})
    if this_run is None:
        monkeypatch.setattr(driver, "measure_candidate", lambda *args, **kwargs: ([], "RuntimeError: device lost"))
    result = driver.tune_workload(kernel, bucket, "llvm", db, 2, tmp_path / "ms", timed, timed)
    assert result.default_us == pytest.approx(900) and result.geometry == default.key()
    assert result.default_error == ("" if this_run else "RuntimeError: device lost")


def test_long_graphs_take_fewer_replays_per_value():
    """A value spans VALUE_MIN_US of replays, within [1, the evaluator's number]: not ten of a tens-of-ms one."""
    from tvm_canary.tuning import measure

    most = measure.evaluator_config().number
    assert measure.replays_per_value(23_000.0, most) == 1  # verify ALL 16M on the H200
    assert measure.replays_per_value(15_000.0, most) == 2  # write 1 x 32768
    assert measure.replays_per_value(measure.VALUE_MIN_US, most) == 1
    assert measure.replays_per_value(measure.VALUE_MIN_US - 1, most) == 2
    assert measure.replays_per_value(8.0, most) == most  # a few-µs launch keeps all replays
    assert measure.replays_per_value(0.0, most) == most


@pytest.mark.slow
def test_tune_again_says_it_measured_nothing(tuned_logs, capsys):
    assert main([*TUNE_CI, "--out", str(tuned_logs), "--log-dir", str(tuned_logs.parent / "ms-logs-2")]) == 0
    out = capsys.readouterr().out
    key = keys.device_key(torch.device("cpu"))
    assert "nothing measured" in out and f"tuned on a device with key {key}" in out
    assert not (tuned_logs.parent / "ms-logs-2").exists()  # MetaSchedule never ran


@pytest.mark.parametrize("trials", ["0", "-1"])
def test_tune_rejects_fewer_than_one_trial(trials, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--target", "llvm", "--trials", trials])
    assert exit_info.value.code == 2
    assert f"argument --trials: must be at least 1, got {trials}" in capsys.readouterr().err


@pytest.mark.slow
def test_tune_writes_a_database_per_device(tuned_logs):
    key = keys.device_key(torch.device("cpu"))
    assert (tuned_logs / key / "database_workload.json").exists()
    records = (tuned_logs / key / "database_tuning_record.json").read_text()
    assert records.count("\n") >= 6  # 4 write + 2 verify (NONE and ALL)


@pytest.mark.slow
def test_tuned_kernels_load_and_match_the_reference(tuned_logs, monkeypatch):
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tuned_logs))
    apply._records.cache_clear()
    # forget geometries taken from the repository's tune_logs/
    monkeypatch.setattr(C, "_by_launch", {})
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(tuned_logs / keys.device_key(torch.device("cpu"))))
    want = apply.chosen("write", (8, 16), apply.measured_records(db)[("write", (8, 16))], cuda=False)[1]
    assert apply.tuned_geometry("write", torch.device("cpu"), 8) == want
    assert C.geometry("write", torch.device("cpu"), 8) == want
    for seed in range(15):
        run_differential("write", "cpu", seed)
        run_differential("verify", "cpu", seed)
    assert any(k[0] == "write" and k[4] == want for k in C._memory)  # the tuned build ran
    apply._records.cache_clear()


@pytest.mark.gpu
def test_tune_on_a_gpu_times_candidates_in_cuda_graphs(tmp_path, monkeypatch, capsys):
    """ci tuned on GPU 0 (CUDA graphs, ``GPU_POOL_SLOTS`` pool): finite default and tuned times per workload;
    tuned kernels pass the differential tests."""
    key = keys.device_key(torch.device("cuda", 0))
    assert main(["tune", "--target", "cuda", "--kernels", "write", "verify", "--trials", "3", "--workloads", "ci",
                 "--out", str(tmp_path), "--log-dir", str(tmp_path / "ms-logs")]) == 0
    assert "nan" not in capsys.readouterr().out  # every default measured
    from tvm.s_tir import meta_schedule as ms

    records = apply.measured_records(ms.database.JSONDatabase(work_dir=str(tmp_path / key)))
    assert set(records) == {("verify", (1024,)), ("verify", (1024, 2)), ("write", (8, 16))}
    assert all(0 < cost < 1e-3 for rows in records.values() for cost, _ in rows)  # µs, not a failure's 1e10 s
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tmp_path))
    monkeypatch.setattr(C, "_by_launch", {})
    apply._records.cache_clear()
    try:
        assert apply.tuned_geometry("verify", torch.device("cuda", 0), 1024) is not None, key
        for seed in range(5):
            run_differential("write", "cuda", seed)
            run_differential("verify", "cuda", seed)
    finally:
        apply._records.cache_clear()


def test_gpu_cases_scatter_slots_over_a_pool_that_fits(monkeypatch):
    """A GPU case draws from ``GPU_POOL_SLOTS`` slots or as many as fit half the free memory, at least twice
    its own; a CPU case from twice its slots."""
    gpu = torch.device("cuda", 0)
    free = 10 * 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 24 * 2**30))
    real_kv_slot = workloads.CASE_COPIES * (32 + workloads.KV_SOURCES * workloads.KV_BYTES)
    assert workloads.pool_universe(4096, gpu, 0) == workloads.GPU_POOL_SLOTS  # 3 x 32 B per slot fits
    assert workloads.pool_universe(4096, gpu, 2) == free // 2 // real_kv_slot < workloads.GPU_POOL_SLOTS
    assert workloads.pool_universe(1 << 24, gpu, 2) == 1 << 25  # twice its slots, fitting or not
    assert workloads.pool_universe(4096, torch.device("cpu"), 2) == 8192


def test_a_verify_case_times_each_order_in_a_launch_of_its_own():
    """Verify's case: two bucket-sized launches, as benchmarks time them: random slots in random order, then
    consecutive ones in chain order; the reference check covers both (skipping the second fails)."""
    from tvm_canary.runtime.targets import default_geometry

    case = workloads.make_case("verify", (256,), torch.device("cpu"))
    random_args, chain_args = case.launches
    assert random_args[0].data_ptr() == chain_args[0].data_ptr()  # one canary buffer
    assert [ptr for ptr, _ in case.initial].count(random_args[0].data_ptr()) == 1  # and one snapshot of it
    assert [args[1].numel() for args in case.launches] == [256, 256]  # plan capacity: each the bucket's size
    assert len(set(random_args[1].tolist()) | set(chain_args[1].tolist())) == 512  # no slot in both
    assert random_args[0].shape[0] == 2 * 256 + 1  # the run lies inside the pool of twice the random slots
    slots = [args[1][:128] for args in case.launches]
    assert not bool((slots[0][1:] > slots[0][:-1]).all())  # random order
    steps = slots[1][1:] - slots[1][:-1]
    assert int((steps == 1).sum()) >= 128 - 128 // 64 - 1  # consecutive, a new chain every 64
    built = C.build("verify", workloads.tuned_spec("verify", (256,)), "llvm", default_geometry("verify", "llvm"))
    verify = built.mod["canary_verify"]
    case.reset()
    for args in case.launches:
        verify(*args)
    assert case.matches()
    case.reset()
    verify(*case.launches[0])
    assert not case.matches()


def test_verify_case_slots_are_distinct_and_in_the_pool(monkeypatch):
    """Verify's two bucket-sized plans share no slot nor use slot 0, at any size, also in a pool over twice
    them (a GPU's; a larger CPU one here)."""
    for universe in (None, 1000):
        if universe is not None:
            monkeypatch.setattr(workloads, "pool_universe", lambda scattered, device, mode, u=universe: u)
        case = workloads.make_case("verify", (100,), torch.device("cpu"))
        random_slots, chain_slots = (args[1].tolist() for args in case.launches)
        pool = case.launches[0][0].shape[0]
        assert len(random_slots) == len(chain_slots) == 100
        assert chain_slots == list(range(1, 101))  # chain order on 1 .. 100 (two chains of 64, cut)
        assert not set(random_slots) & set(range(1, 129)) and len(set(random_slots)) == 100
        assert 0 < min(random_slots) and max(random_slots) < pool == (universe or 2 * 128) + 1


def test_records_timed_on_another_case_are_stale(monkeypatch):
    """A changed tuning case (``workloads.CASE_VERSIONS``) stales its kernel's records: never ranked together."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(store.readable(keys.committed_tune_logs() / "amd-epyc")),
                                  allow_missing=False)
    stale: set = set()
    assert any(kernel == "verify" for kernel, _ in apply.measured_records(db, stale)) and not stale
    monkeypatch.setitem(workloads.CASE_VERSIONS, "verify", workloads.CASE_VERSIONS["verify"] + 1)
    rows = apply.measured_records(db, stale)
    assert stale == {"verify"} and rows and not any(kernel == "verify" for kernel, _ in rows)


@pytest.mark.slow
def test_tuned_geometry_is_chosen_within_the_launch_mode(tuned_logs, monkeypatch):
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tuned_logs))
    apply._records.cache_clear()
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(tuned_logs / keys.device_key(torch.device("cpu"))))
    folded = apply.chosen("verify", (1024, 2), apply.measured_records(db)[("verify", (1024, 2))], cuda=False)[1]
    assert apply.tuned_geometry("verify", torch.device("cpu"), 1 << 20, 2) == folded
    assert apply.tuned_geometry("verify", torch.device("cpu"), 1024, 1) is None  # no PARTIAL bucket: default
    apply._records.cache_clear()


def _write_database(root, picks: dict, with_default: bool = True) -> None:
    """A CPU database in ``root``: write buckets' default at 1 ms (unless not ``with_default``: the pick
    then selects nothing), their pick at 0.5 ms (so it applies)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary import schedules
    from tvm_canary.runtime import targets
    from tvm_canary.tuning.driver import commit_measurement

    folder = root / keys.device_key(torch.device("cpu"))
    folder.mkdir()
    db = ms.database.JSONDatabase(work_dir=str(folder))
    knobs, target = schedules.knobs("write", False), targets.target_from_tag("llvm")
    default = targets.default_geometry("write", "llvm")
    for bucket, pick in picks.items():
        mod = tvm.IRModule({"main": workloads.descriptor("write", bucket, "llvm")})
        if with_default:
            commit_measurement(db, mod, knobs, default, [1e-3], target)
        commit_measurement(db, mod, knobs, pick, [0.5e-3], target)


def _unrolled(unroll: int):
    from tvm_canary.runtime import targets

    return dataclasses.replace(targets.default_geometry("write", "llvm"), unroll=unroll)


def test_write_geometry_is_chosen_within_the_launch_mode(tmp_path, monkeypatch):
    """Write's NONE ``(reqs, tokens)`` and ALL ``(reqs, tokens, 2)`` buckets choose per mode; PARTIAL: default."""
    picks = {(8, 16): _unrolled(1), (8, 16, 2): _unrolled(2)}
    _write_database(tmp_path, picks)
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path])
    apply._records.cache_clear()
    try:
        for bucket, pick in picks.items():
            assert apply.tuned_geometry("write", torch.device("cpu"), 8, workloads.mode_of("write", bucket)) == pick
        assert apply.tuned_geometry("write", torch.device("cpu"), 8, int(RealKvHashMode.PARTIAL)) is None
    finally:
        apply._records.cache_clear()


def test_a_database_takes_the_place_of_later_ones_only_for_its_workloads(tmp_path, monkeypatch):
    """Once an empty database (``tune --time-limit 0``) hid later ones, a partly tuned one the rest, one
    without a bucket's valid default record its pick."""
    from tvm.s_tir import meta_schedule as ms

    cpu = torch.device("cpu")
    roots = [tmp_path / name for name in ("empty", "user", "committed")]
    for root in roots:
        root.mkdir()
    (roots[0] / keys.device_key(cpu)).mkdir()
    ms.database.JSONDatabase(work_dir=str(roots[0] / keys.device_key(cpu)))  # as older tune runs left one
    _write_database(roots[1], {(8, 16): _unrolled(1), (8, 32): _unrolled(1)}, with_default=False)
    _write_database(roots[2], {(8, 16): _unrolled(2), (1, 512): _unrolled(8)})
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: roots)
    apply._records.cache_clear()
    try:
        assert apply.tuned_geometry("write", cpu, (8, 16)) == _unrolled(2)  # the first selecting a measured pick
        assert apply.tuned_geometry("write", cpu, (8, 32)) == _unrolled(4)  # none does: the default
        assert apply.tuned_geometry("write", cpu, (1, 512)) == _unrolled(8)
    finally:
        apply._records.cache_clear()


def test_the_first_write_of_a_mode_loads_every_geometry_its_buckets_select(tmp_path, monkeypatch):
    """Write's first launch in a mode loads all its buckets' geometries, another token count none (nor in
    CUDA-graph capture). Other kernels load the one they launch."""
    picks = {(8, 16): _unrolled(1), (1, 512): _unrolled(2), (8, 16, 2): _unrolled(8)}
    _write_database(tmp_path, picks)
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path])
    monkeypatch.setattr(C, "_memory", {})
    monkeypatch.setattr(C, "_by_launch", {})
    monkeypatch.setattr(C, "_load_or_build", lambda name, spec, device, geom: (name, geom))  # no compiling here
    apply._records.cache_clear()
    cpu = torch.device("cpu")
    try:
        assert C.get_kernel("write", (0, False, False, 0), cpu, (8, 1), 0) == ("write", _unrolled(1))
        assert {k[4] for k in C._memory} == {_unrolled(1), _unrolled(2)}  # NONE's buckets, not ALL's
        loaded = dict(C._memory)
        assert C.get_kernel("write", (0, False, False, 0), cpu, (1, 2048), 0) == ("write", _unrolled(2))
        assert C._memory == loaded  # nothing more to load
        C.get_kernel("verify", (0, False, False, 0), cpu, 1024, 0)
        assert len(C._memory) == len(loaded) + 1
    finally:
        apply._records.cache_clear()


def test_the_first_write_without_a_database_loads_every_default_of_its_mode(monkeypatch):
    """Without a database write's default follows tokens per request: its first launch loads all its mode's
    defaults, a long chain after a decode step none."""
    from tvm_canary.runtime import targets

    monkeypatch.setattr(C, "tuning_enabled", lambda: False)
    monkeypatch.setattr(targets, "tag_for", lambda device: "cuda-sm_90")
    monkeypatch.setattr(C, "_memory", {})
    monkeypatch.setattr(C, "_by_launch", {})
    monkeypatch.setattr(C, "_load_or_build", lambda name, spec, device, geom: (name, geom))  # no compiling here
    gpu = torch.device("cuda", 0)  # untouched: nothing built or launched
    short = targets.default_geometry("write", "cuda-sm_90", 2, (4096, 1))
    long = targets.default_geometry("write", "cuda-sm_90", 2, (1, 32768))
    assert (short.unroll, long.unroll) == (1, 8)
    assert C.get_kernel("write", (2, False, False, 0), gpu, (4096, 1), 2) == ("write", short)
    assert {k[4] for k in C._memory} == {short, long}
    loaded = dict(C._memory)
    assert C.get_kernel("write", (2, False, False, 0), gpu, (1, 32768), 2) == ("write", long)
    assert C._memory == loaded


@pytest.mark.parametrize("mode", list(RealKvHashMode))
def test_write_launches_carry_their_real_kv_mode(mode):
    """A write folding sources launches in its real-KV hash mode (its buckets choose); without, mode 0."""
    case = write_case(torch.Generator().manual_seed(3), "cpu")
    ctx = case["context"]
    case["context"] = dataclasses.replace(ctx, real_kv_hash_mode=mode, real_kv_sources=four_sources(3)[:2])
    assert packing.write_call(**case).mode == int(mode)
    if mode != RealKvHashMode.ALL:
        case["context"] = dataclasses.replace(ctx, real_kv_hash_mode=mode, real_kv_sources=())
        assert packing.write_call(**case).mode == 0


def test_write_takes_the_bucket_of_its_requests_and_tokens_per_request():
    """Write's point is (request capacity, tokens per request): a decode step takes the one-token bucket at
    any batch, not a long-chain one. A bare size compares leading sizes."""
    gpu_buckets = sorted([(4096, 1), (64, 512), (1, 32768), (4096, 1, 2), (64, 512, 2), (1, 32768, 2)])
    none, folded = [b for b in gpu_buckets if len(b) == 2], [b for b in gpu_buckets if len(b) == 3]
    wants = {(1, 1): (4096, 1), (64, 1): (4096, 1), (256, 1): (4096, 1), (4096, 1): (4096, 1),
             (1, 2048): (1, 32768), (1, 32768): (1, 32768), (16, 64): (64, 512), (64, 512): (64, 512)}
    for point, want in wants.items():
        assert apply.nearest(none, point) == want, point
        assert apply.nearest(folded, point) == (*want, 2), point
    assert apply.nearest(none, 64) == (64, 512) and apply.nearest(none, 1) == (1, 32768)  # leading size only

    case = write_case(torch.Generator().manual_seed(3), "cpu")
    cap, tokens = case["plan"].write_seed_slot_indices.shape[0], case["input_ids"].shape[0]
    assert packing.write_call(**case).size == (cap, max(1, tokens // cap))


def test_scatter_takes_the_bucket_of_its_batch():
    """Scatter's point is its batch size, not its pool's rows (sized for the largest batch)."""
    pool = torch.zeros(4097, 8, dtype=torch.int32)
    call = packing.scatter_call(flat_in=torch.zeros(256 * 8, dtype=torch.int64), offsets=torch.arange(257) * 8,
                                req_pool_indices=torch.arange(256) + 1, pool_out=pool)
    assert call.size == 256
    assert apply.nearest(sorted([(256, 1024), (4096, 1024)]), call.size) == (256, 1024)


def test_a_tuned_launch_takes_a_bucket_of_its_own_size_class(monkeypatch):
    """``apply.tuned_geometry``: nearest bucket in the size class (``targets.size_class``): 64 x 4 takes 4096 x
    1, not the nearer 64 x 512; verify 16385 64K, not the as-near 4K. None in class: default (None)."""
    from tvm_canary.geometry import Geometry
    from tvm_canary.runtime import targets

    names = ("short", "long", "small", "large")
    picks = {name: Geometry(gpu=True, blocks=blocks) for blocks, name in enumerate(names, 1)}
    tables = {"write": {(4096, 1, 2): picks["short"], (64, 512, 2): picks["long"]},
              "verify": {(4096, 2): picks["small"], (1 << 16, 2): picks["large"]}}
    monkeypatch.setattr(apply, "_records", lambda key, cuda: tables)
    monkeypatch.setattr(keys, "device_key", lambda device: "a-test-gpu")
    monkeypatch.setattr(targets, "tag_for", lambda device: "cuda-sm_90")
    gpu = torch.device("cuda", 0)
    assert apply.nearest(sorted(tables["write"]), (64, 4)) == (64, 512, 2)  # nearest of the mode
    wants = {("write", (64, 4)): "short", ("write", (4096, 1)): "short", ("write", (8, 30)): "short",
             ("write", (8, 130)): "long",
             ("write", (1, 32768)): "long", ("verify", 1 << 14): "small", ("verify", (1 << 14) + 1): "large",
             ("verify", 1 << 24): "large"}
    for (kernel, point), want in wants.items():
        assert apply.tuned_geometry(kernel, gpu, point, 2) == picks[want], (kernel, point)
    del tables["write"][4096, 1, 2]
    assert apply.tuned_geometry("write", gpu, (64, 4), 2) is None
    assert apply.tuned_geometry("write", gpu, (64, 130), 2) == picks["long"]
    tables["write"] = {(4096, 1, 1): picks["short"], (64, 512, 1): picks["long"]}
    wants = {(4096, 1): picks["short"], (256, 4): picks["short"], (256, 5): None, (128, 22): None,
             (128, 23): picks["long"]}
    for point, want in wants.items():
        assert apply.tuned_geometry("write", gpu, point, 1) == want, point


def test_device_without_database_falls_back_to_default(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tmp_path))
    apply._records.cache_clear()
    # not the repository's tune_logs/ (may hold this CPU's database)
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path])
    assert apply.tuned_geometry("verify", torch.device("cpu"), 1024) is None
    apply._records.cache_clear()


def test_the_default_geometry_is_that_of_the_launch_mode():
    """Verify and write: a CUDA default per mode (``CUDA_MODE_DEFAULTS``), a design-space point ``tune``
    measures; AOT builds cover a specialization's modes; the CPU has one."""
    from tvm_canary import schedules
    from tvm_canary.consts import RealKvHashMode
    from tvm_canary.runtime import aot, specializations, targets
    from tvm_canary.schedules.space import knob_values_of

    none, partial, full = (targets.default_geometry("verify", "cuda", int(m)) for m in RealKvHashMode)
    assert none == targets.default_geometry("verify", "cuda-sm_90") and len({none, partial, full}) == 3
    assert full == targets.default_geometry("verify", "cuda-sm_90", int(RealKvHashMode.ALL))
    verifies = (none, partial, full)
    assert all(knob_values_of(schedules.knobs("verify", True, int(m)), g) for m, g in zip(RealKvHashMode, verifies))
    assert "pairs" not in schedules.knobs("verify", True) and "pairs" in schedules.knobs("verify", True, 2)
    assert (none.thin, partial.thin, full.thin) == (0, 1, 1)  # thin where faster (defaults.py)
    writes = [targets.default_geometry("write", "cuda", int(m)) for m in RealKvHashMode]
    assert [(g.threads, g.thin) for g in writes] == [(64, 0), (32, 0), (32, 1)]
    assert all(knob_values_of(schedules.knobs("write", True, int(m)), g) for m, g in zip(RealKvHashMode, writes))
    assert (partial.pairs, writes[1].pairs) == (1, 1)  # paired where measured faster
    assert (full.threads, full.pairs, writes[2].pairs) == (32, 2, 2)  # ALL's small launches fold split
    long_all = targets.default_geometry("write", "cuda", int(RealKvHashMode.ALL), (1, 128))
    assert (long_all.threads, long_all.pairs) == (256, 1)  # its long chains paired
    assert all(knob_values_of(schedules.knobs("write", True, mode), geom)  # the size classes' too
               for mode in (1, 2) for geom in targets.default_geometries("write", "cuda", mode))
    cpu = targets.default_geometry("verify", "llvm")
    assert targets.default_geometry("verify", "llvm", int(RealKvHashMode.ALL)) == cpu
    all_mode = specializations.spec("verify", num_sources=2, partial=False, check_token=False, fold_words=0)
    partial_mode = specializations.spec("verify", num_sources=2, partial=True, check_token=False, fold_words=0)
    full_large = targets.default_geometry("verify", "cuda-sm_90", int(RealKvHashMode.ALL), 1 << 20)
    partial_sizes = [targets.default_geometry("verify", "cuda-sm_90", int(RealKvHashMode.PARTIAL), n)
                     for n in (1 << 16, 1 << 20)]
    assert aot.geometries("verify", partial_mode, "cuda-sm_90") == [partial, *partial_sizes]  # every size class
    assert all(knob_values_of(schedules.knobs("verify", True, mode), geom)  # in the tuner's design space
               for mode in (0, 1, 2) for geom in targets.default_geometries("verify", "cuda", mode))
    assert aot.geometries("verify", all_mode, "cuda-sm_90") == [full, full_large]
    no_sources = specializations.spec("verify", num_sources=0, partial=False, check_token=False, fold_words=0)
    none_large = targets.default_geometry("verify", "cuda-sm_90", int(RealKvHashMode.NONE), 1 << 20)
    assert aot.geometries("verify", no_sources, "cuda-sm_90") == [none, none_large]


def test_the_default_geometry_follows_the_launch_size_class():
    """From ``CUDA_SIZE_DEFAULTS``' size on, that class's default; below or sizeless, the mode's. The size is
    the workload point (``KernelCall.size``, ``workloads.point_of``), so launches, tuner and AOT agree.
    Write's classes bound tokens per request; plan, scatter, CPU have none."""
    from tvm_canary import schedules
    from tvm_canary.runtime import targets
    from tvm_canary.schedules import CUDA_SIZE_DEFAULTS
    from tvm_canary.schedules.space import knob_values_of

    for classes in CUDA_SIZE_DEFAULTS.values():  # by increasing bound, each reaching the last
        bounds = [at_least for at_least, _ in classes]
        assert all(targets.reaches(b, a) and a != b for a, b in zip(bounds, bounds[1:])), bounds
    ((at_least, overrides),) = CUDA_SIZE_DEFAULTS[("verify", 2)]
    assert (at_least, overrides) == ((1 << 14) + 1, {"blocks": 2112, "threads": 256, "min_blocks": 4, "thin": 0,
                                                     "pairs": 2})
    split = targets.default_geometry("verify", "cuda-sm_90", 2)
    wide = dataclasses.replace(split, blocks=2112, threads=256, min_blocks=4, thin=0)
    assert (split.threads, split.pairs) == (32, 2) and split.fold_pairs() and not wide.fold_pairs()
    for size, expected in ((None, split), (1, split), (at_least - 1, split), (at_least, wide), (1 << 24, wide)):
        assert targets.default_geometry("verify", "cuda-sm_90", 2, size) == expected, size
    assert targets.default_geometries("verify", "cuda", 2) == [split, wide]
    # PARTIAL: thin, paired below it; full blocks, single-chain folds from it.
    assert CUDA_SIZE_DEFAULTS[("verify", 1)][0][0] == at_least
    partial_small = targets.default_geometry("verify", "cuda-sm_90", 1)
    partial_large = targets.default_geometry("verify", "cuda-sm_90", 1, at_least)
    assert (partial_small.thin, partial_small.pairs, partial_large.thin, partial_large.pairs) == (1, 1, 0, 0)
    assert targets.default_geometry("verify", "cuda-sm_90", 1, at_least - 1) == partial_small
    # from 256K entries (NONE's bound, below) 2112 512-lane blocks, two an SM
    (_, (partial_bound, wide_overrides)) = CUDA_SIZE_DEFAULTS[("verify", 1)]
    assert (partial_bound, wide_overrides) == ((1 << 18) + 1, {"blocks": 2112, "threads": 512, "min_blocks": 2})
    partial_wide = dataclasses.replace(partial_large, blocks=2112, threads=512, min_blocks=2)
    for size, expected in ((partial_bound - 1, partial_large), (partial_bound, partial_wide), (1 << 24, partial_wide)):
        assert targets.default_geometry("verify", "cuda-sm_90", 1, size) == expected, size
    assert targets.default_geometries("verify", "cuda", 1) == [partial_small, partial_large, partial_wide]
    # NONE: 128 registers (min_blocks 4) up to 256K entries, 32 from there
    ((none_bound, none_overrides),) = CUDA_SIZE_DEFAULTS[("verify", 0)]
    assert (none_bound, none_overrides) == ((1 << 18) + 1, {"min_blocks": 16})
    none_small = targets.default_geometry("verify", "cuda-sm_90", 0)
    none_large = dataclasses.replace(none_small, min_blocks=16)
    assert none_small.min_blocks == 4
    for size, expected in ((None, none_small), (1 << 16, none_small), (none_bound - 1, none_small),
                           (none_bound, none_large), (1 << 24, none_large)):
        assert targets.default_geometry("verify", "cuda-sm_90", 0, size) == expected, size
    assert targets.default_geometries("verify", "cuda", 0) == [none_small, none_large]
    # write: from 23 tokens per request (ALL: 128) 8 entries in flight, else 2 (ALL: 1); NONE and PARTIAL
    # 64 full lanes, ALL long chains 256 full paired, short 32 thin split; PARTIAL up to 4 tokens 264 x 32.
    none_short = targets.default_geometry("write", "cuda-sm_90", 0)
    long_lanes = {0: {}, 1: {}, 2: {"threads": 256, "thin": 0, "pairs": 1}}
    for mode, bound in ((0, 23), (1, 23), (2, 128)):
        short = targets.default_geometry("write", "cuda-sm_90", mode)
        chains = none_short if mode == 1 else short  # from 5 tokens per request on
        long = dataclasses.replace(chains, unroll=8, **long_lanes[mode])
        assert chains.unroll == (1 if mode == 2 else 2)
        points = (((4096, 1), short), ((64, 4), short), ((64, 5), chains), ((64, bound - 1), chains),
                  ((1, bound), long), ((64, 512), long), ((1, 32768), long))
        for point, expected in points:
            assert targets.default_geometry("write", "cuda-sm_90", mode, point) == expected, (mode, point)
            assert workloads.default_of("write", (*point, mode), "cuda") == expected, (mode, point)
        assert targets.default_geometry("write", "cuda-sm_90", mode, 4096) == short  # requests alone: no class
        assert targets.default_geometries("write", "cuda", mode) == list(dict.fromkeys([short, chains, long]))
    partial_short = targets.default_geometry("write", "cuda-sm_90", 1)
    assert (partial_short.blocks, partial_short.threads, partial_short.unroll, partial_short.pairs) == (264, 32, 1, 1)
    assert [targets.size_class("write", "cuda", 1, (64, n)) for n in (4, 5, 22, 23)] == [0, 1, 1, 2]
    assert (targets.size_label(at_least), targets.size_label((1, 23))) == ("16385", "1x23")
    assert targets.reaches((64, 512), (1, 23)) and not targets.reaches((4096, 1), (1, 23))
    assert not targets.reaches(4096, (1, 23)) and not targets.reaches((4096,), (1, 23))
    assert targets.reaches(at_least, at_least) and not targets.reaches(at_least - 1, at_least)
    unclassed = (("plan", 0, 4096), ("scatter", 0, 4096))
    for kernel, mode, size in unclassed:
        assert targets.default_geometry(kernel, "cuda", mode, size) == targets.default_geometry(kernel, "cuda", mode)
        assert targets.default_geometries(kernel, "cuda", mode) == [targets.default_geometry(kernel, "cuda", mode)]
    assert targets.default_geometry("verify", "llvm", 2, 1 << 24) == targets.default_geometry("verify", "llvm", 2)
    assert targets.default_geometries("verify", "llvm", 2) == [targets.default_geometry("verify", "llvm", 2)]
    # a bucket's default: a launch's of its size, mode
    assert workloads.point_of("verify", (1 << 16, 2)) == 1 << 16
    assert workloads.point_of("write", (64, 512, 2)) == (64, 512)
    assert workloads.default_of("verify", (4096, 2), "cuda") == split
    assert workloads.default_of("verify", (1 << 16, 2), "cuda") == wide
    assert workloads.default_of("verify", (1 << 24, 2), "cuda") == wide
    assert workloads.default_of("write", (4096, 1, 2), "cuda") == targets.default_geometry("write", "cuda", 2)
    # at the class boundary (16K) the 4K bucket (ties go smaller), split like its default
    buckets = [(4096, 2), (1 << 16, 2)]
    for size in (at_least - 1, at_least):
        launch_default = targets.default_geometry("verify", "cuda", 2, size)
        assert workloads.default_of("verify", apply.nearest(buckets, size), "cuda") == launch_default, size
    assert knob_values_of(schedules.knobs("verify", True, 2), wide)  # a point of the design space: tune measures it


def test_a_launch_takes_the_default_of_its_size_class(monkeypatch):
    """``compile.geometry`` passes the launch's size to the default if no database applies."""
    from tvm_canary.runtime import targets

    monkeypatch.setattr(targets, "tag_for", lambda device: "cuda-sm_90")
    monkeypatch.setenv("TVM_CANARY_TUNED", "0")
    device = torch.device("cuda", 0)
    assert C.geometry("verify", device, 1024, 2).pairs == 2
    assert C.geometry("verify", device, 1 << 20, 2) == targets.default_geometry("verify", "cuda-sm_90", 2, 1 << 20)
    assert C.geometry("verify", device, 1 << 20, 2).threads == 256


def write_bucket_database(folder):
    """(empty database in ``folder``, ``commit(geometry, run_secs)`` for CPU write (8, 16), default)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary import schedules
    from tvm_canary.runtime import targets
    from tvm_canary.tuning import workloads
    from tvm_canary.tuning.driver import commit_measurement

    db = ms.database.JSONDatabase(work_dir=str(folder))
    mod = tvm.IRModule({"main": workloads.descriptor("write", (8, 16), "llvm")})
    knobs, target = schedules.knobs("write", False), targets.target_from_tag("llvm")

    def commit(geom, run_secs, space=knobs):
        commit_measurement(db, mod, space, geom, run_secs, target)

    return db, commit, targets.default_geometry("write", "llvm")


def chosen_in(folder, cuda: bool) -> dict:
    """{kernel: {bucket: geometry}} of ``apply._chosen_geometries`` of ``folder``'s database."""
    from tvm.s_tir import meta_schedule as ms

    out: dict = {}
    db = ms.database.JSONDatabase(work_dir=str(folder), allow_missing=False)
    for (kernel, bucket), (_, geometry) in apply._chosen_geometries(db, str(folder), cuda).items():
        out.setdefault(kernel, {})[bucket] = geometry
    return out


def test_default_geometry_competes_and_failed_records_never_win(tmp_path):
    """``driver.commit_measurement``'s trace replays to the default; a failed (1e10 s) record is no measurement."""
    db, commit, default = write_bucket_database(tmp_path)
    failed = dataclasses.replace(default, unroll=1)
    commit(failed, [1e10])
    assert ("write", (8, 16)) not in apply.measured_records(db)
    commit(default, [1e-3])
    ((cost, record),) = apply.measured_records(db)[("write", (8, 16))]
    assert cost == 1e-3 and apply.record_geometry(record, cuda=False) == default


@pytest.mark.parametrize(("faster", "wins"), [(0.02, False), (0.04, True)])
def test_a_candidate_replaces_the_default_only_when_clearly_faster(tmp_path, faster, wins):
    """``apply.chosen``: the fastest applies only if ``TUNED_MARGIN`` (3%) faster than its database's default."""
    db, commit, default = write_bucket_database(tmp_path)
    candidate = dataclasses.replace(default, unroll=1)
    commit(default, [1e-3])
    commit(candidate, [(1 - faster) * 1e-3])
    rows = apply.measured_records(db)[("write", (8, 16))]
    assert apply.record_geometry(rows[0][1], cuda=False) == candidate  # the fastest record either way
    want = ((1 - faster) * 1e-3, candidate) if wins else (1e-3, default)
    assert apply.chosen("write", (8, 16), rows, cuda=False) == want


@pytest.mark.parametrize("default_seconds", [1e10, None], ids=["default-failed", "default-never-measured"])
def test_a_bucket_without_a_record_of_its_default_keeps_the_default(tmp_path, caplog, default_seconds):
    """``apply.chosen``: only a record measured against the default replaces it; a failed (1e10 s) or
    unmeasured default stays; one warning names the bucket."""
    db, commit, default = write_bucket_database(tmp_path)
    candidate = dataclasses.replace(default, unroll=1)
    commit(candidate, [1e-6])
    if default_seconds is not None:
        commit(default, [default_seconds])
    rows = apply.measured_records(db)[("write", (8, 16))]
    assert [apply.record_geometry(r, cuda=False) for _, r in rows] == [candidate]
    assert apply.chosen_row("write", (8, 16), rows, cuda=False) is None
    cost, geom = apply.chosen("write", (8, 16), rows, cuda=False)
    assert math.isnan(cost) and geom == default
    with caplog.at_level("WARNING", logger="tvm_canary"):
        assert chosen_in(tmp_path, cuda=False) == {"write": {(8, 16): default}}
    (warning,) = [r.getMessage() for r in caplog.records if "no valid record of the default" in r.getMessage()]
    assert "write (8, 16)" in warning
    assert f"`tvm-canary tune --target llvm --kernels write --stale-only --out {tmp_path.parent}`" in warning


def test_a_record_outside_the_design_space_is_never_applied(tmp_path):
    """A hand-edited one (unroll 0 divided by zero per write launch) yields to the fastest valid record."""
    from tvm_canary import schedules

    db, commit, default = write_bucket_database(tmp_path)
    wider = {**schedules.knobs("write", False), "unroll": [0, 1, 2, 4, 8]}
    commit(default, [1e-3])
    commit(dataclasses.replace(default, unroll=0), [1e-6], space=wider)
    rows = apply.measured_records(db)[("write", (8, 16))]
    assert apply.chosen("write", (8, 16), rows, cuda=False) == (1e-3, default)
    valid = dataclasses.replace(default, unroll=1)
    assert apply.in_design_space("write", (8, 16), valid, cuda=False)
    commit(valid, [0.5e-3])
    rows = apply.measured_records(db)[("write", (8, 16))]
    assert apply.chosen("write", (8, 16), rows, cuda=False) == (0.5e-3, valid)
    assert not apply.in_design_space("write", (8, 16), dataclasses.replace(valid, blocks=7), cuda=False)


@pytest.mark.parametrize("damage", ["truncated", "no-records-file", "another-device", "bad-decision", "not-ours"])
def test_an_unreadable_or_foreign_database_leaves_the_defaults(tmp_path, monkeypatch, caplog, capsys, damage,
                                                                committed_cpu_key):
    """An unreadable (truncated, file missing, decision not a candidate) or foreign (another device's, or a
    record of a workload not ``tune``'s) database: defaults, one warning at load, a kv-canary line in ``info``, a
    refused merge; no TVM error per launch."""
    import shutil

    from tvm_canary import info
    from tvm_canary.cli import main

    key = committed_cpu_key
    folder = tmp_path / "logs" / key
    if damage == "another-device":
        shutil.copytree(keys.committed_tune_logs() / "nvidia-h200-sm_90", folder)
        want = "holds records for target cuda sm_90, not for device key"
    else:
        store.unpack(shutil.copytree(keys.committed_tune_logs() / key, folder))
        records = folder / "database_tuning_record.json"
        want = "cannot read the tuning database"
        if damage == "not-ours":  # a stand-in without its canary.kernel attribute
            import tvm
            from tvm.s_tir import meta_schedule as ms

            mod = tvm.IRModule({"main": workloads.descriptor("write", (8, 16), "llvm").without_attr("canary.kernel")})
            db = ms.database.JSONDatabase(work_dir=str(folder))
            db.commit_tuning_record(ms.database.TuningRecord(tvm.s_tir.Schedule(mod).trace, db.commit_workload(mod),
                                                             [1e-6], tvm.target.Target("llvm")))
            want = "holds a record tvm_canary did not write"
        elif damage == "truncated":
            records.write_text(records.read_text()[:-60])
        elif damage == "no-records-file":
            records.unlink()
        else:
            # every unroll-sampling record decides candidate 9 of 4
            records.write_text(re.sub(r"\]\],\[\[1,\d+\]\]\]", "]],[[1,9]]]", records.read_text()))
            assert "[[1,9]]]" in records.read_text(), "no sampled decision to edit"
            want = "Wrong decision value"
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path / "logs"])
    monkeypatch.setattr(apply, "_noticed", set())
    apply._records.cache_clear()
    with caplog.at_level("WARNING", logger="tvm_canary"):
        assert apply.tuned_geometry("write", torch.device("cpu"), 8) is None
    assert [want in r.getMessage() and str(folder) in r.getMessage() for r in caplog.records] == [True], caplog.text
    apply._records.cache_clear()
    assert any(want in line and "none usable" in line for line in info.lines()), info.lines()
    (tmp_path / "out").mkdir()
    assert main(["tune-merge", str(folder), "--out", str(tmp_path / "out" / key)]) == 1
    assert f"kv-canary: refusing to merge {folder}" in capsys.readouterr().err


def test_the_committed_gpu_database_falls_back_to_the_default_of_a_bucket_without_its_record(tmp_path, caplog):
    """Real CUDA records (a committed H200 bucket, times rewritten): another geometry applies if clearly
    faster than the default's record; without it, the default and a warning naming the bucket."""
    from tvm.s_tir import meta_schedule as ms

    folder = store.readable(keys.committed_tune_logs() / "nvidia-h200-sm_90")
    records = ms.database.JSONDatabase(work_dir=str(folder), allow_missing=False).get_all_tuning_records()
    by_bucket: dict = {}
    for record in records:
        func = record.workload.mod["main"]
        by_bucket.setdefault((str(func.attrs["canary.kernel"]), workloads.bucket_of(func)), []).append(record)

    def split(key):
        """A bucket's (default's record, another geometry's record, that geometry), or None."""
        default = workloads.default_of(*key, "cuda")
        geometries = [(apply.record_geometry(r, cuda=True), r) for r in by_bucket[key]]
        mine = next((r for g, r in geometries if g == default), None)
        other = next(((r, g) for g, r in geometries if g != default), None)
        return (mine, *other) if mine is not None and other is not None else None

    found = next(((k, s) for k in sorted(by_bucket) if (s := split(k))), None)
    if found is None:
        pytest.skip("the committed H200 database holds no bucket with a record of another geometry than its default")
    key, (default_record, other_record, other) = found

    launches = workloads.CASE_LAUNCHES.get(key[0], 1)

    def copy_with(name, timed):
        """The folder of a database of the bucket's ``(record, seconds per launch)`` pairs."""
        (tmp_path / name).mkdir()
        db = ms.database.JSONDatabase(work_dir=str(tmp_path / name))
        for record, seconds in timed:
            db.commit_tuning_record(ms.database.TuningRecord(record.trace, db.commit_workload(record.workload.mod),
                                                             [seconds] * launches, record.target, record.args_info))
        return str(tmp_path / name)

    with caplog.at_level("WARNING", logger="tvm_canary"):
        assert chosen_in(copy_with("both", [(default_record, 1e-5), (other_record, 0.9e-5)]),
                         cuda=True) == {key[0]: {key[1]: other}}
        assert not caplog.records
        alone = copy_with("alone", [(other_record, 1e-9)])
        assert chosen_in(alone, cuda=True) == {key[0]: {key[1]: workloads.default_of(*key, "cuda")}}
    (warning,) = [r.getMessage() for r in caplog.records]
    assert f"no valid record of the default geometry of {key[0]} {key[1]}" in warning


def test_a_candidate_slower_in_one_launch_of_its_case_never_replaces_the_default(tmp_path, monkeypatch):
    """``apply.chosen``, two-launch case (verify's; write on the CPU; ``launch_seconds``): a record not
    ``TUNED_MARGIN`` faster than the default in both launches yields to the next that is, else the default."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary import schedules
    from tvm_canary.runtime import targets
    from tvm_canary.tuning import workloads
    from tvm_canary.tuning.driver import commit_measurement

    assert workloads.CASE_LAUNCHES == {"verify": 2}
    assert apply.launch_seconds("verify", [1.0, 5.0, 3.0, 7.0]) == [2.0, 6.0]
    assert apply.launch_seconds("write", [1.0, 5.0, 3.0]) == [3.0]
    monkeypatch.setitem(workloads.CASE_LAUNCHES, "write", 2)
    mod = tvm.IRModule({"main": workloads.descriptor("write", (8, 16), "llvm")})
    knobs, target = schedules.knobs("write", False), targets.target_from_tag("llvm")
    default = targets.default_geometry("write", "llvm")
    # first and second launch (µs) per repeat; the default's case 1200 µs
    timed = {"default": (default, [1000, 200]), "second slower": (dataclasses.replace(default, unroll=1), [900, 201]),
             "second within the margin": (dataclasses.replace(default, unroll=8), [900, 196]),
             "both faster": (dataclasses.replace(default, unroll=2), [960, 193])}

    def pick(*names):
        folder = tmp_path / "-".join(names).replace(" ", "_")
        folder.mkdir()
        db = ms.database.JSONDatabase(work_dir=str(folder))
        for name in names:
            geom, (first_us, second_us) = timed[name]
            commit_measurement(db, mod, knobs, geom, [1e-6 * first_us, 1e-6 * second_us] * 3, target)
        rows = apply.measured_records(db)[("write", (8, 16))]
        cost, geom = apply.chosen("write", (8, 16), rows, cuda=False)
        return round(cost * 1e6, 6), next(name for name in names if timed[name][0] == geom)

    assert pick("default", "second slower", "second within the margin", "both faster") == (1153, "both faster")
    assert pick("default", "second slower", "second within the margin") == (1200, "default")


def test_records_of_a_changed_kernel_are_ignored_with_one_warning(tmp_path, monkeypatch, caplog):
    """One warning names the kernels to re-tune."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary import schedules
    from tvm_canary.runtime import targets
    from tvm_canary.tuning import workloads
    from tvm_canary.tuning.driver import commit_measurement

    key = keys.device_key(torch.device("cpu"))
    (tmp_path / key).mkdir()
    db = ms.database.JSONDatabase(work_dir=str(tmp_path / key))
    target = targets.target_from_tag("llvm")
    tuned = dataclasses.replace(targets.default_geometry("write", "llvm"), unroll=1)
    for kernel, bucket in [("write", (8, 16)), ("write", (1, 64)), ("scatter", (8, 16))]:
        mod = tvm.IRModule({"main": workloads.descriptor(kernel, bucket, "llvm")})
        default = workloads.default_of(kernel, bucket, "llvm")
        commit_measurement(db, mod, schedules.knobs(kernel, False), default, [2e-3], target)
        if kernel == "write":  # twice the default's speed: applies
            commit_measurement(db, mod, schedules.knobs(kernel, False), tuned, [1e-3], target)
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path])
    apply._records.cache_clear()
    assert apply.tuned_geometry("write", torch.device("cpu"), 8) == tuned  # current kernels: applies
    current = workloads.kernel_hash
    monkeypatch.setattr(workloads, "kernel_hash", lambda k, b, kind: "0" * 16 if k == "write" else current(k, b, kind))
    apply._records.cache_clear()
    with caplog.at_level("WARNING", logger="tvm_canary"):
        assert apply.tuned_geometry("write", torch.device("cpu"), 8) is None
        assert apply.tuned_geometry("write", torch.device("cpu"), 1) is None
        assert apply.tuned_geometry("scatter", torch.device("cpu"), 8) is not None  # unchanged kernel: applies
    stale = [r.getMessage() for r in caplog.records if "older version" in r.getMessage()]
    assert len(stale) == 1 and "of write;" in stale[0], stale
    assert "tvm-canary tune --target llvm --kernels write --stale-only --out" in stale[0], stale
    apply._records.cache_clear()


def test_stale_buckets_are_those_without_a_current_record_of_their_default(tmp_path, monkeypatch):
    """``--stale-only``: a bucket without a current default record (other geometry, untuned, changed kernel)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary import schedules
    from tvm_canary.runtime import targets
    from tvm_canary.tuning.driver import commit_measurement

    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    target = targets.target_from_tag("llvm")
    other = dataclasses.replace(targets.default_geometry("write", "llvm"), unroll=1)
    jobs = [("write", (8, 16)), ("write", (1, 64)), ("write", (256, 1)), ("scatter", (8, 16))]
    for (kernel, bucket), geom in zip(jobs, [None, other, "untuned", None]):
        if geom == "untuned":
            continue
        mod = tvm.IRModule({"main": workloads.descriptor(kernel, bucket, "llvm")})
        default = workloads.default_of(kernel, bucket, "llvm")
        assert geom != default
        commit_measurement(db, mod, schedules.knobs(kernel, False), geom or default, [2e-3], target)
    assert apply.stale_buckets(db, jobs, False) == [("write", (1, 64)), ("write", (256, 1))]
    # --stale-only adds the database's buckets (another preset's) to the preset's
    assert apply.database_buckets(db, {"write"}) == [("write", (1, 64)), ("write", (8, 16))]
    assert apply.database_buckets(db, {"write", "scatter"})[0] == ("scatter", (8, 16))
    monkeypatch.setitem(workloads.CASE_VERSIONS, "write", workloads.CASE_VERSIONS["write"] + 1)
    assert apply.stale_buckets(db, jobs, False) == jobs[:3]


@pytest.mark.slow
def test_tune_stale_only_tunes_only_the_workloads_a_kernel_change_staled(tuned_logs, tmp_path, monkeypatch, capsys):
    """After a verify change ``--stale-only`` re-tunes verify only, keeping write's; nothing stale: nothing."""
    import shutil

    from tvm.s_tir import meta_schedule as ms

    out = tmp_path / "tune_logs"
    shutil.copytree(tuned_logs, out)
    def write_records():
        """The copy's valid current write records: (bucket, case seconds) fastest first."""
        db = ms.database.JSONDatabase(work_dir=str(out / keys.device_key(torch.device("cpu"))))
        rows = apply.measured_records(db).items()
        return {key: [cost for cost, _ in costs] for key, costs in rows if key[0] == "write"}

    written = write_records()
    assert written and all(written.values())
    assert main([*TUNE_CI, "--stale-only", "--out", str(out), "--log-dir", str(tmp_path / "ms-0")]) == 0
    stale_line = "--stale-only: {} of 3 workloads without a current record of their default"
    assert stale_line.format(0) + "; nothing to tune" in capsys.readouterr().out
    assert not (tmp_path / "ms-0").exists()  # MetaSchedule never ran
    monkeypatch.setitem(workloads.CASE_VERSIONS, "verify", workloads.CASE_VERSIONS["verify"] + 1)
    assert main([*TUNE_CI, "--stale-only", "--out", str(out), "--log-dir", str(tmp_path / "ms-1")]) == 0
    printed = capsys.readouterr().out
    assert stale_line.format(2) + ": verify (1024,), verify (1024, 2)" in printed
    table = printed[printed.index("kernel "):].splitlines()[1:]
    assert [line.split()[0] for line in table if line.startswith(("write ", "verify "))] == ["verify", "verify"]
    assert write_records() == written
    assert main([*TUNE_CI, "--stale-only", "--out", str(out), "--log-dir", str(tmp_path / "ms-2")]) == 0
    assert "nothing to tune" in capsys.readouterr().out


COMMITTED_KEYS = sorted(p.name for p in keys.committed_tune_logs().iterdir() if store.holds_database(p))


def test_the_committed_databases_are_packed():
    """Both committed databases, each kept packed (``tuning.store``: the tracked tree's budget)."""
    assert COMMITTED_KEYS == ["amd-epyc", "nvidia-h200-sm_90"]
    assert all(store.is_packed(keys.committed_tune_logs() / key) for key in COMMITTED_KEYS)


@pytest.mark.parametrize("key", COMMITTED_KEYS)
def test_committed_databases_match_the_current_kernels(key, tmp_path):
    """Committed records match the kernels (TensorIR changes need a re-tune, or tuning/restamp.py if
    provably code-neutral); each workload is the stand-in `tune` commits today (another would get a twin
    entry); tables compact, as `tune-merge` writes; unpacked and packed again, byte for byte the same."""
    import shutil

    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    folder = keys.committed_tune_logs() / key
    db = ms.database.JSONDatabase(work_dir=str(store.readable(folder)), allow_missing=False)
    stale: set = set()
    assert apply.measured_records(db, stale) and not stale
    today: dict = {}  # (kernel, bucket, target kind) -> today's stand-in, built once
    for record in db.get_all_tuning_records():
        func = record.workload.mod["main"]
        workload = (str(func.attrs["canary.kernel"]), workloads.bucket_of(func), record.target.kind.name)
        if workload not in today:
            today[workload] = workloads.descriptor(*workload)
        assert tvm_ffi.structural_equal(func, today[workload]), workload[:2]
    copy = shutil.copytree(folder, tmp_path / key)
    store.unpack(copy)
    assert merge.compact_workload_table(copy)
    table = store.readable(folder) / "database_workload.json"
    assert (copy / "database_workload.json").read_text() == table.read_text()
    store.pack(copy)
    assert [(copy / n).read_bytes() for n in sorted(os.listdir(folder))] == [
        (folder / n).read_bytes() for n in sorted(os.listdir(folder))]


def test_tune_says_why_the_default_failed_beside_records_that_did_not(tmp_path, monkeypatch, capsys):
    """A failed default (not drawn) is named in the summary, not only MetaSchedule's log."""
    from tvm_canary.tuning import driver

    monkeypatch.setattr(driver, "measure_candidate", lambda *args, **kwargs: ([], "kv-canary: the default's error"))
    monkeypatch.setattr(driver, "default_row", lambda *args, **kwargs: None)
    # not drawn: the search's one candidate may be the default (its draw varies with the host's load)
    monkeypatch.setattr(driver, "_default_records", lambda *args, **kwargs: 0)
    assert main(["tune", "--target", "llvm", "--kernels", "write", "--trials", "1", "--workloads", "ci",
                 "--out", str(tmp_path), "--log-dir", str(tmp_path / "ms-logs")]) == 0
    assert "(the default's measurement failed: kv-canary: the default's error; no record" in capsys.readouterr().out


def test_every_search_round_keeps_metaschedule_quiet_without_verbose(tmp_path, monkeypatch):
    """Each round resets MetaSchedule's logger, which a round's logging setup leaves at DEBUG."""
    import logging

    from tvm.s_tir import meta_schedule as ms

    levels = []

    def round_measuring_nothing(*args, **kwargs):
        levels.append(logging.getLogger("tvm.s_tir.meta_schedule").level)
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.DEBUG)  # as MetaSchedule's setup does

    monkeypatch.setattr(ms, "tune_tir", round_measuring_nothing)
    main(["tune", "--target", "llvm", "--kernels", "write", "--trials", "2", "--workloads", "ci", "--out",
          str(tmp_path), "--log-dir", str(tmp_path / "ms-logs")])
    assert len(levels) > 1 and set(levels) == {logging.WARNING}, levels


def test_restamp_command_line(tmp_path, capsys):
    """``--help`` prints the docstring (no folder traceback); a non-folder is a usage error before any
    re-stamp; re-stamping keeps a committed database's records byte for byte."""
    import shutil

    from tvm_canary.tuning import restamp

    with pytest.raises(SystemExit) as exit_status:
        restamp.main(["--help"])
    assert exit_status.value.code == 0 and restamp.__doc__.splitlines()[0] in capsys.readouterr().out
    copy = shutil.copytree(keys.committed_tune_logs() / "amd-epyc", tmp_path / "amd-epyc")
    store.unpack(copy)
    with pytest.raises(SystemExit) as exit_status:
        restamp.main([str(copy), str(tmp_path / "missing")])
    assert exit_status.value.code == 2 and "missing is not a folder" in capsys.readouterr().err
    broken = tmp_path / "broken" / "amd-epyc"
    shutil.copytree(copy, broken)
    (broken / "database_workload.json").write_text("[truncated")
    table = (copy / "database_workload.json").read_bytes()
    with pytest.raises(SystemExit) as exit_status:  # all folders read before any re-stamp
        restamp.main([str(copy), str(broken)])
    assert exit_status.value.code == 1
    assert f"kv-canary: cannot read the tuning database {broken}" in capsys.readouterr().err
    assert (copy / "database_workload.json").read_bytes() == table
    records = (copy / "database_tuning_record.json").read_bytes()
    workloads_in_table = len((copy / "database_workload.json").read_text().splitlines())
    assert restamp.main([str(copy)]) == 0
    assert capsys.readouterr().out == f"{copy}: {workloads_in_table} workloads re-stamped\n"
    assert (copy / "database_tuning_record.json").read_bytes() == records


def test_a_packed_database_is_read_as_it_is_and_stays_packed_where_written(tmp_path, capsys):
    """A packed folder (``store``) is read through its unpacked copy in the kernel cache (a damaged one refused by
    name); ``restamp``, ``tune-merge`` and ``tune`` write it plain in place and pack it again, records unchanged;
    ``python -m tvm_canary.tuning.store unpack`` / ``pack`` round-trip it byte for byte."""
    import gzip
    import shutil

    from tvm_canary.tuning import restamp

    committed = keys.committed_tune_logs() / "amd-epyc"
    folder = shutil.copytree(committed, tmp_path / "logs" / "amd-epyc")
    records = store.record_lines(folder)
    assert store.readable(folder).name == "amd-epyc" and store.readable(folder) == store.readable(committed)
    assert restamp.main([str(folder)]) == 0
    other = shutil.copytree(committed, tmp_path / "other" / "amd-epyc")
    assert main(["tune-merge", str(other), "--out", str(folder)]) == 0
    assert main(["tune", "--target", "llvm", "--kernels", "write", "--workloads", "ci", "--time-limit", "0",
                 "--out", str(tmp_path / "logs"), "--log-dir", str(tmp_path / "ms")]) == 3
    assert sorted(os.listdir(folder)) == [n + store.PACKED for n in sorted(store.DATABASE_FILES)]
    assert sorted(store.record_lines(folder)) == sorted(records) and apply.measured_records(
        apply.open_database(folder, "amd-epyc"))
    packed = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    assert store.main(["unpack", str(folder)]) == 0 and sorted(os.listdir(folder)) == sorted(store.DATABASE_FILES)
    assert store.main(["pack", str(folder)]) == 0
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == packed
    damaged = folder / (store.DATABASE_FILES[0] + store.PACKED)
    damaged.write_bytes(gzip.compress(b"[truncated", mtime=0))
    with pytest.raises(ValueError, match=f"kv-canary: cannot read the tuning database {folder}"):
        apply.open_database(folder, "amd-epyc")
    capsys.readouterr()


@pytest.mark.parametrize("damage", ["deflate", "no-records-file"])
def test_a_damaged_packed_database_is_refused_by_name_and_left_as_it_was(tmp_path, monkeypatch, capsys, damage):
    """Damaged deflate data (``zlib.error``) or a missing packed records file: listed and refused at load, in
    ``info`` and by ``tune`` in one line naming the user's folder, the folder untouched, no staging left behind."""
    import shutil

    from tvm_canary import info

    folder = shutil.copytree(keys.committed_tune_logs() / "amd-epyc", tmp_path / "logs" / "amd-epyc")
    records = folder / (store.DATABASE_FILES[1] + store.PACKED)
    if damage == "deflate":
        data = bytearray(records.read_bytes())
        data[40:60] = bytes(20)
        records.write_bytes(bytes(data))
        want = f"damaged packed file {records}"
    else:
        records.unlink()
        want = f"{folder} holds database_workload.json.gz but no database_tuning_record.json.gz"
    before = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path / "logs"])
    assert ("amd-epyc", folder) in keys.databases()
    with pytest.raises(ValueError, match=re.escape(f"kv-canary: cannot read the tuning database {folder}: ")):
        apply.open_database(folder, "amd-epyc")
    apply._records.cache_clear()
    assert any(str(folder) in line and ("unreadable" in line or "none usable" in line) for line in info.lines())
    assert main(["tune", "--target", "llvm", "--kernels", "write", "--workloads", "ci", "--time-limit", "0",
                 "--out", str(tmp_path / "logs"), "--log-dir", str(tmp_path / "ms")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot read the tuning database {folder}: " in err and want in err, err
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before
    assert not list((C.cache_dir().parent / "tune-logs").glob("*/.unpacking-*"))


def test_a_packed_database_unpacks_for_the_caches_other_users_or_privately(tmp_path, monkeypatch):
    """The unpacked copy is readable by the cache's other users; where the cache cannot be written, a private
    temporary folder serves."""
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path / "cache"))
    folder = keys.committed_tune_logs() / "amd-epyc"
    copy = store.readable(folder)
    assert copy.stat().st_mode & 0o777 == C.new_file_mode(executable=True)
    assert {(copy / n).stat().st_mode & 0o777 for n in store.DATABASE_FILES} == {C.new_file_mode()}
    monkeypatch.setattr(store, "_cache_root", lambda: pathlib.Path("/proc/no-cache"))
    private = store.readable(folder)
    assert private != copy and private.parent.parent == store._private_root()
    assert [(private / n).read_bytes() for n in store.DATABASE_FILES] == [(copy / n).read_bytes()
                                                                          for n in store.DATABASE_FILES]


def test_restamp_refuses_records_of_an_earlier_tuning_case(tmp_path, monkeypatch, capsys):
    """Records of write's previous tuning case are refused (incomparable times), nothing written."""
    import shutil

    from tvm_canary.tuning import restamp

    copy = shutil.copytree(keys.committed_tune_logs() / "amd-epyc", tmp_path / "amd-epyc")
    store.unpack(copy)
    current = workloads.CASE_VERSIONS["write"]
    monkeypatch.setitem(workloads.CASE_VERSIONS, "write", current - 1)
    assert restamp.main([str(copy)]) == 0  # stamped as on the earlier case
    monkeypatch.setitem(workloads.CASE_VERSIONS, "write", current)
    capsys.readouterr()
    table = (copy / "database_workload.json").read_bytes()
    refused = r"kv-canary: .* holds records of write \(.*\) timed on an earlier tuning case"
    with pytest.raises(SystemExit, match=refused):
        restamp.main([str(copy)])
    assert (copy / "database_workload.json").read_bytes() == table
    stale: set = set()
    apply.measured_records(apply.open_database(copy, "amd-epyc"), stale)
    assert stale == {"write"}


def test_notices_print_once_above_progress_bars(tmp_path, monkeypatch):
    """The "no tuned schedule" notice goes via tqdm.write, once a process and device."""
    from tvm_canary import console

    printed = []
    monkeypatch.setattr(console.tqdm, "write", lambda text, file=None: printed.append(text))
    console.print_notices_above_progress_bars()
    console.print_notices_above_progress_bars()  # idempotent: still one handler
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path])
    monkeypatch.setattr(apply, "_noticed", set())
    apply._records.cache_clear()
    for kernel in ("write", "verify", "write"):
        assert apply.tuned_geometry(kernel, torch.device("cpu"), 8) is None
    key = keys.device_key(torch.device("cpu"))
    assert printed == [f"tvm_canary: no tuned schedule for {key}; using the default schedule"]
    apply._records.cache_clear()


def test_the_notice_names_kernel_and_mode_and_only_where_a_schedule_could_be_tuned(monkeypatch, caplog):
    """Write records in NONE only: a PARTIAL write gets one notice; verify (no CPU knobs) none."""
    import logging

    from tvm_canary.runtime.targets import default_geometry

    key = keys.device_key(torch.device("cpu"))
    monkeypatch.setattr(apply, "_records", lambda key, cuda: {"write": {(8, 16): default_geometry("write", "llvm")}})
    monkeypatch.setattr(apply, "_noticed", set())
    partial = int(RealKvHashMode.PARTIAL)
    with caplog.at_level(logging.WARNING, logger="tvm_canary"):
        for kernel, mode in (("verify", 0), ("verify", partial), ("write", partial), ("write", partial)):
            assert apply.tuned_geometry(kernel, torch.device("cpu"), 8, mode) is None
    assert caplog.messages == [
        f"tvm_canary: no tuned schedule for write (real-KV mode {partial}) on {key}; using the default schedule"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_tune_cuda_without_a_gpu_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_status:
        main(["tune", "--target", "cuda"])
    err = capsys.readouterr().err
    assert exit_status.value.code == 2 and err.count("\n") == 1
    assert err.startswith("tvm-canary tune: error: --target cuda needs a CUDA GPU"), err


def test_candidate_artifacts_have_file_names_of_their_own():
    """A shared name made an RPC session run the first candidate's code (``measure._build_exported``)."""
    import pathlib

    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.runtime import targets
    from tvm_canary.tuning import measure

    geom = targets.default_geometry("write", "llvm")
    built = [measure._build_exported(("write", (8, 16), "llvm", geom, C.source_hash())) for _ in range(2)]
    paths = [pathlib.Path(path) for path, _ in built]
    try:
        assert paths[0].name != paths[1].name and all(p.stat().st_size > 0 for p in paths)
        assert all(seconds > 0 for _, seconds in built)  # the worker's time, for tune's summary
    finally:
        for path in paths:
            ms.utils.remove_build_dir(str(path))


def test_a_dead_build_worker_fails_only_its_round():
    """A dead worker (OOM, codegen crash) fails its round; the next gets a fresh pool."""
    import os
    import signal
    import time

    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.runtime import targets
    from tvm_canary.tuning import measure, workloads

    target = targets.target_from_tag("llvm")
    inputs = [ms.builder.BuilderInput(tvm.IRModule({"main": workloads.descriptor("write", (8, 16), "llvm")}), target)]
    builder = measure.CandidateBuilder(max_workers=1)
    built = []
    try:
        built += builder.build(inputs)
        worker = next(iter(builder._pool._processes))
        os.kill(worker, signal.SIGINT)  # Ctrl-C reaches the workers too: ignored (it broke the pool)
        time.sleep(1)
        built += builder.build(inputs)
        os.kill(worker, signal.SIGKILL)
        time.sleep(1)
        built += builder.build(inputs)  # broken pool: this round fails
        built += builder.build(inputs)  # a fresh pool
        errors = [r.error_msg for r in built]
        assert errors[0] is errors[1] is errors[3] is None and "candidate build failed" in errors[2], errors
    finally:
        builder.shutdown()
        for r in built:
            if r.artifact_path:
                ms.utils.remove_build_dir(r.artifact_path)


OOM_TRACEBACK = """LocalRunner: An exception occurred
Traceback (most recent call last):
  File "/tmp/tvm-site/tvm/exec/popen_worker.py", line 106, in main
    result = fn(*args, **kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 139.80 GiB
"""


def test_error_summary_names_the_exception():
    from tvm_canary.tuning.driver import error_summary

    assert error_summary(OOM_TRACEBACK) == ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 GiB. "
                                            "GPU 0 has a total capacity of 139.80 GiB")
    assert error_summary("build failed\n  in codegen\n") == "in codegen"
    assert error_summary("") == "(no message)"
    assert error_summary("ValueError: " + "x" * 500, width=40) == "ValueError: " + "x" * 25 + "..."


class _FailingBuilder:
    """A builder whose every build fails with ``OOM_TRACEBACK`` (no artifact to run)."""

    build_seconds = worker_seconds = 0.0
    built = max_workers = 0

    def build(self, inputs):
        import types

        return [types.SimpleNamespace(error_msg=OOM_TRACEBACK, artifact_path=None) for _ in inputs]

    def shutdown(self):
        pass


def test_a_workload_that_measures_nothing_says_why(tmp_path):
    """Default failing too: the result names error and log folder, no candidates."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.tuning.driver import tune_workload

    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    result = tune_workload("scatter", (8, 16), "llvm", db, 4, tmp_path / "ms", _FailingBuilder(), runner=None)
    assert result.candidates == 0
    assert "every candidate failed (the default's: torch.OutOfMemoryError: CUDA out of memory." in result.geometry
    assert str(tmp_path / "ms" / "logs") in result.geometry


def test_tune_exits_1_when_a_workload_measured_nothing(tmp_path, monkeypatch, capsys):
    """Nothing recorded into a new database: no empty database is left behind."""
    import types

    from tvm_canary.tuning import driver, measure

    monkeypatch.setattr(measure, "CandidateBuilder", _FailingBuilder)
    idle_runner = types.SimpleNamespace(pool=types.SimpleNamespace(shutdown=lambda: None))
    monkeypatch.setattr(driver, "local_runner", lambda: idle_runner)
    rc = main(["tune", "--target", "llvm", "--kernels", "scatter", "--workloads", "ci", "--out", str(tmp_path),
               "--log-dir", str(tmp_path / "ms")])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "every candidate failed (the default's: torch.OutOfMemoryError" in out
    assert "already had its candidates" not in out  # once said of a run whose every workload failed
    assert "tvm-canary tune: error: nothing measured for 1 workload: scatter (8, 16)" in err
    assert not (tmp_path / keys.device_key(torch.device("cpu"))).exists()


def test_tune_starts_no_workload_past_its_time_limit_or_after_ctrl_c(tmp_path, monkeypatch, capsys):
    """``--time-limit``: start while elapsed plus the longest so far fits; the rest listed, records kept;
    exit 3 with the tuned table (none cut). Ctrl-C in a TVM callback (which TVM re-raises as a bare
    RuntimeError): likewise, the workload cut listed too, exit 130; SIGTERM (``timeout``) as Ctrl-C, exit 143."""
    import signal
    import types

    import tvm_ffi

    from tvm_canary.tuning import command, driver, measure

    clock = [0.0]
    monkeypatch.setattr(command, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(measure, "CandidateBuilder", _FailingBuilder)
    idle_runner = types.SimpleNamespace(pool=types.SimpleNamespace(shutdown=lambda: None))
    monkeypatch.setattr(driver, "local_runner", lambda: idle_runner)
    monkeypatch.setattr(driver, "build_defaults", lambda *args: {})

    interrupted = []  # kernels whose workload gets a Ctrl-C
    stop_signal = [signal.SIGINT]
    ctrl_c = tvm_ffi.convert(lambda: signal.raise_signal(stop_signal[0]))

    def tune_workload(kernel, bucket, *args):
        clock[0] += 10.0
        if kernel in interrupted:
            ctrl_c()
        return driver.Result(kernel, bucket, 2, 2, 2.0, 1.0, "geometry", seconds=10.0)

    monkeypatch.setattr(driver, "tune_workload", tune_workload)
    argv = ["tune", "--target", "llvm", "--kernels", "verify", "write", "plan", "--workloads", "ci",
            "--out", str(tmp_path), "--log-dir", str(tmp_path / "ms")]
    rc = main([*argv, "--time-limit", "25"])
    out, err = capsys.readouterr()
    assert rc == 3
    assert "2 workloads in 20.0 s" in out  # verify (1024,), (1024, 2): a third ends at 30 s
    assert ("stopped (at --time-limit 25 s): 2 workloads not tuned in this run (their earlier records, if any, are "
            "kept): write (8, 16), plan (8, 16)") in err
    clock[0] = 0.0
    assert main(argv) == 0 and "4 workloads in 40.0 s" in capsys.readouterr().out
    clock[0], handler = 0.0, signal.getsignal(signal.SIGINT)
    interrupted.append("write")
    assert main(argv) == 130 and signal.getsignal(signal.SIGINT) is handler
    out, err = capsys.readouterr()
    assert "2 workloads in 20.0 s" in out and "Traceback" not in err
    assert "stopped (interrupted): 2 workloads not tuned in this run" in err and "write (8, 16), plan (8, 16)" in err
    clock[0], stop_signal[0], handler = 0.0, signal.SIGTERM, signal.getsignal(signal.SIGTERM)
    assert main(argv) == 143 and signal.getsignal(signal.SIGTERM) is handler
    assert "stopped (interrupted): 2 workloads not tuned in this run" in capsys.readouterr().err


def test_tune_refuses_an_out_it_cannot_create_before_building(tmp_path, monkeypatch, capsys):
    """One usage line before any build, no traceback."""
    from tvm_canary.tuning import driver

    monkeypatch.setattr(driver, "build_defaults", lambda *a, **k: pytest.fail("built before checking --out"))
    with pytest.raises(SystemExit) as exit_info:
        main([*TUNE_CI, "--out", "/proc/tvm-canary-no-such-folder", "--log-dir", str(tmp_path / "ms")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "cannot" in err and "/proc" in err and "Traceback" not in err, err


def test_tune_refuses_a_default_log_folder_it_cannot_create_before_connecting(monkeypatch, capsys):
    """No ``--log-dir``, an unwritable ``$TVM_CANARY_CACHE``: one usage line before any connection or build."""
    from tvm_canary.tuning import fleet

    monkeypatch.setenv("TVM_CANARY_CACHE", "/proc/tvm-canary-no-such-folder")
    monkeypatch.setattr(fleet, "connect", lambda *a: pytest.fail("connected before checking the log folder"))
    with pytest.raises(SystemExit) as exit_info:
        main([*TUNE_CI, "--rpc-tracker", "127.0.0.1:9", "--rpc-key", "k"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "kv-canary: the default --log-dir: /proc/tvm-canary-no-such-folder/tune-runs: cannot write" in err, err


def test_tune_refuses_a_database_it_cannot_write_and_leaves_it_as_it_was(tuned_logs, tmp_path, monkeypatch, capsys):
    """Refused in one line before tuning, files unchanged, no late traceback (``os.access`` as non-root)."""
    import os
    import shutil

    from tvm_canary import cliargs

    out = tmp_path / "logs"
    shutil.copytree(tuned_logs, out)
    before = {p: p.read_bytes() for p in out.rglob("*.json")}
    records = next(p for p in before if p.name == "database_tuning_record.json")
    real_access = os.access
    monkeypatch.setattr(cliargs.os, "access",
                        lambda path, mode: pathlib.Path(path) != records and real_access(path, mode))
    with pytest.raises(SystemExit) as exit_info:
        main([*TUNE_CI, "--out", str(out), "--log-dir", str(tmp_path / "ms")])
    assert exit_info.value.code == 2
    assert f"kv-canary: cannot write to {records}" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in out.rglob("*.json")} == before


def test_tune_merge_into_an_unwritable_folder_is_one_line(tuned_logs, tmp_path, monkeypatch, capsys):
    """One ``kv-canary:`` line, no traceback."""
    import tempfile

    key = keys.device_key(torch.device("cpu"))

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", refused)
    assert main(["tune-merge", str(tuned_logs / key), "--out", str(tmp_path / "out" / key)]) == 1
    assert "kv-canary: cannot write the merged database" in capsys.readouterr().err


def test_a_time_limit_of_zero_builds_nothing(tmp_path, monkeypatch, capsys):
    """No workload started, no default built; all listed as left, status 3; no empty database left behind,
    an existing one kept."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary.tuning import driver

    monkeypatch.setattr(driver, "build_defaults", lambda *a, **k: pytest.fail("built defaults for no workload"))
    folder = tmp_path / "out" / keys.device_key(torch.device("cpu"))
    for existing in (False, True):
        if existing:
            folder.mkdir()
            ms.database.JSONDatabase(work_dir=str(folder))
        assert main([*TUNE_CI, "--time-limit", "0", "--out", str(tmp_path / "out"), "--log-dir",
                     str(tmp_path / "ms")]) == 3
        assert "3 workloads not tuned in this run" in capsys.readouterr().err
        assert folder.exists() == existing and all((folder / n).exists() == existing for n in merge.DATABASE_FILES)


def test_a_fleet_gone_mid_run_keeps_the_table_and_a_compact_database(tmp_path, monkeypatch, capsys):
    """Last server gone between workloads: ``tune`` prints its table, lists the rest, compacts the
    workload table, exits 1 with the fleet's ``kv-canary:`` line."""
    import json

    from tvm_canary.runtime import targets
    from tvm_canary.tuning import driver, fleet

    asked = []

    def require_servers():
        asked.append(1)
        if len(asked) > 1:
            raise RuntimeError("kv-canary: the RPC tracker at 127.0.0.1:9 has no server under key 'k'")

    cpu = torch.device("cpu")
    remote = dataclasses.make_dataclass("Remote", ["device_key", "tag", "runner", "workers", "require_servers"])(
        keys.device_key(cpu), targets.tag_for(cpu), driver.local_runner, 1, require_servers)
    monkeypatch.setattr(fleet, "connect", lambda *a: remote)
    out = tmp_path / "out"
    assert main([*TUNE_CI, "--rpc-tracker", "127.0.0.1:9", "--rpc-key", "k", "--out", str(out),
                 "--log-dir", str(tmp_path / "ms")]) == 1
    printed = capsys.readouterr()
    assert "tuned geometry" in printed.out and "1 workload in" in printed.out, printed.out
    assert "stopped (the fleet went away): 2 workloads not tuned" in printed.err, printed.err
    assert "kv-canary: the RPC tracker at 127.0.0.1:9 has no server" in printed.err
    table = (out / remote.device_key / "database_workload.json").read_text().splitlines()
    assert table and all(merge.compact_entry(*json.loads(line)) == line for line in table)


def test_a_resumed_workload_measures_only_the_trials_it_lacks(tmp_path, capsys):
    """Under ``--trials`` measured candidates, a workload measures the rest, not ``--trials`` more."""
    args = ["tune", "--target", "llvm", "--kernels", "write", "--workloads", "ci", "--out", str(tmp_path / "out"),
            "--log-dir", str(tmp_path / "ms")]
    for trials in ("2", "4"):
        assert main([*args, "--trials", trials]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()[::-1] if line.startswith("write"))
    candidates, new = row.split()[3:5]  # the bucket "(8, 16)" is two words
    # first run: 2 or 3 (with the default); the resume may redraw a measured geometry, so may end at 3
    # (driver.SEARCH_ROUNDS), never over the space's 4
    assert candidates in {"3", "4"} and 0 <= int(new) <= 2, row


def test_tune_refuses_a_database_folder_without_its_workload_table(tmp_path, capsys, committed_cpu_key):
    """Records without a workload table: refused before tuning (no TVM crash)."""
    import shutil

    folder = tmp_path / "out" / committed_cpu_key
    folder.mkdir(parents=True)
    shutil.copy(store.readable(keys.committed_tune_logs() / committed_cpu_key) / "database_tuning_record.json", folder)
    status = main([*TUNE_CI, "--time-limit", "0", "--out", str(tmp_path / "out"), "--log-dir", str(tmp_path / "ms")])
    assert status == 1
    assert f"kv-canary: cannot read the tuning database {folder}" in capsys.readouterr().err
    assert not (folder / "database_workload.json").exists()


def test_kernel_hash_changes_with_the_tensorir_of_every_path_a_knob_chooses(tmp_path, monkeypatch):
    """A change to TensorIR only thin geometries build changes verify's kernel hash: old records go stale."""
    from tvm.script import tirx as T

    from tvm_canary.kernels import verify as verify_kernel
    from tvm_canary.runtime import parse

    def hashed(cache: str) -> str:
        monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path / cache))
        workloads._hash_table.cache_clear()
        parse.kernel_ir.cache_clear()
        return workloads.kernel_hash("verify", (1024, 0), "cuda")

    work_grid = verify_kernel.work_grid

    def two_warps_at_most_when_thin(geom, units):
        blocks, lanes = work_grid(geom, units)
        return (blocks, T.min(lanes, T.int64(64))) if geom.thin else (blocks, lanes)

    before = hashed("before")
    monkeypatch.setattr(verify_kernel, "work_grid", two_warps_at_most_when_thin)
    try:
        assert hashed("after") != before
    finally:
        monkeypatch.undo()
        workloads._hash_table.cache_clear()
        parse.kernel_ir.cache_clear()
