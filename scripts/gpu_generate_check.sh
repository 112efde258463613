#!/usr/bin/env bash
# On the GPU: `mambacpp generate --prompts-file` (one batch, different lengths) gives each prompt the tokens it gets
# alone, greedy and seeded sampling, with and without CUDA graphs. Usage: gpu_generate_check.sh MAMBACPP LOGDIR
set -euo pipefail
cli=$1 log=$2
prompts=$log/prompts.txt
printf 'def parse_args(\nimport os\nclass Config(object):\n    return self.\n' >"$prompts"
fail=0
for mode in "--temp 0" "--temp 0.9 --seed 5" "--temp 0 --no-cuda-graph"; do
  "$cli" generate --device cuda --prompts-file "$prompts" --json -n 48 $mode >"$log/batch.jsonl"
  i=0
  while IFS= read -r line; do
    printf '%s\n' "$line" >"$log/one.txt"
    extra=$mode
    [[ $mode == *--seed* ]] && extra="--temp 0.9 --seed $((5 + i))"
    alone=$("$cli" generate --device cuda --prompts-file "$log/one.txt" --json -n 48 $extra)
    batched=$(sed -n "$((i + 1))p" "$log/batch.jsonl")
    a=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$alone")
    b=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$batched")
    if [ "$a" == "$b" ]; then echo "ok   [$mode] prompt $i"; else echo "DIFF [$mode] prompt $i: alone $a batched $b"; fail=1; fi
    i=$((i + 1))
  done <"$prompts"
done
g=$("$cli" generate --device cuda -p "def parse_args(" --json -n 64 --temp 0 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
e=$("$cli" generate --device cuda -p "def parse_args(" --json -n 64 --temp 0 --no-cuda-graph | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
[ "$g" == "$e" ] && echo "ok   graph == eager tokens" || { echo "DIFF graph vs eager: $g / $e"; fail=1; }
exit $fail
