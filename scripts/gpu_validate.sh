#!/usr/bin/env bash
# One GPU session on the H200 (repo root):  bash scripts/gpu_validate.sh OUTDIR [tune] [tests] [aot] [bench] [bench-tuned]
# (TUNE_ARGS / BENCH_ARGS: extra arguments, e.g. "--kernels verify"; BENCH_DEFAULT: a default-geometry bench JSON)
#   tune:  MetaSchedule tuning of all kernels, resuming tune_logs/ (databases in OUTDIR/tune.tgz)
#   tests: the CUDA test suite (with the tuned database active when tune ran)
#   aot:   ahead-of-time build for sm_90 + sm_80 and a runtime-only run of the CUDA differential tests
#   bench: benchmarks/bench_kernels.py with the default (untuned) geometries
#   bench-tuned: the same with the tuned database (TVM_CANARY_TUNE_LOGS), compared with bench
set -uo pipefail
out="${1:-/tmp/gpu-validate}"; shift; mkdir -p "$out"
stages="${*:-tune tests aot bench}"
source scripts/gpu-env.sh > "$out/env.log" 2>&1; cat "$out/env.log"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$out/env.log"
python3 -c "import torch, tvm_ffi; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tvm_ffi', tvm_ffi.__version__)" | tee -a "$out/env.log"

if [[ " $stages " == *" tune "* ]]; then
  echo "== tune" | tee "$out/tune.log"
  mkdir -p /tmp/tune_logs && cp -r tune_logs/. /tmp/tune_logs/  # resume from the committed databases
  timeout 420 python3 -m tvm_canary tune --target cuda --trials 20 --out /tmp/tune_logs ${TUNE_ARGS:-} 2>&1 \
    | grep -v "INFO\|^ \|^--\|^Total\|^$" | tail -12 | tee -a "$out/tune.log"
  tar czf "$out/tune.tgz" -C /tmp tune_logs  # one file: a call returns few files
  export TVM_CANARY_TUNE_LOGS=/tmp/tune_logs
fi
if [[ " $stages " == *" tests "* ]]; then
  echo "== CUDA test suite (TVM_CANARY_TUNE_LOGS=${TVM_CANARY_TUNE_LOGS:-none})" | tee "$out/pytest.log"
  timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider -p no:benchmark -rs tests -k "cuda or graph" 2>&1 | tail -6 | tee -a "$out/pytest.log"
fi
if [[ " $stages " == *" aot "* ]]; then
  echo "== ahead-of-time build (sm_90, sm_80) and runtime-only run" | tee "$out/aot.log"
  python3 -m tvm_canary build --target cuda --arch sm_90 --arch sm_80 -o /tmp/aot 2>&1 | tail -1 | tee -a "$out/aot.log"
  TVM_USE_RUNTIME_LIB=1 TVM_CANARY_MODULES=/tmp/aot TVM_CANARY_CACHE=/tmp/empty-cache timeout 200 \
    python3 -m pytest -q -p no:cacheprovider tests/test_differential.py tests/test_cuda_graph.py -k "cuda or graph" 2>&1 | tail -3 | tee -a "$out/aot.log"
  ls /tmp/empty-cache 2>/dev/null | wc -l | sed 's/^/modules compiled at load in runtime-only mode: /' | tee -a "$out/aot.log"
fi
if [[ " $stages " == *" bench "* ]]; then
  echo "== benchmarks (default geometries)" | tee "$out/bench.log"
  TVM_CANARY_TUNED=0 timeout 280 python3 benchmarks/bench_kernels.py ${BENCH_ARGS:-} --json "$out/bench.json" 2>&1 | tee -a "$out/bench.log" | tail -52
fi
if [[ " $stages " == *" bench-tuned "* ]]; then
  echo "== benchmarks (tuned geometries, TVM_CANARY_TUNE_LOGS=${TVM_CANARY_TUNE_LOGS:-repo tune_logs})" | tee "$out/bench-tuned.log"
  timeout 280 python3 benchmarks/bench_kernels.py ${BENCH_ARGS:-} --json "$out/bench-tuned.json" 2>&1 | tee -a "$out/bench-tuned.log" | tail -52
  base="${BENCH_DEFAULT:-$out/bench.json}"  # a default-geometry run of this or an earlier call
  [[ -f "$base" ]] && python3 benchmarks/compare.py "$base" "$out/bench-tuned.json" | tee "$out/compare.log"
fi
