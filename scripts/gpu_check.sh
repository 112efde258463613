#!/usr/bin/env bash
# GPU check for a GPU machine: runs the GPU tests, their timings, compute-sanitizer (memcheck on every GPU
# test, racecheck on the shared-memory kernels) and `mambacpp bench` on random weights of real shapes, then prints a
# summary table last. For a GPU machine without gtest/json/pcre2 dev packages, build the binaries on another x86-64
# machine and copy them there with the two libraries:
#   cmake -S . -B build-gpu -G Ninja -DMAMBACPP_CUDA=ON -DMAMBACPP_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release
#   ninja -C build-gpu mambacpp_gpu_tests mambacpp_cli
#   mkdir -p build-gpu/devlibs && cp -L /lib/x86_64-linux-gnu/{libutf8proc.so.2,libpcre2-8.so.0} build-gpu/devlibs
#   then on the GPU machine, with build-gpu/tests/mambacpp_gpu_tests, build-gpu/mambacpp and build-gpu/devlibs:
#   scripts/gpu_check.sh build-gpu
# Logs go to $OUT (when set) or /tmp/gpu_check. Exit status: 0 when every step passed.
# Each step has its own time limit so that the whole script ends inside ten minutes.
set -u -o pipefail

BUILD=${1:-build-gpu}
TESTS=$BUILD/tests/mambacpp_gpu_tests
CLI=$BUILD/mambacpp
LOG=${OUT:-/tmp/gpu_check}
mkdir -p "$LOG"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

