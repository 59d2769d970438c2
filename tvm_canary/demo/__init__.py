"""The simulated-serving demo (``tvm-canary demo``): the run loop over ``tvm_canary.testing``'s engine and faults."""

from .run import add_parser, run

__all__ = ["add_parser", "run"]
