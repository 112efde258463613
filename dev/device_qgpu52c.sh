#!/usr/bin/env bash
# Issue 52, quantized weights on CUDA after phase 2 of qgpu52c (the quantized fused GEMV and the FP8 prefill GEMM
# went to dev/; q8_0 / fp8 decode runs the plain ops again): mamba2-2.7b batch-1 decode with bf16, q8_0 and fp8 e4m3
# random weights in one run, to show the quantized rows back at the plain path's times (H100, 2026-12-07: q8_0
# 3.046-3.064 ms/step, fp8 2.952-2.960, bf16 3.149-3.225). No tests: the lead runs the whole GPU suite. Run from the
# repo root after the build (build-gpu/mambacpp); ends within 45 s; a summary on stdout, the JSON rows and the
# bench's stderr under $OUT/qgpu52c/.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp/device_qgpu52c}/qgpu52c; mkdir -p "$LOG"
t0=$SECONDS
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

# bench NAME ARGS...: one line "NAME <json>" appended to $LOG/rows.txt, unless the 43 s budget is spent (a row takes
# ~9-11 s on an H100: 5-7 s to make and load the random weights, then 4 x (16-token prompt + 64 steps)).
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
rm -f "$LOG/last.err"

python3 - "$LOG" <<'PY'
import json, os, sys
rows = {}
for line in open(os.path.join(sys.argv[1], 'rows.txt')):
    name, _, j = line.partition(' ')
    try: rows[name] = json.loads(j)
    except Exception: print('unparsed row', name)
print(f"{'row':16s} {'decode ms/step':>14s} {'floor ms':>9s} {'floor %':>8s} {'vs bf16':>8s} {'prefill tok/s':>14s}")
base = rows.get('m2_2p7_b1_bf16')
for k, j in rows.items():
    d = j['decode_ms_per_step']
    r = f"{d / base['decode_ms_per_step']:.3f}" if base else '-'
    print(f"{k:16s} {d:14.4f} {j['decode_floor_ms_per_step']:9.4f} {j['decode_floor_percent']:8.1f} {r:>8s}"
          f" {j.get('prefill_tokens_per_s', 0):14.0f}")
PY
echo "all $((SECONDS - t0)) s"
