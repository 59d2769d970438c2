#!/usr/bin/env bash
# One GPU session: the CUDA test suite, ahead-of-time artifacts loaded by a runtime-only TVM, and the
# kernel benchmarks. Usage (on the GPU host, repo root):  bash scripts/gpu_validate.sh OUTDIR
set -uo pipefail
out="${1:-/tmp/gpu-validate}"; mkdir -p "$out"
source scripts/gpu-env.sh > "$out/env.log" 2>&1; cat "$out/env.log"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$out/env.log"
python3 -c "import torch, tvm_ffi; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tvm_ffi', tvm_ffi.__version__)" | tee -a "$out/env.log"

echo "== CUDA test suite" | tee "$out/pytest.log"
timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider -rs tests -k "cuda or graph" 2>&1 | tail -15 | tee -a "$out/pytest.log"

echo "== ahead-of-time build (sm_90, sm_80) and runtime-only run" | tee "$out/aot.log"
python3 - <<'PY' 2>&1 | tail -5 | tee -a "$out/aot.log"
import time, torch
from tvm_canary.runtime import compile as C
from tvm_canary.runtime.aot import build_all
C.ensure_cuda_runtime()
t = time.time()
files = build_all(["cuda-sm_90", "cuda-sm_80"], "/tmp/aot")
print(f"built {len(files)} modules in {time.time() - t:.1f} s, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB")
PY
TVM_USE_RUNTIME_LIB=1 TVM_CANARY_MODULES=/tmp/aot TVM_CANARY_CACHE=/tmp/empty-cache timeout 200 \
  python3 -m pytest -q -p no:cacheprovider tests/test_differential.py tests/test_cuda_graph.py -k "cuda or graph" 2>&1 | tail -3 | tee -a "$out/aot.log"
TVM_USE_RUNTIME_LIB=1 python3 -c "import tvm; print('runtime-only:', tvm.base._RUNTIME_ONLY)" | tee -a "$out/aot.log"
ls /tmp/empty-cache 2>/dev/null | wc -l | sed 's/^/modules compiled at load in runtime-only mode: /' | tee -a "$out/aot.log"

echo "== benchmarks" | tee "$out/bench.log"
timeout 280 python3 benchmarks/bench_kernels.py --json "$out/bench.json" 2>&1 | tee -a "$out/bench.log" | tail -52
