"""Fleet tuning without a GPU: a loopback tracker and CPU ``tvm-canary rpc-server`` tune a tiny llvm
workload end to end, the record applying at load; preflight refuses what would hang or measure by another
protocol; a terminated ``rpc-server`` leaves no process; ``tune-merge`` keeps each workload's choice (and
default) of a run measuring the default, refusing another device's database."""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import struct
import subprocess
import sys
import time
import types

import pytest
import torch
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tvm_canary import schedules
from tvm_canary.cli import main
from tvm_canary.runtime import compile as C
from tvm_canary.runtime import targets
from tvm_canary.runtime.targets import default_geometry
from tvm_canary.tuning import apply, driver, fleet, keys, measure, merge, workloads
from tvm_canary.tuning.driver import commit_measurement

RPC_KEY = "ci-cpu"
TUNE_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def tracker():
    """HOST:PORT of a loopback tracker with one CPU tvm_canary RPC server under RPC_KEY."""
    with fleet.local_fleet(RPC_KEY, [{}], start_timeout_s=60) as address:
        yield address


@pytest.fixture(scope="module")
def mixed_tracker():
    """A loopback tracker, a tvm_canary RPC server then TVM's stock one, under the key "mix"."""
    with fleet.local_fleet("mix", [{}], start_timeout_s=60) as address:
        host, port = fleet.parse_address(address)
        stock = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", address, "--key", "mix",
                                  "--host", host, "--port", str(fleet._free_port()), "--port-end", "65535"],
                                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            fleet._await_servers(host, port, "mix", lambda servers, free: free == 2)
            yield address
        finally:
            fleet.stop_process_group(stock)


@pytest.mark.slow
def test_preflight_refuses_a_stock_server_beside_a_canary_one(mixed_tracker):
    """Preflight checks every server, not just the first registered."""
    with pytest.raises(fleet.ServerRefused, match="^kv-canary: the RPC server under key 'mix' lacks tvm_canary"):
        fleet.connect(mixed_tracker, "mix", "llvm", None)


def test_preflight_checks_the_free_servers_and_waits_for_none_busy(monkeypatch):
    """A server busy with another client is not awaited (the runner worker reaching it checks)."""
    requests = []
    monkeypatch.setattr(fleet, "_registered", lambda *_: (2, 1))
    monkeypatch.setattr(fleet, "_request", lambda *_: requests.append(object()) or requests[-1])
    monkeypatch.setattr(fleet, "_server_info", lambda *_: {"key": "k", "tag": "llvm"})
    assert fleet.connect("127.0.0.1:9", "busy", "llvm", 1).device_key == "k" and len(requests) == 1


def test_a_server_refused_mid_run_ends_the_run(tmp_path, monkeypatch, capsys):
    """A worker's refusal ends tune (exit 1) via MetaSchedule's C++ loop, not a 1e10 s candidate, exit 0."""
    inner = concurrent.futures.Future()
    inner.set_exception(fleet.ServerRefused("Traceback ...\ntvm_canary.tuning.fleet.ServerRefused: kv-canary: no"))
    future = types.SimpleNamespace(_inst=types.SimpleNamespace(future=inner, result=lambda: pytest.fail("stored")))
    with pytest.raises(fleet.ServerRefused, match="^kv-canary: no$"):
        fleet._refusing(future)._inst.result()
    assert isinstance(tvm_ffi.convert(fleet.ServerRefused("x")).py_error(), fleet.ServerRefused)
    remote = fleet.Fleet("127.0.0.1", 9, "k", "llvm", keys.device_key(torch.device("cpu")), "llvm", 1)
    monkeypatch.setattr(fleet, "connect", lambda *_: remote)
    monkeypatch.setattr(fleet.Fleet, "require_servers", lambda self: None)
    monkeypatch.setattr(fleet.Fleet, "runner", lambda self: types.SimpleNamespace(pool=concurrent.futures.Executor()))
    monkeypatch.setattr(driver, "build_defaults", lambda *_: {})
    monkeypatch.setattr(driver, "tune_workload", lambda *_: fleet._refusing(future)._inst.result())
    assert main(["tune", "--target", "llvm", "--kernels", "write", "--workloads", "ci", "--out", str(tmp_path),
                 "--rpc-tracker", "127.0.0.1:9", "--rpc-key", "k"]) == 1
    err = capsys.readouterr().err
    assert "stopped (an RPC server was refused): 1 workload not tuned" in err and "error: kv-canary: no\n" in err


