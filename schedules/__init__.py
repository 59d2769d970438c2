"""Launch geometries per kernel: the default used when nothing is tuned (``DEFAULTS``)."""

from .defaults import DEFAULTS

__all__ = ["DEFAULTS"]
