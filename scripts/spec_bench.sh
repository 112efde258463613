#!/usr/bin/env bash
# Speculative decoding on the CPU: generate's decode tokens/s and acceptance without speculation, with prompt lookup
# (--draft-ngram) and with draft models, on an editing prompt (a method of fixtures/heldout.txt, then the same method
# begun again: much of the answer is in the prompt) and on a free prompt. Greedy, so every row of a prompt gives the
# same tokens (the hash column). LAYERS2: the shipped model's first 2 of 8 layers (scripts/make_layer_skip_draft.py).
#   scripts/spec_bench.sh [BUILD_DIR] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/mambacpp
threads=${2:-1}
draft2=$(mktemp -d)
trap 'rm -rf "$draft2"' EXIT
python3 scripts/make_layer_skip_draft.py models/default 2 "$draft2" > /dev/null

edit_prompt="$(sed -n 66,112p fixtures/heldout.txt)
$(sed -n 66,70p fixtures/heldout.txt)"
free_prompt='import os
import sys


def main():
'
run() {  # name, prompt, extra args...
  local name=$1 prompt=$2
  shift 2
  for rep in 1 2 3; do
    OMP_NUM_THREADS=$threads "$bin" generate --device cpu --threads "$threads" --temp 0 --ignore-eos -n 256 --json \
      -p "$prompt" "$@"
  done | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
tps = sorted(r["timings"]["generate_tokens_per_s"] for r in rows)[1]
d, a = rows[0]["draft_tokens"], rows[0]["accepted_draft_tokens"]
toks = tuple(rows[0]["tokens"])
spec = (sys.argv[2] or "none").replace(sys.argv[3], "LAYERS2")
print(f"| {sys.argv[1]} | {spec} | {tps:.0f} | {d} | {a} | {100 * a / d if d else 0:.0f}% | {hash(toks) & 0xffff:04x} |")
' "$name" "$*" "$draft2"
}
echo "| prompt | speculation | decode tokens/s (median of 3) | drafted | accepted | acceptance | tokens hash |"
echo "|---|---|---|---|---|---|---|"
for p in edit free; do
  prompt=$edit_prompt
  [ $p = free ] && prompt=$free_prompt
  run $p "$prompt"
  for k in 2 4 8; do run $p "$prompt" --draft-ngram 3 --draft-max $k; done
  run $p "$prompt" --draft-ngram 3 --draft-max 4 --draft-fixed
  run $p "$prompt" --draft-model "$draft2" --draft-max 4
  run $p "$prompt" --draft-model models/default --draft-max 4
done
