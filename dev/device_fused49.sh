#!/usr/bin/env bash
# One GPU run for the hybrids' fused decode (branch fused49: Falcon-H1's parallel layer and Granite-4.0-H's
# multipliers in the fused GEMVs' epilogue, the hybrids' attention and MLP sublayers on fused linears), after the
# lead's build (build-gpu/mambacpp, build-gpu/tests/mambacpp_gpu_tests), from the repo root, <= 120 s:
#   1. the GPU tests of these paths (fused vs plain vs CPU, the Falcon-H1 and hybrid fixture, graph and CPU tests);
#   2. decode rows with and without --no-fused-decode in the same run: with --no-batch-invariant (fast precision,
#      batches of 1-8 on the fused GEMVs) and in exact precision; the default mode (fast, batch-invariant: the
#      pinned GEMMs, which take no multipliers yet, so Falcon-H1 / Granite stay plain there) once each. Rows stop
#      at BUDGET seconds (92; each row has 20 s).
# Details under $OUT/fused49/; a summary table on stdout.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp}/fused49; mkdir -p "$LOG"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

timeout 60 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 \
  --gtest_filter="${TESTS:-GpuFusedHybridDecode.*:GpuFusedLinearMultipliers.*:GpuFalconH1.*:GpuHybrid.MatchesCpuPath:GpuHybrid.GraphDecodeEqualsEagerAndCpu:GpuHybrid.BatchMemberEqualsItselfAlone:FusedDecode.*:GpuMoe.ModelsMatchTheCpu}" \
  > "$LOG/tests.log" 2>&1
echo "tests rc=$? ($((SECONDS - t0)) s; 124: the 60 s limit, see tests.log for what ran)"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[gpu fused hybrid\]" "$LOG/tests.log" | head -40

: > "$LOG/bench.jsonl"
row() {  # row NAME MODE-LABEL ARGS...: one bench run appended as a JSON line tagged with its name and mode
  local name=$1 mode=$2; shift 2
  if [ $((SECONDS - t0)) -gt "${BUDGET:-92}" ]; then echo "skipped $name $mode (time)"; return; fi
  local out
  out=$(timeout 20 "$B/mambacpp" bench --device cuda --json -r 3 "$@" 2> "$LOG/err_${name}_${mode}.txt" | tail -1)
  [ -n "$out" ] || out='{}'
  echo "{\"row\": \"$name\", \"mode\": \"$mode\", \"r\": $out}" >> "$LOG/bench.jsonl"
}
# Most telling first: the fused GEMVs (fast precision, --no-batch-invariant) against the plain ops, then exact
# precision, then the default mode (unchanged for these two families: its pinned GEMMs take no multipliers yet).
F05="--shape falcon-h1-0.5b -b 1 -p 16 -g 64" G1="--shape granite-4.0-h-1b -b 1 -p 1024 -g 32"
NI=--no-batch-invariant NF=--no-fused-decode EX="--precision exact"
row falcon05_b1 noinv $F05 $NI;       row falcon05_b1 noinv_nofused $F05 $NI $NF
row granite1b_b1 noinv $G1 $NI;      row granite1b_b1 noinv_nofused $G1 $NI $NF
row falcon05_b1 exact $F05 $EX;       row falcon05_b1 exact_nofused $F05 $EX $NF
row granite1b_b1 exact $G1 $EX;      row granite1b_b1 exact_nofused $G1 $EX $NF
row falcon05_b1 fast $F05;           row granite1b_b1 fast $G1
row falcon05_b8 noinv --shape falcon-h1-0.5b -b 8 -p 16 -g 64 $NI
row falcon05_b8 noinv_nofused --shape falcon-h1-0.5b -b 8 -p 16 -g 64 $NI $NF
row falcon7b_b1 noinv --shape falcon-h1-7b -b 1 -p 16 -g 64 $NI
row falcon7b_b1 noinv_nofused --shape falcon-h1-7b -b 1 -p 16 -g 64 $NI $NF
echo "bench done ($((SECONDS - t0)) s)"
python3 - "$LOG/bench.jsonl" "$LOG" <<'PY'
import json, sys
print(f"{'row':14} {'mode':14} {'ms/step':>9} {'floor':>7} {'%floor':>7}")
for line in open(sys.argv[1]):
    d = json.loads(line); r = d["r"]
    if "decode_ms_per_step" not in r:
        err = open(f"{sys.argv[2]}/err_{d['row']}_{d['mode']}.txt", errors="replace").read().strip().splitlines()
        print(f"{d['row']:14} {d['mode']:14} {'failed':>9}  {(err[-1] if err else 'no output (timeout?)')[:100]}"); continue
    print(f"{d['row']:14} {d['mode']:14} {r['decode_ms_per_step']:9.3f} {r['decode_floor_ms_per_step']:7.3f} "
          f"{r['decode_floor_percent']:6.1f}%")
PY
echo "total $((SECONDS - t0)) s"
