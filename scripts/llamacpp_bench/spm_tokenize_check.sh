#!/usr/bin/env bash
# llama.cpp's tokenization of SentencePiece-style ("llama") GGUF vocabularies written by `mambacpp quantize`, kept as
# the fixtures tests/gguf_spm_tokenizer_test.cpp compares mambacpp's own GGUF tokenizer with.
#   (cd scripts/llamacpp_bench && npm ci)   # once: node-llama-cpp, llama.cpp prebuilt
#   bash scripts/llamacpp_bench/spm_tokenize_check.sh build/mambacpp
# For each SentencePiece-style tokenizer.json of fixtures/tokenizers (spm_llama2: Prepend + Replace normaliser;
# spm_metaspace: Metaspace pre-tokenizer, added tokens), the shipped model's weights with that tokenizer are written as
# GGUF (f16), and llama.cpp tokenizes the tokenizer fixture's texts, texts around its special tokens and the first
# 6,000 characters of fixtures/heldout.txt through that file. Output: fixtures/gguf_tokenizer/<name>.llamacpp.json.
set -euo pipefail
M=$(realpath "${1:-build/mambacpp}")
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$root/fixtures/gguf_tokenizer"
for name in spm_llama2 spm_metaspace; do
  mkdir -p "$tmp/$name"
  cp "$root/models/default/config.json" "$root/models/default/model.safetensors" "$tmp/$name/"
  cp "$root/fixtures/tokenizers/$name/tokenizer.json" "$tmp/$name/"
  "$M" quantize --model "$tmp/$name" --type f16 --out "$tmp/$name.gguf" > /dev/null
  python3 - "$root" "$name" "$tmp/$name.texts.json" <<'PY'
import json, sys
root, name, out = sys.argv[1:4]
cases = json.load(open(f"{root}/fixtures/tokenizers/{name}/cases.json"))["encode"]
texts = [c["text"] for c in cases]
texts += ["<s>Hello</s> world", "a<s>b", " <s> x", "</s></s>", "[INST] What is 2+2? [/INST] 4</s>",
          "<think>step</think>answer", "<unk> unknown", "🦙 llamas — naïve café 東京\n\n\ttabs", "\n", "  two  spaces  ",
          "x" * 300, "ǅungla ﬁ ᾳ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
texts.append(open(f"{root}/fixtures/heldout.txt", encoding="utf-8").read()[:6000])
json.dump(texts, open(out, "w"), ensure_ascii=False)
PY
  (cd "$root/scripts/llamacpp_bench" && node gguf_tokenize.mjs --model "$tmp/$name.gguf" --texts "$tmp/$name.texts.json" \
     --out "$root/fixtures/gguf_tokenizer/$name.llamacpp.json")
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['model']='$name (models/default + fixtures/tokenizers/$name/tokenizer.json, quantize --type f16)'; json.dump(d, open(sys.argv[1],'w'), ensure_ascii=False)" "$root/fixtures/gguf_tokenizer/$name.llamacpp.json"
  echo "$name: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(len(d['texts']), 'texts,', sum(map(len, d['ids'])), 'tokens')" "$root/fixtures/gguf_tokenizer/$name.llamacpp.json")"
done
