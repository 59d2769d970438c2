"""Ahead-of-time artifacts: they load and run in a runtime-only TVM (no compiler library) through the
API, and a folder built with the device's tuning database covers what loading with it asks for."""

from __future__ import annotations

import dataclasses
import errno
import filecmp
import functools
import json
import os
import pathlib
import platform
import subprocess
import sys

import pytest
import torch
import tvm
from tvm.s_tir import meta_schedule as ms

from tvm_canary import _sources, schedules
from tvm_canary.cli import main
from tvm_canary.runtime import aot, specializations, targets
from tvm_canary.runtime import compile as C
from tvm_canary.tuning import apply, keys, workloads
from tvm_canary.tuning.driver import commit_measurement

CHILD = """
import torch, tvm
assert tvm.base._RUNTIME_ONLY
import tvm_canary as tc
flat = torch.arange(10); off = torch.tensor([0, 3, 10]); rpi = torch.tensor([1, 2])
pool = torch.full((4, 8), -5, dtype=torch.int32)
tc.launch_scatter_req_token_ids_kernel(flat_in=flat, offsets=off, req_pool_indices=rpi, pool_out=pool)
want = torch.full((4, 8), -5, dtype=torch.int32); want[1, :3] = torch.arange(3); want[2, :7] = torch.arange(3, 10)
assert torch.equal(pool, want), pool
try:
    tc.launch_canary_plan_kernels  # plan was not built: its first launch must say so clearly
    from tvm_canary.runtime import get_kernel
    get_kernel("plan", (False, False), torch.device("cpu"))
    raise SystemExit("plan loaded without an artifact")
except RuntimeError as e:
    assert "no prebuilt module plan-" in str(e), e
print("ok")
"""


def test_runtime_only_host_runs_prebuilt_modules(tmp_path):
    assert main(["build", "--target", "llvm", "--kernels", "scatter", "-o", str(tmp_path / "modules")]) == 0
    assert len(list((tmp_path / "modules").glob("scatter-*.so"))) == 1
    assert (tmp_path / "modules" / "manifest.json").exists()
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", TVM_CANARY_MODULES=str(tmp_path / "modules"),
               TVM_CANARY_CACHE=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr
    # the command line starts too
    res = subprocess.run([sys.executable, "-m", "tvm_canary", "info"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "runtime only" in res.stdout, res.stdout + res.stderr


def test_build_covers_the_geometries_of_the_tuning_database(tmp_path, monkeypatch, capsys):
    """A folder built with the device's tuning database holds the tuned geometry's module: loading with
    that database compiles nothing."""
    cpu = torch.device("cpu")
    tuned = dataclasses.replace(targets.default_geometry("write", "llvm"), unroll=1)
    (tmp_path / "logs" / keys.device_key(cpu)).mkdir(parents=True)
    db = ms.database.JSONDatabase(work_dir=str(tmp_path / "logs" / keys.device_key(cpu)))
    mod = tvm.IRModule({"main": workloads.descriptor("write", (8, 16), "llvm")})
    for geom, seconds in ((targets.default_geometry("write", "llvm"), 2e-6), (tuned, 1e-6)):  # tuned: twice as fast
        commit_measurement(db, mod, schedules.knobs("write", False), geom, [seconds], targets.target_from_tag("llvm"))
    monkeypatch.setattr(keys, "tune_logs_dirs", lambda: [tmp_path / "logs"])
    apply._records.cache_clear()
    # One specialization keeps the test to two builds (default and tuned geometry).
    axes = (("num_sources", (0,)), ("partial", (False,)), ("input_assert", (False,)), ("fold_words", (0,)))
    monkeypatch.setitem(specializations.AXES, "write", axes)
    out = str(tmp_path / "modules")
    assert main(["build", "--target", "llvm", "--kernels", "write", "--jobs", "1", "-o", out]) == 0
    assert f"tuning databases {keys.device_key(cpu)}" in capsys.readouterr().out
    assert len(list((tmp_path / "modules").glob("write-0-0-*.so"))) == 2

    def no_compiling(*args):
        raise AssertionError(f"compiled {args[:2]} although the ahead-of-time folder has it")

    monkeypatch.setattr(C, "build", no_compiling)
    monkeypatch.setenv("TVM_CANARY_MODULES", str(tmp_path / "modules"))
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(C, "_memory", {})
    monkeypatch.setattr(C, "_by_launch", {})
    assert C.geometry("write", cpu, 8) == tuned
    C.get_kernel("write", (0, False, False, 0), cpu, 8)
    assert [k[4] for k in C._memory] == [tuned]
    apply._records.cache_clear()


def test_build_compiles_the_missing_modules_in_worker_processes(tmp_path, monkeypatch):
    """With --jobs N the modules the cache lacks compile in N processes, none in the building
    process; the folder equals a one-by-one build's."""
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path / "cache-1"))
    assert main(["build", "--target", "llvm", "--kernels", "scatter", "plan", "--tuning", "none", "--jobs", "1",
                 "-o", str(tmp_path / "one-by-one")]) == 0

    def no_compiling(*args):
        raise AssertionError(f"the building process compiled {args[:2]}")

    monkeypatch.setattr(C, "build", no_compiling)  # the spawned workers import C afresh and compile
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path / "cache-2"))
    assert main(["build", "--target", "llvm", "--kernels", "scatter", "plan", "--tuning", "none", "--jobs", "2",
                 "-o", str(tmp_path / "workers")]) == 0
    names = sorted(p.name for p in (tmp_path / "one-by-one").glob("*.so"))
    assert len(names) >= 2 and names == sorted(p.name for p in (tmp_path / "workers").glob("*.so"))
    assert all(filecmp.cmp(tmp_path / "one-by-one" / n, tmp_path / "workers" / n, shallow=False) for n in names)
    assert sorted(p.name for p in (tmp_path / "cache-2").rglob("*.so")) == names


