"""Option helpers shared by the simulated-serving commands (``demo``, ``selftest``)."""

from __future__ import annotations

import argparse

import torch


def int_at_least(low: int):
    """An argparse ``type`` accepting integers ``>= low`` (argparse reports the rest as usage errors)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device cpu|cuda``, defaulting to cuda when a GPU is visible."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="device of the KV pool and the canary tensors")


def require_device(args: argparse.Namespace, command: str) -> torch.device:
    """``args.device`` as a torch device; exits with a one-line message when CUDA is asked for but not visible."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"tvm-canary {command}: --device cuda: no CUDA GPU is visible to torch on this machine "
                         "(use --device cpu)")
    return torch.device(args.device)
