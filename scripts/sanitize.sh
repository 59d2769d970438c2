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
# The warm-up compiles every kernel the campaign reaches (from an empty kernel cache on an H100 host one process took
# 485 s, eight 121 s), so it runs as SANITIZE_WARM_JOBS processes (default half the CPUs, at most 8), each a
# slice of the seeds of whole 16-case rounds (tvm_canary/fuzz.py's order), the cache's build lock keeping
# two from building one module. A failed warm-up fails the stage.
set -uo pipefail
out="${1:?usage: scripts/sanitize.sh OUTDIR}"; mkdir -p "$out"
seconds="${SANITIZE_SECONDS:-60}"
seeds="${SANITIZE_SEED_BASE:-7000000}"
failed=0
cpus=$(nproc 2>/dev/null || echo 2)
jobs="${SANITIZE_WARM_JOBS:-$(( cpus / 2 < 1 ? 1 : (cpus / 2 > 8 ? 8 : cpus / 2) ))}"
slice=$(( (${SANITIZE_WARM_CASES:-1000} + 16 * jobs - 1) / (16 * jobs) * 16 ))
pids=()
for ((j = 0; j < jobs; j++)); do
  python3 -m tvm_canary fuzz --device cuda:0 --cases "$slice" --seed-base $((seeds + j * slice)) \
    --out "$out/sanitize-warm-$j.json" > "$out/sanitize-warm-$j.log" 2>&1 &
  pids+=($!)
done
warm_cases=0; warm_failures=0; warm_failed=0
for ((j = 0; j < jobs; j++)); do
  wait "${pids[$j]}" || warm_failed=1
  # the campaign's counts from its summary, "fuzz: N case(s) on 1 process, F failure(s)"
  counts=$(sed -nE 's/^fuzz: ([0-9]+) cases? on .*, ([0-9]+) failures?$/\1 \2/p' "$out/sanitize-warm-$j.log" | tail -1)
  read -r n f <<< "${counts:-0 0}"
  [[ -n "$counts" ]] || warm_failed=1
  warm_cases=$((warm_cases + n)); warm_failures=$((warm_failures + f))
done
echo "warm-up (no sanitizer): fuzz: $warm_cases cases on $jobs processes, $warm_failures failures" | tee "$out/sanitize.log"
if [[ $warm_failed != 0 ]]; then
  failed=1
  echo "warm-up: a process failed (logs: $out/sanitize-warm-*.log)" | tee -a "$out/sanitize.log"
fi
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