@pytest.mark.parametrize("kept", [0, 100, 5000, 0.5, -1], ids=["empty", "100B", "5000B", "half", "last-byte"])
def test_a_truncated_prebuilt_module_is_named_in_one_line(tmp_path, monkeypatch, kept):
    """A module cut short anywhere is refused before it is loaded (loading maps it past its end: a silent SIGBUS)."""
    geom = targets.default_geometry("scatter", "llvm", 0, None)
    whole = C.cached_module("scatter", (), "llvm", geom).read_bytes()
    kept = int(len(whole) * kept) if isinstance(kept, float) else kept % len(whole)  # -1: all but the last byte
    (tmp_path / f"{C.module_key('scatter', (), 'llvm', geom)}.so").write_bytes(whole[:kept])
    monkeypatch.setenv("TVM_CANARY_MODULES", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"^kv-canary: cannot load the prebuilt module .*scatter.*\.so: "):
        C._load_or_build("scatter", (), torch.device("cpu"), geom)


def test_a_damaged_kernel_cache_entry_is_compiled_again_and_an_unloadable_one_named(tmp_path, monkeypatch, caplog):
    """A cut module is rebuilt, one that does not load named in one line; small program headers are damage."""
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path))
    geom = targets.default_geometry("scatter", "llvm", 0, None)
    path = C.cached_module("scatter", (), "llvm", geom)
    whole = path.read_bytes()
    damaged = path.with_suffix(".damaged")  # a new file: the loaded module's pages stay mapped
    damaged.write_bytes(whole[:18] + (183).to_bytes(2, "little") + whole[20:])
    os.replace(damaged, path)
    with pytest.raises(RuntimeError, match=r"^kv-canary: cannot load the kernel cache's .*\.so: .*\(a damaged file: "):
        C._load_or_build("scatter", (), torch.device("cpu"), geom)
    for kept in (0, 5000):
        damaged.write_bytes(whole[:kept])
        os.replace(damaged, path)
        with caplog.at_level("WARNING", logger="tvm_canary"):
            assert C._load_or_build("scatter", (), torch.device("cpu"), geom) is not None
        assert "is damaged" in caplog.text and path.read_bytes() == whole
        caplog.clear()
    header = bytearray(whole)  # e_phoff 8 bytes before the end, e_phentsize 1, e_phnum 8
    header[32:40], header[54:58] = (len(whole) - 8).to_bytes(8, "little"), bytes([1, 0, 8, 0])
    damaged.write_bytes(header)
    assert "program headers are 1 bytes" in C.damaged_module(damaged)


