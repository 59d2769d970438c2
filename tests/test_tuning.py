"""The tuning pipeline without a GPU: a tiny MetaSchedule run on llvm writes a database, the database is
reloaded at kernel load, and the tuned kernels pass the differential tests."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_differential import run_differential

from tvm_canary.cli import main
from tvm_canary.runtime import compile as C
from tvm_canary.tuning import apply, keys


@pytest.fixture(scope="module")
def tuned_logs(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune_logs")
    assert main(["tune", "--target", "llvm", "--kernels", "write", "verify", "--trials", "4", "--workloads", "ci", "--out", str(out)]) == 0
    return out


def test_tune_writes_a_database_per_device(tuned_logs):
    key = keys.device_key(torch.device("cpu"))
    assert (tuned_logs / key / "database_workload.json").exists()
    assert (tuned_logs / key / "database_tuning_record.json").read_text().count("\n") >= 6  # 4 write + 2 verify (NONE and ALL)


def test_tuned_kernels_load_and_match_the_reference(tuned_logs, monkeypatch):
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tuned_logs))
    apply._records.cache_clear()
    # Launches earlier in this process chose their geometry from the repository's tune_logs/: forget them.
    monkeypatch.setattr(C, "_by_launch", {})
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(tuned_logs / keys.device_key(torch.device("cpu"))))
    best = apply.measured_records(db, cuda=False)[("write", (8, 16))][0][1]
    want = apply.record_geometry(best, cuda=False)
    assert apply.tuned_geometry("write", torch.device("cpu"), 8) == want
    assert C.geometry("write", torch.device("cpu"), 8) == want
    for seed in range(15):
        run_differential("write", "cpu", seed)
        run_differential("verify", "cpu", seed)
    assert any(k[0] == "write" and k[4] == want for k in C._memory)  # the tuned build was the one run
    apply._records.cache_clear()


def test_tuned_geometry_is_chosen_within_the_launch_mode(tuned_logs, monkeypatch):
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tuned_logs))
    apply._records.cache_clear()
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(tuned_logs / keys.device_key(torch.device("cpu"))))
    folded = apply.measured_records(db, cuda=False)[("verify", (1024, 2))][0][1]
    assert apply.tuned_geometry("verify", torch.device("cpu"), 1 << 20, 2) == apply.record_geometry(folded, cuda=False)
    assert apply.tuned_geometry("verify", torch.device("cpu"), 1024, 1) is None  # no PARTIAL bucket: default
    apply._records.cache_clear()


def test_device_without_database_falls_back_to_default(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tmp_path))
    apply._records.cache_clear()
    # The repository's own tune_logs/ may hold this CPU's database; point the lookup away from it.
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path])
    assert apply.tuned_geometry("verify", torch.device("cpu"), 1024) is None
    apply._records.cache_clear()


def test_default_geometry_competes_and_failed_records_never_win(tmp_path):
    """``record_default`` stores the default's measurement with a trace that replays to the default; a
    record MetaSchedule marked failed (1e10 s) is not a measurement."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_canary import schedules
    from tvm_canary.runtime import targets
    from tvm_canary.tuning import workloads
    from tvm_canary.tuning.driver import commit_measurement

    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    mod = tvm.IRModule({"main": workloads.descriptor("write", (8, 16), "llvm")})
    knobs, target = schedules.knobs("write", False), targets.target_from_tag("llvm")
    default = targets.default_geometry("write", "llvm")
    failed = dataclasses.replace(default, unroll=1)
    commit_measurement(db, mod, knobs, failed, 1e10, target)
    assert ("write", (8, 16)) not in apply.measured_records(db, cuda=False)
    commit_measurement(db, mod, knobs, default, 1e-3, target)
    ((cost, record),) = apply.measured_records(db, cuda=False)[("write", (8, 16))]
    assert cost == 1e-3 and apply.record_geometry(record, cuda=False) == default
