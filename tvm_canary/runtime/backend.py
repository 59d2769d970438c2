"""Backend choice: compiled TVM kernels (default) or the torch reference (explicit switch, SPEC D1).

``TVM_CANARY_BACKEND=reference`` in the environment, or ``with use_backend("reference"):``, makes the
public launch functions run ``tvm_canary.reference`` instead of the compiled kernels.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

BACKENDS = ("tvm", "reference")
_current = contextvars.ContextVar("tvm_canary_backend", default=None)


def current_backend() -> str:
    name = _current.get() or os.environ.get("TVM_CANARY_BACKEND", "tvm")
    if name not in BACKENDS:
        raise ValueError(f"kv-canary: unknown backend {name!r}, expected one of {BACKENDS}")
    return name


def use_reference() -> bool:
    return current_backend() == "reference"


@contextlib.contextmanager
def use_backend(name: str):
    """Run the launches inside the block on backend ``name`` ("tvm" or "reference")."""
    if name not in BACKENDS:
        raise ValueError(f"kv-canary: unknown backend {name!r}, expected one of {BACKENDS}")
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)
