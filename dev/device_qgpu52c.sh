#!/usr/bin/env bash
# Issue 52, quantized weights on the fused decode path (backend/cuda/quant_fused_gemv.cu) and fp8 prefill on the FP8
# tensor cores (quant_fp8_gemm.cpp): the GPU tests of the quantized kernels, then batch-1 decode rows with bf16, q8_0
# and fp8 random weights (mamba2-2.7b, nemotron-h-8b), the 16k fp8 prefill A/B (MAMBACPP_FP8_PREFILL_GEMM=1: the FP8
# GEMM; unset: the 16-bit copy), and the decode A/B: the quantized 2.7b rows with --no-fused-decode (the plain
# recipe with the quant GEMV: what ran before this branch). Rows past the time budget are skipped, in this order. Run from the repo root after the build (build-gpu/mambacpp, build-gpu/tests/
# mambacpp_gpu_tests); ends within 120 s; a summary on stdout, the test log, JSON rows and the bench's stderr under
# $OUT/qgpu52c/.
set -u -o pipefail
B=${B:-build-gpu}
LOG=${OUT:-/tmp/device_qgpu52c}/qgpu52c; mkdir -p "$LOG"
t0=$SECONDS
budget=117
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

# Tests: the fused kernel against fp64 and its batch invariance, the models' fused recipe against the plain ops, and
# the existing quant tests (the GEMV, the scratch copy, the CPU q8_0 model).
timeout 30 "$B/tests/mambacpp_gpu_tests" --gtest_filter='CudaQuantFused.*:CudaFp8Prefill.*:CudaQuant.*' \
  > "$LOG/tests.txt" 2>&1
echo "tests rc=$? ($((SECONDS - t0)) s)"
grep -E '^\[quant|^\[fp8|^\[  (FAILED|PASSED) |^\[==========\]|Failure|error|differs' "$LOG/tests.txt" | head -45

# bench NAME SECONDS ARGS...: one line "NAME <json>" appended to $LOG/rows.txt, unless the budget is spent. A
# 2.7b row takes ~8-9 s on an H100 (~5-6 s of load, then 3 x (16-token prompt + 64 steps)); an 8b row ~20-25 s (random fp8 weights quantized on the host).
: > "$LOG/rows.txt"; : > "$LOG/bench.err"
bench() {
  local name=$1 cap=$2; shift 2
  local left=$((budget - (SECONDS - t0)))
  [ $left -gt $cap ] && left=$cap
  if [ $left -lt $((cap / 2 + 2)) ]; then echo "$name: skipped (time)"; return; fi
  local j rc
  j=$(MAMBACPP_FP8_PREFILL_GEMM=${FP8GEMM:-0} timeout $left "$B/mambacpp" bench --device cuda --json "$@" 2> "$LOG/last.err")
  rc=$?
  { echo "== $name rc=$rc"; cat "$LOG/last.err"; } >> "$LOG/bench.err"
  if [ $rc -ne 0 ]; then echo "$name: rc=$rc $(tail -c 300 "$LOG/last.err")"; return; fi
  echo "$name $(echo "$j" | tail -1)" >> "$LOG/rows.txt"
}
M2="--shape mamba2-2.7b -b 1 -p 16 -g 64 -r 3"
N8="--shape nemotron-h-8b -b 1 -p 16 -g 64 -r 3"
for w in bf16 q8_0 fp8; do bench "m2_2p7_b1_$w" 14 $M2 --weights $w; done
for w in q8_0 fp8; do bench "nh_8b_b1_$w" 30 $N8 --weights $w; done
P16="--shape mamba2-2.7b -b 1 -p 16384 -g 1 -r 2"
bench m2_2p7_16k_fp8_copy 16 $P16 --weights fp8
FP8GEMM=1 bench m2_2p7_16k_fp8_gemm 16 $P16 --weights fp8
for w in q8_0 fp8; do bench "m2_2p7_b1_${w}_plain" 14 $M2 --weights $w --no-fused-decode; done
bench m2_2p7_16k_bf16 16 $P16 --weights bf16
bench nh_8b_b1_bf16 26 $N8 --weights bf16
rm -f "$LOG/last.err"

python3 - "$LOG" <<'PY'
import json, os, sys
rows = {}
for line in open(os.path.join(sys.argv[1], 'rows.txt')):
    name, _, j = line.partition(' ')
    try: rows[name] = json.loads(j)
    except Exception: print('unparsed row', name)
print(f"{'row':22s} {'decode ms/step':>14s} {'floor ms':>9s} {'floor %':>8s} {'above floor ms':>15s} {'prefill tok/s':>14s}")
for k, j in rows.items():
    d, f = j['decode_ms_per_step'], j['decode_floor_ms_per_step']
    print(f"{k:22s} {d:14.4f} {f:9.4f} {j['decode_floor_percent']:8.1f} {d - f:15.4f} {j.get('prefill_tokens_per_s', 0):14.0f}")
for shape in ('m2_2p7_b1', 'nh_8b_b1'):
    base = rows.get(f'{shape}_bf16')
    for w in ('q8_0', 'fp8'):
        r, p = rows.get(f'{shape}_{w}'), rows.get(f'{shape}_{w}_plain')
        if base and r:
            print(f"{shape} {w}/bf16 decode time {r['decode_ms_per_step'] / base['decode_ms_per_step']:.3f} (target <= 0.6)")
        if r and p:
            print(f"{shape} {w} fused/plain decode time {r['decode_ms_per_step'] / p['decode_ms_per_step']:.3f}")
b, c, g = (rows.get(f'm2_2p7_16k_{k}') for k in ('bf16', 'fp8_copy', 'fp8_gemm'))
if c and g:
    print(f"mamba2-2.7b 16k prefill fp8: FP8 GEMM {g['prefill_tokens_per_s']:.0f} tok/s vs 16-bit copy {c['prefill_tokens_per_s']:.0f}"
          f" ({g['prefill_tokens_per_s'] / c['prefill_tokens_per_s']:.3f}x)")
if b and g:
    print(f"mamba2-2.7b 16k prefill fp8 GEMM / bf16 tokens/s {g['prefill_tokens_per_s'] / b['prefill_tokens_per_s']:.3f} (target >= 1.3)")
PY
echo "all $((SECONDS - t0)) s"
