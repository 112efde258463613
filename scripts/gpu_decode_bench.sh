#!/usr/bin/env bash
# Decode figures of issue 13 on the GPU machine: builds nothing, runs `mambacpp bench` over the batch sizes and
# models of the issue's table (medians of -r runs; each row twice with TWICE=1) and prints a table last.
# Usage: gpu_decode_bench.sh MAMBACPP [LOGDIR]   (EXTRA="--precision exact" adds options to every row;
# ROWS="..." picks rows by name).
set -u -o pipefail
cli=$1 log=${2:-${OUT:-/tmp/gpu_decode}}
mkdir -p "$log"
runs=1; [ "${TWICE:-0}" = 1 ] && runs=2
row() {  # row NAME ARGS...
  local name=$1; shift
  if [ -n "${ROWS:-}" ] && [[ " $ROWS " != *" $name "* ]]; then return 0; fi
  for i in $(seq $runs); do
    timeout 120 "$cli" bench --device cuda --json -r "${REPEAT:-3}" "$@" ${EXTRA:-} | sed "s/^{/{\"row\":\"$name\",/" \
      | tee -a "$log/decode.jsonl" || echo "row $name failed"
  done
}
row m2_130m   --shape mamba2-130m -b 1 -p 100 -g 1000
row m2_2p7_b1 --shape mamba2-2.7b -b 1 -p 16 -g 200
row m2_2p7_b1_bf16 --shape mamba2-2.7b -b 1 -p 16 -g 200 --state-dtype bf16
for b in 8 32 64 128 256; do row m2_2p7_b$b --shape mamba2-2.7b -b $b -p 16 -g 64 --state-dtype bf16; done
row m1_2p8_b1 --shape mamba-2.8b -b 1 -p 16 -g 200
for b in 32 128; do row m1_2p8_b$b --shape mamba-2.8b -b $b -p 16 -g 64 --state-dtype bf16; done
python3 - "$log/decode.jsonl" <<'PY'
import json, sys
print(f"{'row':16} {'B':>4} {'state':>5} {'ms/step':>8} {'total ms':>9} {'floor ms':>8} {'% floor':>7}")
for line in open(sys.argv[1]):
    try: j = json.loads(line)
    except ValueError: continue
    print(f"{j['row']:16} {j['batch']:>4} {j['state_dtype']:>5} {j['decode_ms_per_step']:>8.4f} {j['total_ms']:>9.1f} "
          f"{j['decode_floor_ms_per_step']:>8.4f} {j['decode_floor_percent']:>7.1f}")
PY
