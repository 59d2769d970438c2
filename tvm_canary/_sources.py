"""The sources that shape the generated code, and the hash this process keys its modules by.

Imported first by ``tvm_canary`` (standard library only), so ``source_hash`` reads the sources before
any of them is imported. TVMScript re-reads a kernel's text when it parses it, so a process whose
sources are edited would build code of one version under the key of another: from the first check
that sees other sources (``require_sources_as_read``) it refuses until restarted.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib

_edited = False  # a check saw sources other than source_hash's: refuse for the rest of the process


@functools.lru_cache(maxsize=None)
def source_files() -> list[pathlib.Path]:
    """The sources of everything that shapes the generated code: the kernels, their constants and
    geometry, and the build (this module, the TVMScript parsing, the targets, ``compile.build``)."""
    pkg = pathlib.Path(__file__).resolve().parent
    build_code = [pkg / "runtime" / name for name in ("compile.py", "parse.py", "targets.py")]
    return sorted((pkg / "kernels").glob("*.py")) + [pkg / "consts.py", pkg / "_consts.py", pkg / "geometry.py",
                                                     pkg / "_sources.py", *build_code]


def files_hash(files) -> str:
    """SHA-256 (16 hex digits) of the files' bytes, in the order given."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(pathlib.Path(f).read_bytes())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """Hash of ``source_files`` as this process read them on importing ``tvm_canary``: the key of every
    module, TensorIR and kernel hash it stores."""
    return files_hash(source_files())


def require_sources_as_read() -> None:
    """Refuse (one ``kv-canary:`` line) once ``source_files`` differ, or differed at an earlier check,
    from what ``source_hash`` read (a file moved away counts). Checked where code is imported or parsed:
    the kernel package's import, ``parse.kernel_ir`` before and after parsing, build workers."""
    global _edited
    try:
        _edited = _edited or files_hash(source_files()) != source_hash()
    except OSError:
        _edited = True
    if _edited:
        raise RuntimeError("kv-canary: the kernel or build sources changed since this process first read them; "
                           "restart it to use the new code")


source_hash()
