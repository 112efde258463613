#!/usr/bin/env bash
# Records what llama.cpp (node-llama-cpp's prebuilt CPU build) does with files mambacpp writes, for
# tests/gguf_llamacpp_test.cpp, which runs without node or network:
#   fixtures/gguf_llamacpp/<fixture>.llamacpp.json: llama.cpp's log-probabilities (f32 KV cache, no flash attention)
#     on the F32 GGUF `mambacpp quantize` writes from a checkpoint fixture, at the fixture's tokens;
#   fixtures/gguf_llamacpp/default_<type>.tensors.json: llama.cpp's quantizer (llama_model_quantize, no importance
#     matrix) on the F32 GGUF of models/default: every tensor's ggml type and the FNV-1a 64 of its bytes.
#   bash scripts/llamacpp_bench/make_llamacpp_fixtures.sh build/mambacpp [fixture...]
# With fixtures named (paths under fixtures/, e.g. moe/jamba_f32), only their log-probabilities are recorded.
set -euo pipefail
M=$(realpath "${1:?usage: make_llamacpp_fixtures.sh MAMBACPP [fixture...]}"); shift
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
out="$root/fixtures/gguf_llamacpp"; mkdir -p "$out"
bins="$here/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# falcon_h1_norm_after_gate_mlp_bias and falcon_h1_tied are made by make_falcon_h1_variant.py, nemotron_h_moe_grouped
# by make_nemotron_h_moe_variant.py (forms llama.cpp runs that the transformers fixtures only hold beside biases or
# layers it lacks).
list=(models/mamba1_bf16_tied models/mamba2_bf16_sharded hybrid/nemotron_h_f32 falcon_h1/falcon_h1_f32
      gguf_llamacpp/falcon_h1_norm_after_gate_mlp_bias gguf_llamacpp/falcon_h1_tied moe/granite_moe_all_f32
      moe/jamba_f32 gguf_llamacpp/nemotron_h_moe_grouped)
[ $# -gt 0 ] && list=("$@")
for f in "${list[@]}"; do
  d="$root/fixtures/$f"; name=$(basename "$f")
  "$M" quantize --model "$d" --type f32 --out "$tmp/$name.gguf" >/dev/null
  (cd "$here" && node gguf_logits.mjs --model "$tmp/$name.gguf" --tokens "$(tr -s ' \n' ' ' < "$d/tokens.txt")" \
     --gen 4 --kv f32 --out "$tmp/ll.json")
  python3 - "$tmp/ll.json" "$out/$name.llamacpp.json" "fixtures/$f" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rec = {"generator": "scripts/llamacpp_bench/make_llamacpp_fixtures.sh", "llama_cpp": "node-llama-cpp 3.21.1",
       "fixture": sys.argv[3], "kv_cache": "f32, flash attention off", "tokens": j["tokens"],
       "logprobs": [{k: v for k, v in row.items() if v > -20} for row in j["logprobs"]], "greedy": j["greedy"]}
json.dump(rec, open(sys.argv[2], "w"))
PY
done
[ $# -gt 0 ] && exit 0
git clone -q "$here/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$tmp/llama.cpp" 2>/dev/null
g++ -O1 -std=c++17 -I"$tmp/llama.cpp/include" -I"$tmp/llama.cpp/ggml/include" "$here/llama_quantize.cpp" \
    -o "$tmp/llama_quantize" "$bins"/libllama.v*.so -Wl,-rpath,"$bins"
"$M" quantize --model "$root/models/default" --type f32 --out "$tmp/default.gguf" >/dev/null
for t in q8_0 q4_k_m q6_k; do
  "$tmp/llama_quantize" "$tmp/default.gguf" "$tmp/default_$t.gguf" "$t" >/dev/null 2>&1
  python3 "$here/gguf_compare_tensors.py" --hashes "$tmp/default_$t.gguf" > "$out/default_$t.tensors.json"
done
