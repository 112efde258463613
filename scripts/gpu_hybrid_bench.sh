#!/usr/bin/env bash
# Hybrid-model figures of issue 15 on the GPU machine: builds nothing, runs `mambacpp bench` on random bf16 weights of
# the named hybrid shapes (prefill of a 4096-token prompt; decode at batch 1/32/128 with 1k and 16k contexts), each
# row a median of -r runs, and prints a table last (the floors: docs/benchmarks.md "Hybrid models on the GPU").
# Usage: gpu_hybrid_bench.sh MAMBACPP [LOGDIR]   (ROWS="..." picks rows by name; EXTRA adds options to every row)
set -u -o pipefail
cli=$1 log=${2:-${OUT:-/tmp/gpu_hybrid}}
mkdir -p "$log"
row() {  # row NAME TIMEOUT ARGS...
  local name=$1 limit=$2; shift 2
  if [ -n "${ROWS:-}" ] && [[ " $ROWS " != *" $name "* ]]; then return 0; fi
  timeout "$limit" "$cli" bench --device cuda --json "$@" ${EXTRA:-} | sed "s/^{/{\"row\":\"$name\",/" \
    | tee -a "$log/hybrid.jsonl" || echo "row $name failed"
}
for m in granite-4.0-h-1b nemotron-h-8b bamba-9b; do
  row "${m}_prefill4k" 120 --shape "$m" -b 1 -p 4096 -g 0 -r 3
  for b in 1 32 128; do row "${m}_b${b}_1k" 150 --shape "$m" -b "$b" -p 1024 -g 32 -r 3; done
  row "${m}_b1_16k" 120 --shape "$m" -b 1 -p 16384 -g 16 -r 2
  row "${m}_b32_16k" 240 --shape "$m" -b 32 -p 16384 -g 8 -r 1  # 524k prompt tokens per run
done
# The serving load of vLLM's published Bamba-9B figure (prompts ~200-600, outputs ~200).
row bamba-9b_serve 300 --shape bamba-9b --serve --requests 256 --min-prompt 200 --max-prompt 600 -g 200 --max-seqs 128 -r 2
python3 - "$log/hybrid.jsonl" <<'PY'
import json, sys
print(f"{'row':28} {'B':>4} {'prompt':>6} {'prefill tok/s':>13} {'ms/step':>8} {'floor ms':>8} {'% floor':>7}")
for line in open(sys.argv[1]):
    try: j = json.loads(line)
    except ValueError: continue
    if j.get('mode') == 'serve':
        print(f"{j['row']:28} serve {j['requests']} req, {j['generated_tokens_per_s']:.0f} generated tok/s, wall {j['wall_ms']:.0f} ms, "
              f"ttft p50 {j['ttft_ms_p50']:.0f} ms, itl p50 {j['itl_ms_p50']:.2f} ms; closed batch {j['closed_batch']['generated_tokens_per_s']:.0f} tok/s")
        continue
    print(f"{j['row']:28} {j['batch']:>4} {j['prompt']:>6} {j['prefill_tokens_per_s']:>13.0f} {j['decode_ms_per_step']:>8.3f} "
          f"{j['decode_floor_ms_per_step']:>8.3f} {j['decode_floor_percent']:>7.1f}")
PY
