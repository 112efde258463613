#!/usr/bin/env bash
# Mamba-1 short pieces as ONE decode forward (branch m1pieces54, issues 53/54), after the lead's build, from the repo
# root, <= 90 s:
#   1. the GPU tests GpuStepPieces* (a piece of k <= 16 tokens == k decode steps, logits memcmp and state bytes, on
#      mamba2-130m and mamba-130m, both precisions, f32 and bf16 state; Mamba-1's many pieces against rounds of decode
#      steps; the route predicate) and GpuSpeculative*;
#   2. the A/B: random-weight mamba-2.8b, fast precision, batch 1, a 16-token prompt (a short piece) then 64 decode
#      steps: ONE = this branch (the prompt as one decode forward), SUCC = MAMBACPP_STEP_PIECES_SUCCESSIVE=1 (the
#      route of main: 16 successive decode forwards). prefill_ms is the prompt's; decode ms/step must not move
#      (the decode steps take the same kernels either way; docs/benchmarks.md's H100 row: 3.60 ms/step);
#   3. if time is left: batch 4 (four 16-token pieces, 64 rows in one forward) ONE vs SUCC, and mamba-130m b1.
# Details under $OUT/m1pieces54/; a summary on stdout.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp}/m1pieces54; mkdir -p "$LOG"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
t0=$SECONDS
left() { echo $(( ${BUDGET:-88} - (SECONDS - t0) )); }
cap() { local l; l=$(left); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }  # cap N: seconds for a stage, at most N
timeout 5 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

# 1. tests
timeout "$(cap 40)" "$B/tests/mambacpp_gpu_tests" \
  --gtest_filter='GpuStepPieces*:*GpuStepPieces*:GpuSpeculative*:*GpuSpeculative*' \
  --gtest_output=xml:"$LOG/tests.xml" > "$LOG/tests.txt" 2>&1
echo "tests rc=$? ($((SECONDS - t0)) s)"
grep -E '^\[==========\] [0-9]+ tests? from [0-9]+ test suites? ran' -A100 "$LOG/tests.txt" | grep -v '^ *$' | head -40 \
  || tail -5 "$LOG/tests.txt"  # a timeout: the last lines say where
grep -A4 ': Failure' "$LOG/tests.txt" | head -30

# 2./3. bench rows
row() {  # row NAME MODE(one|succ) ARGS...
  local name=$1 mode=$2; shift 2
  if [ "$(left)" -lt 9 ]; then echo "skipped $name (time)"; return; fi
  local out env=()
  [ "$mode" = succ ] && env=(env MAMBACPP_STEP_PIECES_SUCCESSIVE=1)
  out=$(timeout "$(cap 14)" "${env[@]}" "$B/mambacpp" bench --device cuda --json "$@" 2> "$LOG/bench_$name.err" | tail -1)
  echo "$out" > "$LOG/bench_$name.json"
  python3 - "$name" "$out" <<'PY'
import json, sys
try:
    r = json.loads(sys.argv[2])
except Exception:
    print(f"{sys.argv[1]:16} failed"); sys.exit()
nan = float("nan")
print(f"{sys.argv[1]:16} prefill {r.get('prefill_ms', nan):8.2f} ms (runs {r.get('prefill_ms_runs')})  "
      f"decode {r.get('decode_ms_per_step', nan):7.3f} ms/step")
PY
}
echo "A/B on $(timeout 5 nvidia-smi --query-gpu=name --format=csv,noheader | head -1): 16-token prompt + 64 steps"
row m28_b1_one one --shape mamba-2.8b -b 1 -p 16 -g 64 -r 3
row m28_b1_succ succ --shape mamba-2.8b -b 1 -p 16 -g 64 -r 3
row m28_b4_one one --shape mamba-2.8b -b 4 -p 16 -g 16 -r 3
row m28_b4_succ succ --shape mamba-2.8b -b 4 -p 16 -g 16 -r 3
row m130_b1_one one --shape mamba-130m -b 1 -p 16 -g 64 -r 3
row m130_b1_succ succ --shape mamba-130m -b 1 -p 16 -g 64 -r 3
echo "total $((SECONDS - t0)) s"
