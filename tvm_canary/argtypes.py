"""Type checks of public-API arguments (docs/SPEC.md section 4 "Argument types", D9).

The contract's own checks (section 4) compare values and read tensor attributes; given a value of the wrong type they
would crash with a bare ``AttributeError`` or ``TypeError``. The helpers here raise a ``TypeError`` with the
``kv-canary:`` prefix instead, placed exactly where the contract's check would have crashed, so every contract message
keeps its text and precedence.
"""

from __future__ import annotations

import numbers
import operator
import sys

import torch

# The dataclass options of the public records (contexts, sources, plans): frozen, slotted, keyword-only,
# and weakly referable where Python allows (3.11+), so ``tvm_canary.eager`` can forget a memoised launch
# when its context or plan dies (on 3.10 launches are not memoised).
RECORD = dict(frozen=True, slots=True, kw_only=True, **({"weakref_slot": True} if sys.version_info >= (3, 11) else {}))


def type_name(value: object) -> str:
    """``numpy.ndarray``, ``list``, ``NoneType``: the qualified name of ``value``'s type."""
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__.split('.')[0]}.{cls.__qualname__}"


def shape_text(tensor: torch.Tensor) -> str:
    """``tensor``'s shape as a tuple prints (``(3,)``, ``(2, 4)``), in numbers also while torch.compile traces
    it with symbolic sizes (a ``torch.SymInt`` formats as its value; the tuple's repr shows ``s56``)."""
    dims = [f"{d}" for d in tensor.shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def require_tensor(value: object, name: str) -> None:
    """``value`` is a dense ``torch.Tensor`` (numpy arrays and lists are not converted; sparse and nested
    tensors, without strides to check, are refused)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type_name(value)}")
    if value.layout != torch.strided or value.is_nested:
        kind = "nested" if value.is_nested else str(value.layout).removeprefix("torch.")
        raise TypeError(f"kv-canary: {name} must be a dense (strided) tensor, got a {kind} tensor")


def require_instance(value: object, cls: type, name: str) -> None:
    """``value`` is a ``cls`` (for plans, contexts and real-KV sources)."""
    if not isinstance(value, cls):
        raise TypeError(f"kv-canary: {name} must be a {cls.__name__}, got {type_name(value)}")


def require_number(value: object, name: str) -> None:
    """``value`` can be compared with an int: the precondition of a contract range check.

    Call it just before the range check, and ``require_integer`` after it, so a float outside the range still gets the
    contract's ``ValueError`` first.
    """
    refuse_array(value, name)
    if not isinstance(value, numbers.Real) and not hasattr(type(value), "__index__"):
        raise TypeError(f"kv-canary: {name} must be an int, got {type_name(value)}")


def refuse_array(value: object, name: str) -> None:
    """The "must be an int" TypeError for a tensor or array of one or more dimensions (it has ``__index__``,
    and comparing it with an int gives no single truth value). Ints pass first (a traced caller's
    ``torch.SymInt`` cannot be asked for ``ndim``)."""
    if not isinstance(value, int | torch.SymInt) and getattr(value, "ndim", 0):
        raise TypeError(f"kv-canary: {name} must be an int, got {type_name(value)}")


def refuse_negative(value, name: str) -> None:
    """The "must be non-negative" ValueError for a number below 0 (the caller checks its type)."""
    if value < 0:
        raise ValueError(f"kv-canary: {name} must be non-negative, got {value}")


def require_non_negative(value: object, name: str) -> int:
    """``value`` as an int >= 0: ``require_number``, ``refuse_negative``, ``require_integer``."""
    require_number(value, name)
    refuse_negative(value, name)
    return require_integer(value, name)


def require_positive(value: object, name: str) -> int:
    """``value`` as a positive int: ``require_number``, the "must be positive" ValueError, ``require_integer``."""
    require_number(value, name)
    if value <= 0:
        raise ValueError(f"kv-canary: {name} must be positive, got {value}")
    return require_integer(value, name)


def fits_int64(value: int) -> bool:
    """Whether ``value`` lies in int64's range."""
    return -(2**63) <= value < 2**63


def require_int64(value: object, name: str) -> int:
    """``value`` as an int (``require_integer``) that fits in int64, as a kernel argument must."""
    value = require_integer(value, name)
    if not fits_int64(value):
        raise ValueError(f"kv-canary: {name} must fit in int64, got {value}")
    return value


def require_integer(value: object, name: str) -> int:
    """``value`` as an int; Python and numpy ints (anything with ``__index__``) are accepted. An int, or a
    traced caller's symbolic size (``torch.SymInt``, an int to ``torch.compile``), is returned as is:
    indexing a symbolic size would make it a constant of the compiled graph."""
    if type(value) is int or isinstance(value, torch.SymInt):
        return value

    def not_an_int() -> TypeError:
        return TypeError(f"kv-canary: {name} must be an int, got {type_name(value)} {value!r}")

    require_number(value, name)  # not a number (None, a str, ...): the type alone (SPEC 4 "Argument types")
    # A float is refused before operator.index: inside torch.compile, torch 2.11's Dynamo turns
    # operator.index's TypeError into its own internal error, unseen by the except below.
    if isinstance(value, float):
        raise not_an_int()
    try:
        return operator.index(value)
    except TypeError:
        raise not_an_int() from None
