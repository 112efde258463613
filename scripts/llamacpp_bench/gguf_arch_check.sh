#!/usr/bin/env bash
# Every architecture through GGUF both ways: each checkpoint fixture (transformers-made, with its logits.npy) written
# as an F32 GGUF by `mambacpp quantize`, then
#   - ours on the file against the fixture's logits (compare_source.mjs: max |logit difference|; for a derived
#     checkpoint without them, fixtures/gguf_llamacpp/falcon_h1_*, against ours on the checkpoint);
#   - llama.cpp (node-llama-cpp's prebuilt CPU build, gguf_logits.mjs) on the same file against ours
#     with an f32 KV cache (compare_logits.mjs: max |log-probability difference| over tokens with log p > -20, argmax agreement).
# Prints one line per fixture; a file llama.cpp refuses is reported with its message.
#   bash scripts/llamacpp_bench/gguf_arch_check.sh build/mambacpp [fixture dirs...]
set -uo pipefail
M=$(realpath "${1:?usage: gguf_arch_check.sh MAMBACPP [FIXTURE_DIR...]}"); shift
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
fixtures=("$@")
[ ${#fixtures[@]} -gt 0 ] || fixtures=("$root"/fixtures/models/* "$root"/fixtures/hybrid/* "$root"/fixtures/moe/* \
                                        "$root"/fixtures/falcon_h1/* "$root"/fixtures/gguf_llamacpp/falcon_h1_*/ \
                                        "$root"/fixtures/gguf_llamacpp/nemotron_h_moe_*/)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for d in "${fixtures[@]}"; do
  [ -f "$d/config.json" ] && [ -f "$d/tokens.txt" ] || continue
  name=$(basename "$d"); g="$tmp/$name.gguf"
  if ! err=$("$M" quantize --model "$d" --type f32 --out "$g" 2>&1 >/dev/null); then
    echo "$name: quantize refuses: $(echo "$err" | tail -1)"; continue
  fi
  tr -s ' \n' ' ' < "$d/tokens.txt" > "$tmp/toks.txt"
  if ! err=$("$M" logits --model "$g" --device cpu --tokens-file "$tmp/toks.txt" --out "$tmp/ours.npy" 2>&1); then
    echo "$name: mambacpp refuses the file: $(echo "$err" | tail -1)"; continue
  fi
  # A derived checkpoint without transformers logits (make_falcon_h1_variant.py): ours on the checkpoint instead.
  ref="$d/logits.npy"
  if [ ! -f "$ref" ]; then
    "$M" logits --model "$d" --device cpu --tokens-file "$tmp/toks.txt" --out "$tmp/ref.npy" >/dev/null 2>&1
    ref="$tmp/ref.npy"
  fi
  src=$(node "$here/compare_source.mjs" --ours "$tmp/ours.npy" --ref "$ref" --tol 1e-4)
  if ! err=$(cd "$here" && node gguf_logits.mjs --model "$g" --tokens "$(cat "$tmp/toks.txt")" --gen 4 --kv f32 \
               --out "$tmp/ll.json" 2>&1); then
    echo "$name: ours_vs_source $src; llama.cpp refuses: $(echo "$err" | grep -m1 -iE 'error|fail' | cut -c1-200)"
    continue
  fi
  ll=$(node "$here/compare_logits.mjs" --ours "$tmp/ours.npy" --theirs "$tmp/ll.json" --tol 1e-3)
  echo "$name: ours_vs_source $src; ours_vs_llama.cpp $ll"
done
