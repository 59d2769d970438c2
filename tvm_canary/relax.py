"""Calling the canary kernels from a TVM Relax function (docs/EMBEDDING.md, "Recipe 3: TVM Relax", states the recipe and
its limits: no launch checks, D10 is the caller's, use every result, stay outside dataflow blocks).

``add_kernel(bb, kernel, spec, tag)`` adds a kernel specialization's TensorIR to a ``relax.BlockBuilder``'s
module; ``call_kernel(bb, gvar, **args)`` emits an in-place call of it (``R.call_tir_inplace``). Torch tensors
pass straight in (DLPack; a 2-D table with no columns as ``runtime.packing.table(t)``).

Arguments are the kernel's TensorIR parameters, by name (``parameters(bb, gvar)``): tensors are int64 but the int32
counts, ``flags`` and token tables (``r2t``, ``pool``), the canary buffer is its int64 view ``[S, stride / 8]``, a
real-KV source its int64 view ``[rows, row_bytes / 8]`` with ``ps``/``tw``/``fw`` = page size, token words, fold words
(``fw`` = 2 in PARTIAL mode, ``read_bytes / 8`` in ALL), scalars are Python ints. Unused source slots may be left
out (all four of a slot's parameters); the slots the specialization folds (its ``num_sources``) and a given ``src<i>``
need all four. ``flags`` (verify, write) is an int32 scratch zeroed once per violation ring
(``runtime.packing.flags_for``); the plan kernel's ``scratch`` is int64 ``[bs + 1]``. The compiled kernels refuse
arguments breaking the shape relations they rely on (``kernels.common.require``); overlaps they cannot see.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .cliargs import CUDA_ARCH
from .runtime import compile as compile_cache
from .runtime import packing, parse, specializations, targets

# kernel -> names of the TensorIR parameters it writes (the in-place results, in parameter order)
WRITES = {
    "write": ("buf", "ring", "write_index", "slot_counter", "kernel_counter", "flags"),
    "verify": ("ring", "write_index", "slot_counter", "kernel_counter", "flags"),
    "plan": ("vslots", "vtoks", "vpos", "vprev", "v_num_valid", "v_enable", "woff", "wseeds", "w_num_valid_reqs",
             "scratch"),
    "scatter": ("pool",),
}
_KERNEL_ATTR = "tvm_canary.kernel"
_SOURCES_ATTR = "tvm_canary.sources"  # the sources the specialization folds: their slots are used


def add_kernel(bb: relax.BlockBuilder, kernel: str, spec: tuple = (), tag: str = "llvm",
               mode: int | None = None, size: int | tuple | None = None) -> relax.GlobalVar:
    """Add kernel ``kernel`` specialised by ``spec`` (``runtime.specializations``) to ``bb``'s module, in the
    default geometry (``targets.default_geometry``) of target tag ``tag`` (``llvm``, ``cuda-sm_90``, ...), the
    spec's launch mode (``mode``, if given, must be it) and workload point ``size`` (``KernelCall.size``, e.g.
    verify's plan capacity; None: below any size class). Named ``canary_<kernel>[_<spec>]``, plus
    ``_<geometry>`` if the module holds that specialization in another geometry; returns its GlobalVar
    (the existing one for the same function). ValueError for an unknown ``kernel`` or ``tag``, a ``spec``
    not in ``all_specs`` or another ``mode``."""
    if kernel not in specializations.AXES:
        raise ValueError(f"kv-canary: no kernel {kernel!r} (kernels: {', '.join(specializations.KERNELS)})")
    spec = tuple(spec) if isinstance(spec, tuple | list) else spec
    if spec not in specializations.all_specs(kernel):
        axes = [name for name, _ in specializations.AXES[kernel]]
        raise ValueError(f"kv-canary: {kernel} has no specialization {spec!r} (its axes: {axes})")
    if tag != "llvm" and not re.fullmatch(f"cuda-{CUDA_ARCH}", str(tag)):
        raise ValueError(f"kv-canary: unknown target tag {tag!r} (llvm, or cuda-sm_XY such as cuda-sm_90)")
    launch = specializations.launch_mode(kernel, spec)
    if mode not in (None, launch):
        raise ValueError(f"kv-canary: {kernel} {spec!r} runs in mode {launch} (launch_mode), not {mode}")
    geom = targets.default_geometry(kernel, tag, launch, size)
    name = "_".join(["canary", kernel, *(str(int(x)) for x in spec)])
    sources = int(specializations.axis_values(kernel, spec).get("num_sources", 0))
    ir = _default_ir(kernel, spec, tag, geom)
    taken = {str(f.attrs["global_symbol"]): f for f in bb.get().functions.values()
             if f.attrs is not None and "global_symbol" in f.attrs}
    for symbol in (name, f"{name}_{geom.key().replace('-', '_')}"):
        func = ir.with_attr({"global_symbol": symbol, "tirx.is_scheduled": True, _KERNEL_ATTR: kernel,
                             _SOURCES_ATTR: sources})
        if symbol not in taken or tvm_ffi.structural_equal(taken[symbol], func):
            return bb.add_func(func, symbol)
    raise AssertionError(f"{name}: two functions of one geometry differ")


def _default_ir(kernel: str, spec: tuple, tag: str, geom) -> tvm.tirx.PrimFunc:
    """The kernel's TensorIR in geometry ``geom`` (a default of the tag). Parsing the TVMScript takes
    seconds, so the IR is kept as JSON beside the compiled modules in the disk cache (same key: a
    changed kernel source is never reused). A damaged file is parsed and written again; a cache that
    cannot store it (read-only, full) only costs the parse next time."""
    path = compile_cache.cache_dir() / f"{compile_cache.module_key(kernel, spec, tag, geom)}.tir.json"
    if path.exists():
        try:
            return tvm.ir.load_json(path.read_text())
        except Exception as e:  # noqa: BLE001 -- any damage (cut short, foreign bytes): parse it again
            logging.getLogger("tvm_canary").warning("tvm_canary: the kernel cache's %s does not load (%s); parsing "
                                                    "the kernel again", path, compile_cache.error_line(e))
    func = parse.kernel_ir(kernel, spec, geom)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".json", delete=False) as tmp:
            tmp.write(tvm.ir.save_json(func))
        os.chmod(tmp.name, compile_cache.new_file_mode())
        os.replace(tmp.name, path)
    except OSError:  # see the docstring
        pass
    return func


def parameters(bb: relax.BlockBuilder, gvar: relax.GlobalVar) -> list[str]:
    """The TensorIR parameter names of an added kernel, in order."""
    return [p.name for p in bb.get()[gvar].params]


def call_kernel(bb: relax.BlockBuilder, gvar: relax.GlobalVar, **args) -> dict[str, relax.Expr]:
    """Emit ``R.call_tir_inplace`` of an added kernel on ``args`` (its parameter names -> Relax tensors
    or Python ints). Returns the written parameters' new values by name (``WRITES``), bound to variables;
    use them, or Relax deletes the call."""
    func = bb.get()[gvar]
    written = WRITES[str(func.attrs[_KERNEL_ATTR])]
    call_args, inplace, out_ty = [], [], []
    used_sources = {name[3:] for name in args if name.startswith("src") and name[3:].isdigit()}
    used_sources |= {str(i) for i in range(int(func.attrs.get(_SOURCES_ATTR, 0)))}
    for i, param in enumerate(func.params):
        value = args.pop(param.name, None)
        if value is None:
            value = _unused_source(param.name, used_sources)
        if isinstance(param.ty, tvm.ir.PrimType):
            value = relax.prim_value(tvm.tirx.IntImm(param.ty.dtype, int(value)))
        if param.name in written:
            inplace.append(i)
            out_ty.append(bb.normalize(value).ty)
        call_args.append(value)
    if args:
        raise TypeError(f"kv-canary: {gvar.name_hint} has no parameter(s) {sorted(args)}")
    if len(out_ty) == 1:
        return {written[0]: bb.emit(relax.call_tir_inplace(gvar, call_args, inplace, out_ty[0]))}
    result = bb.emit(relax.call_tir_inplace(gvar, call_args, inplace, out_ty))
    return {name: bb.emit(relax.TupleGetItem(result, k)) for k, name in enumerate(written)}


def _unused_source(name: str, used_sources: set[str]):
    """The value of a left-out parameter of an unused real-KV source slot (``src<i>``, ``ps<i>`` ...);
    ``used_sources``: the slots whose parameters cannot be left out (module docstring)."""
    if name.startswith("src") and name[3:].isdigit() and name[3:] not in used_sources:
        return relax.const(np.zeros((1, 1), dtype="int64"), "int64")
    if name[:2] in packing.UNUSED_SOURCE and name[2:].isdigit() and name[2:] not in used_sources:
        return packing.UNUSED_SOURCE[name[:2]]
    raise TypeError(f"kv-canary: missing argument {name!r}")
