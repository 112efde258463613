#!/usr/bin/env bash
# One GPU run for a prefill setting (an environment variable the CUDA backend reads, e.g.
# MAMBACPP_SSD_OUTPUT=tile): build, the GPU tests without and with it, the prefill rows A/B on the same binary in
# the same run (default, setting, default, setting: clocks drift under sustained load,
# docs/perf-log/benchmarks-2026-12.md q16), and the layer profile of each at 8,192 tokens (PROFILE_SHAPE, default mamba2-2.7b). Logs under $OUT.
# Usage: gpu_prefill_ab.sh SRC_DIR [BUILD_DIR]   env: AB (the setting, NAME=VALUE; required), ROWS (gpu_prefill_bench.sh
# rows, default main), ROUNDS (2), NOBUILD=1 skips the build, NOTESTS=1 the tests, NOPROFILE=1 the profiles. With
# everything on it takes ~8 minutes: split it over two runs (NOPROFILE=1, then NOBUILD=1 NOTESTS=1 ROUNDS=0) where a
# run's time limit is near.
set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # dev/; the product's drivers are in ../scripts
SRC=${1:-.} B=${2:-build-gpu}
: "${AB:?AB=NAME=VALUE: the setting to measure}"
LOG=${OUT:-/tmp/gpu_prefill_ab}; mkdir -p "$LOG"
t0=$SECONDS
if [ "${NOBUILD:-0}" != 1 ]; then
  bash .deps/build_from_debs.sh build .deps/debs "$SRC" "$B" -DMAMBACPP_CUDA=ON -DMAMBACPP_NATIVE=OFF \
    -DMAMBACPP_PYTHON=OFF -- mambacpp_gpu_tests mambacpp_cli > "$LOG/build.log" 2>&1 || { tail -40 "$LOG/build.log"; exit 1; }
fi
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
echo "build $((SECONDS - t0)) s"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ "${NOTESTS:-0}" != 1 ]; then
  timeout 240 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 > "$LOG/tests_default.log" 2>&1
  echo "tests (default) rc=$?"
  env "$AB" timeout 240 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 > "$LOG/tests_ab.log" 2>&1
  echo "tests ($AB) rc=$?"
  grep -hE "^\[  FAILED|Failure|tests? (passed|failed)|PASSED" "$LOG"/tests_*.log | head -30
  echo "tests $((SECONDS - t0)) s"
fi
for ((round = 1; round <= ${ROUNDS:-2}; ++round)); do
  echo "== round $round: default"; bash "$here/../scripts/gpu_prefill_bench.sh" "$B/mambacpp" "${ROWS:-main}"
  echo "== round $round: $AB"; env "$AB" bash "$here/../scripts/gpu_prefill_bench.sh" "$B/mambacpp" "${ROWS:-main}"
done
echo "bench $((SECONDS - t0)) s"
if [ "${NOPROFILE:-0}" != 1 ]; then
  mkdir -p "$LOG/default" "$LOG/ab"
  shape=${PROFILE_SHAPE:-mamba2-2.7b}
  TIMEOUT=100 bash "$here/gpu_prefill_profile.sh" "$B/mambacpp" "$shape" 8192 "$LOG/default" | tail -16
  env "$AB" TIMEOUT=100 bash "$here/gpu_prefill_profile.sh" "$B/mambacpp" "$shape" 8192 "$LOG/ab" | tail -16
fi
echo "total $((SECONDS - t0)) s"
