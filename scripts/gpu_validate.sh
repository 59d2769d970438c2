#!/usr/bin/env bash
# One GPU validation session (repo root):
#   bash scripts/gpu_validate.sh OUTDIR [tune] [tests] [aot] [sanitize] [conformance] [bench] [embedding]
# (TUNE_ARGS / BENCH_ARGS: extra arguments, e.g. "--kernels verify", or TUNE_ARGS="--stale-only" after a kernel
#  change; BENCH_SECONDS: bench's limit, default 900)
#   tune:  MetaSchedule tuning of all kernels at 20 trials in at most 420 s (no workload starts that would end past
#          380 s of the run: exit 3, the rest listed), on top of tune_logs/ (databases in
#          OUTDIR/tune.tgz; the committed databases are compacted, so every bucket is measured again: a
#          whole tune from empty at 32 trials took 552.1 s on an H200 in the fifty-sixth session, docs/PERFORMANCE.md "Tuning")
#   tests: the CUDA test suite (with the tuned database active when tune ran)
#   aot:   ahead-of-time build for sm_90 + sm_80 and a runtime-only run of the CUDA differential tests
#   sanitize: a fuzz campaign under compute-sanitizer memcheck, racecheck and synccheck (scripts/sanitize.sh; SANITIZE_SECONDS, SANITIZE_TOOLS)
#   conformance: tvm-canary conformance over the CPU and every visible GPU in one process, then one process
#          per GPU (torch.distributed.run, NCCL) with a fuzz campaign per GPU (FUZZ_SECONDS, default 30)
#   bench: benchmarks/bench_kernels.py --ab, the run of docs/PERFORMANCE.md: every kernel's default geometry
#          and its tuned one (the database tune wrote, else the committed one) timed interleaved, beside the
#          floors and baselines; it continues OUTDIR/bench.json when that exists (--resume: a run made a
#          part at a time, BENCH_ARGS="--kernels write plan scatter" first; verify's rows are written as each
#          is timed, so a call cut short after its first row goes on with BENCH_ARGS less any --redo); then
#          its tables and target summary (plot.py --no-png, report.py) in OUTDIR/tables.md and OUTDIR/targets.md
#   embedding: benchmarks/bench_embedding.py (decode-step cost, host overhead) and `demo --cuda-graph`
# Every stage runs even when an earlier one failed; the exit status is 0 only if all of them passed, and
# the last line names the failed stages. Exit status 2: unknown stage name.
set -uo pipefail
out="${1:-/tmp/gpu-validate}"; shift; mkdir -p "$out"
stages="${*:-tune tests aot sanitize bench}"
for s in $stages; do
  case "$s" in tune|tests|aot|sanitize|conformance|bench|embedding) ;;
    *) echo "gpu_validate: unknown stage '$s' (tune tests aot sanitize conformance bench embedding)" >&2; exit 2;;
  esac
done
failed=()
# check NAME STATUS: record stage NAME as failed unless STATUS is 0.
check() { if [[ "$2" != 0 ]]; then failed+=("$1"); echo "== $1: FAILED (exit status $2)"; fi; }
wants() { [[ " $stages " == *" $1 "* ]]; }
# run_pytest STAGE LOG ARGS...: pytest ARGS (within $TIMEOUT s, default 300), its whole output kept beside
# LOG as STAGE-pytest.log; LOG gets the names of the failed and erroring tests and the summary line
# (-rfEs: the skip reasons stay in the whole output), so that a failure names its tests.
run_pytest() {
  local stage="$1" log="$2"; shift 2
  local full; full="$(dirname "$log")/$stage-pytest.log"
  timeout "${TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rfEs "$@" > "$full" 2>&1
  local rc=$?
  { grep -aE "^(FAILED|ERROR) " "$full"; tail -1 "$full"; } | tee -a "$log"
  check "$stage" "$rc"
}

source scripts/gpu-env.sh > "$out/env.log" 2>&1; env_rc=$?; cat "$out/env.log"
if [[ $env_rc != 0 ]]; then
  echo "gpu_validate: FAILED: environment (scripts/gpu-env.sh, exit status $env_rc); no stage ran" >&2
  exit 1
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$out/env.log"
python3 -c "import torch, tvm_ffi; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tvm_ffi', tvm_ffi.__version__)" | tee -a "$out/env.log"

if wants tune; then
  echo "== tune" | tee "$out/tune.log"
  mkdir -p /tmp/tune_logs && cp -r tune_logs/. /tmp/tune_logs/  # resume from the committed databases
  # --time-limit: no workload starts that would end past it (exit 3), so the table and database stay whole
  timeout 420 python3 -m tvm_canary tune --target cuda --trials 20 --time-limit 380 --out /tmp/tune_logs ${TUNE_ARGS:-} > "$out/tune-full.log" 2>&1
  check tune $?
  # the tune's table (a header, one row per workload: 24 for the whole H200 database) and its summary lines
  grep -v "INFO\|^ \|^--\|^Total\|^$" "$out/tune-full.log" | tail -32 | tee -a "$out/tune.log"
  tar czf "$out/tune.tgz" -C /tmp tune_logs  # one file: a call returns few files
  rm -f "$out/tune-full.log"
  export TVM_CANARY_TUNE_LOGS=/tmp/tune_logs