@pytest.mark.slow
def test_a_server_a_runner_worker_refuses_ends_a_real_run(tracker, tmp_path, monkeypatch, capsys):
    """Across MetaSchedule's real runner (``Fleet.runner`` wraps its futures) a foreign device key ends
    ``tune``: exit 1, nothing stored."""
    connect = fleet.connect

    def another_key(*args):
        found = connect(*args)
        return dataclasses.replace(found, device_key=found.device_key + "-other")

    monkeypatch.setattr(fleet, "connect", another_key)
    args = ["tune", "--target", "llvm", "--kernels", "write", "--workloads", "ci", "--trials", "2", "--out",
            str(tmp_path), "--log-dir", str(tmp_path / "ms-logs"), "--rpc-tracker", tracker, "--rpc-key", RPC_KEY]
    assert fleet._bounded("tune on the loopback fleet", lambda: main(args), timeout_s=TUNE_TIMEOUT_S) == 1
    err = capsys.readouterr().err
    assert "stopped (an RPC server was refused)" in err and "-other (one RPC key per device model)" in err
    assert not any(line.strip() for folder in tmp_path.glob("*-other") for line in
                   (folder / "database_tuning_record.json").read_text().splitlines())


@pytest.fixture(scope="module")
def fleet_logs(tracker, tmp_path_factory):
    out = tmp_path_factory.mktemp("fleet_logs")
    # two kernels, three workloads, one session: each candidate its own code and case
    args = ["tune", "--target", "llvm", "--kernels", "write", "verify", "--workloads", "ci", "--trials", "2",
            "--out", str(out), "--log-dir", str(out.parent / "ms-logs"), "--rpc-tracker", tracker, "--rpc-key", RPC_KEY]
    # outer limit: a dead server would leave MetaSchedule waiting
    assert fleet._bounded("tune on the loopback fleet", lambda: main(args), timeout_s=TUNE_TIMEOUT_S) == 0
    return out


@pytest.mark.slow
def test_fleet_tuning_measures_on_the_server_and_its_record_applies(fleet_logs, monkeypatch, capsys):
    key = keys.device_key(torch.device("cpu"))  # the server runs on this CPU
    db = ms.database.JSONDatabase(work_dir=str(fleet_logs / key))
    records = apply.measured_records(db)
    assert set(records) == {("write", (8, 16)), ("verify", (1024,)), ("verify", (1024, 2))}  # every workload measured
    rows = records[("write", (8, 16))]
    assert len(rows) >= 2  # 2 candidates (and the default if not drawn), all checked
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(fleet_logs))
    monkeypatch.setattr(C, "_by_launch", {})
    apply._records.cache_clear()
    want = apply.chosen("write", (8, 16), rows, cuda=False)[1]
    try:
        assert apply.tuned_geometry("write", torch.device("cpu"), 8) == want
    finally:
        apply._records.cache_clear()


@pytest.mark.slow
def test_a_candidate_failing_the_reference_check_on_the_server_never_becomes_a_record(fleet_logs):
    """Every stored time is real: MetaSchedule marks failed candidates with 1e10 s."""
    db = ms.database.JSONDatabase(work_dir=str(fleet_logs / keys.device_key(torch.device("cpu"))))
    assert all(max(float(s) for s in r.run_secs) < apply.FAILED_RUN_SECS for r in db.get_all_tuning_records())


