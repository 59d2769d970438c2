"""The simulated-serving demo (``tvm-canary demo``): engine, faults and the run loop."""

from .run import add_parser, run

__all__ = ["add_parser", "run"]
