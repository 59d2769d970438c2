"""The sources that shape the generated code, and the hash this process keys its modules by.

Imported first by ``tvm_canary`` (standard library only): it reads the sources before any is imported.
TVMScript re-reads a kernel's text to parse it, so after an edit a process refuses until restarted.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib

_edited = False  # a check saw sources other than source_hash's: refuse for the rest of the process
_unreadable = None  # the read at import's error, raised by every later source_hash


@functools.lru_cache(maxsize=None)
def source_files() -> list[pathlib.Path]:
    """The sources of everything that shapes the generated code: the kernels, their constants and
    geometry, and the build (this module, the TVMScript parsing, the targets, ``compile.build``)."""
    pkg = pathlib.Path(__file__).resolve().parent
    build_code = [pkg / "runtime" / name for name in ("compile.py", "parse.py", "targets.py")]
    return python_files(pkg / "kernels") + [pkg / "consts.py", pkg / "_consts.py", pkg / "geometry.py",
                                            pkg / "_sources.py", *build_code]


def python_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """The folder's ``*.py`` files, sorted, less hidden ones (an editor's ``.#x.py``, macOS's ``._x.py``)."""
    return sorted(f for f in folder.glob("*.py") if not f.name.startswith("."))


def files_hash(files) -> str:
    """SHA-256 (16 hex digits) of the files' bytes, in the order given."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(pathlib.Path(f).read_bytes())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """Hash of ``source_files`` as this process read them on importing ``tvm_canary``: the key of every
    module, TensorIR and kernel hash it stores; unreadable (zipped), a one-line error here, not at import."""
    if _unreadable:
        raise _unreadable
    try:
        return files_hash(source_files())
    except OSError as e:
        raise RuntimeError(f"kv-canary: cannot read the kernel sources ({e.strerror}: {e.filename}), which key "
                           "and build the compiled modules (a zipped or sourceless install?)") from None


def require_sources_as_read() -> None:
    """Refuse (one ``kv-canary:`` line) once ``source_files`` differ, or differed at an earlier check,
    from what ``source_hash`` read (a file moved away counts). Checked where code is imported or parsed:
    the kernel package's import, ``parse.kernel_ir`` before and after parsing, build workers."""
    global _edited
    read = source_hash()
    try:
        _edited = _edited or files_hash(source_files()) != read
    except OSError:
        _edited = True
    if _edited:
        raise RuntimeError("kv-canary: the kernel or build sources changed since this process first read them; "
                           "restart it to use the new code")


def require_parents_sources(parent_hash: str, began: str) -> None:
    """A spawned worker's check: refuse (one line) sources other than its parent's (it reads them afresh);
    ``began``: what the parent is doing ("this build", "tuning")."""
    if source_hash() != parent_hash:
        raise RuntimeError(f"kv-canary: the kernel or build sources changed since {began} began; restart it")


try:
    source_hash()
except RuntimeError as e:  # said where a key is needed (a later read would key code never imported)
    _unreadable = e