@pytest.mark.slow
def test_preflight_refuses_what_would_hang(tracker, monkeypatch):
    with pytest.raises(RuntimeError, match="kv-canary: the RPC tracker at .* has no server under key 'nobody'"):
        fleet.connect(tracker, "nobody", "llvm", None)
    with pytest.raises(ValueError, match="kv-canary: --rpc-workers must be between 1 and the 1 server registered"):
        fleet.connect(tracker, RPC_KEY, "llvm", 2)
    with pytest.raises(RuntimeError, match="kv-canary: cannot reach the RPC tracker"):
        fleet.connect(f"127.0.0.1:{fleet._free_port()}", RPC_KEY, "llvm", None)
    # the server's refusal: one kv-canary line, not TVM's RPCError traceback
    with pytest.raises(RuntimeError, match="^kv-canary: this RPC server has no CUDA GPU visible to torch$"):
        fleet.connect(tracker, RPC_KEY, "cuda", None)
    # a gone fleet: a session request fails after TRACKER_TIMEOUT_S (1 s here), asked per workload
    # (``Fleet.require_servers``).
    monkeypatch.setattr(fleet, "TRACKER_TIMEOUT_S", 1)
    host, port = fleet.parse_address(tracker)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="has no server under key 'nobody'"):
        fleet._request(host, port, "nobody")
    with pytest.raises(RuntimeError, match="has no server under key 'nobody'"):
        fleet.Fleet(host, port, "nobody", "llvm", "amd-epyc", "llvm", 1).require_servers()
    assert time.monotonic() - start < 10


