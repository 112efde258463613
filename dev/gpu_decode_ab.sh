#!/usr/bin/env bash
# One GPU run for the fused decode kernel (fused_gemv_fast.cu): build, the precision / invariance / fused-decode
# GPU tests, decode rows with the kernel (MAMBACPP_DECODE_GEMM=fused) and with the default cuBLASLt path in the same
# run, and ncu times / DRAM bytes of the kernel at mamba2-2.7b batch 1 and 32. Logs under $OUT.
# Usage: gpu_decode_ab.sh SRC_DIR [BUILD_DIR]   (NOBUILD=1 skips the build; FULL=1 runs every GPU test and the whole
# table twice instead of the A/B subset; NEW_ROWS, AB_ROWS (cuBLASLt) and NOINV_ROWS (--no-batch-invariant) pick
# the rows, empty for none; NCU_BATCHES the ncu batch sizes, default "1 32"; TESTS the gtest filter)
set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # dev/; the product's drivers are in ../scripts
SRC=${1:-.} B=${2:-build-gpu}
LOG=${OUT:-/tmp/gpu_decode_ab}; mkdir -p "$LOG"
t0=$SECONDS
if [ "${NOBUILD:-0}" != 1 ]; then
  bash .deps/build_from_debs.sh build .deps/debs "$SRC" "$B" -DMAMBACPP_CUDA=ON -DMAMBACPP_NATIVE=OFF \
    -DMAMBACPP_PYTHON=OFF -- mambacpp_gpu_tests mambacpp_cli > "$LOG/build.log" 2>&1 || { tail -40 "$LOG/build.log"; exit 1; }
fi
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
echo "build $((SECONDS - t0)) s"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ "${FULL:-0}" = 1 ]; then
  timeout 300 ctest --test-dir "$B" -L gpu --output-on-failure > "$LOG/tests.log" 2>&1; echo "ctest rc=$?"
  timeout 200 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 --gtest_filter='*Fast*:*Invariance*' > "$LOG/tests_fast.log" 2>&1
else
  timeout 200 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 \
    --gtest_filter="${TESTS:-*CudaFastFusedLinear*:*CudaFastLinear*:*Invariance*:*FusedDecode*:*Fast*:GpuModel.*:CudaModel.*}" > "$LOG/tests.log" 2>&1
  echo "tests rc=$?"
fi
echo "tests $((SECONDS - t0)) s"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[invariance\].*B 256|\[fast fused\]|\[fast\]|tests passed|tests failed" \
  "$LOG"/tests*.log | head -60
cli=$B/mambacpp
bench() { bash "$here/../scripts/gpu_decode_bench.sh" "$cli" "$@"; }
if [ "${FULL:-0}" = 1 ]; then
  MAMBACPP_DECODE_GEMM=fused TWICE=1 bench "$LOG/new" > /tmp/new.log 2>&1
else
  MAMBACPP_DECODE_GEMM=fused ROWS="${NEW_ROWS:-m2_130m m2_2p7_b1 m2_2p7_b8 m2_2p7_b32 m2_2p7_b128 m1_2p8_b1 m1_2p8_b32}" bench "$LOG/new" > /tmp/new.log 2>&1
fi
: > /tmp/lt.log; : > /tmp/noinv.log
AB_ROWS=${AB_ROWS-m2_130m m2_2p7_b1 m2_2p7_b32 m2_2p7_b128 m1_2p8_b1}
NOINV_ROWS=${NOINV_ROWS-m2_130m m2_2p7_b1 m1_2p8_b1}
[ -n "$AB_ROWS" ] && ROWS="$AB_ROWS" bench "$LOG/lt" > /tmp/lt.log 2>&1
[ -n "$NOINV_ROWS" ] && EXTRA="--no-batch-invariant" ROWS="$NOINV_ROWS" bench "$LOG/noinv" > /tmp/noinv.log 2>&1
echo "bench $((SECONDS - t0)) s"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for b in ${NCU_BATCHES:-1 32}; do
  MAMBACPP_DECODE_GEMM=fused timeout 120 "$ncu" --clock-control none --metrics gpu__time_duration.sum,dram__bytes.sum -k regex:fast_gemv \
    --launch-skip 200 --launch-count 6 "$cli" bench --device cuda --shape mamba2-2.7b -b $b -p 1 -g 3 -r 1 \
    --no-cuda-graph --state-dtype bf16 > "$LOG/ncu_b$b.txt" 2>&1
  echo "ncu b$b rc=$?"
  grep -E "fast_gemv_kernel|gpu__time_duration|dram__bytes" "$LOG/ncu_b$b.txt" | sed 's/  */ /g' | cut -c1-120 | head -18
done
echo "all $((SECONDS - t0)) s"
echo "=== fast, MAMBACPP_DECODE_GEMM=fused"; tail -n +1 /tmp/new.log | grep -A40 "^row "
echo "=== fast, default (cuBLASLt)"; grep -A20 "^row " /tmp/lt.log
echo "=== --no-batch-invariant"; grep -A10 "^row " /tmp/noinv.log
