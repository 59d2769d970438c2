"""Launch geometries per kernel: ``DEFAULTS`` are used when nothing is tuned."""

from .defaults import DEFAULTS

__all__ = ["DEFAULTS"]
