"""``tvm-canary info`` reports the databases, devices and folders in use; a wheel built from the tree
carries the committed tuning databases and finds them through ``importlib.resources``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

from tvm_canary.cli import main
from tvm_canary.tuning import keys, store

REPO = keys.source_checkout()


def test_info_lists_devices_databases_and_folders(tmp_path, monkeypatch, capsys, committed_cpu_key):
    key = committed_cpu_key  # its committed copy comes after the copy below
    shutil.copytree(keys.committed_tune_logs() / key, tmp_path / "logs" / key)
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tmp_path / "logs"))
    monkeypatch.setenv("TVM_CANARY_MODULES", str(tmp_path / "modules"))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    records = len(store.record_lines(tmp_path / "logs" / key))
    assert f"cpu      key {key}" in out and f"tuning database: {tmp_path / 'logs' / key}" in out
    assert f"{records:5} records, {records:4} usable  {tmp_path / 'logs' / key}" in out
    assert "(for workloads none above selects a measured geometry for)" in out  # the committed copy comes later
    assert "TVM 0.27" in out and "tvm-ffi " in out
    assert f"AOT module folders ($TVM_CANARY_MODULES): {tmp_path / 'modules'}" in out and "kernel cache: " in out


def test_info_reports_a_records_file_it_cannot_decode(tmp_path, monkeypatch, capsys, committed_cpu_key):
    shutil.copytree(keys.committed_tune_logs() / committed_cpu_key, tmp_path / committed_cpu_key)
    store.unpack(tmp_path / committed_cpu_key)
    with open(tmp_path / committed_cpu_key / "database_tuning_record.json", "ab") as f:
        f.write(b"\xff\xfe\n")
    monkeypatch.setenv("TVM_CANARY_TUNE_LOGS", str(tmp_path))
    assert main(["info"]) == 0
    assert "none usable" in capsys.readouterr().out


def test_wheel_carries_the_tuning_databases(tmp_path):
    """A wheel built from a copy of the tree, unpacked (a pure-Python install), finds its databases."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in ("tvm_canary", "tune_logs"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
           "-w", str(tmp_path / "dist")]
    res = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    (wheel,) = (tmp_path / "dist").glob("tvm_canary-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    committed = sorted(p.parent.name for p in (REPO / "tune_logs").glob("*/database_workload.json.gz"))
    assert committed  # the committed databases are packed (tuning.store)
    for key in committed:
        assert f"tvm_canary/tune_logs/{key}/database_workload.json.gz" in names
        assert f"tvm_canary/tune_logs/{key}/database_tuning_record.json.gz" in names
    assert "tvm_canary/schedules/defaults.py" in names
    assert not any(n.startswith("schedules/") for n in names)  # no generic top-level package
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TVM_CANARY_TUNE_LOGS")}
    env.update(PYTHONPATH=str(tmp_path / "site"), XDG_DATA_HOME=str(tmp_path / "xdg"))
    child = ("from tvm_canary.tuning import keys; print(keys.default_out_dir()); "
             "print(*(f'{k} {p}' for k, p in keys.databases()), sep='\\n')")
    res = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    out_dir, *found = res.stdout.splitlines()
    assert out_dir == str(tmp_path / "xdg" / "tvm_canary" / "tune_logs")  # an installed copy is not written to
    packaged = tmp_path / "site" / "tvm_canary" / "tune_logs"
    assert found == [f"{key} {packaged / key}" for key in committed]
