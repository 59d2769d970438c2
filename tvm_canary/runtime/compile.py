"""Finding the compiled module of a kernel: memory, prebuilt artifacts, disk cache, then compile.

``get_kernel(name, spec, device)`` returns the compiled ``tvm_ffi.Function``. Lookup order:
1. the in-process dict;
2. ahead-of-time artifacts in the directories of ``$TVM_CANARY_MODULES`` (``os.pathsep``-separated;
   written by ``tvm-canary build``), which need only the TVM runtime;
3. the disk cache (``$TVM_CANARY_CACHE`` or ``~/.cache/tvm_canary``);
4. ``tvm.compile`` (needs the TVM compiler), stored into the disk cache.
Module keys hold the kernel, its specialization, the geometry, the target tag, the machine (host code
is built for it), the TVM version and a hash of the sources that shape the generated code
(``source_files``: the kernels and the build code), so a stale module is never loaded. Building needs a
C/C++ compiler to link each module, and runs under TVM's default pass configuration (``build``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import pathlib
import platform
import shutil
import struct
import sys
import tempfile
import threading

import torch
import tvm

from .._sources import (  # noqa: F401 (re-exported)
    files_hash,
    require_parents_sources,
    require_sources_as_read,
    source_files,
    source_hash,
)
from . import targets
from .specializations import spec_id

_memory: dict[tuple, object] = {}  # (kernel, spec, device, geometry) -> function
_by_launch: dict[tuple, object] = {}  # (kernel, spec, torch.device, size, mode) -> function
_lock = threading.Lock()



def cache_dir() -> pathlib.Path:
    root = os.environ.get("TVM_CANARY_CACHE") or os.path.join(pathlib.Path.home(), ".cache", "tvm_canary")
    return pathlib.Path(root) / tvm.__version__


def module_key(name: str, spec: tuple, tag: str, geom) -> str:
    """A build's file name less ``.so``."""
    return (f"{name}-{spec_id(spec)}-{geom.key()}-{tag}-{platform.machine()}-tvm{tvm.__version__}-"
            f"{source_hash()}")


def build(name: str, spec: tuple, tag: str, geom):
    """Compile kernel ``name`` for one specialization; returns a ``tvm.runtime.Executable``.

    Built inside the target's scope so that, where TVM's CUDA runtime is loaded, the device code is
    compiled for the tag's arch at build time (and so stored in exported artifacts), and under a fresh
    default ``PassContext``: a caller's (``tirx.disable_assert``, say, which would drop the kernels' own
    checks) must not shape a module that the disk cache shares with every later process.
    """
    from .parse import kernel_ir  # the TVMScript parser: compiler hosts only

    target = targets.target_from_tag(tag)
    with tvm.transform.PassContext(), target:
        return tvm.compile(kernel_ir(name, spec, geom), target=target)


def export(ex, path: pathlib.Path) -> None:
    """Write an executable to ``path`` atomically, readable as a file the process creates is
    (``new_file_mode``), or leave nothing."""
    require_c_compiler()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".so", delete=False) as tmp:
        tmp_path = tmp.name
    try:
        ex.export_library(tmp_path)
        os.chmod(tmp_path, new_file_mode(executable=True))
        os.replace(tmp_path, path)
    finally:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)


def require_c_compiler() -> None:
    """Refuse to build a module with no C/C++ compiler to link it (TVM's ``get_cc``, which runs ``$CXX`` as
    one program)."""
    from tvm.support.cc import get_cc

    compiler = get_cc()
    if sys.platform.startswith("linux") and not (compiler and shutil.which(compiler)):
        missing = f"$CXX/$CC {compiler!r} is not one program on PATH" if compiler else "none is on PATH"
        raise RuntimeError(f"kv-canary: building a kernel module needs a C/C++ compiler and {missing} (install "
                           "g++ or clang, or load modules built by `tvm-canary build`)")


def new_file_mode(executable: bool = False) -> int:
    """The mode a file the process creates gets under its umask (``tempfile`` makes its files 0600, which
    other users sharing a cache or a database could not read)."""
    return (0o777 if executable else 0o666) & ~_umask()


