#!/usr/bin/env bash
# Sanitizer stage of scripts/gpu_validate.sh (also runs alone, after `source scripts/gpu-env.sh`):
#   bash scripts/sanitize.sh OUTDIR
# A fuzz campaign on cuda:0 (tvm-canary fuzz: differential cases and guard-banded garbage plans) under
# compute-sanitizer --tool memcheck with the torch caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1,
# so every tensor is its own allocation and a stray access past one is reported), then under --tool
# racecheck (shared-memory hazards), then under --tool synccheck (barriers and warp-synchronous
# primitives, __syncthreads_or and the shuffles and votes, called where the threads they name cannot
# all reach them). The same seeds first run once without the sanitizer so that every kernel is
# compiled outside it. A tool passes when its summary line says zero (memcheck and synccheck: "ERROR
# SUMMARY: 0 errors"; racecheck: "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)") and
# the campaign passed; the summary lines go to OUTDIR/sanitize.log, the full logs to
# OUTDIR/sanitize-TOOL.log. SANITIZE_TOOLS (default "memcheck racecheck synccheck"): the tools, in order;
# SANITIZE_SECONDS (default 60): the campaign length under each tool; SANITIZE_WARM_CASES (default 1000): the
# cases of the warm-up run (more than a sanitized run reaches); SANITIZE_SEED_BASE (default 7000000).
# The warm-up compiles every kernel the campaign reaches: from an empty kernel cache (a fresh GPU host)
# that takes long (an H200 host reached 178 cases in 299 s), so gpu_validate.sh runs the CUDA suite first.
set -uo pipefail
out="${1:?usage: scripts/sanitize.sh OUTDIR}"; mkdir -p "$out"
seconds="${SANITIZE_SECONDS:-60}"
seeds="${SANITIZE_SEED_BASE:-7000000}"
failed=0
python3 -m tvm_canary fuzz --device cuda:0 --cases "${SANITIZE_WARM_CASES:-1000}" --seed-base "$seeds" --out "$out/sanitize-warm.json" \
  > "$out/sanitize-warm.log" 2>&1
echo "warm-up (no sanitizer): $(tail -1 "$out/sanitize-warm.log")" | tee "$out/sanitize.log"
for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
  log="$out/sanitize-$tool.log"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout $((seconds + 600)) compute-sanitizer --tool "$tool" --error-exitcode 86 \
    python3 -m tvm_canary fuzz --device cuda:0 --seconds "$seconds" --seed-base "$seeds" \
    --out "$out/sanitize-$tool.json" > "$log" 2>&1
  status=$?
  summary=$(grep -E "(ERROR|RACECHECK) SUMMARY: [0-9]+ (error|hazard)" "$log" | tail -1)
  campaign=$(grep -E "^fuzz: " "$log" | tail -1)
  echo "$tool: ${summary:-no summary line} | ${campaign:-no campaign summary} | exit status $status" | tee -a "$out/sanitize.log"
  if [[ $status != 0 || ( "$summary" != *"ERROR SUMMARY: 0 errors"* && "$summary" != *"RACECHECK SUMMARY: 0 hazards"* ) ]]; then
    failed=1
    grep -m 20 -E "^========= (Invalid|Race|Error|Program hit|Barrier)" "$log" | tee -a "$out/sanitize.log"
  fi
done
exit $failed
