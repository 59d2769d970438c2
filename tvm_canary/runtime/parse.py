"""The TensorIR of a kernel specialization: ``tvm_canary.kernels.<kernel>.make(*spec, geom)``, parsed
once per process.

Every caller that needs a kernel's TensorIR (compilation for each target, the tuning kernel hashes, the
Relax module) takes it from ``kernel_ir``, so a (kernel, specialization, geometry) is parsed once per
process however many targets lower it (the CUDA archs share their geometry). Callers must not mutate
the returned function (TVM IR is immutable; ``with_attr`` returns a copy).

Parsing is slow in TVM 0.27 for a reason outside the kernels: at every ``T.macro`` call the parser
finds itself with ``inspect.getouterframes``, which reads the source lines of every frame on the
stack (and scans ``sys.modules`` for each), about 20 ms per macro call, two seconds per write or
verify kernel and more under pytest's deep stacks. ``kernel_ir`` parses with that lookup replaced by
a plain walk of the same frames in the same order (``_parser_on_stack``), which returns the same
parser: the TensorIR is identical, parsing takes about a quarter of the time.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading

from tvm.script.parser.core.parser import ScriptMacro

from .._sources import require_sources_as_read

_patch_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def kernel_ir(kernel: str, spec: tuple, geom):
    """The ``tvm.tirx.PrimFunc`` of ``kernel`` for specialization ``spec`` in geometry ``geom``
    (memoized per process; do not mutate); refused when the sources differ from those the process keys
    its modules by (``_sources.require_sources_as_read``, before and after parsing)."""
    require_sources_as_read()
    make = importlib.import_module(f"tvm_canary.kernels.{kernel}").make
    with _fast_macro_lookup():
        func = make(*spec, geom)
    require_sources_as_read()
    return func


def _parser_on_stack(macro) -> object:
    """``ScriptMacro._find_parser_def`` without building frame records: the innermost frame whose
    globals hold the parser (the parser puts itself there while it evaluates macro calls)."""
    name = ScriptMacro.parser_object_name
    frame = sys._getframe(1)
    while frame is not None:
        parser = frame.f_globals.get(name)
        if parser is not None:
            return parser
        frame = frame.f_back
    raise RuntimeError(f"{name} not available")


@contextlib.contextmanager
def _fast_macro_lookup():
    """Use ``_parser_on_stack`` for the macro calls parsed inside the block (restored on exit)."""
    with _patch_lock:
        original = ScriptMacro.__dict__["_find_parser_def"]
        ScriptMacro._find_parser_def = _parser_on_stack
        try:
            yield
        finally:
            ScriptMacro._find_parser_def = original
