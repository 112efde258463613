#!/usr/bin/env bash
# Issue 51, the grammar mask on the device: the GPU tests of the mask (CUDA select_top_k with allowed-token masks
# against the CPU backend bitwise; the engine's constrained tokens with the mask on the device equal to the host
# path's; the existing GpuGrammar and GpuSelectTopK tests beside them), then the A/B of one constrained generation
# (json_object, greedy, the shipped model) with the mask on the device against whole rows masked on the host, batch 1
# and 8, both paths in the same run (GpuGrammarMask.PerfDeviceAgainstHostMask's [perf] lines). Run from the repo root
# after the GPU build (build-gpu/tests/mambacpp_gpu_tests); ends within 60 s; a summary on stdout, the test logs
# under $OUT/chat51c/.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp/device_chat51c}/chat51c; mkdir -p "$LOG"
t0=$SECONDS
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

run() {  # run NAME SECONDS FILTER
  local name=$1 secs=$2 filter=$3 rc
  timeout "$secs" "$B/tests/mambacpp_gpu_tests" --gtest_filter="$filter" > "$LOG/$name.log" 2>&1
  rc=$?
  echo "== $name rc=$rc ($((SECONDS - t0)) s)"
  grep -E '^\[ +(OK|FAILED) +\] .*\(|^\[  PASSED' "$LOG/$name.log" | head -12
  grep -E -A3 'Failure$' "$LOG/$name.log" | head -24
  grep -F '[perf]' "$LOG/$name.log"
}
run tests 35 'GpuGrammarMask.SelectTopKMatchesTheCpuBitwise:GpuGrammarMask.SameTokensAsTheHostPath:GpuGrammar.*:GpuSelectTopK.MatchesTheCpuBitwise:GpuSelectTopK.BadAndEmptyRows'
run perf 20 'GpuGrammarMask.PerfDeviceAgainstHostMask'
echo "all $((SECONDS - t0)) s"
