#!/usr/bin/env bash
# Falcon-H1 / Granite-4.0-H decode rows after branch fused49b (the multipliers on fast precision's pinned GEMMs: the
# default mode now runs these two families' decode on the fused path), after the lead's build and test run, from the
# repo root, <= 45 s, no tests (the lead runs the whole suite):
#   falcon-h1-0.5b and granite-4.0-h-1b at batch 1 in the default mode (fast, batch-invariant) and with
#   --no-fused-decode (the plain per-op kernels), then --no-batch-invariant (the fused GEMVs) if time is left;
#   each with its bytes floor (phase 1: ~8 s a row). Rows end by BUDGET seconds (42; each row has up to 12 s).
# Details under $OUT/fused49b/; a summary table on stdout.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp}/fused49b; mkdir -p "$LOG"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
t0=$SECONDS
timeout 5 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

: > "$LOG/bench.jsonl"
row() {  # row NAME MODE-LABEL ARGS...: one bench run appended as a JSON line tagged with its name and mode
  local name=$1 mode=$2; shift 2
  local left=$(( ${BUDGET:-42} - (SECONDS - t0) ))  # each row gets up to 12 s, never past the budget
  if [ "$left" -lt 6 ]; then echo "skipped $name $mode (time)"; return; fi
  [ "$left" -gt 12 ] && left=12
  local out
  out=$(timeout "$left" "$B/mambacpp" bench --device cuda --json -r 3 "$@" 2> "$LOG/err_${name}_${mode}.txt" | tail -1)
  [ -n "$out" ] || out='{}'
  echo "{\"row\": \"$name\", \"mode\": \"$mode\", \"r\": $out}" >> "$LOG/bench.jsonl"
}
F05="--shape falcon-h1-0.5b -b 1 -p 16 -g 64" G1="--shape granite-4.0-h-1b -b 1 -p 1024 -g 32"
NF=--no-fused-decode NI=--no-batch-invariant
row falcon05_b1 default $F05;        row falcon05_b1 default_nofused $F05 $NF
row granite1b_b1 default $G1;        row granite1b_b1 default_nofused $G1 $NF
row falcon05_b1 noinv $F05 $NI;      row granite1b_b1 noinv $G1 $NI
echo "bench done ($((SECONDS - t0)) s)"
timeout 5 python3 - "$LOG/bench.jsonl" "$LOG" <<'PY'
import json, sys
print(f"{'row':14} {'mode':16} {'ms/step':>9} {'floor':>7} {'%floor':>7}")
for line in open(sys.argv[1]):
    d = json.loads(line); r = d["r"]
    if "decode_ms_per_step" not in r:
        err = open(f"{sys.argv[2]}/err_{d['row']}_{d['mode']}.txt", errors="replace").read().strip().splitlines()
        print(f"{d['row']:14} {d['mode']:16} {'failed':>9}  {(err[-1] if err else 'no output (timeout?)')[:100]}"); continue
    print(f"{d['row']:14} {d['mode']:16} {r['decode_ms_per_step']:9.3f} {r['decode_floor_ms_per_step']:7.3f} "
          f"{r['decode_floor_percent']:6.1f}%")
PY
echo "total $((SECONDS - t0)) s"
