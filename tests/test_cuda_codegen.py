"""CUDA code generation without a GPU: every kernel specialization lowers for CUDA, keeps all state on
the device (no host-side workspace or reads of device tensors), and its device code compiles with nvcc
for sm_80 and sm_90: CUDA breakage caught in CPU CI.

One class per kernel: under the README's ``pytest -n 2 --dist loadscope`` a class runs in one worker, so the nvcc test
finds its lowerings in ``cuda_build``'s per-process cache: each (kernel, specialization, arch) lowered once a run.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

import pytest

from tvm_canary.geometry import Geometry
from tvm_canary.runtime import compile as C
from tvm_canary.runtime import targets
from tvm_canary.runtime.specializations import KERNELS, all_specs, launch_mode, spec_id


@functools.cache  # the nvcc test reuses the lowering test's builds
def cuda_build(kernel, spec, arch):
    """The specialization in the default geometry of its launch mode (PARTIAL or ALL when it folds
    sources, NONE otherwise)."""
    tag = f"cuda-{arch}"
    return C.build(kernel, spec, tag, targets.default_geometry(kernel, tag, launch_mode(kernel, spec)))


def pytest_generate_tests(metafunc) -> None:
    """``spec``: every specialization of the class's kernel."""
    if "spec" in metafunc.fixturenames:
        specs = all_specs(metafunc.cls.kernel)
        metafunc.parametrize("spec", specs, ids=[spec_id(s) for s in specs])


class KernelCodegen:
    """The codegen tests of one kernel (``kernel``, set by the subclasses below)."""

    kernel: str

    def test_cuda_lowering_keeps_state_on_device(self, spec):
        ex = cuda_build(self.kernel, spec, "sm_90")
        host_ir = ex.mod.inspect_source("ll")
        assert "TVMBackendAllocWorkspace" not in host_ir  # a host-allocated buffer would be written by the CPU
        source = ex.mod.imports[0].inspect_source("cuda")
        assert f"canary_{self.kernel}_kernel" in source

    @pytest.mark.nvcc
    @pytest.mark.slow
    @pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
    @pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
    def test_nvcc_compiles_generated_source(self, arch, tmp_path):
        """Every third specialization's device code through nvcc's device compiler and assembler (``-cubin``:
        cicc and ptxas for ``arch``, as at module load; these sources' host side is nvcc's launch stubs), one
        nvcc run per arch."""
        specs = all_specs(self.kernel)
        files = []
        for spec in specs[:: max(1, len(specs) // 3)]:
            cu = tmp_path / f"{self.kernel}-{spec_id(spec)}.cu"
            cu.write_text(cuda_build(self.kernel, spec, arch).mod.imports[0].inspect_source("cuda"))
            files.append(cu.name)
        cmd = ["nvcc", "-cubin", f"-arch={arch}", "-std=c++17", *files]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-4000:]
        assert all((tmp_path / f).with_suffix(".cubin").stat().st_size > 0 for f in files)


class TestWrite(KernelCodegen):
    kernel = "write"


class TestVerify(KernelCodegen):
    kernel = "verify"


class TestPlan(KernelCodegen):
    kernel = "plan"

    def test_the_window_start_cannot_wrap(self, spec):
        """Every ``- window`` in the CUDA source subtracts from a prefix clamped to ``[0, 2^63)``: NVRTC
        turned the guarded ``p > window ? p - window : 0`` into ``max(p - window, 0)``, which wrapped for
        a prefix near -2^63."""
        source = cuda_build(self.kernel, spec, "sm_90").mod.imports[0].inspect_source("cuda")
        at = [m.start() for m in re.finditer(r" - window\)", source)]
        assert at and all(source[:i].endswith(", (int64_t)0)") and "(max(" in source[i - 60 : i] for i in at), (
            [source[i - 60 : i + 10] for i in at])


class TestScatter(KernelCodegen):
    kernel = "scatter"

    def test_the_row_length_cannot_wrap(self, spec):
        """A row's end is clamped to ``[-2^62, 2^62]`` before its start is subtracted: NVRTC turned the
        guarded ``end > start ? end - start : 0`` into ``max(end - start, 0)``, which wrapped for an end
        near -2^63 (a row longer than the pool's)."""
        source = cuda_build(self.kernel, spec, "sm_90").mod.imports[0].inspect_source("cuda")
        assert f"(int64_t)-{2**62}), (int64_t){2**62}) - start" in source


@pytest.mark.parametrize(
    ("units", "thin", "grid"),
    [(0, 1, (1, 32)), (1, 1, (1, 32)), (1024, 1, (32, 32)), (16896, 1, (528, 32)), (16897, 1, (265, 64)),
     (65536, 1, (512, 128)), (1 << 24, 1, (528, 128)), (1024, 0, (8, 128)), (1 << 24, 0, (528, 128))],
)
def test_work_grid(units, thin, grid):
    """``(blocks, width)`` of ``kernels.common.work_grid`` for 528 x 128: thin, the fewest warps per block
    that let 528 blocks hold every unit; else (and for large counts either way) full blocks."""
    import tvm
    import tvm.sym

    from tvm_canary.kernels.common import work_grid

    nb, width = work_grid(Geometry(gpu=True, blocks=528, threads=128, thin=thin), tvm.tirx.const(units, "int64"))
    analyzer = tvm.sym.Analyzer()
    assert (int(analyzer.simplify(nb)), int(analyzer.simplify(width))) == grid
    cpu = work_grid(Geometry(gpu=False, thin=thin), tvm.tirx.const(units, "int64"))
    assert [int(analyzer.simplify(x)) for x in cpu] == [1, 1]


def test_every_kernel_has_codegen_tests():
    assert sorted(cls.kernel for cls in KernelCodegen.__subclasses__()) == sorted(KERNELS)


def test_write_folds_split_where_the_specialization_allows():
    """Write ALL's short-chain default and verify ALL's below 16K entries (``pairs`` 2) fold two sources
    of a built-in word count split: a lane per source, the odd lane's chain shuffled to the even one
    (``kernels.common.split_fold``); a runtime word count, another source count or the CPU fold as ``pairs`` 1."""

    from tvm_canary.kernels.common import splits_sources

    geom = targets.default_geometry("write", "cuda", 2)
    assert geom.pairs == 2 and all(splits_sources(geom, 2, words) for words in (16, 32, 64, 128, 256))
    assert not any(splits_sources(geom, sources, words) for sources, words in ((2, 0), (1, 32), (3, 32), (4, 32)))
    assert not splits_sources(Geometry(gpu=False, pairs=2), 2, 32)

    def source(spec):
        return cuda_build("write", spec, "sm_90").mod.imports[0].inspect_source("cuda")

    shuffle = "__shfl_xor_sync(pair_mask"
    assert shuffle in source((2, False, False, 32)) and shuffle in source((2, False, False, 256))
    assert shuffle not in source((2, False, False, 0))
    # verify ALL checks entries split at every size: below 16K entries in thin 32-lane blocks, from 16K on in
    # 2112 blocks of 256 lanes
    assert shuffle in cuda_build("verify", (2, False, False, 32), "sm_90").mod.imports[0].inspect_source("cuda")
    large = targets.default_geometry("verify", "cuda", 2, 1 << 20)
    built = C.build("verify", (2, False, False, 32), "cuda-sm_90", large)
    assert large.pairs == 2 and shuffle in built.mod.imports[0].inspect_source("cuda")
