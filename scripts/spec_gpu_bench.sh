#!/usr/bin/env bash
# Speculative decoding on the GPU (issue 53's rows): greedy `generate` of random-weight mamba2-2.7b without
# speculation, with prompt lookup and with draft models (a random mamba2-130m: other weights, so it shows the cost of
# drafts that are rejected; the target's own first 8 layers; the target itself: every draft accepted), at batch 1
# and 8. Prompts are token ids (the random checkpoints have no tokenizer): 192 pseudo-random ids followed by their
# first 32 again (an "editing" prompt: the answer's start is in the prompt). Every row of a batch gives the same tokens
# (the hash column). GPU machine; makes its checkpoints with dev/random_hf_mamba2.py (torch + transformers).
#   scripts/spec_gpu_bench.sh BUILD_DIR [WORK_DIR]
# Controlled acceptance (the "tail x S" rows): targets whose layers from the draft's L_D on add S times their output
# to the residual stream (scripts/make_layer_skip_draft.py --tail-scale), drafted by the first L_D layers: the draft
# agrees with the target at a rate set by S while the target reads every weight (the step cost of the real shape).
# SCALES at batch 1 and 8: the acceptance a scale gives depends on the shape's random weights (mamba2-130m, 3 layers:
# 1 -> 97%, 1.25 -> 92%, 1.5 -> 40%, 2 -> 8%, with --draft-fixed); default "1.25 1.4 1.75" on the CPU, and on the GPU
# "0.25 0.5 1 2" (not measured there yet: read the acceptance column; each scale is a 5.4 GB copy of the target).
# DEVICE=cpu: the mamba2-130m shape (SHAPE), L_D 3, THREADS 2, N 128 tokens, checkpoints by dev/write_random_checkpoint.cpp
# (compiled against BUILD_DIR's libmambacpp.a; the "random mamba2-130m" draft is then a random 4-layer model).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1/mambacpp work=${2:-/tmp/spec_gpu}
device=${DEVICE:-cuda}
mkdir -p "$work"
if [ "$device" = cpu ]; then
  shape=${SHAPE:-mamba2-130m} ld=${L_D:-3} n=${N:-128} extra=(--threads "${THREADS:-2}")
  t=$work/t-$shape d=$work/d-$shape
  writer=$work/write_ckpt
  [ -x "$writer" ] || c++ -O2 -std=c++20 -fopenmp -Isrc -Itests -Iinclude -DMAMBACPP_FIXTURE_DIR='"fixtures"' \
      -DMAMBACPP_SOURCE_DIR='"."' -DMAMBACPP_BINARY='"build/mambacpp"' dev/write_random_checkpoint.cpp \
      tests/support/test_support.cpp "$1/libmambacpp.a" -lgomp -lpcre2-8 -lutf8proc -lz -lhwy -o "$writer" || exit 1
  [ -f "$t/config.json" ] || "$writer" "$shape" "$t" || exit 1
  [ -f "$d/config.json" ] || "$writer" "$shape" "$d" 4 || exit 1
else
  shape=mamba2-2.7b ld=${L_D:-8} n=${N:-256} extra=()
  t=$work/t27 d=$work/d130
  [ -f "$t/config.json" ] || python3 dev/random_hf_mamba2.py mamba2-2.7b "$t" || exit 1
  [ -f "$d/config.json" ] || python3 dev/random_hf_mamba2.py mamba2-130m "$d" || exit 1
fi
tl=$t-l$ld
[ -f "$tl/config.json" ] || python3 scripts/make_layer_skip_draft.py "$t" "$ld" "$tl" > /dev/null || exit 1
if [ "$device" = cpu ]; then scales=${SCALES:-1.25 1.4 1.75}; else scales=${SCALES:-0.25 0.5 1 2}; fi
for s in $scales; do
  [ -f "$t-s$s/config.json" ] || python3 scripts/make_layer_skip_draft.py --tail-scale "$s" "$t" "$ld" "$t-s$s" > /dev/null || exit 1
done
python3 - "$work" <<'PY'
import random, sys
for b in range(8):
    rnd = random.Random(b)
    ids = [rnd.randrange(1000, 50000) for _ in range(192)]
    open(f"{sys.argv[1]}/p{b}.txt", "w").write(" ".join(map(str, ids + ids[:32])))
PY
target=$t
run() {  # name batch reps args... (the target: $target)
  local name=$1 batch=$2 reps=$3; shift 3
  local files=()
  for b in $(seq 0 $((batch - 1))); do files+=(--tokens-file "$work/p$b.txt"); done
  for rep in $(seq "$reps"); do
    timeout 600 "$bin" generate --device "$device" --model "$target" "${files[@]}" -n "$n" --temp 0 --ignore-eos --json "${extra[@]}" "$@" \
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
if [ "$device" = cpu ]; then lscpu | sed -n 's/^Model name: *//p'; echo "$shape, ${THREADS:-2} threads, $n tokens"
else nvidia-smi --query-gpu=name --format=csv,noheader; fi
echo "| speculation | batch | decode tokens/s (median) | drafted | accepted | acceptance | tokens hash |"
echo "|---|---|---|---|---|---|---|"
run none 1 3
run "--draft-ngram 3" 1 3 --draft-ngram 3
run "--draft-ngram 3 --draft-max 8" 1 1 --draft-ngram 3 --draft-max 8
run "--draft-model random mamba2-130m" 1 1 --draft-model "$d"
run "--draft-model first $ld layers" 1 1 --draft-model "$tl"
run "--draft-model itself" 1 1 --draft-model "$t"
run none 8 2
run "--draft-ngram 3" 8 2 --draft-ngram 3
run "--draft-model first $ld layers" 8 1 --draft-model "$tl"
# Controlled acceptance: each scale's own plain row beside its speculative one (the same shape and work as the
# unscaled target; the tokens differ).
for s in $scales; do
  target=$t-s$s
  run "tail x$s: none" 1 3
  run "tail x$s: --draft-model first $ld layers" 1 3 --draft-model "$tl"
  run "tail x$s: none" 8 2
  run "tail x$s: --draft-model first $ld layers" 8 2 --draft-model "$tl"
done
