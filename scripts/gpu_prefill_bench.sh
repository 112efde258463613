#!/usr/bin/env bash
# Prefill rows of issue 14 (docs/benchmarks.md "GPU prefill"): random bf16 weights of the real shapes, one prompt
# (or a batch of prompts), `mambacpp bench -g 1`, median of 3 timed runs after a warm-up. Prints one line per row:
#   row-name  prefill_ms  tokens/s
# Usage: gpu_prefill_bench.sh MAMBACPP [ROWS] [EXTRA BENCH ARGS...]
#   ROWS: all (default; the issue's rows), main (the headline rows), mamba2 (the Mamba-2 rows of main and
#   mamba2-130m), pieces (the 16k row at several --batch-tokens)
set -uo pipefail
cli=$1 rows=${2:-all}
shift $(( $# >= 2 ? 2 : 1 ))
extra=("$@")
run() {  # name, bench args...
  local name=$1; shift
  local out
  out=$(timeout 120 "$cli" bench --device cuda -g 1 -r 3 --json "$@" "${extra[@]}" 2>&1 | grep '^{' | tail -1)
  if [ -z "$out" ]; then echo "$name  FAILED"; return; fi
  python3 - "$name" "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[2])
print(f"{sys.argv[1]:<34} {j['prefill_ms']:9.2f} ms {j['prefill_tokens_per_s']:10.0f} tok/s")
PY
}
m27=(--shape mamba2-2.7b)
case "$rows" in
  main | mamba2)
    run "2.7b 4k f32 fast" "${m27[@]}" -p 4096
    run "2.7b 16k f32 fast" "${m27[@]}" -p 16384
    run "2.7b b32x512 bf16 fast" "${m27[@]}" -b 32 -p 512 --state-dtype bf16
    if [ "$rows" = main ]; then
      run "2.8b 4k f32 fast" --shape mamba-2.8b -p 4096
    else
      run "mamba2-130m 4k fast" --shape mamba2-130m -p 4096
    fi ;;
  pieces)
    for bt in 2048 4096 8192 16384; do run "2.7b 16k f32 fast bt$bt" "${m27[@]}" -p 16384 --batch-tokens $bt; done
    for bt in 2048 4096; do run "2.7b 4k f32 fast bt$bt" "${m27[@]}" -p 4096 --batch-tokens $bt; done ;;
  *)
    run "2.7b 4k f32 fast" "${m27[@]}" -p 4096
    run "2.7b 4k bf16 fast" "${m27[@]}" -p 4096 --state-dtype bf16
    run "2.7b 4k f32 exact" "${m27[@]}" -p 4096 --precision exact
    run "2.7b 4k bf16 exact" "${m27[@]}" -p 4096 --state-dtype bf16 --precision exact
    run "2.7b 16k f32 fast" "${m27[@]}" -p 16384
    run "2.7b 16k bf16 fast" "${m27[@]}" -p 16384 --state-dtype bf16
    run "2.7b 16k f32 exact" "${m27[@]}" -p 16384 --precision exact
    run "2.8b 4k f32 fast" --shape mamba-2.8b -p 4096
    run "2.8b 16k f32 fast" --shape mamba-2.8b -p 16384
    run "mamba2-130m 4k fast" --shape mamba2-130m -p 4096
    run "mamba-130m 4k fast" --shape mamba-130m -p 4096
    run "2.7b b32x512 bf16 fast" "${m27[@]}" -b 32 -p 512 --state-dtype bf16 ;;
esac