def _umask() -> int:
    """The process umask, read where Linux shows it (``/proc/self/status``): setting it to read it back,
    the only portable way, would briefly give files other threads create that moment the mode 0o666."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)  # the strictest while it is set, should another thread create a file
    os.umask(umask)
    return umask


def get_kernel(name: str, spec: tuple, device: torch.device, size: int | tuple = 0, mode: int = 0):
    """Compiled function of kernel ``name`` specialised by ``spec`` for ``device`` (cached), with the
    tuned geometry of the bucket nearest to ``size`` (``packing.KernelCall.size``) among those of
    ``mode`` (verify's or write's real-KV hash mode) and of its size class (``tuning.apply.tuned_geometry``)
    when the device has one, else the default of that mode and size (``size`` 0: below any size class).
    After the first launch of a key: one dict lookup."""
    fn = _by_launch.get((name, spec, device, size, mode))
    if fn is None:
        fn = _first_launch(name, spec, device, size, mode)
    return fn


def _first_launch(name: str, spec: tuple, device: torch.device, size: int | tuple, mode: int):
    """``get_kernel`` of a launch key not seen yet: choose the geometry, find or build the module. A
    write's geometry follows each launch's token count (``packing.write_point``), so the first write of
    a specialization and mode also loads every geometry a write of that mode can take: those the
    device's database selects in that mode, or, when it selects none, every default of the mode (its
    size classes, ``targets.default_geometries``). A later write at another token count then loads and
    compiles nothing (a CUDA graph being captured, a serving loop past its warm-up)."""
    with _lock:
        fn = _module(name, spec, device, geometry(name, device, size, mode))
        _by_launch[name, spec, device, size, mode] = fn
        if name == "write":
            for geom in _write_geometries(device, mode):
                _module(name, spec, device, geom)
    return fn


def _write_geometries(device: torch.device, mode: int) -> list:
    """Every geometry a write launch of ``mode`` on ``device`` can take (``geometry``, any size)."""
    if tuning_enabled():
        from ..tuning import apply, keys

        selected = apply.selected_geometries("write", keys.device_key(device), device.type == "cuda", mode)
        if selected:
            return selected
    return targets.default_geometries("write", targets.tag_for(device), mode)


def _module(name: str, spec: tuple, device: torch.device, geom):
    """The compiled function of one build, kept in memory (call with ``_lock`` held)."""
    key = (name, spec, device.type, device.index, geom)
    if key not in _memory:
        _memory[key] = _load_or_build(name, spec, device, geom)
    return _memory[key]


def geometry(name: str, device: torch.device, size: int | tuple, mode: int = 0):
    """Tuned geometry for the device (see ``tuning.apply``) when enabled and found, else the default
    of the launch's mode and size (``targets.default_geometry``).
    Reading tuning databases needs the TVM compiler; runtime-only hosts use the default."""
    if tuning_enabled():
        from ..tuning.apply import tuned_geometry

        tuned = tuned_geometry(name, device, size, mode)
        if tuned is not None:
            return tuned
    return targets.default_geometry(name, targets.tag_for(device), mode, size)


def tuning_enabled() -> bool:
    """Whether launches take their geometry from tuning databases (``TVM_CANARY_TUNED`` not ``0``, and
    the TVM compiler, which reading a database needs, is present)."""
    return os.environ.get("TVM_CANARY_TUNED", "1") != "0" and compiler_available()


def _load_or_build(name: str, spec: tuple, device: torch.device, geom):
    if device.type == "cuda":
        ensure_cuda_runtime()
    tag = targets.tag_for(device)
    key = module_key(name, spec, tag, geom)
    for directory in prebuilt_dirs():
        path = directory / f"{key}.so"
        if path.exists():
            damage = damaged_module(path)
            if damage:
                raise RuntimeError(f"kv-canary: cannot load the prebuilt module {path}: {damage}")
            try:
                return tvm.runtime.load_module(str(path))[f"canary_{name}"]
            except Exception as e:  # a truncated or foreign file: name it in one line
                raise RuntimeError(f"kv-canary: cannot load the prebuilt module {path}: {error_line(e)}") from None
    if prebuilt_dirs() and compiler_available() and key not in _missing_prebuilt:
        _missing_prebuilt.add(key)
        logging.getLogger("tvm_canary").warning(
            "tvm_canary: TVM_CANARY_MODULES=%r has no module %s.so (built from other sources, for other machines "
            "or geometries?); compiling it", os.environ.get("TVM_CANARY_MODULES", ""), key)
    path = cached_module(name, spec, tag, geom)
    try:
        return tvm.runtime.load_module(str(path))[f"canary_{name}"]
    except Exception as e:  # whole but not loadable (a no-exec mount, a foreign file): name it in one line
        raise RuntimeError(f"kv-canary: cannot load the kernel cache's {path}: {error_line(e)} (a damaged "
                           "file: delete it; a folder that cannot map executables: set TVM_CANARY_CACHE)") from None


_missing_prebuilt: set = set()  # module keys the prebuilt folders lacked (warned once per process)


def cache_path(name: str, spec: tuple, tag: str, geom) -> pathlib.Path:
    """Where the disk cache keeps the module of a build (``cached_module``), present or not."""
    return cache_dir() / f"{module_key(name, spec, tag, geom)}.so"


def cached_module(name: str, spec: tuple, tag: str, geom) -> pathlib.Path:
    """The module file of a build in the disk cache, compiled (``build``) and stored first if missing or
    damaged."""
    path = cache_path(name, spec, tag, geom)
    filename = path.name
    if path.exists() and not damaged_module(path):
        return path
    if not compiler_available():
        raise RuntimeError(
            f"kv-canary: no prebuilt module {filename} (this machine's) in "
            f"TVM_CANARY_MODULES={os.environ.get('TVM_CANARY_MODULES', '')!r} and this TVM has no compiler "
            "(runtime-only); build it with `tvm-canary build` on a host with the compiler"
        )
    try:
        with _build_lock(path):  # another process building the same module: wait for its file instead
            damage = damaged_module(path) if path.exists() else None
            if damage:
                logging.getLogger("tvm_canary").warning("tvm_canary: the kernel cache's %s is damaged (%s); "
                                                        "compiling it again", path, damage)
            if damage or not path.exists():
                require_c_compiler()
                export(build(name, spec, tag, geom), path)
    except OSError as e:  # not writable (permissions, a read-only file system), full
        raise RuntimeError(f"kv-canary: the kernel cache {path.parent} lacks {filename} and cannot store it "
                           f"({e.strerror}: {e.filename}); set TVM_CANARY_CACHE to a writable folder") from None
    return path


def error_line(error: BaseException) -> str:
    """The last line of an error's text (TVM's errors end with the message after a traceback), or its
    type's name when it has none: what a one-line ``kv-canary:`` error quotes."""
    return (str(error).strip().splitlines() or [type(error).__name__])[-1]


