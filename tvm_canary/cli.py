"""The ``tvm-canary`` command: one argparse subcommand per module.

A subcommand module provides ``add_parser(subparsers)``, which registers its parser and sets
``func`` to a callable taking the parsed namespace and returning the exit status.

Errors a user can fix are one line on stderr: usage errors (exit status 2, ``cliargs.Parser``, also for a
``cliargs.UsageError`` a subcommand raises after parsing) and the package's own ``kv-canary:`` errors raised while a
subcommand runs (exit status 1; 2 for the ``FINDINGS_EXIT_1`` commands, whose status 1 means their check found a
mismatch). Output to a reader that went away (``tvm-canary info | head -1``) ends the command quietly with status 1, as
a Python program writing to a closed pipe does (2 for the ``FINDINGS_EXIT_1`` commands). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import sys

from . import build, conformance, demo, fuzz, info, selftest
from .cliargs import Parser, UsageError
from .console import discard, print_notices_above_progress_bars
from .tuning import command as tune
from .tuning import fleet, merge

SUBCOMMANDS = (demo, selftest, build, tune, merge, fleet, info, conformance, fuzz)
DISTRIBUTION = "tvm_canary"
# Commands whose exit status 1 is a finding (a case failing on a device); their errors exit 2 (module docstring).
FINDINGS_EXIT_1 = ("conformance", "fuzz")


def package_version() -> str:
    """The installed distribution's version; else the source tree's pyproject.toml version."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.MULTILINE) if pyproject.is_file() else None
    return f"{found.group(1)} (source tree, not installed)" if found else "unknown (not installed)"


def build_parser() -> Parser:
    parser = Parser(prog="tvm-canary", description="KV-cache canary (sglang kv-canary on Apache TVM)")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version()}", help="print the version and exit"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    parser.subcommands = subparsers.choices  # name -> its parser (usage errors found after parsing)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process arguments), run the subcommand, return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    print_notices_above_progress_bars()
    error_status = 2 if args.command in FINDINGS_EXIT_1 else 1  # a run that ended on an error (module docstring)
    try:
        return args.func(args)
    except BrokenPipeError:
        discard()
        return error_status
    except UsageError as e:
        parser.subcommands[args.command].error(str(e))
    except (ValueError, TypeError, RuntimeError, KeyError) as e:
        message = str(e.args[0]) if e.args else ""
        if not message.startswith("kv-canary:"):
            raise
        print(f"tvm-canary {args.command}: error: {message}", file=sys.stderr)
        return error_status
