#!/usr/bin/env bash
# Issue 55 phase 2 (attention on the tensor cores), the rows docs/benchmarks.md and
# docs/perf-log/attention-tensor-cores-2026-12-07.md quote, after the build (binaries in build-gpu/; the lead runs the
# GPU suite itself): attention_bench decode (batch 32 at 16k: the f32 kernel variants beside the tensor-core kernel
# and the copy bandwidth) and one 16k prefill layer (f32 kernel vs tensor cores, TFLOP/s), then the nemotron-h-8b 16k
# prefill row. Prints a summary; logs under $OUT/attn55b/. Runs in <= 45 s.
# The model row gets what is left of the 45 s (~38 s): loading 8B random weights takes ~13 s before the warm-up and
# the timed prefill (phase 1 gave each row 20 s, too little: killed by timeout, no JSON, empty stderr).
# Usage (repo root, after building mambacpp_cli and attention_bench):
#   bash dev/device_attn55b.sh [BUILD_DIR (build-gpu)]
set -u -o pipefail
B=${1:-build-gpu}
LOG=${OUT:-/tmp}/attn55b; mkdir -p "$LOG"
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$SECONDS
timeout 5 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

[ -x "$B/tests/attention_bench" ] || echo "!! $B/tests/attention_bench missing: build the attention_bench target too"
echo "== attention_bench decode: batch 32, context 16384, 32/8 heads of 128"
timeout 8 "$B/tests/attention_bench" 32 16384 32 8 128 10 2>&1 | tee "$LOG/bench_decode.log"
echo "== attention_bench prefill: 16384 rows, 32/8 heads of 128"
timeout 8 "$B/tests/attention_bench" prefill 16384 32 8 128 3 2>&1 | tee "$LOG/bench_prefill.log"
echo "($((SECONDS - t0)) s)"

echo "== nemotron-h-8b, 16,384-token prompt (bench -b 1 -p 16384 -g 0 -r 1, fast precision: tensor-core attention)"
left=$((44 - (SECONDS - t0)))
if [ "$left" -lt 20 ]; then
  echo "nemotron-h-8b skipped: only $left s left"
else
  timeout "$left" "$B/mambacpp" bench --device cuda --json --shape nemotron-h-8b -b 1 -p 16384 -g 0 -r 1 \
    > "$LOG/row_nemotron-h-8b.out" 2> "$LOG/row_nemotron-h-8b.err"
  rc=$?
  j=$(grep '^{' "$LOG/row_nemotron-h-8b.out" | tail -1)
  echo "$j" > "$LOG/row_nemotron-h-8b.json"
  python3 -c 'import json, sys
rc, s = sys.argv[1:3]
try:
    j = json.loads(s)
    print("nemotron-h-8b 16k prefill %.1f ms, %.0f tokens/s (load %.1f s, copy %.0f GB/s, %s)"
          % (j["prefill_ms"], j["prefill_tokens_per_s"], j["load_ms"] / 1e3, j["copy_bandwidth_gb_s"], j["device"]))
except Exception as e:
    print("nemotron-h-8b failed (rc %s%s): %s" % (rc, ", timeout" if rc == "124" else "", e))' "$rc" "$j"
  [ -n "$j" ] || tail -5 "$LOG/row_nemotron-h-8b.err"
fi
echo "total $((SECONDS - t0)) s"
