"""The command line's output: notices of the ``tvm_canary`` logger (e.g. "no tuned schedule for ...", each
logged once per process) printed above its tqdm progress bars instead of through them, and counts of
things in words (``counted``), and an output discarded once its reader went away (``discard``)."""

from __future__ import annotations

import logging
import os
import sys

from tqdm import tqdm


class _AboveProgressBars(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stderr)


def counted(count: int, noun: str) -> str:
    """``1 case``, ``2 cases``, ``2 processes``: ``count`` and ``noun``, in the plural unless it is 1."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


def print_notices_above_progress_bars() -> None:
    """Route the ``tvm_canary`` logger's records through ``tqdm.write`` (idempotent)."""
    logger = logging.getLogger("tvm_canary")
    if not any(isinstance(h, _AboveProgressBars) for h in logger.handlers):
        logger.addHandler(_AboveProgressBars())


def discard(stream=None) -> None:
    """Point ``stream`` (default stdout) at /dev/null after a write raised ``BrokenPipeError`` (its reader went
    away): Python's recipe, so that later writes and the flush at exit do not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), (stream or sys.stdout).fileno())
