"""Baseline (a): a clean-room CUDA implementation with the original's fixed launch geometry.

The kernels are in ``original_cuda.cu`` (written from docs/SPEC.md sections 1-3 and 5: verify 64 x 512
grid-stride, write one block per request, plan offsets + persistent entries grid, scatter 1024-column
tiles) and are compiled, like the original, with tvm-ffi's JIT (``tvm_ffi.cpp.load_inline``). The
functions below take the public launch functions' keyword arguments (SPEC 0), so the benchmark can call
them on the very tensors it gives tvm_canary. Violation rows are appended by atomic arrival (SPEC 3.5),
so a ring is compared to the reference's as a set of rows.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil

import torch

from tvm_canary.consts import MAX_REAL_KV_SOURCES, RealKvHashMode

SOURCE = pathlib.Path(__file__).with_name("original_cuda.cu")
FUNCTIONS = ("original_verify", "original_write", "original_plan", "original_scatter")


@functools.cache
def module():
    """The JIT-built module (cached by tvm-ffi under ~/.cache/tvm-ffi, keyed by the source)."""
    import tvm_ffi.cpp

    if "TVM_FFI_CUDA_ARCH_LIST" not in os.environ and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        os.environ["TVM_FFI_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    ldflags = [f"-L{_cudart_dir()}"]
    if shutil.which("ninja") is None:  # tvm-ffi's JIT drives ninja; without it, the same build by hand
        return _build_without_ninja(ldflags)
    return tvm_ffi.cpp.load_inline(
        name="canary_original_baseline", cuda_sources=SOURCE.read_text(), functions=list(FUNCTIONS),
        extra_ldflags=ldflags,
    )


def _build_without_ninja(ldflags: list[str]):
    """What ``load_inline`` does, with nvcc called directly: the source plus tvm-ffi's export macros,
    compiled for the arch in $TVM_FFI_CUDA_ARCH_LIST, linked against libtvm_ffi, loaded with tvm-ffi."""
    import hashlib
    import subprocess

    import tvm_ffi
    from tvm_ffi import libinfo

    exports = "".join(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({f}, {f});\n" for f in FUNCTIONS)
    text = "#include <tvm/ffi/container/tensor.h>\n#include <tvm/ffi/function.h>\n" + SOURCE.read_text() + exports
    major, minor = os.environ["TVM_FFI_CUDA_ARCH_LIST"].split()[0].split(".")
    out = (pathlib.Path.home() / ".cache" / "tvm-ffi"
           / f"canary_original_{hashlib.sha256(text.encode()).hexdigest()[:16]}")
    lib = out / "canary_original_baseline.so"
    if not lib.exists():
        out.mkdir(parents=True, exist_ok=True)
        (out / "source.cu").write_text(text)
        includes = [f"-I{d}" for d in libinfo.include_paths()]
        cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O2",
               f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}", *includes, str(out / "source.cu"),
               f"-L{pathlib.Path(libinfo.find_libtvm_ffi()).parent}", "-ltvm_ffi", *ldflags, "-lcudart", "-o", str(lib)]
        subprocess.run(cmd, check=True)
    return tvm_ffi.load_module(str(lib))


def _cudart_dir() -> str:
    """A directory holding ``libcudart.so`` for the link (tvm-ffi links ``-lcudart``): under $CUDA_HOME,
    next to nvcc, /usr/local/cuda*, or torch's CUDA runtime wheels; a bare ``libcudart.so.N`` gets an
    unversioned link in a private folder."""
    import glob
    import tempfile

    nvcc = shutil.which("nvcc")
    roots = [pathlib.Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots += [pathlib.Path(nvcc).resolve().parent.parent] if nvcc else []
    roots += [pathlib.Path(p) for p in sorted(glob.glob("/usr/local/cuda*"))]
    roots += [pathlib.Path(p) for p in glob.glob(str(pathlib.Path(torch.__file__).parent.parent / "nvidia" / "*"))]
    dirs = [r / sub for r in roots for sub in ("lib64", "lib", "targets/x86_64-linux/lib")]
    for d in dirs:
        if (d / "libcudart.so").exists():
            return str(d)
    for d in dirs:
        for versioned in sorted(d.glob("libcudart.so.*")):
            link_dir = pathlib.Path(tempfile.mkdtemp(prefix="canary-cudart-"))
            (link_dir / "libcudart.so").symlink_to(versioned)
            return str(link_dir)
    raise RuntimeError("kv-canary: no libcudart found (next to nvcc or in torch's nvidia wheels) "
                       "to link the CUDA baseline")


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _sources(context):
    """(four uint8 2-D tensors, CPU int64 [4, 4] params, count, mode) of a context's real-KV sources;
    a param row is (page_size, num_bytes_per_token, read_bytes, row stride in bytes)."""
    used = context.real_kv_sources if context.real_kv_hash_mode != RealKvHashMode.NONE else ()
    views = [s.tensor.view(torch.uint8).reshape(s.tensor.shape[0], -1) for s in used]
    params = torch.zeros(MAX_REAL_KV_SOURCES, 4, dtype=torch.int64)
    for i, (s, view) in enumerate(zip(used, views)):
        params[i] = torch.tensor([s.page_size, s.num_bytes_per_token, s.read_bytes, view.stride(0)])
    filler = context.canary_buf
    views += [filler] * (MAX_REAL_KV_SOURCES - len(views))
    return views, params, len(used), int(context.real_kv_hash_mode)


def _sink(context):
    return [context.violation_ring, context.violation_write_index, context.slot_run_counter, context.kernel_run_counter,
            int(context.kernel_kind)]


def verify(*, context, plan, check_verify_expected_token):
    views, params, count, mode = _sources(context)
    module().original_verify(
        context.canary_buf, plan.verify_slot_indices, plan.verify_expected_tokens, plan.verify_expected_positions,
        plan.verify_prev_slot_indices, plan.verify_num_valid, plan.enable, *_sink(context),
        bool(check_verify_expected_token), *views, params, count, mode, _stream(context.canary_buf.device),
    )


def write(*, context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert, expected_input_tokens,
          expected_input_positions):
    views, params, count, mode = _sources(context)
    on = bool(enable_write_input_assert)
    module().original_write(
        context.canary_buf, plan.write_offsets, plan.write_seed_slot_indices, plan.write_num_valid_reqs,
        input_ids, positions, out_cache_loc, expected_input_tokens if on else input_ids,
        expected_input_positions if on else positions, context.enable_chain_position_assert, *_sink(context), on,
        *views, params, count, mode, _stream(context.canary_buf.device),
    )


def plan(*, verify_plan_out, write_plan_out, req_pool_indices, prefix_lens, extend_seq_lens, req_to_token,
         swa_window_size, full_to_swa_index_mapping, verify_capacity, req_to_verify_expected_tokens,
         req_to_verify_expected_tokens_valid_lens, kv_token_id_vs_position_offset):
    device = req_pool_indices.device
    scratch = torch.empty(4096 + 1, dtype=torch.int64, device=device)  # as the original: per call
    has_lut = full_to_swa_index_mapping is not None
    has_pool = req_to_verify_expected_tokens is not None
    module().original_plan(
        verify_plan_out.verify_slot_indices, verify_plan_out.verify_expected_tokens,
        verify_plan_out.verify_expected_positions, verify_plan_out.verify_prev_slot_indices,
        verify_plan_out.verify_num_valid, verify_plan_out.enable, write_plan_out.write_offsets,
        write_plan_out.write_seed_slot_indices, write_plan_out.write_num_valid_reqs, req_pool_indices, prefix_lens,
        extend_seq_lens, req_to_token, int(swa_window_size), has_lut,
        full_to_swa_index_mapping if has_lut else req_pool_indices, has_pool,
        req_to_verify_expected_tokens if has_pool else req_to_token,
        req_to_verify_expected_tokens_valid_lens if has_pool else req_pool_indices,
        int(kv_token_id_vs_position_offset), scratch, torch.cuda.get_device_properties(device).multi_processor_count,
        _stream(device),
    )


def scatter(*, flat_in, offsets, req_pool_indices, pool_out):
    module().original_scatter(flat_in, offsets, req_pool_indices, pool_out, _stream(flat_in.device))


LAUNCHES = {"verify": verify, "write": write, "plan": plan, "scatter": scatter}
