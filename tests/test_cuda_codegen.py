"""CUDA code generation without a GPU: every kernel specialization lowers for CUDA, keeps all state on
the device (no host-side workspace, no host reads of device tensors), and its source compiles with
nvcc for sm_80 and sm_90, so CUDA breakage is caught in CPU CI.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest

from tvm_canary.runtime import compile as C
from tvm_canary.runtime import targets
from tvm_canary.runtime.specializations import KERNELS, all_specs, spec_id

CASES = [(k, s) for k in KERNELS for s in all_specs(k)]


@functools.cache  # each (kernel, spec, arch) is built once per run: the nvcc test reuses the lowering test's
def cuda_build(kernel, spec, arch):
    tag = f"cuda-{arch}"
    return C.build(kernel, spec, tag, targets.default_geometry(kernel, tag))


@pytest.mark.parametrize("kernel,spec", CASES, ids=[f"{k}-{spec_id(s)}" for k, s in CASES])
def test_cuda_lowering_keeps_state_on_device(kernel, spec):
    ex = cuda_build(kernel, spec, "sm_90")
    host_ir = ex.mod.inspect_source("ll")
    assert "TVMBackendAllocWorkspace" not in host_ir  # a host-allocated buffer would be written by the CPU
    source = ex.mod.imports[0].inspect_source("cuda")
    assert f"canary_{kernel}_kernel" in source


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_nvcc_compiles_generated_source(kernel, arch, tmp_path):
    specs = all_specs(kernel)
    for spec in specs[:: max(1, len(specs) // 3)]:
        source = cuda_build(kernel, spec, arch).mod.imports[0].inspect_source("cuda")
        cu = tmp_path / f"{kernel}.cu"
        cu.write_text(source)
        cmd = ["nvcc", "-c", "-o", str(tmp_path / f"{kernel}.o"), f"-arch={arch}", "-std=c++17", str(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-4000:]
