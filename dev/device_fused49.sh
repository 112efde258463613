#!/usr/bin/env bash
# One GPU run for the hybrids' fused decode (branch fused49: Falcon-H1's parallel layer and Granite-4.0-H's
# multipliers in the fused GEMVs' epilogue, the hybrids' attention and MLP sublayers on fused linears), after the
# lead's build (build-gpu/mambacpp, build-gpu/tests/mambacpp_gpu_tests), from the repo root, <= 120 s:
#   1. the GPU tests of these paths (fused vs plain vs CPU, the Falcon-H1 and hybrid fixture, graph and CPU tests);
#   2. decode rows with and without --no-fused-decode in the same run, in the default mode (fast precision,
#      batch-invariant: the pinned GEMMs, which take no multipliers yet, so Falcon-H1 / Granite stay plain there),
#      with --no-batch-invariant (fast precision, batches of 1-8 on the fused GEMVs) and in exact precision.
# Details under $OUT/fused49/; a summary table on stdout.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp}/fused49; mkdir -p "$LOG"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

timeout 75 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 \
  --gtest_filter="${TESTS:-GpuFusedHybridDecode.*:GpuFalconH1.*:GpuHybrid.MatchesCpuPath:GpuHybrid.GraphDecodeEqualsEagerAndCpu:GpuHybrid.FixturesMatchTransformers:*FusedDecode*}" \
  > "$LOG/tests.log" 2>&1
echo "tests rc=$? ($((SECONDS - t0)) s)"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[gpu fused hybrid\]" "$LOG/tests.log" | head -40

: > "$LOG/bench.jsonl"
row() {  # row NAME MODE-LABEL ARGS...: one bench run appended as a JSON line tagged with its name and mode
  local name=$1 mode=$2; shift 2
  local out
  out=$(timeout 25 "$B/mambacpp" bench --device cuda --json -r 3 "$@" 2> "$LOG/err_${name}_${mode}.txt" | tail -1)
  [ -n "$out" ] || out='{}'
  echo "{\"row\": \"$name\", \"mode\": \"$mode\", \"r\": $out}" >> "$LOG/bench.jsonl"
}
modes() {  # modes NAME ARGS...: the row in every mode, fused and not, back to back
  local name=$1; shift
  row "$name" fast "$@";                 row "$name" fast_nofused "$@" --no-fused-decode
  row "$name" noinv "$@" --no-batch-invariant; row "$name" noinv_nofused "$@" --no-batch-invariant --no-fused-decode
  row "$name" exact "$@" --precision exact;    row "$name" exact_nofused "$@" --precision exact --no-fused-decode
}
modes falcon05_b1 --shape falcon-h1-0.5b -b 1 -p 16 -g 64
modes granite1b_b1 --shape granite-4.0-h-1b -b 1 -p 1024 -g 32
row falcon05_b32 fast --shape falcon-h1-0.5b -b 32 -p 16 -g 64
row falcon05_b32 fast_nofused --shape falcon-h1-0.5b -b 32 -p 16 -g 64 --no-fused-decode
row falcon05_b8 noinv --shape falcon-h1-0.5b -b 8 -p 16 -g 64 --no-batch-invariant
row falcon05_b8 noinv_nofused --shape falcon-h1-0.5b -b 8 -p 16 -g 64 --no-batch-invariant --no-fused-decode
if [ $((SECONDS - t0)) -lt 80 ]; then
  row falcon7b_b1 noinv --shape falcon-h1-7b -b 1 -p 16 -g 64 --no-batch-invariant
  row falcon7b_b1 noinv_nofused --shape falcon-h1-7b -b 1 -p 16 -g 64 --no-batch-invariant --no-fused-decode
fi
echo "bench done ($((SECONDS - t0)) s)"
python3 - "$LOG/bench.jsonl" <<'PY'
import json, sys
print(f"{'row':14} {'mode':14} {'ms/step':>9} {'floor':>7} {'%floor':>7}")
for line in open(sys.argv[1]):
    d = json.loads(line); r = d["r"]
    if "decode_ms_per_step" not in r:
        print(f"{d['row']:14} {d['mode']:14} {'failed':>9}"); continue
    print(f"{d['row']:14} {d['mode']:14} {r['decode_ms_per_step']:9.3f} {r['decode_floor_ms_per_step']:7.3f} "
          f"{r['decode_floor_percent']:6.1f}%")
PY
echo "total $((SECONDS - t0)) s"
