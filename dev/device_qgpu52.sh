#!/usr/bin/env bash
# One GPU run for issue 52's quantized weights on CUDA (q8_0 and fp8 e4m3; backend/cuda/quant_*): the quant GPU tests,
# then bench rows of bf16 vs q8_0 vs fp8 random weights in the same run. Run from the repo root after the build
# (build-gpu/mambacpp, build-gpu/tests/mambacpp_gpu_tests). Details under $OUT/qgpu52/; a summary on stdout.
# Targets (issue 52): batch-1 decode with q8_0 or fp8 <= 0.6x the bf16 time; fp8 16k prefill >= 1.3x bf16 (phase 1
# runs fp8 prefill on a bf16 copy of the bytes, so expect ~1x or below there; the row is the baseline for phase 2).
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp/device_qgpu52}/qgpu52; mkdir -p "$LOG"
t0=$SECONDS
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

timeout 45 "$B/tests/mambacpp_gpu_tests" --gtest_brief=1 --gtest_filter='CudaQuant.*:CudaOps.Linear*:CudaOps.Embed*' \
  > "$LOG/tests.log" 2>&1
echo "tests rc=$? ($((SECONDS - t0)) s)"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[quant\]|Expected|Which is|err" "$LOG/tests.log" | head -30

# bench NAME ARGS...: one line "NAME <json>" appended to $LOG/rows.txt (stderr to bench.err), unless the time budget
# is spent. Few files: $OUT brings back at most 8.
: > "$LOG/rows.txt"; : > "$LOG/bench.err"
bench() {
  local name=$1; shift
  local left=$((116 - (SECONDS - t0)))
  [ $left -gt 40 ] && left=40
  if [ $left -lt 8 ]; then echo "$name: skipped (time)"; return; fi
  local j
  j=$(timeout $left "$B/mambacpp" bench --device cuda --json "$@" 2> /tmp/qgpu52_bench.err)
  local rc=$?
  { echo "== $name rc=$rc"; cat /tmp/qgpu52_bench.err; } >> "$LOG/bench.err"
  if [ $rc -ne 0 ]; then echo "$name: rc=$rc $(tail -c 300 /tmp/qgpu52_bench.err)"; return; fi
  echo "$name $(echo "$j" | tail -1)" >> "$LOG/rows.txt"
}
for w in bf16 q8_0 fp8; do bench "m2_2p7_b1_$w" --shape mamba2-2.7b -b 1 -p 16 -g 64 -r 3 --weights $w; done
for w in bf16 fp8 q8_0; do bench "m2_2p7_p16k_$w" --shape mamba2-2.7b -b 1 -p 16384 -g 1 -r 2 --weights $w; done
for w in bf16 q8_0 fp8; do bench "nemo8b_b1_$w" --shape nemotron-h-8b -b 1 -p 16 -g 64 -r 3 --weights $w; done
for w in bf16 q8_0 fp8; do bench "m2_2p7_b32_$w" --shape mamba2-2.7b -b 32 -p 16 -g 64 -r 3 --weights $w; done

python3 - "$LOG" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = {}
for line in open(os.path.join(d, 'rows.txt')):
    name, _, j = line.partition(' ')
    try: rows[name] = json.loads(j)
    except Exception: print('unparsed row', name)
print(f"{'row':22s} {'decode ms/step':>14s} {'floor %':>8s} {'prefill tok/s':>14s} {'load ms':>8s}")
for k, j in rows.items():
    print(f"{k:22s} {j['decode_ms_per_step']:14.4f} {j['decode_floor_percent']:8.1f} {j['prefill_tokens_per_s']:14.0f} {j['load_ms']:8.0f}")
def ratio(a, b, key):
    if a in rows and b in rows and rows[b][key] > 0: return rows[a][key] / rows[b][key]
for base in ('m2_2p7_b1', 'nemo8b_b1', 'm2_2p7_b32'):
    for w in ('q8_0', 'fp8'):
        r = ratio(f'{base}_{w}', f'{base}_bf16', 'decode_ms_per_step')
        if r: print(f"{base} {w}/bf16 decode time {r:.3f}" + (" (target <= 0.6)" if 'b1' in base else ""))
for w in ('fp8', 'q8_0'):
    r = ratio(f'm2_2p7_p16k_{w}', 'm2_2p7_p16k_bf16', 'prefill_tokens_per_s')
    if r: print(f"mamba2-2.7b 16k prefill {w}/bf16 tokens/s {r:.3f}" + (" (target >= 1.3)" if w == 'fp8' else ""))
PY
echo "all $((SECONDS - t0)) s"
