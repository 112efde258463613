#!/usr/bin/env bash
# Issue 52, q4_k / q5_k / q6_k weights on CUDA (kquant52): mamba2-2.7b batch-1 decode rows with q4_k (Q4_K_M: Q6_K
# embedding), q6_k, bf16 and q8_0 random weights in the same run, each beside its own bytes floor (the bench's: every
# weight's stored bytes read once per step / the measured copy bandwidth), then q5_k and the Nemotron-H 8B q4_k row
# while the budget lasts. Bench rows only (the tests run in the GPU suite: CudaKQuant.*, CudaQuant.*). Run from the
# repo root after the build (build-gpu/); ends within 60 s; a summary on stdout, the JSON rows and the bench's stderr
# under $OUT/kquant52/.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp/device_kquant52}/kquant52; mkdir -p "$LOG"
t0=$SECONDS
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1

# bench NAME LIMIT ARGS...: one line "NAME <json>" appended to $LOG/rows.txt, unless the 57 s budget is spent. A row
# takes ~9-11 s on an H100 (making and loading the random weights, then 4 x (16-token prompt + 64 steps)); k-quant
# matrices copy their blocks from a small quantized pool (src/model/random_weights.cpp), so they load as fast.
: > "$LOG/rows.txt"; : > "$LOG/bench.err"
bench() {
  local name=$1 cap=$2; shift 2
  local left=$((57 - (SECONDS - t0)))
  [ $left -gt $cap ] && left=$cap
  if [ $left -lt $((cap * 2 / 3)) ]; then echo "$name: skipped (time)"; return; fi
  local j rc
  j=$(timeout $left "$B/mambacpp" bench --device cuda --json "$@" 2> "$LOG/last.err")
  rc=$?
  { echo "== $name rc=$rc"; cat "$LOG/last.err"; } >> "$LOG/bench.err"
  if [ $rc -ne 0 ]; then echo "$name: rc=$rc $(tail -c 300 "$LOG/last.err")"; return; fi
  echo "$name $(echo "$j" | tail -1)" >> "$LOG/rows.txt"
}
for w in q4_k q6_k bf16 q8_0 q5_k; do
  bench "m2_2p7_b1_$w" 16 --shape mamba2-2.7b -b 1 -p 16 -g 64 -r 3 --weights $w
done
# Nemotron-H 8B (attention + MLP + Mamba-2) q4_k only where the budget still allows (phase 1: bf16 6.538 ms/step).
bench nh8b_b1_q4_k 20 --shape nemotron-h-8b -b 1 -p 16 -g 64 -r 3 --weights q4_k
rm -f "$LOG/last.err"

python3 - "$LOG" <<'PY'
import json, os, sys
rows = {}
for line in open(os.path.join(sys.argv[1], 'rows.txt')):
    name, _, j = line.partition(' ')
    try: rows[name] = json.loads(j)
    except Exception: print('unparsed row', name)
print(f"{'row':18s} {'decode ms/step':>14s} {'MB/step':>8s} {'floor ms':>9s} {'floor %':>8s} {'vs bf16':>8s} {'vs q8_0':>8s}"
      f" {'prefill tok/s':>14s} {'load ms':>8s}")
for k, j in rows.items():
    prefix = next((k[:-len(s)] for s in ('_bf16', '_q8_0', '_q4_k', '_q5_k', '_q6_k') if k.endswith(s)), k)
    base, q8 = rows.get(prefix + '_bf16'), rows.get(prefix + '_q8_0')
    d = j['decode_ms_per_step']
    r = f"{d / base['decode_ms_per_step']:.3f}" if base else '-'
    r8 = f"{d / q8['decode_ms_per_step']:.3f}" if q8 else '-'
    print(f"{k:18s} {d:14.4f} {j.get('decode_step_bytes', 0) / 1e6:8.1f} {j['decode_floor_ms_per_step']:9.4f} {j['decode_floor_percent']:8.1f} {r:>8s} {r8:>8s}"
          f" {j.get('prefill_tokens_per_s', 0):14.0f} {j.get('load_ms', 0):8.0f}")
PY
echo "all $((SECONDS - t0)) s"