_ELF_HEADER = {1: "<HHIIIIIHHHHHH", 2: "<HHIQQQIHHHHHH"}  # after e_ident, by EI_CLASS (32 / 64 bit), little-endian
_PROGRAM_HEADER = {1: ("<IIIIIIII", 1, 4), 2: ("<IIQQQQQQ", 2, 5)}  # format, index of p_offset, of p_filesz


def damaged_module(path: pathlib.Path) -> str | None:
    """Why the module file at ``path`` cannot be whole, or None. On Linux a module is an ELF shared
    library: it must start with the ELF magic and hold every byte its program and section headers
    name (a file cut short, by an interrupted copy or a full disk, is mapped past its end when loaded,
    and the process dies of SIGBUS). Elsewhere (other formats) nothing is checked."""
    if not sys.platform.startswith("linux"):
        return None
    data = path.read_bytes()
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] not in _ELF_HEADER or data[5] != 1:
        return f"not a little-endian ELF shared library ({len(data)} bytes)"
    fields = struct.unpack_from(_ELF_HEADER[data[4]], data, 16)
    phoff, shoff = fields[4], fields[5]
    phentsize, phnum, shentsize, shnum = fields[8], fields[9], fields[10], fields[11]
    needed = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    fmt, offset_at, size_at = _PROGRAM_HEADER[data[4]]
    if phnum and phentsize < struct.calcsize(fmt):
        return f"its program headers are {phentsize} bytes, fewer than an ELF program header's"
    if phoff + phentsize * phnum <= len(data):
        for k in range(phnum):
            header = struct.unpack_from(fmt, data, phoff + k * phentsize)
            needed = max(needed, header[offset_at] + header[size_at])
    if needed > len(data):
        return f"cut short: {len(data)} bytes, its headers name {needed}"
    return None


@contextlib.contextmanager
def _build_lock(path: pathlib.Path):
    """Hold an exclusive lock on ``<path>.lock`` (POSIX ``flock``; no lock where ``fcntl`` is missing), so
    that processes sharing the disk cache (parallel test workers, torchrun ranks) compile a module once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container or ``taskset`` narrows;
    ``os.cpu_count()`` where the platform has no mask): the default number of processes that compile
    side by side (``tvm-canary build --jobs``, the tuner's candidate builder)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def prebuilt_dirs() -> list[pathlib.Path]:
    return [pathlib.Path(p) for p in os.environ.get("TVM_CANARY_MODULES", "").split(os.pathsep) if p]


def compiler_available() -> bool:
    return not getattr(tvm.base, "_RUNTIME_ONLY", False)


@functools.lru_cache(maxsize=None)
def ensure_cuda_runtime() -> None:
    """Make TVM's CUDA runtime available; raise a clear error if it cannot be.

    TVM loads ``libtvm_runtime_cuda.so`` only when it can (it needs ``libcudart.so.13``), and
    otherwise silently reports no CUDA device; runtime-only builds never load it.
    """
    if not tvm.cuda(0).exist:
        lib = pathlib.Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
        try:
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise RuntimeError(f"kv-canary: TVM's CUDA runtime could not be loaded ({e}); it needs a CUDA 13 "
                               "runtime (libcudart.so.13) and the NVIDIA driver (libcuda.so.1)") from e
    if not tvm.cuda(0).exist:
        raise RuntimeError("kv-canary: TVM sees no CUDA device (is libcudart.so.13 on LD_LIBRARY_PATH?)")

