"""The ``tvm-canary`` command: one argparse subcommand per module.

A subcommand module provides ``add_parser(subparsers)``, which registers its parser and sets
``func`` to a callable taking the parsed namespace and returning the exit status.
"""

from __future__ import annotations

import argparse

from . import build, demo, selftest, tune

SUBCOMMANDS = (demo, selftest, build, tune)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-canary", description="KV-cache canary (sglang kv-canary on Apache TVM)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process arguments), run the subcommand, return its exit status."""
    args = build_parser().parse_args(argv)
    return args.func(args)
