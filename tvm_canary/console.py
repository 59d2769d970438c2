"""Notices of the ``tvm_canary`` logger (e.g. "no tuned schedule for ...", each logged once per process)
printed by the command line above its tqdm progress bars instead of through them."""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm


class _AboveProgressBars(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stderr)


def print_notices_above_progress_bars() -> None:
    """Route the ``tvm_canary`` logger's records through ``tqdm.write`` (idempotent)."""
    logger = logging.getLogger("tvm_canary")
    if not any(isinstance(h, _AboveProgressBars) for h in logger.handlers):
        logger.addHandler(_AboveProgressBars())