def test_module_keys_name_the_machine_and_the_sources_first_read(tmp_path, monkeypatch):
    """Keys name the machine; after a source edit a process and its build workers keep the key and
    parse nothing (TVMScript reads the edited text)."""
    geom = dataclasses.replace(targets.default_geometry("scatter", "llvm", 0, None), unroll=7)  # not parsed yet
    first = C.module_key("scatter", (), "llvm", geom)
    assert f"-llvm-{platform.machine()}-" in first
    assert f"-cuda-sm_90-{platform.machine()}-" in C.module_key("scatter", (), "cuda-sm_90", geom)
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path))
    with monkeypatch.context() as edited:
        edited.setattr(_sources, "_edited", False)  # restored on leaving: the refusal lasts the process
        edited.setattr(_sources, "files_hash", lambda files: "edited")
        assert C.module_key("scatter", (), "llvm", geom) == first
        with pytest.raises(RuntimeError, match=r"^kv-canary: the kernel or build sources changed since this process"):
            C.cached_module("scatter", (), "llvm", geom)
        assert not list(tmp_path.rglob("*.so"))
    with pytest.raises(RuntimeError, match=r"^kv-canary: the kernel or build sources changed since this build"):
        aot._compile(("llvm", "scatter", (), geom), "another")
    assert C.cached_module("scatter", (), "llvm", geom).exists()


def test_hidden_and_unreadable_sources(tmp_path, monkeypatch):
    """An editor's lock file (dangling ``.#x.py``) broke imports; unreadable sources (zipped) are one line."""
    (tmp_path / "a.py").write_text("")
    (tmp_path / "._b.py").write_text("")
    (tmp_path / ".#c.py").symlink_to("user@host.1:2")
    assert _sources.python_files(tmp_path) == [tmp_path / "a.py"]

    def unreadable(files):
        raise NotADirectoryError(20, "Not a directory", "tc.zip/tvm_canary/consts.py")

    monkeypatch.setattr(_sources, "files_hash", unreadable)
    monkeypatch.setattr(_sources, "_edited", False)  # restored
    monkeypatch.setattr(_sources, "source_hash", functools.lru_cache(_sources.source_hash.__wrapped__))
    with pytest.raises(RuntimeError, match=r"^kv-canary: cannot read the kernel sources \(Not a directory: tc"):
        _sources.require_sources_as_read()


def test_a_build_without_a_c_compiler_says_so_and_leaves_nothing(tmp_path, monkeypatch):
    ex = C.build("scatter", (), "llvm", targets.default_geometry("scatter", "llvm", 0, None))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"^kv-canary: building a kernel module needs a C/C\+\+ compiler and none"):
        C.export(ex, tmp_path / "out" / "scatter.so")
    monkeypatch.setenv("CXX", "g++ -O2")
    with pytest.raises(RuntimeError, match=r"compiler and \$CXX/\$CC 'g\+\+ -O2' is not one program on PATH"):
        C.export(ex, tmp_path / "out" / "scatter.so")
    monkeypatch.setenv("CXX", "/bin/false")  # a compiler that fails: its temporary file goes too
    with pytest.raises(RuntimeError, match="Compilation error"):
        C.export(ex, tmp_path / "out" / "scatter.so")
    assert not list((tmp_path / "out").iterdir())