def test_a_terminated_rpc_server_stops_its_server_process():
    """SIGTERM/SIGINT on ``rpc-server`` stops its TVM server (else keeping port and registration). No
    tracker: the server binds its port, retries."""
    import psutil

    args = [sys.executable, "-m", "tvm_canary", "rpc-server", "--tracker", f"127.0.0.1:{fleet._free_port()}",
            "--key", RPC_KEY, "--host", "127.0.0.1", "--port", str(fleet._free_port()), "--port-end", "65535"]
    proc = subprocess.Popen(args, cwd=pathlib.Path(fleet.__file__).parents[2], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        started = fleet._bounded("the rpc-server's start", proc.stdout.readline, timeout_s=60)
        assert started.startswith("tvm_canary RPC server on port"), started
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children  # the TVM server process
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(10)
        assert psutil.wait_procs(children, timeout=5)[1] == []  # none left alive
        assert status == 128 + signal.SIGTERM  # stopped by it, not the signal's default
    finally:
        fleet.stop_process_group(proc)  # what a failure left behind
        proc.stdout.close()


@pytest.mark.slow  # a loopback tracker and server
def test_an_rpc_server_whose_session_process_was_killed_serves_again(tmp_path):
    """Once a session killed by a signal (OOM, segfaulting candidate) ends TVM's listen thread, a new server
    registers and serves."""
    import psutil

    with fleet.local_fleet(RPC_KEY, [{}], log_dir=tmp_path) as address:
        host, port = fleet.parse_address(address)
        (rpc_server,) = (p for p in psutil.Process().children() if {"rpc-server", address} <= set(p.cmdline()))
        session = fleet._request(host, port, RPC_KEY)
        (server,) = rpc_server.children()  # the TVM server process
        (session_process,) = server.children()
        session_process.send_signal(signal.SIGKILL)
        del session
        session = fleet._request(host, port, RPC_KEY)  # within TRACKER_TIMEOUT_S (was: refused, no server)
        assert json.loads(session.get_function("tvm_canary.fleet.device_info")("llvm"))["protocol"]
        assert rpc_server.is_running()
        assert "kv-canary: the RPC server stopped serving" in (tmp_path / "server-0.log").read_text()


def test_a_hung_candidate_ends_its_session_process():
    """Past CANDIDATE_TIMEOUT_S (1 s here) a session process ends (exit status 1), even in native code holding
    the GIL (a backtracking regex); a candidate done in time disarms the limit."""
    script = ("import re, time\nfrom tvm_canary.tuning import fleet, measure\nfleet.CANDIDATE_TIMEOUT_S = 1\n"
              "measure.run_case = lambda *args: [1e-6]\n"
              "print(fleet._run_case(None, '[1]', 'llvm', 1, 1, 0), flush=True)\ntime.sleep(2)\n"
              "measure.run_case = lambda *args: [float(bool(re.match('(a+)+$', 'a' * 64 + 'b')))]\n"
              "print('returned', fleet._run_case(None, '[1]', 'llvm', 1, 1, 0), flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=pathlib.Path(fleet.__file__).parents[2],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (1, "[1e-06]\n"), proc.stderr
    assert "Timeout (0:00:01)!" in proc.stderr


def test_an_rpc_server_whose_tracker_is_gone_exits(monkeypatch, capsys):
    """TVM's server quits retrying after 60 s, living unregistered; ``rpc-server`` exits 1 (stopping it)
    after TRACKER_GONE_S (2 s here) of refusals."""
    monkeypatch.setattr(fleet, "TRACKER_GONE_S", 2)
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # what ``serve`` sets, restored afterwards
    port = fleet._free_port()
    args = argparse.Namespace(tracker=f"127.0.0.1:{fleet._free_port()}", key=RPC_KEY, host="127.0.0.1", port=port,
                              port_end=65535, custom_addr=None)
    start = time.monotonic()
    assert fleet._serve_command(args) == 1
    assert time.monotonic() - start < 60
    assert "has refused connections for 2 s; this server can no longer register" in capsys.readouterr().err


def test_build_workers_exit_when_the_tuning_process_is_killed():
    """Build workers (~500 MB each) exit with a SIGKILLed ``tune`` parent (``measure.exit_with_parent``)."""
    import psutil

    script = ("import os, signal\nfrom tvm_canary.tuning import measure\nbuilder = measure.CandidateBuilder(1)\n"
              "builder.build([])  # starts the pool\nprint(builder._pool.submit(os.getpid).result(), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=pathlib.Path(fleet.__file__).parents[2],
                          capture_output=True, text=True, timeout=120)
    worker = int(proc.stdout.split()[-1])
    deadline = time.monotonic() + 20
    while psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the build worker outlived its killed parent"
        time.sleep(0.2)


# -- tune-merge


def _database(root, key, costs: dict):
    """A database ``root/key``: the given seconds per (kernel, bucket, geometry)."""
    folder = root / key
    folder.mkdir(parents=True)
    db = ms.database.JSONDatabase(work_dir=str(folder))
    for (kernel, bucket, geom), seconds in costs.items():
        mod = tvm.IRModule({"main": workloads.descriptor(kernel, bucket, "llvm")})
        launches = workloads.CASE_LAUNCHES.get(kernel, 1)  # ``seconds``: the case's, split over launches
        commit_measurement(db, mod, schedules.knobs(kernel, False), geom, [seconds / launches] * launches,
                           targets.target_from_tag("llvm"))
    return folder


def test_tune_merge_keeps_the_chosen_record_of_a_run_that_measured_the_default(tmp_path, capsys):
    """Host a chose its default (2.05 us) over a slower candidate; host b measured a faster one (2 us), no
    default: a's choice and default stay, not b's unweighed one. A failed record never wins."""
    key = keys.device_key(torch.device("cpu"))
    g = {u: dataclasses.replace(default_geometry("write", "llvm"), unroll=u) for u in (1, 2, 4)}
    assert g[4] == default_geometry("write", "llvm")
    a = _database(tmp_path / "host-a", key, {("write", (8, 16), g[1]): 3e-6, ("write", (8, 16), g[4]): 2.05e-6,
                                             ("write", (256, 1), g[2]): 1e10})
    b = _database(tmp_path / "host-b", key, {("write", (8, 16), g[2]): 2e-6, ("write", (256, 1), g[4]): 5e-6})
    out = tmp_path / "merged" / key
    assert main(["tune-merge", str(a), str(b), "--out", str(out)]) == 0
    merged = apply.measured_records(ms.database.JSONDatabase(work_dir=str(out)))
    # per workload the chosen record, and the default's if other
    assert {w: len(rows) for w, rows in merged.items()} == {("write", (8, 16)): 1, ("write", (256, 1)): 1}
    assert apply.record_geometry(merged[("write", (8, 16))][0][1], cuda=False) == g[4]  # a's choice: its default
    assert apply.record_geometry(merged[("write", (256, 1))][0][1], cuda=False) == g[4]  # the failed record lost
    assert "wrote 2 workloads" in capsys.readouterr().out


def test_tune_merge_keeps_a_qualifying_choice_over_a_faster_record_without_its_default(tmp_path, monkeypatch):
    """Two-launch case (µs): host a chose g1 (45, 45) over its default (50, 50); host b measured only g2 (39, 50.5),
    slower than a's default in launch two. Kept: a's choice and default, not the default weighing b against it gives."""
    monkeypatch.setitem(workloads.CASE_LAUNCHES, "write", 2)
    key = keys.device_key(torch.device("cpu"))
    default = targets.default_geometry("write", "llvm")
    g1, g2 = (dataclasses.replace(default, unroll=u) for u in (1, 2))
    mod = tvm.IRModule({"main": workloads.descriptor("write", (8, 16), "llvm")})
    for host, measured in (("host-a", [(default, (50, 50)), (g1, (45, 45))]), ("host-b", [(g2, (39, 50.5))])):
        folder = tmp_path / host / key
        folder.mkdir(parents=True)
        db = ms.database.JSONDatabase(work_dir=str(folder))
        for geom, launches in measured:
            commit_measurement(db, mod, schedules.knobs("write", False), geom, [1e-6 * us for us in launches] * 3,
                               targets.target_from_tag("llvm"))
    out = tmp_path / "merged" / key
    assert main(["tune-merge", str(tmp_path / "host-a" / key), str(tmp_path / "host-b" / key), "--out", str(out)]) == 0
    rows = apply.measured_records(ms.database.JSONDatabase(work_dir=str(out)))[("write", (8, 16))]
    assert [apply.record_geometry(r, cuda=False) for _, r in rows] == [g1, default]
    assert apply.chosen("write", (8, 16), rows, cuda=False)[1] == g1


def test_a_server_that_measures_with_another_protocol_is_refused(monkeypatch):
    """``measure.protocol`` hashes what shapes a measurement; another tvm_canary's server (times ranked with
    this host's): refused by name."""
    assert len(measure.protocol()) == 16 and measure.protocol() == measure.protocol()
    ours = {"key": "k", "tag": "llvm", "protocol": measure.protocol()}
    monkeypatch.setattr(fleet, "_server_function", lambda session, rpc_key, name: lambda device_type: json.dumps(ours))
    assert fleet._server_info(None, "ci", "llvm") == ours
    ours["protocol"] = "0" * 16
    with pytest.raises(RuntimeError, match="another measurement protocol"):
        fleet._server_info(None, "ci", "llvm")
    del ours["protocol"]  # a server from before protocols were reported
    with pytest.raises(RuntimeError, match="another measurement protocol"):
        fleet._server_info(None, "ci", "llvm")


def test_a_server_reports_the_protocol_of_the_code_it_imported(monkeypatch):
    """Read before sessions fork (read in one, updated files passed for the code the server runs)."""
    started = measure.protocol()
    monkeypatch.setattr(measure, "protocol", functools.lru_cache(measure.protocol.__wrapped__))  # fresh, restored
    fleet.register_server_functions()
    monkeypatch.setattr(C, "files_hash", lambda files: "updated")
    assert json.loads(fleet._device_info("llvm"))["protocol"] == started


def test_tune_merge_writes_the_workload_table_compact(tmp_path):
    """The merged table drops MetaSchedule's indentation (~half the bytes); same modules and records."""
    key = keys.device_key(torch.device("cpu"))
    source = _database(tmp_path / "host", key, {("write", (8, 16), default_geometry("write", "llvm")): 1e-6,
                                               ("verify", (4096,), default_geometry("verify", "llvm")): 2e-6})
    out = tmp_path / "merged" / key
    assert main(["tune-merge", str(source), "--out", str(out)]) == 0
    written = (out / "database_workload.json").read_text()
    assert len(written) < 0.7 * len((source / "database_workload.json").read_text())
    for line in written.splitlines():
        raw = base64.b64decode(json.loads(line)[1])
        (length,) = struct.unpack("<Q", raw[:8])
        assert length == len(raw) - 8 and raw[8:] == json.dumps(json.loads(raw[8:]), separators=(",", ":")).encode()

    def modules(folder):
        records = ms.database.JSONDatabase(work_dir=str(folder)).get_all_tuning_records()
        named = [(str(r.workload.mod["main"].attrs["canary.kernel"]), r.workload.mod) for r in records]
        return sorted(named, key=lambda m: m[0])

    merged, original = modules(out), modules(source)
    assert [name for name, _ in merged] == [name for name, _ in original] == ["verify", "write"]
    for (_, a), (_, b) in zip(merged, original):
        tvm.ir.assert_structural_equal(a, b)


def test_tune_merge_never_leaves_a_table_beside_records_it_does_not_match(tmp_path, monkeypatch, capsys):
    """Records name workloads by position. Stopped at any step, ``--out`` (new too) holds the old
    database, a table with empty records, or the new one; files get the umask's mode, not 0600."""
    key = keys.device_key(torch.device("cpu"))
    geom = default_geometry("write", "llvm")
    old = {("write", (8, 16), geom): 1e-6}
    new = {("verify", (4096,), default_geometry("verify", "llvm")): 2e-6, ("write", (256, 1), geom): 3e-6}
    out, fresh = tmp_path / "out" / key, tmp_path / "fresh" / key
    assert main(["tune-merge", str(_database(tmp_path / "old", key, old)), "--out", str(out)]) == 0
    before = [(out / name).read_bytes() for name in merge.DATABASE_FILES]
    source = _database(tmp_path / "new", key, new)
    renames = os.replace
    for stop in range(3):
        for target in (out, fresh):
            calls = []

            def replace(src, dst, stop=stop, calls=calls):
                calls.append(dst)
                if len(calls) > stop:
                    raise OSError(28, "No space left on device")
                renames(src, dst)

            monkeypatch.setattr(merge.os, "replace", replace)
            with pytest.raises(OSError):
                merge.merge([source], target)
            monkeypatch.setattr(merge.os, "replace", renames)
        table, records = [(out / name).read_bytes() for name in merge.DATABASE_FILES]
        assert [table, records] == before or records == b"", stop
        (out / merge.DATABASE_FILES[0]).write_bytes(before[0])
        (out / merge.DATABASE_FILES[1]).write_bytes(before[1])
        assert main(["tune-merge", str(source), "--out", str(fresh)]) == 0, stop
        shutil.rmtree(fresh)
    assert main(["tune-merge", str(source), "--out", str(out)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert {(out / name).stat().st_mode & 0o777 for name in merge.DATABASE_FILES} == {0o666 & ~umask}


def test_tune_merge_says_which_stale_records_it_drops(tmp_path, monkeypatch, capsys):
    """Older kernel code's records dropped: their kernels named, and the buckets without a current record."""
    key, buckets = keys.device_key(torch.device("cpu")), [(8, 16), (256, 1)]

    def database(name, tuned):
        return _database(tmp_path / name, key, {("write", b, workloads.default_of("write", b, "llvm")): 1e-6
                                                for b in tuned})

    def merged(*sources):
        out = tmp_path / "out" / "-".join(p.parent.name for p in sources) / key
        assert main(["tune-merge", *map(str, sources), "--out", str(out)]) == 0
        return capsys.readouterr().out

    stale = database("stale", buckets)
    monkeypatch.setitem(workloads.CASE_VERSIONS, "write", workloads.CASE_VERSIONS["write"] + 1)
    out = merged(stale)
    assert "wrote 0 workloads" in out and "dropped the records of write tuned for older kernel code" in out
    assert "(re-tune write (8, 16), write (256, 1) with `tvm-canary tune --stale-only`" in out
    assert "(re-tune write (256, 1) with" in merged(stale, database("one", buckets[:1]))
    assert "(superseded: each of their buckets has a current record)" in merged(stale, database("both", buckets))


def test_tune_refuses_a_folder_of_another_target_or_unreadable(tmp_path, capsys):
    """A device-key folder of another target's or truncated records: refused by name before any write (no
    unusable database, no TVM traceback)."""
    key = keys.device_key(torch.device("cpu"))
    one_record = {("write", (8, 16), default_geometry("write", "llvm")): 1e-6}
    shutil.copytree(keys.committed_tune_logs() / "nvidia-h200-sm_90", tmp_path / "gpu" / key)
    assert main(["tune", "--target", "llvm", "--kernels", "write", "--trials", "1",
                 "--out", str(tmp_path / "gpu")]) == 1
    assert "holds records for target" in capsys.readouterr().err
    broken = _database(tmp_path / "broken", key, one_record)
    (broken / "database_workload.json").write_text("[truncated")
    assert main(["tune", "--target", "llvm", "--kernels", "write", "--trials", "1",
                 "--out", str(tmp_path / "broken")]) == 1
    assert f"kv-canary: cannot read the tuning database {broken}" in capsys.readouterr().err


def test_tune_merge_refuses_another_devices_database(tmp_path, capsys):
    key = keys.device_key(torch.device("cpu"))
    one_record = {("write", (8, 16), default_geometry("write", "llvm")): 1e-6}
    ours = _database(tmp_path / "a", key, one_record)
    theirs = _database(tmp_path / "b", "nvidia-h200-sm_90", one_record)
    out = tmp_path / "merged" / key
    assert main(["tune-merge", str(ours), str(theirs), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert (f"kv-canary: refusing to merge {theirs}: it is the database of device key 'nvidia-h200-sm_90', "
            f"the output is for '{key}'") in err
    assert not out.exists()  # nothing written
    # an llvm database renamed into a GPU key's folder: refused by its records' target
    renamed = tmp_path / "c" / "nvidia-h200-sm_90"
    renamed.parent.mkdir()
    ours.rename(renamed)
    assert main(["tune-merge", str(renamed), "--out", str(tmp_path / "m2" / "nvidia-h200-sm_90")]) == 1
    assert "holds records for target llvm, not for device key 'nvidia-h200-sm_90'" in capsys.readouterr().err


def test_a_database_applies_only_to_its_own_device_key(tmp_path, monkeypatch, caplog):
    key = keys.device_key(torch.device("cpu"))
    _database(tmp_path, "another-cpu", {("write", (8, 16), default_geometry("write", "llvm")): 1e-6})
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path])
    apply._records.cache_clear()
    apply._noticed.discard(key)
    try:
        with caplog.at_level("WARNING", logger="tvm_canary"):
            assert apply.tuned_geometry("write", torch.device("cpu"), 8) is None
        assert f"no tuned schedule for {key}; using the default schedule" in caplog.text
    finally:
        apply._records.cache_clear()


def test_tune_merge_weighs_the_best_against_its_own_runs_default(tmp_path):
    """A record is weighed against its run's default, not another's faster one: host a measured g1 10%
    under its default, host b the default 1% over g1."""
    key = keys.device_key(torch.device("cpu"))
    g = {u: dataclasses.replace(default_geometry("write", "llvm"), unroll=u) for u in (1, 4)}
    a = _database(tmp_path / "host-a", key, {("write", (8, 16), g[1]): 2.0e-6, ("write", (8, 16), g[4]): 2.2e-6})
    b = _database(tmp_path / "host-b", key, {("write", (8, 16), g[4]): 2.02e-6})
    out = tmp_path / "merged" / key
    assert main(["tune-merge", str(a), str(b), "--out", str(out)]) == 0
    rows = apply.measured_records(ms.database.JSONDatabase(work_dir=str(out)))[("write", (8, 16))]
    assert [(round(c * 1e6, 2), apply.record_geometry(r, cuda=False)) for c, r in rows] == [(2.0, g[1]), (2.2, g[4])]
    assert apply.chosen("write", (8, 16), rows, cuda=False)[1] == g[1]


def test_tune_warns_once_when_fewer_servers_than_workers_remain(monkeypatch, capsys):
    """``require_servers`` warns once per drop: a lost server costs each workload a candidate and 30 s."""
    counts = iter([(2, 2), (1, 1), (1, 1), (1, 1), (1, 1)])
    monkeypatch.setattr(fleet, "_servers", lambda host, port, key: next(counts))
    monkeypatch.setattr(fleet, "TRACKER_TIMEOUT_S", 0)
    remote = fleet.Fleet("127.0.0.1", 9, "k", "llvm", "amd-epyc", "llvm", 2)
    remote.require_servers()
    assert capsys.readouterr().err == ""
    remote.require_servers()
    remote.require_servers()
    err = capsys.readouterr().err
    assert err.count("tvm-canary tune: warning: 1 of the 2 RPC servers under key 'k' remain registered") == 1, err


@pytest.mark.parametrize("argv, message", [
    ("rpc-server --tracker nohost --key k", "got 'nohost'"),
    ("tune --target llvm --rpc-tracker nohost --rpc-key k", "got 'nohost'"),
    ("rpc-server --tracker h:99999 --key k", "HOST:PORT (PORT 0 to 65535) for the RPC tracker, got 'h:99999'"),
    ("tune --target llvm --rpc-tracker h:99999 --rpc-key k", "got 'h:99999'"),
    ("rpc-server --tracker h:9 --key k --port 70000", "--port: must be at most 65535, got 70000"),
    ("rpc-server --tracker h:9 --key k --port-end 70010", "--port-end: must be at most 65535, got 70010"),
    ("rpc-server --tracker h:1 --key k --port 9095 --port-end 9095", "--port-end 9095 must be above")])
def test_a_bad_tracker_address_or_port_range_is_a_usage_error(argv, message, capsys):
    """No port, one over 65535, an empty range: not exit 1 or TVM's traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv.split())
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_spare_server_gone_costs_no_wait(monkeypatch, capsys):
    """More servers than workers: losing one, enough left, does not wait TRACKER_TIMEOUT_S."""
    counts = iter([(3, 3), (2, 2), (2, 2)])
    monkeypatch.setattr(fleet, "_servers", lambda host, port, key: next(counts))
    monkeypatch.setattr(fleet, "TRACKER_TIMEOUT_S", 5)
    remote = fleet.Fleet("127.0.0.1", 9, "k", "llvm", "amd-epyc", "llvm", 2)
    remote.require_servers()
    start = time.monotonic()
    remote.require_servers()
    assert time.monotonic() - start < 1 and capsys.readouterr().err == ""


@pytest.mark.parametrize("visible, served", [("2,3", ["2", "3"]), (None, ["0", "1"])])
def test_fleet_tune_serves_the_gpus_the_caller_made_visible(visible, served, monkeypatch, tmp_path):
    """Under CUDA_VISIBLE_DEVICES=2,3 ``scripts/fleet_tune.py`` gives servers GPUs 2, 3, not 0, 1."""
    path = pathlib.Path(fleet.__file__).parents[2] / "scripts" / "fleet_tune.py"
    spec = importlib.util.spec_from_file_location("fleet_tune", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    started = []

    @contextlib.contextmanager
    def local_fleet(rpc_key, server_envs, **_):
        started.extend(server_envs)
        raise LookupError  # nothing is started: the script stops here

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible or "")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU {i}")
    monkeypatch.setattr(fleet, "local_fleet", local_fleet)
    monkeypatch.setattr(sys, "argv", [str(path), "--out", str(tmp_path)])
    with pytest.raises(LookupError):
        script.main()
    assert started == [{"CUDA_VISIBLE_DEVICES": gpu} for gpu in served]
