#!/usr/bin/env bash
# Issue 55 phase 1 (attention on the tensor cores), one GPU run after the build (binaries in build-gpu/): the attention
# GPU tests (fp64 references, split invariance, the hybrid models' self-consistency), attention_bench old vs new
# (decode batch 32 at 16k: f32 kernel variants beside the tensor-core kernel and the KV-bytes floor; one 16k prefill
# layer: f32 kernel vs tensor cores in TFLOP/s), and the 16k prefill rows of nemotron-h-8b and bamba-9b with the
# f32 kernel (MAMBACPP_ATTN_MMA=0, the phase-1 A/B switch) and with the tensor-core kernel (default), interleaved.
# Prints a summary; logs under $OUT/attn55/. Runs in <= 120 s.
# Usage (repo root, after building mambacpp_gpu_tests mambacpp_cli attention_bench):
#   bash dev/device_attn55.sh [BUILD_DIR (build-gpu)]
set -u -o pipefail
B=${1:-build-gpu}
LOG=${OUT:-/tmp}/attn55; mkdir -p "$LOG"
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

echo "== tests"
filter='GpuAttention*:GpuAttentionMma*:GpuHybrid.FixturesMatchTransformers:GpuHybrid.AnySplitEqualsOnePass'
filter+=':GpuHybrid.BatchMemberEqualsItselfAlone:GpuHybrid.GraphDecodeEqualsEagerAndCpu'
timeout 40 "$B/tests/mambacpp_gpu_tests" --gtest_filter="$filter" > "$LOG/tests.log" 2>&1
echo "tests rc=$? ($((SECONDS - t0)) s)"
grep -E "^\[ +(OK|FAILED) +\]|Failure|worst|outside|^\[  PASSED" "$LOG/tests.log" | head -40

[ -x "$B/tests/attention_bench" ] || echo "!! $B/tests/attention_bench missing: build the attention_bench target too"
echo "== attention_bench decode: batch 32, context 16384, 32/8 heads of 128"
timeout 15 "$B/tests/attention_bench" 32 16384 32 8 128 10 2>&1 | tee "$LOG/bench_decode.log"
echo "== attention_bench prefill: 16384 rows, 32/8 heads of 128"
timeout 15 "$B/tests/attention_bench" prefill 16384 32 8 128 3 2>&1 | tee "$LOG/bench_prefill.log"
echo "($((SECONDS - t0)) s)"

echo "== 16k prefill rows (tokens/s): f32 attention (MAMBACPP_ATTN_MMA=0) vs tensor cores"
row() {  # shape mma: one row, within what is left of the 120 s
  local j left=$((116 - (SECONDS - t0)))
  [ "$left" -gt 20 ] && left=20
  [ "$left" -lt 3 ] && { echo "$1 mma=$2 skipped (time)"; return; }
  j=$(MAMBACPP_ATTN_MMA=$2 timeout "$left" "$B/mambacpp" bench --device cuda --json --shape "$1" -b 1 -p 16384 -g 0 \
      -r 1 2> "$LOG/row_$1_mma$2.err" | grep '^{' | tail -1)
  echo "$j" > "$LOG/row_$1_mma$2.json"
  python3 -c 'import json, sys
n, m, s = sys.argv[1:4]
try:
    j = json.loads(s)
    print("%-16s mma=%s %9.1f ms %9.0f tok/s" % (n, m, j["prefill_ms"], j["prefill_tokens_per_s"]))
except Exception as e:
    print("%-16s mma=%s failed: %s" % (n, m, e))' "$1" "$2" "$j"
}
for shape in nemotron-h-8b bamba-9b; do
  row "$shape" 0
  row "$shape" 1
done
echo "total $((SECONDS - t0)) s"