fi
if wants tests; then
  echo "== CUDA test suite (TVM_CANARY_TUNE_LOGS=${TVM_CANARY_TUNE_LOGS:-none})" | tee "$out/pytest.log"
  TIMEOUT=300 run_pytest tests "$out/pytest.log" -n 8 -p no:benchmark tests -m "gpu or nvcc"
fi
if wants aot; then
  echo "== ahead-of-time build (sm_90, sm_80) and runtime-only run" | tee "$out/aot.log"
  python3 -m tvm_canary build --target cuda --arch sm_90 --arch sm_80 -o /tmp/aot 2>&1 | tail -1 | tee -a "$out/aot.log"
  check aot-build "${PIPESTATUS[0]}"
  TVM_USE_RUNTIME_LIB=1 TVM_CANARY_MODULES=/tmp/aot TVM_CANARY_CACHE=/tmp/empty-cache TIMEOUT=200 \
    run_pytest aot-runtime-only "$out/aot.log" tests/test_differential.py tests/test_fold_words.py tests/test_cuda_graph.py -m gpu
  compiled=$(ls /tmp/empty-cache 2>/dev/null | wc -l)
  echo "modules compiled at load in runtime-only mode: $compiled" | tee -a "$out/aot.log"
  check aot-compiled-at-load "$compiled"
fi
if wants sanitize; then
  echo "== sanitizer (compute-sanitizer ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; ${SANITIZE_SECONDS:-60} s fuzz each)"
  bash scripts/sanitize.sh "$out"
  check sanitize $?
fi
if wants conformance; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  echo "== conformance (cpu + ${gpus} GPUs in one process; then one process per GPU) and fuzz" | tee "$out/conformance.log"
  timeout 300 python3 -m tvm_canary conformance --json "$out/conformance.json" 2>&1 | tail -25 | tee -a "$out/conformance.log"
  check conformance "${PIPESTATUS[0]}"
  timeout 300 python3 -m torch.distributed.run --nproc-per-node "$gpus" -m tvm_canary conformance --cases 10 \
    --json "$out/conformance-ranks.json" 2>&1 | tail -25 | tee -a "$out/conformance.log"
  check conformance-ranks "${PIPESTATUS[0]}"
  timeout $(( ${FUZZ_SECONDS:-30} + 300 )) python3 -m torch.distributed.run --nproc-per-node "$gpus" -m tvm_canary fuzz \
    --seconds "${FUZZ_SECONDS:-30}" --out "$out/fuzz-failures.json" 2>&1 | grep -E "^fuzz" | tee -a "$out/conformance.log"
  check fuzz "${PIPESTATUS[0]}"
fi
if wants bench; then
  resume=""; [[ -f "$out/bench.json" ]] && resume="--resume"
  echo "== benchmarks (default and tuned geometries interleaved, TVM_CANARY_TUNE_LOGS=${TVM_CANARY_TUNE_LOGS:-none}) ${resume}" | tee "$out/bench.log"
  timeout "${BENCH_SECONDS:-900}" python3 benchmarks/bench_kernels.py --ab ${BENCH_ARGS:-} $resume --json "$out/bench.json" 2>&1 | tee -a "$out/bench.log" | tail -52
  check bench "${PIPESTATUS[0]}"
  if [[ -f "$out/bench.json" ]]; then  # PNGs: plot.py where matplotlib is (docs/PERFORMANCE.md)
    python3 benchmarks/plot.py "$out/bench.json" --no-png --markdown "$out/tables.md"
    check bench-tables $?
    python3 benchmarks/report.py "$out/bench.json" --markdown "$out/targets.md"
    check bench-report $?
  fi
fi
if wants embedding; then
  echo "== embedding: decode-step cost (eager, CUDA graph) and host overhead; demo --cuda-graph" | tee "$out/embedding.log"
  timeout 300 python3 benchmarks/bench_embedding.py --json "$out/embedding.json" 2>&1 | tail -12 | tee -a "$out/embedding.log"
  check embedding "${PIPESTATUS[0]}"
  timeout 200 python3 -m tvm_canary demo --cuda-graph 2>&1 | tail -4 | tee -a "$out/embedding.log"
  check demo-cuda-graph "${PIPESTATUS[0]}"
fi

if (( ${#failed[@]} )); then
  echo "gpu_validate: FAILED stages: ${failed[*]} (logs in $out)" >&2
  exit 1
fi
echo "gpu_validate: all stages passed: $stages (logs in $out)"
