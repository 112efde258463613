#!/usr/bin/env bash
# Issue 48's MoE GPU speed work, one device run (from the repository root, after the build; binaries in build-gpu/):
#   1. the GpuMoe tests (CUDA MoE ops against the CPU, batch invariance at the released widths, graphs);
#   2. GpuMoe.DISABLED_ExpertTimesAtReleasedShapes: moe_experts alone at Granite-4.0-H Tiny's and Nemotron 3 Nano's
#      expert shapes for 1, 32 and 128 tokens, the streaming GEMV against the kernel before it (MAMBACPP_MOE_GEMV=old)
#      in the same process, with the bandwidth of the chosen experts' bytes (the A/B: seconds, no model load);
#   3. bench rows of granite-4.0-h-tiny (b1, b32, b128 decode; 4k prefill) on the new kernel, beside this morning's
#      numbers (H100, the kernel before it). Each granite-tiny load takes ~12 s; nemotron-3-nano-30b-a3b ~50 s, so
#      its rows run only with NANO=1 (b1, b32; + b128 with NANO128=1, its stderr kept: the run that printed no JSON).
#   AB=1 repeats the granite decode rows with MAMBACPP_MOE_GEMV=old (the same binary, the old kernel).
# <= 120 s with the defaults. Details under $OUT/moe48/; the summary is printed last.
# Phase 1's A/B (commit 1c61abc). Since phase 2 MAMBACPP_MOE_GEMV is gone (AB=1 repeats the same rows) and the timing
# test times the product path alone; the phase-2 rows are dev/device_moe48b.sh.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp}/moe48
mkdir -p "$LOG"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -d "$B/devlibs" ] && export LD_LIBRARY_PATH=$B/devlibs:$LD_LIBRARY_PATH
t0=$SECONDS
summary=()
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$LOG/gpu.txt"

timeout 60 "$B/tests/mambacpp_gpu_tests" --gtest_filter='GpuMoe.*' > "$LOG/tests.log" 2>&1
rc=$?
summary+=("tests GpuMoe.*: rc=$rc, $(grep -cE '^\[       OK' "$LOG/tests.log") ok, $(grep -cE '^\[  FAILED  \] GpuMoe' "$LOG/tests.log") failed ($((SECONDS - t0)) s)")
grep -E '^\[  FAILED|Failure|error' "$LOG/tests.log" | head -20

t1=$SECONDS
timeout 45 "$B/tests/mambacpp_gpu_tests" --gtest_also_run_disabled_tests \
  --gtest_filter='GpuMoe.DISABLED_ExpertTimesAtReleasedShapes' > "$LOG/times.log" 2>&1
summary+=("expert times: rc=$? ($((SECONDS - t1)) s)")
while read -r line; do summary+=("  $line"); done < <(grep '^\[moe time\]' "$LOG/times.log")

# row NAME ENV SHAPE ARGS...: one bench run (its JSON in $LOG/NAME.json, stderr in $LOG/NAME.err).
row() {
  local name=$1 env=$2 shape=$3 limit=$4
  shift 4
  local t=$SECONDS
  env $env timeout "$limit" "$B/mambacpp" bench --device cuda --json --shape "$shape" "$@" > "$LOG/$name.json" 2> "$LOG/$name.err"
  local rc=$?
  local r
  r=$(python3 - "$LOG/$name.json" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    print("no JSON"); sys.exit()
if j["gen"] > 0:
    print(f'{j["decode_ms_per_step"]:.3f} ms/step, floor {j["decode_floor_ms_per_step"]:.3f} '
          f'({j["decode_floor_percent"]:.0f}%), prefill {j["prefill_tokens_per_s"]:.0f} tok/s')
else:
    print(f'prefill {j["prefill_tokens_per_s"]:.0f} tok/s ({j["prefill_ms"]:.1f} ms)')
EOF
)
  summary+=("$(printf '%-22s rc=%-3s %3ss  %s' "$name" "$rc" $((SECONDS - t)) "$r")")
  [ "$rc" -eq 0 ] || tail -3 "$LOG/$name.err"
}

G=granite-4.0-h-tiny N=nemotron-3-nano-30b-a3b
row tiny_b1 "" $G 40 -b 1 -p 16 -g 64 -r 3
row tiny_b32 "" $G 40 -b 32 -p 16 -g 64 -r 3
row tiny_b128 "" $G 40 -b 128 -p 16 -g 64 -r 3
row tiny_prefill4k "" $G 40 -b 1 -p 4096 -g 0 -r 3
if [ "${AB:-0}" = 1 ]; then
  for b in 1 32 128; do row tiny_b${b}_old MAMBACPP_MOE_GEMV=old $G 40 -b $b -p 16 -g 64 -r 3; done
fi
if [ "${NANO:-0}" = 1 ]; then
  row nano_b1 "" $N 100 -b 1 -p 16 -g 64 -r 3
  row nano_b32 "" $N 100 -b 32 -p 16 -g 64 -r 3
fi
[ "${NANO128:-0}" = 1 ] && row nano_b128 "" $N 150 -b 128 -p 16 -g 16 -r 1

echo "== summary ($((SECONDS - t0)) s; this morning on H100 with the old kernel: tiny b1 4.228 ms/step (floor 1.066),"
echo "   b32 15.893 (5.961), b128 41.972 (10.136), prefill 4k 17,056 tok/s; nano b1 5.795 (2.282), b32 27.752 (18.545))"
printf '%s\n' "${summary[@]}"
