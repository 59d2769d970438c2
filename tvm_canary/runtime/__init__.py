"""Compiling kernels for a device, caching them in memory and on disk, choosing the backend."""

from .backend import use_backend, use_reference
from .compile import get_kernel

__all__ = ["get_kernel", "use_backend", "use_reference"]
