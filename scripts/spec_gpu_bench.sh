#!/usr/bin/env bash
# Speculative decoding on the GPU (issue 53's rows): greedy `generate` of random-weight mamba2-2.7b without
# speculation, with prompt lookup and with draft models (a random mamba2-130m: other weights, so it shows the cost of
# drafts that are rejected; the target's own first 8 layers; the target itself: every draft accepted), at batch 1
# and 8. Prompts are token ids (the random checkpoints have no tokenizer): 192 pseudo-random ids followed by their
# first 32 again (an "editing" prompt: the answer's start is in the prompt). Every row of a batch gives the same tokens
# (the hash column). GPU machine; makes its checkpoints with dev/random_hf_mamba2.py (torch + transformers).
#   scripts/spec_gpu_bench.sh BUILD_DIR [WORK_DIR]   (DEVICE=cpu runs it on the CPU)
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1/mambacpp work=${2:-/tmp/spec_gpu}
mkdir -p "$work"
[ -f "$work/t27/config.json" ] || python3 dev/random_hf_mamba2.py mamba2-2.7b "$work/t27" || exit 1
[ -f "$work/d130/config.json" ] || python3 dev/random_hf_mamba2.py mamba2-130m "$work/d130" || exit 1
[ -f "$work/t27-l8/config.json" ] || python3 scripts/make_layer_skip_draft.py "$work/t27" 8 "$work/t27-l8" > /dev/null || exit 1
python3 - "$work" <<'PY'
import random, sys
for b in range(8):
    rnd = random.Random(b)
    ids = [rnd.randrange(1000, 50000) for _ in range(192)]
    open(f"{sys.argv[1]}/p{b}.txt", "w").write(" ".join(map(str, ids + ids[:32])))
PY
run() {  # name batch reps args...
  local name=$1 batch=$2 reps=$3; shift 3
  local files=()
  for b in $(seq 0 $((batch - 1))); do files+=(--tokens-file "$work/p$b.txt"); done
  for rep in $(seq "$reps"); do
    timeout 120 "$bin" generate --device "${DEVICE:-cuda}" --model "$work/t27" "${files[@]}" -n 256 --temp 0 --ignore-eos --json "$@" \
      | python3 -c 'import json,sys; print(json.dumps([json.loads(l) for l in sys.stdin if l.startswith("{")]))'
  done | python3 -c '
import json, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]
if not runs or not runs[0]: print(f"| {sys.argv[1]} | failed |"); sys.exit()
# A batch run: every row shares the wall clock, so tokens/s is the sum over rows of one run (median over runs).
tps = sorted(sum(r["timings"]["generate_tokens_per_s"] for r in run) for run in runs)[len(runs) // 2]
d = sum(r["draft_tokens"] for r in runs[0]); a = sum(r["accepted_draft_tokens"] for r in runs[0])
h = hash(tuple(tuple(r["tokens"]) for r in runs[0])) & 0xffff
print(f"| {sys.argv[1]} | {sys.argv[2]} | {tps:.1f} | {d} | {a} | {100 * a / d if d else 0:.0f}% | {h:04x} |")
' "$name" "$batch"
}
nvidia-smi --query-gpu=name --format=csv,noheader
echo "| speculation | batch | decode tokens/s (median) | drafted | accepted | acceptance | tokens hash |"
echo "|---|---|---|---|---|---|---|"
run none 1 3
run "--draft-ngram 3" 1 3 --draft-ngram 3
run "--draft-ngram 3 --draft-max 8" 1 1 --draft-ngram 3 --draft-max 8
run "--draft-model random mamba2-130m" 1 1 --draft-model "$work/d130"
run "--draft-model first 8 layers" 1 1 --draft-model "$work/t27-l8"
run "--draft-model itself" 1 1 --draft-model "$work/t27"
run none 8 2
run "--draft-ngram 3" 8 2 --draft-ngram 3
run "--draft-model first 8 layers" 8 1 --draft-model "$work/t27-l8"
