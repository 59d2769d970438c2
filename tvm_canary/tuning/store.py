"""How a tuning database folder (``<root>/<device key>/``) holds its two files: plain, as MetaSchedule reads and writes
them (``DATABASE_FILES``), or packed, each gzip-compressed (``<name>.gz``, about 11x smaller), as the committed
databases are kept so the tracked tree stays small enough to travel with a GPU call.

``readable(folder)`` is a folder MetaSchedule can open: the folder itself, or for a packed one its files unpacked once
per content into the kernel cache. ``editable(folder)`` unpacks a packed folder in place while a command writes it
(``tune``, ``tune-merge``, ``restamp``) and packs it again afterwards, so a committed database stays packed.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import pathlib
import shutil
import tempfile

DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")
PACKED = ".gz"


def is_packed(folder: pathlib.Path) -> bool:
    """Whether ``folder`` holds its database packed (a packed workload table and no plain one)."""
    return (folder / (DATABASE_FILES[0] + PACKED)).is_file() and not (folder / DATABASE_FILES[0]).is_file()


def holds_database(folder: pathlib.Path) -> bool:
    """Whether ``folder`` holds a workload table, plain or packed."""
    return (folder / DATABASE_FILES[0]).is_file() or is_packed(folder)


def record_lines(folder: pathlib.Path) -> list[bytes]:
    """The non-empty lines of ``folder``'s records file, plain or packed (none if it is missing)."""
    name = DATABASE_FILES[1]
    if is_packed(folder):
        path = folder / (name + PACKED)
        data = gzip.decompress(path.read_bytes()) if path.exists() else b""
    else:
        path = folder / name
        data = path.read_bytes() if path.exists() else b""
    return [line for line in data.splitlines() if line.strip()]


def readable(folder: pathlib.Path) -> pathlib.Path:
    """A folder of the same name holding ``folder``'s database plain: ``folder`` itself unless packed, else its files
    unpacked under the kernel cache (``tune-logs/<sha-256 of the packed files>/<name>``, made once, atomically)."""
    if not is_packed(folder):
        return folder
    from ..runtime import compile as C

    packed = [(folder / (name + PACKED)).read_bytes() if (folder / (name + PACKED)).exists() else None
              for name in DATABASE_FILES]
    digest = hashlib.sha256(b"".join(b"-" if p is None else hashlib.sha256(p).digest() for p in packed)).hexdigest()
    target = C.cache_dir().parent / "tune-logs" / digest[:16] / folder.name
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=".unpacking-"))
        for name, data in zip(DATABASE_FILES, packed):
            if data is not None:  # a missing records file stays missing: refused as unreadable
                (staged / name).write_bytes(gzip.decompress(data))
        try:
            os.rename(staged, target)
        except OSError:  # another process unpacked it first
            shutil.rmtree(staged, ignore_errors=True)
    return target


def pack(folder: pathlib.Path) -> None:
    """Replace ``folder``'s plain files by packed ones (bytes reproducible: no timestamp in the gzip header)."""
    for name in DATABASE_FILES:
        plain = folder / name
        if plain.exists():
            packed = folder / (name + PACKED)
            with tempfile.NamedTemporaryFile(dir=folder, delete=False) as tmp:
                tmp.write(gzip.compress(plain.read_bytes(), compresslevel=9, mtime=0))
            os.chmod(tmp.name, plain.stat().st_mode & 0o777)
            os.replace(tmp.name, packed)
            plain.unlink()


def unpack(folder: pathlib.Path) -> None:
    """Replace ``folder``'s packed files by plain ones."""
    for name in DATABASE_FILES:
        packed = folder / (name + PACKED)
        if packed.exists():
            with tempfile.NamedTemporaryFile(dir=folder, delete=False) as tmp:
                tmp.write(gzip.decompress(packed.read_bytes()))
            os.chmod(tmp.name, packed.stat().st_mode & 0o777)
            os.replace(tmp.name, folder / name)
            packed.unlink()


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
