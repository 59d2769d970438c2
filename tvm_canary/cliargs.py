"""argparse pieces shared by the ``tvm-canary`` subcommands.

``Parser`` is the class of the top-level parser and, through ``add_subparsers``, of every subcommand's: usage errors
are one line (no usage block), and option help shows each default the help text does not state. ``torch_device`` is
the ``type=`` of ``--device`` options: ``cuda`` without a GPU visible to torch is a usage error, not a traceback
from inside torch; ``int_at_least(low)`` that of counts (steps, trials, workers, ports), ``duration(zero=...)`` of
durations, ``seed`` of seeds, ``output_file``, ``output_folder`` and ``output_root`` of paths a command writes
(checked before it runs, so a long run is not lost to a bad path at its end).
"""

from __future__ import annotations

import argparse
import copy
import errno
import functools
import math
import os
import pathlib
import re
import tempfile

import torch


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help mentions its default, the option
    is a flag, or it has no default; an option without help still shows its default."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings and self._get_help_string(action):
            action = copy.copy(action)
            action.help = self._get_help_string(action)
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
            return text
        return f"{text} (default: %(default)s)".lstrip()


class UsageError(Exception):
    """A usage error found after parsing (options that go together, a value fitting no other option's):
    ``cli.main`` reports it as the subcommand's parser reports its own (exit status 2)."""


class Parser(argparse.ArgumentParser):
    """ArgumentParser with one-line usage errors and defaults shown in help."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def summary(doc: str) -> str:
    """A subcommand's help description: the first line of its module's docstring without reST's
    literal markup (``tvm-canary info``: ... -> tvm-canary info: ...)."""
    return doc.splitlines()[0].replace("``", "")


def default_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_device(value: str) -> str:
    """``--device`` value check: ``cuda`` needs a GPU visible to torch (choices are checked after this)."""
    if value == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            "cuda: torch sees no CUDA device on this machine (torch.cuda.is_available() is False); use --device cpu"
        )
    return value


def int_at_least(low: int, most: int | None = None):
    """An argparse ``type`` accepting integers ``>= low`` (``<= most``); argparse reports the rest as usage errors."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, got {value}")
        return value

    return parse


def duration(*, zero: bool, most: float = math.inf):
    """An argparse ``type`` accepting a duration in seconds: above 0, or from 0 on when ``zero``; at most ``most``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
        if not (value >= 0 if zero else value > 0):  # NaN fails both
            raise argparse.ArgumentTypeError(f"must be {'at least' if zero else 'above'} 0, got {text}")
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g}, got {text}")
        return value

    return parse


def seed(text: str) -> int:
    """An argparse ``type`` accepting a seed torch takes: an int64 (a seed a run adds case numbers to stays one)."""
    value = int_at_least(-(2**63))(text)
    if value >= 2**62:
        raise argparse.ArgumentTypeError(f"must be below 2**62, got {value}")
    return value


OLDEST_CUDA_ARCH = 75  # CUDA 13 (nvcc, NVRTC) compiles for sm_75 and newer
CUDA_ARCH = r"sm_(\d{2,3})[af]?"


def cuda_arch(text: str) -> str:
    """An argparse ``type`` for a CUDA arch: ``sm_`` and a compute capability of two or more digits
    (``sm_90``, ``sm_100a``), as nvcc and NVRTC name them, from ``sm_75`` (``OLDEST_CUDA_ARCH``) on."""
    match = re.fullmatch(CUDA_ARCH, text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a CUDA arch such as sm_90, got {text!r}")
    if int(match.group(1)) < OLDEST_CUDA_ARCH:
        raise argparse.ArgumentTypeError(f"{text} is older than sm_{OLDEST_CUDA_ARCH}, the oldest arch CUDA 13 "
                                         "compiles for")
    return text


def _path_type(check):
    """An argparse path ``type`` whose file-system errors (a name too long, a loop of links) are usage errors."""

    @functools.wraps(check)
    def checked(text: str) -> pathlib.Path:
        try:
            return check(text)
        except OSError as e:
            raise argparse.ArgumentTypeError(f"{text[:80]}: {e.strerror or e}") from None

    return checked


@_path_type
def output_file(text: str) -> pathlib.Path:
    """An argparse ``type`` for a file a command writes: its folder exists, it is not a folder, and it can
    be written (an existing file, pipe or device: ``os.access``; a new one: created and removed)."""
    path = pathlib.Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: folder {path.parent} does not exist")
    try:
        if not path.exists():
            open(path.resolve(), "x").close()  # a dangling link: the file it names
            path.resolve().unlink()
        elif not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text}: cannot write it ({e.strerror})") from None
    return path


@_path_type
def output_root(text: str) -> pathlib.Path:
    """An argparse ``type`` for a folder under which a command writes into subfolders (created if
    missing): not a file. The subfolder is checked once the command knows it (``writable_folder``), so a
    read-only root with writable subfolders serves."""
    path = pathlib.Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    return path


@_path_type
def output_folder(text: str) -> pathlib.Path:
    """An argparse ``type`` for a folder a command writes into (created if missing): not a file, and the
    folder, or where it would be created (its nearest existing parent), one this process can make a
    folder in (probed: one made and removed; ``os.access`` passes ``/proc`` for root)."""
    path = output_root(text)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {existing} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing))
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text}: cannot write into {existing} ({e.strerror})") from None
    return path


def require_compiler(command: str) -> None:
    """Refuse ``command`` (one that builds kernels) on a runtime-only TVM."""
    from .runtime import compile as C

    if not C.compiler_available():
        raise RuntimeError(f"kv-canary: tvm-canary {command} needs TVM's compiler, and this TVM is runtime-only")


def require_module_builds() -> None:
    """Refuse a run (fuzz, conformance) on a host that can build no kernel module (no C/C++ compiler) and has no
    ahead-of-time modules (``TVM_CANARY_MODULES``): every case would fail alike, reported as the kernels' findings."""
    from .runtime import compile as C

    if not C.prebuilt_dirs():
        C.require_c_compiler()


def writable_folder(folder: pathlib.Path, files: tuple[str, ...] = ()) -> None:
    """Create ``folder`` (and its parents) if missing and check that this process can write into it and
    to those of ``files`` (names in it) that exist; else ``UsageError``. A command writing there at its
    end (a tuning database) calls it before its work, so a bad path costs no run."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"kv-canary: cannot create the folder {folder}: {e.strerror}") from None
    for path in (folder, *(folder / name for name in files if (folder / name).exists())):
        if not os.access(path, os.W_OK):
            raise UsageError(f"kv-canary: cannot write to {path} (permissions or a read-only file system)")
