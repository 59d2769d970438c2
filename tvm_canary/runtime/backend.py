"""Backend choice: compiled TVM kernels (default) or the torch reference (explicit switch, SPEC D1).

``TVM_CANARY_BACKEND=reference`` in the environment, or ``with use_backend("reference"):``, makes the public launch
functions run ``tvm_canary.reference`` instead of the compiled kernels.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

BACKENDS = ("tvm", "reference")
_current = contextvars.ContextVar("tvm_canary_backend", default=None)
# os.environ.get raises and catches a KeyError if the variable is unset (about a microsecond, every
# launch); reading os.environ's own mapping is the same lookup without it.
_ENV_KEY = os.environ.encodekey("TVM_CANARY_BACKEND")


def current_backend() -> str:
    """The backend of this launch: ``use_backend``'s, else ``$TVM_CANARY_BACKEND`` (read at every call), else "tvm"."""
    name = _current.get()
    if name is None:
        value = os.environ._data.get(_ENV_KEY)
        name = "tvm" if value is None else os.environ.decodevalue(value)
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
