"""Command-line presentation shared by the subcommands: help that shows defaults, and notices of the
``tvm_canary`` logger (e.g. "no tuned schedule for ...", each logged once per process) printed above
tqdm progress bars instead of through them."""

from __future__ import annotations

import argparse
import logging
import sys

from tqdm import tqdm


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``ArgumentDefaultsHelpFormatter`` that leaves out the defaults that say nothing (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action)


class _AboveProgressBars(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stderr)


def print_notices_above_progress_bars() -> None:
    """Route the ``tvm_canary`` logger's records through ``tqdm.write`` (idempotent)."""
    logger = logging.getLogger("tvm_canary")
    if not any(isinstance(h, _AboveProgressBars) for h in logger.handlers):
        logger.addHandler(_AboveProgressBars())
