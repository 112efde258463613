#!/usr/bin/env bash
# One GPU run for issue 13's work: the GPU tests, then the decode table in fast and exact precision, prefill in
# both, and an ncu look at the kernels of a fast mamba2-2.7b batch-32 step. Logs under $OUT (or /tmp/gpu_decode).
# Usage: gpu_decode_check.sh BUILD_DIR
set -u -o pipefail
B=${1:-build-gpu}
LOG=${OUT:-/tmp/gpu_decode}; mkdir -p "$LOG"
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 240 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 > "$LOG/tests.log" 2>&1
echo "tests rc=$? $((SECONDS - t0)) s"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|\[accuracy\]|\[invariance\]|\[fast\]" "$LOG/tests.log" | head -80
cli=$B/mambacpp
TWICE=1 ROWS="m2_130m m2_2p7_b1 m2_2p7_b32 m2_2p7_b128" bash scripts/gpu_decode_bench.sh "$cli" "$LOG" > "/tmp/bench_fast2.log" 2>&1
ROWS="m2_2p7_b8 m2_2p7_b64 m2_2p7_b256 m1_2p8_b1 m1_2p8_b32 m1_2p8_b128" bash scripts/gpu_decode_bench.sh "$cli" "$LOG" > "/tmp/bench_fast1.log" 2>&1
echo "fast bench $((SECONDS - t0)) s"
EXTRA="--precision exact" ROWS="m2_130m m2_2p7_b1 m2_2p7_b32 m2_2p7_b128 m1_2p8_b1 m1_2p8_b32" \
  bash scripts/gpu_decode_bench.sh "$cli" "$LOG/exact" > "/tmp/bench_exact.log" 2>&1
EXTRA="--no-batch-invariant" ROWS="m2_130m m2_2p7_b1 m1_2p8_b1" \
  bash scripts/gpu_decode_bench.sh "$cli" "$LOG/noinv" > "/tmp/bench_noinv.log" 2>&1
for p in fast exact; do
  timeout 120 "$cli" bench --device cuda --json -r 3 --shape mamba2-2.7b -b 1 -p 4096 -g 1 --precision $p | tee -a "$LOG/prefill.jsonl" | cut -c1-400
done
echo "benches $((SECONDS - t0)) s"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 150 "$ncu" --clock-control none --metrics gpu__time_duration.sum,dram__bytes.sum --launch-skip 600 --launch-count 40 \
  "$cli" bench --device cuda --shape mamba2-2.7b -b 32 -p 1 -g 3 -r 1 --no-cuda-graph --state-dtype bf16 > "$LOG/ncu_fast_b32.txt" 2>&1
echo "ncu rc=$? $((SECONDS - t0)) s"
grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|dram__bytes" "$LOG/ncu_fast_b32.txt" | sed 's/  */ /g' | cut -c1-150 | head -90
echo "=== fast"; tail -16 /tmp/bench_fast1.log; echo "=== exact"; tail -7 /tmp/bench_exact.log; echo "=== fast, not batch-invariant"; tail -4 /tmp/bench_noinv.log