def test_a_callers_pass_context_does_not_shape_a_built_module(tmp_path):
    """A build runs under TVM's default pass configuration whatever the caller holds: the disk cache and
    ``tvm-canary build`` share its module with every later process (a caller's
    ``tirx.disable_assert`` would drop the kernels' ``kv-canary:`` checks for all of them)."""
    geom = targets.default_geometry("scatter", "llvm", 0, None)
    with tvm.transform.PassContext(config={"tirx.disable_assert": True}):
        C.export(C.build("scatter", (), "llvm", geom), tmp_path / "scatter.so")
    assert b"kv-canary: scatter:" in (tmp_path / "scatter.so").read_bytes()


def test_the_module_key_covers_the_build_code():
    """A module's key hashes the build code too (parsing, targets, ``build``): an edit there changes the output."""
    names = {f"{p.parent.name}/{p.name}" for p in C.source_files()}
    assert {"runtime/compile.py", "runtime/parse.py", "runtime/targets.py", "kernels/scatter.py"} <= names


def test_cached_modules_are_readable_by_others_and_an_unwritable_cache_says_so(tmp_path, monkeypatch):
    """A cached module gets the umask's mode for a new file (not ``tempfile``'s 0600); a cache
    lacking a module that cannot store it is named in one ``kv-canary:`` line."""
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path / "cache"))
    geom = targets.default_geometry("scatter", "llvm", 0, None)
    umask = os.umask(0o022)
    try:
        path = C.cached_module("scatter", (), "llvm", geom)
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o755
    path.unlink()

    for error in (PermissionError(errno.EACCES, "Permission denied"), OSError(errno.EROFS, "Read-only file system")):
        def unwritable(*args, error=error, **kwargs):
            raise type(error)(error.errno, error.strerror, str(path.with_suffix(".lock")))

        monkeypatch.setattr(C, "_build_lock", unwritable)
        with pytest.raises(RuntimeError, match=rf"^kv-canary: the kernel cache .* lacks scatter-.*\.so and cannot "
                                               rf"store it \({error.strerror}: .*\.lock\); set TVM_CANARY_CACHE"):
            C.cached_module("scatter", (), "llvm", geom)


def test_kernel_hashes_need_no_writable_cache_and_survive_a_damaged_memo(tmp_path, monkeypatch):
    """The kernel-hash memo is a cache: a read-only kernel cache (prebuilt modules) or a damaged memo
    file recomputes the hashes, not failing every launch that reads a tuning database."""
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path / "cache"))
    workloads._hash_table.cache_clear()  # the memo is read once per process
    want = workloads.kernel_hash("scatter", (256, 1024), "llvm")
    memo = next((tmp_path / "cache").rglob("structural*.json"))
    memo.write_text(memo.read_text()[:10])
    workloads._hash_table.cache_clear()
    assert workloads.kernel_hash("scatter", (256, 1024), "llvm") == want
    memo.unlink()
    workloads._hash_table.cache_clear()

    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(pathlib.Path, "write_text", read_only)
    assert workloads.kernel_hash("scatter", (256, 1024), "llvm") == want
    assert not memo.exists()
    workloads._hash_table.cache_clear()


def test_a_module_missing_from_the_prebuilt_folders_is_compiled_with_a_warning(tmp_path, monkeypatch, caplog):
    geom = targets.default_geometry("scatter", "llvm", 0, None)
    monkeypatch.setenv("TVM_CANARY_MODULES", str(tmp_path))  # an empty folder (e.g. built from other sources)
    monkeypatch.setattr(C, "_missing_prebuilt", set())
    with caplog.at_level("WARNING", logger="tvm_canary"):
        assert C._load_or_build("scatter", (), torch.device("cpu"), geom) is not None
    assert "has no module scatter-" in caplog.text and "compiling it" in caplog.text


def test_a_repeated_arch_is_built_once(tmp_path, capsys):
    """A repeated ``--arch`` or kernel builds once, one tag in the manifest."""
    assert main(["build", "--target", "cuda", *["--arch", "sm_90"] * 2, "--kernels", "scatter", "scatter",
                 "--tuning", "none", "-o", str(tmp_path)]) == 0
    assert "wrote 1 module " in capsys.readouterr().out
    assert json.loads((tmp_path / "manifest.json").read_text())["tags"] == ["cuda-sm_90"]
