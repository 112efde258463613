#!/usr/bin/env bash
# Speculation on the CPU, two builds interleaved (issue 53): plain, OLD and NEW binaries in turn, REPS rounds, tail
# x S targets drafted by their first 3 layers, batch 8 and 1; tokens/s (summed over a batch's rows), drafted /
# accepted and a hash of the tokens (every column of a row gives the same tokens).
#   dev/cpu_spec_ab.sh OLD_BIN NEW_BIN
# The checkpoints and prompts are those of `DEVICE=cpu SCALES="1.75" scripts/spec_gpu_bench.sh build` (WORK, default
# /tmp/spec_gpu). Env: SCALES (1.75), BATCHES ("8 1"), REPS (3), N (64 tokens), THREADS (2).
set -uo pipefail
old=$1 new=$2 W=${WORK:-/tmp/spec_gpu} t=${WORK:-/tmp/spec_gpu}/t-mamba2-130m
one() {  # bin target batch args...
  local bin=$1 tg=$2 batch=$3; shift 3; local files=()
  for b in $(seq 0 $((batch - 1))); do files+=(--tokens-file "$W/p$b.txt"); done
  "$bin" generate --device cpu --threads "${THREADS:-2}" --model "$tg" "${files[@]}" -n "${N:-64}" --temp 0 --ignore-eos \
    --json "$@" 2>/dev/null | python3 -c '
import json, sys
rs = [json.loads(l) for l in sys.stdin if l.startswith("{")]
tps = sum(r["timings"]["generate_tokens_per_s"] for r in rs); d = sum(r["draft_tokens"] for r in rs); a = sum(r["accepted_draft_tokens"] for r in rs)
h = hash(tuple(tuple(r["tokens"]) for r in rs)) & 0xffff
print(f"{tps:8.1f} {d:4}/{a:4} {h:04x}", end="  ")'
}
lscpu | sed -n 's/^Model name: *//p'
for s in ${SCALES:-1.75}; do for batch in ${BATCHES:-8 1}; do for rep in $(seq "${REPS:-3}"); do
  echo -n "x$s b$batch: plain "; one "$new" "$t-s$s" "$batch"
  echo -n "| old "; one "$old" "$t-s$s" "$batch" --draft-model "$t-l3"
  echo -n "| new "; one "$new" "$t-s$s" "$batch" --draft-model "$t-l3"; echo
done; done; done
