#!/usr/bin/env bash
# `mambacpp quantize` against llama.cpp's own quantizer (llama_model_quantize from node-llama-cpp's prebuilt
# libllama, no importance matrix): each model is written as an F32 GGUF by mambacpp, then quantized by llama.cpp
# (q8_0, q4_k_m, q6_k, f16, bf16) and by mambacpp from the same model (q8_0, q4_k, q6_k, f16, bf16); the two files'
# tensors are compared type by type and byte by byte (gguf_compare_tensors.py). Needs `npm ci` here and g++.
#   bash scripts/llamacpp_bench/gguf_quantize_check.sh build/mambacpp [MODEL_DIR...]
set -uo pipefail
M=$(realpath "${1:?usage: gguf_quantize_check.sh MAMBACPP [MODEL_DIR...]}"); shift
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
models=("$@"); [ ${#models[@]} -gt 0 ] || models=("$root/models/default" "$root"/fixtures/hybrid/*_f32 "$root"/fixtures/models/mamba2_bf16_sharded)
bins="$here/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# llama.h of the release node-llama-cpp ships (its llama.cpp source travels as a git bundle).
git clone -q "$here/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$tmp/llama.cpp" 2>/dev/null
g++ -O1 -std=c++17 -I"$tmp/llama.cpp/include" -I"$tmp/llama.cpp/ggml/include" "$here/llama_quantize.cpp" \
    -o "$tmp/llama_quantize" "$bins"/libllama.v*.so -Wl,-rpath,"$bins" || exit 1
for d in "${models[@]}"; do
  name=$(basename "$d")
  "$M" quantize --model "$d" --type f32 --out "$tmp/src.gguf" >/dev/null 2>&1 || { echo "$name: quantize refuses"; continue; }
  for pair in q8_0:q8_0 q4_k:q4_k_m q6_k:q6_k f16:f16 bf16:bf16; do
    ours=${pair%%:*}; theirs=${pair##*:}
    "$M" quantize --model "$d" --type "$ours" --out "$tmp/ours.gguf" >/dev/null 2>&1
    if ! "$tmp/llama_quantize" "$tmp/src.gguf" "$tmp/theirs.gguf" "$theirs" >"$tmp/log" 2>&1; then
      echo "$name $ours: llama.cpp's quantizer failed: $(tail -1 "$tmp/log")"; continue
    fi
    echo "$name $ours vs llama.cpp $theirs: $(python3 "$here/gguf_compare_tensors.py" "$tmp/ours.gguf" "$tmp/theirs.gguf" | tr '\n' ' ')"
  done
done
