#!/usr/bin/env bash
# Issue 52, quantized weights on CUDA: mamba2-2.7b batch-1 decode with bf16, q8_0 and fp8 e4m3 random weights in one
# run (the rows of docs/perf-log/gpu-quantized-2026-12-07.md), then bf16 on the plain per-op recipe
# (--no-fused-decode), the recipe the quantized models run: its distance from the bf16 row is what the fused
# kernels give, the rest of the quantized rows' excess over their floor is the quant GEMV's. No tests: the lead
# runs the whole GPU suite. Run from
# the repo root after the build (build-gpu/mambacpp); ends within 45 s; a summary on stdout, the JSON rows and the
# bench's stderr under $OUT/qgpu52b/.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp/device_qgpu52b}/qgpu52b; mkdir -p "$LOG"
t0=$SECONDS
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

# bench NAME ARGS...: one line "NAME <json>" appended to $LOG/rows.txt, unless the 43 s budget is spent (a row takes
# ~8-9 s on an H100: ~5-6 s of load, then 3 x (16-token prompt + 64 steps)).
: > "$LOG/rows.txt"; : > "$LOG/bench.err"
bench() {
  local name=$1; shift
  local left=$((43 - (SECONDS - t0)))
  [ $left -gt 14 ] && left=14
  if [ $left -lt 6 ]; then echo "$name: skipped (time)"; return; fi
  local j rc
  j=$(timeout $left "$B/mambacpp" bench --device cuda --json "$@" 2> "$LOG/last.err")
  rc=$?
  { echo "== $name rc=$rc"; cat "$LOG/last.err"; } >> "$LOG/bench.err"
  if [ $rc -ne 0 ]; then echo "$name: rc=$rc $(tail -c 300 "$LOG/last.err")"; return; fi
  echo "$name $(echo "$j" | tail -1)" >> "$LOG/rows.txt"
}
for w in bf16 q8_0 fp8; do bench "m2_2p7_b1_$w" --shape mamba2-2.7b -b 1 -p 16 -g 64 -r 3 --weights $w; done
bench m2_2p7_b1_bf16_plain --shape mamba2-2.7b -b 1 -p 16 -g 64 -r 3 --weights bf16 --no-fused-decode
rm -f "$LOG/last.err"

python3 - "$LOG" <<'PY'
import json, os, sys
rows = {}
for line in open(os.path.join(sys.argv[1], 'rows.txt')):
    name, _, j = line.partition(' ')
    try: rows[name] = json.loads(j)
    except Exception: print('unparsed row', name)
print(f"{'row':22s} {'decode ms/step':>14s} {'floor ms':>9s} {'floor %':>8s} {'above floor ms':>15s}")
for k, j in rows.items():
    d, f = j['decode_ms_per_step'], j['decode_floor_ms_per_step']
    print(f"{k:22s} {d:14.4f} {f:9.4f} {j['decode_floor_percent']:8.1f} {d - f:15.4f}")
base = rows.get('m2_2p7_b1_bf16')
for w in ('q8_0', 'fp8'):
    r = rows.get(f'm2_2p7_b1_{w}')
    if base and r and base['decode_ms_per_step'] > 0:
        print(f"mamba2-2.7b b1 {w}/bf16 decode time {r['decode_ms_per_step'] / base['decode_ms_per_step']:.3f} (target <= 0.6)")
PY
echo "all $((SECONDS - t0)) s"
