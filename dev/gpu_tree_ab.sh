#!/usr/bin/env bash
# A/B of two source trees in one GPU run, prefill and decode: this tree ("new") and this tree with PATCH reversed
# ("base"). Builds both (dev/gpu_prefill_ab_tree.sh), runs the GPU tests on the new tree and the prefill rows of both
# alternately, then the decode rows (scripts/gpu_decode_bench.sh) of both alternately, then a hybrid decode row.
# Usage: gpu_tree_ab.sh PATCH [BUILD_DIR]   env: DECODE_ROWS (gpu_decode_bench.sh row names), HYBRID_ROWS (bench
# arguments separated by ';'), and those of gpu_prefill_ab_tree.sh.
set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
patch_file=$(realpath "$1") B=${2:-build-gpu}
LOG=${OUT:-/tmp/gpu_tree_ab}; mkdir -p "$LOG"
NOPROFILE=${NOPROFILE:-1} bash "$here/gpu_prefill_ab_tree.sh" "$patch_file" "$B" || exit 1
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
rows=${DECODE_ROWS:-m2_130m m2_2p7_b1 m2_2p7_b32 m2_2p7_b128 m1_2p8_b1}
for round in 1 2; do
  for tree in base new; do
    bin=$B/mambacpp; [ $tree = base ] && bin=/tmp/ab_base/$B/mambacpp
    ROWS="$rows" bash "$here/../scripts/gpu_decode_bench.sh" "$bin" "$LOG/decode_${tree}_$round" 2>&1 | tail -n +2 |
      sed "s/^/$tree  /"
  done
done
IFS=';' read -r -a hrows <<< "${HYBRID_ROWS:---shape nemotron-h-8b -b 1 -p 16 -g 64;--shape granite-4.0-h-1b -b 32 -p 16 -g 64}"
for tree in base new base new; do
  bin=$B/mambacpp; [ $tree = base ] && bin=/tmp/ab_base/$B/mambacpp
  for r in "${hrows[@]}"; do
    read -r -a args <<< "$r"
    ms=$(timeout 120 "$bin" bench --device cuda --json -r 3 "${args[@]}" 2>/dev/null | grep '^{' | tail -1 |
         python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"{j['decode_ms_per_step']:.4f} ms/step\")")
    echo "$tree  $r: $ms"
  done
done
