"""Ahead-of-time artifacts load and run in a runtime-only TVM (no compiler library) through the API."""

from __future__ import annotations

import os
import subprocess
import sys

from tvm_canary.cli import main

CHILD = """
import torch, tvm
assert tvm.base._RUNTIME_ONLY
import tvm_canary as tc
flat = torch.arange(10); off = torch.tensor([0, 3, 10]); rpi = torch.tensor([1, 2])
pool = torch.full((4, 8), -5, dtype=torch.int32)
tc.launch_scatter_req_token_ids_kernel(flat_in=flat, offsets=off, req_pool_indices=rpi, pool_out=pool)
want = torch.full((4, 8), -5, dtype=torch.int32); want[1, :3] = torch.arange(3); want[2, :7] = torch.arange(3, 10)
assert torch.equal(pool, want), pool
try:
    tc.launch_canary_plan_kernels  # plan was not built: its first launch must say so clearly
    from tvm_canary.runtime import get_kernel
    get_kernel("plan", (False, False), torch.device("cpu"))
    raise SystemExit("plan loaded without an artifact")
except RuntimeError as e:
    assert "no prebuilt module plan-" in str(e), e
print("ok")
"""


def test_runtime_only_host_runs_prebuilt_modules(tmp_path):
    assert main(["build", "--target", "llvm", "--kernels", "scatter", "-o", str(tmp_path / "modules")]) == 0
    assert len(list((tmp_path / "modules").glob("scatter-*.so"))) == 1 and (tmp_path / "modules" / "manifest.json").exists()
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", TVM_CANARY_MODULES=str(tmp_path / "modules"), TVM_CANARY_CACHE=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr
