"""How a tuning database folder (``<root>/<device key>/``) holds its two files: plain, as MetaSchedule reads and writes
them (``DATABASE_FILES``), or packed, each gzip-compressed (``<name>.gz``, about 11x smaller), as the committed
databases are kept so the tracked tree stays small enough to travel with a GPU call.

``readable(folder)`` is a folder MetaSchedule can open: the folder itself, or for a packed one its files unpacked once
per content into the kernel cache (a private temporary folder where the cache cannot be written). ``editable(folder)``
unpacks a packed folder in place while a command writes it (``tune``, ``tune-merge``, ``restamp``) and packs it again
afterwards, so a committed database stays packed. A damaged packed file raises ``OSError`` naming it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gzip
import hashlib
import os
import pathlib
import shutil
import tempfile
import zlib

DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")
PACKED = ".gz"


def is_packed(folder: pathlib.Path) -> bool:
    """Whether ``folder`` holds its database packed (a packed workload table and no plain one)."""
    return (folder / (DATABASE_FILES[0] + PACKED)).is_file() and not (folder / DATABASE_FILES[0]).is_file()


def holds_database(folder: pathlib.Path) -> bool:
    """Whether ``folder`` holds a workload table, plain or packed."""
    return (folder / DATABASE_FILES[0]).is_file() or is_packed(folder)


def records_file(folder: pathlib.Path) -> pathlib.Path | None:
    """The file holding ``folder``'s records: the packed one where there is no plain one (packed, or left so beside
    a plain table by an interrupted unpack), else the plain one; None if there is neither."""
    plain, packed = folder / DATABASE_FILES[1], folder / (DATABASE_FILES[1] + PACKED)
    if packed.exists() and not plain.exists():
        return packed
    return plain if plain.exists() else None


def record_lines(folder: pathlib.Path) -> list[bytes]:
    """The non-empty lines of ``folder``'s records file, plain or packed (none if it is missing)."""
    path = records_file(folder)
    if path is None:
        return []
    data = _unpacked(path) if path.name.endswith(PACKED) else path.read_bytes()
    return [line for line in data.splitlines() if line.strip()]


def readable(folder: pathlib.Path) -> pathlib.Path:
    """A folder of the same name holding ``folder``'s database plain: ``folder`` itself unless packed, else its files
    unpacked under the kernel cache (``tune-logs/<sha-256 of the packed files>/<name>``, made once, atomically,
    readable by the cache's other users) or, where the cache cannot be written, in a temporary folder removed at
    exit."""
    if not is_packed(folder):
        return folder
    packed = {}
    for name in DATABASE_FILES:
        path = folder / (name + PACKED)
        if not path.is_file():
            raise OSError(f"{folder} holds {DATABASE_FILES[0] + PACKED} but no {path.name}")
        packed[name] = path.read_bytes()
    digest = hashlib.sha256(b"".join(hashlib.sha256(data).digest() for data in packed.values())).hexdigest()[:16]
    target = _cache_root() / digest / folder.name
    if target.is_dir():
        return target
    contents = {name: _unpacked(data, str(folder / (name + PACKED))) for name, data in packed.items()}
    try:
        return _unpack_once(target, contents)
    except OSError:  # the cache cannot be written (read-only, or not creatable)
        return _unpack_once(_private_root() / digest / folder.name, contents)


def _cache_root() -> pathlib.Path:
    from ..runtime import compile as C

    return C.cache_dir().parent / "tune-logs"


@functools.lru_cache(maxsize=None)
def _private_root() -> pathlib.Path:
    root = pathlib.Path(tempfile.mkdtemp(prefix="tvm_canary-tune-logs-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def _unpack_once(target: pathlib.Path, contents: dict) -> pathlib.Path:
    """``target`` holding ``contents`` (file name -> bytes), made unless there (another process may make it too),
    atomically (a staging folder renamed), readable by the other users of its cache."""
    from ..runtime import compile as C

    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=".unpacking-"))
    try:
        for file, data in contents.items():
            (staged / file).write_bytes(data)
            os.chmod(staged / file, C.new_file_mode())
        os.chmod(staged, C.new_file_mode(executable=True))
        os.rename(staged, target)
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)
        if not target.is_dir():  # else another process unpacked it first
            raise
    return target


def _unpacked(packed: pathlib.Path | bytes, name: str = "") -> bytes:
    """The bytes of a packed file (its path, or its bytes and ``name``); ``OSError`` naming it if damaged."""
    data, name = (packed.read_bytes(), str(packed)) if isinstance(packed, pathlib.Path) else (packed, name)
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise OSError(f"damaged packed file {name}: {e}") from None


def pack(folder: pathlib.Path) -> None:
    """Replace ``folder``'s plain files by packed ones (bytes reproducible: no timestamp in the gzip header)."""
    _swap(folder, {name + PACKED: gzip.compress((folder / name).read_bytes(), compresslevel=9, mtime=0)
                   for name in DATABASE_FILES if (folder / name).exists()}, lambda name: name.removesuffix(PACKED))


def unpack(folder: pathlib.Path) -> None:
    """Replace ``folder``'s packed files by plain ones; a damaged one raises ``OSError`` before any file changes.
    The records file goes first: stopped between the two, the folder still reads as packed (no plain table)."""
    _swap(folder, {name: _unpacked(folder / (name + PACKED)) for name in reversed(DATABASE_FILES)
                   if (folder / (name + PACKED)).exists()}, lambda name: name + PACKED)


def _swap(folder: pathlib.Path, contents: dict, twin) -> None:
    """Write ``contents`` (file name -> bytes, all computed before) into ``folder``, each through a temporary file
    renamed over it with the mode of its ``twin(name)`` (the file of the other form it replaces); then remove the
    twins."""
    for name, data in contents.items():
        tmp = tempfile.NamedTemporaryFile(dir=folder, delete=False)
        try:
            with tmp:
                tmp.write(data)
            os.chmod(tmp.name, (folder / twin(name)).stat().st_mode & 0o777)
            os.replace(tmp.name, folder / name)
        except BaseException:
            pathlib.Path(tmp.name).unlink(missing_ok=True)
            raise
    for name in contents:
        (folder / twin(name)).unlink()


@contextlib.contextmanager
def editable(folder: pathlib.Path):
    """``folder``'s database plain in place for the ``with`` block, packed again after it (also after an error)
    if it was packed; a folder that is not packed is left as it is."""
    packed = is_packed(folder)
    if packed:
        unpack(folder)
    try:
        yield folder
    finally:
        if packed and (folder / DATABASE_FILES[0]).is_file():
            pack(folder)


def main(argv: list[str] | None = None) -> int:
    """``python -m tvm_canary.tuning.store pack|unpack FOLDER...``: pack a database folder to commit it (a new device
    key's), or unpack one to read its JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tvm_canary.tuning.store", description=main.__doc__)
    parser.add_argument("action", choices=("pack", "unpack"), metavar="pack|unpack",
                        help="pack: gzip the records to commit them; unpack: plain JSON again")
    parser.add_argument("folders", nargs="+", type=pathlib.Path, metavar="FOLDER", help="<root>/<device key>")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not holds_database(folder):
            parser.error(f"{folder} holds no tuning database ({DATABASE_FILES[0]}, plain or packed)")
    for folder in args.folders:
        (pack if args.action == "pack" else unpack)(folder)
        print(f"{folder}: {args.action}ed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