summary=()
failed=0
# step NAME LIMIT_SECONDS COMMAND...: runs it with a time limit, logs to $LOG/NAME.log, records rc and seconds.
# SKIP="name ..." leaves steps out (to fit a shorter time limit).
step() {
  local name=$1 limit=$2
  shift 2
  if [[ " ${SKIP:-} " == *" $name "* ]]; then summary+=("$(printf '%-12s skipped' "$name")"); return 0; fi
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
  local rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-12s rc=%-4s %4ss' "$name" "$rc" $((SECONDS - t0)))")
  [ "$rc" -eq 0 ] || failed=1
  return 0
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader || true
if [ ! -x "$TESTS" ]; then
  echo "missing $TESTS: build it on the development machine and carry it (see the header of this script)"
  exit 2
fi
echo "=== shared libraries"
# Runtime libraries a GPU machine may lack (utf8proc, pcre2, gomp) can be copied into $BUILD/devlibs; they are
# used only when the image's own cannot be found.
if ldd "$TESTS" "$CLI" 2>/dev/null | grep -q "not found" && [ -d "$BUILD/devlibs" ]; then
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PWD/$BUILD/devlibs
  echo "using copied libraries from $BUILD/devlibs"
fi
ldd "$TESTS" | grep -E "not found|cudart|cublas|gomp"
if ldd "$TESTS" | grep -q "not found"; then
  echo "unresolved shared libraries: cannot run the carried binaries here"
  exit 2
fi

step tests 120 "$TESTS" --gtest_brief=1
step perf 60 bash -c "'$TESTS' --gtest_filter='CudaPerf.*:*.DISABLED_Perf*' --gtest_also_run_disabled_tests | grep -E '\[perf\]|FAILED|PASSED'"
step memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 99 "$TESTS" --gtest_brief=1 \
  --gtest_filter='-CudaPerf.*:CudaOps.LinearMatches*'
step memcheck_lin 50 compute-sanitizer --tool memcheck --error-exitcode 99 "$TESTS" --gtest_brief=1 \
  --gtest_filter='CudaOps.LinearMatches*'
step racecheck 80 compute-sanitizer --tool racecheck --error-exitcode 99 "$TESTS" --gtest_brief=1 \
  --gtest_filter='CudaMamba2Ssd.OddSizesAndGroups:CudaMamba2Ssd.RealHeadLongSequenceCrossesChunks:CudaOps.RmsNorm*:CudaOps.GatedRmsNorm*'
# The workloads of docs/benchmarks.md (random weights of real shapes, bf16 weights, greedy), each a median of 3 runs,
# the CUDA-graph ones twice so that the spread is visible. One JSON line per run in $LOG/bench.jsonl.
bench() {  # bench NAME LIMIT ARGS...
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" bash -c "'$CLI' bench --device cuda --json -r 3 $* | tee -a '$LOG/bench.jsonl'"
}
if [ -x "$CLI" ]; then
  step generate 120 scripts/gpu_generate_check.sh "$CLI" "$LOG"
  bench b_m2_130m_a 60 --shape mamba2-130m -b 1 -p 100 -g 1000
  bench b_m2_130m_b 60 --shape mamba2-130m -b 1 -p 100 -g 1000
  bench b_m2_130m_eager 90 --shape mamba2-130m -b 1 -p 100 -g 1000 --no-cuda-graph
  bench b_m2_130m_plain 60 --shape mamba2-130m -b 1 -p 100 -g 1000 --no-fused-decode
  bench b_m1_130m_a 60 --shape mamba-130m -b 1 -p 100 -g 1000
  bench b_m1_130m_b 60 --shape mamba-130m -b 1 -p 100 -g 1000
  bench b_m1_130m_eager 90 --shape mamba-130m -b 1 -p 100 -g 1000 --no-cuda-graph
  bench b_m1_130m_plain 60 --shape mamba-130m -b 1 -p 100 -g 1000 --no-fused-decode
  bench b_2p7_f32s 120 --shape mamba2-2.7b -b 1 -p 100 -g 200
  bench b_2p7_bf16s 120 --shape mamba2-2.7b -b 1 -p 100 -g 200 --state-dtype bf16
  bench b_2p7_plain 120 --shape mamba2-2.7b -b 1 -p 100 -g 200 --no-fused-decode
  bench b_2p7_b8 120 --shape mamba2-2.7b -b 8 -p 100 -g 100
  bench b_2p7_b32 120 --shape mamba2-2.7b -b 32 -p 100 -g 100 --state-dtype bf16
  bench b_2p7_prefill 120 --shape mamba2-2.7b -b 1 -p 4096 -g 0
  step profile_m2 150 scripts/gpu_profile.sh "$CLI" mamba2-130m "$LOG"
  step profile_2p7 200 scripts/gpu_profile.sh "$CLI" mamba2-2.7b "$LOG"
else
  summary+=("bench        skipped: $CLI not carried")
fi

echo
echo "=== summary (logs in $LOG)"
grep -hE "^\[  (PASSED|FAILED|SKIPPED) " "$LOG/tests.log" | head -20
grep -h "ERROR SUMMARY" "$LOG"/memcheck*.log "$LOG/racecheck.log" 2>/dev/null
grep -h "RACECHECK SUMMARY" "$LOG/racecheck.log" 2>/dev/null
grep -h "\[model\]" "$LOG/tests.log" 2>/dev/null
grep -h "\[perf\]" "$LOG/perf.log" 2>/dev/null
if [ -s "$LOG/bench.jsonl" ]; then
  python3 - "$LOG/bench.jsonl" <<'PY'
import json, sys
print(f"{'model':12} {'B':>3} {'P':>5} {'G':>5} {'state':>5} {'graph':>5} {'fused':>5} {'prefill tok/s':>13} {'ms/step':>8} {'total ms':>9} {'floor ms':>8} {'% floor':>7}")
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    print(f"{j['model']:12} {j['batch']:>3} {j['prompt']:>5} {j['gen']:>5} {j['state_dtype']:>5} {str(j['cuda_graphs']):>5} {str(j.get('fused_decode', '-')):>5} {j['prefill_tokens_per_s']:>13.0f} "
          f"{j['decode_ms_per_step']:>8.4f} {j['total_ms']:>9.1f} {j['decode_floor_ms_per_step']:>8.4f} {j['decode_floor_percent']:>7.1f}")
PY
fi
printf '%s\n' "${summary[@]}"
exit "$failed"
