// A tokenizer from a GGUF file's vocabulary (tokenizer.ggml.*, as llama.cpp's converter writes it). llama.cpp's
// "gpt2" model is a byte-level BPE whose split regex is named by tokenizer.ggml.pre ("gpt-2" and the GPT-NeoX family:
// ByteLevel's GPT-2 regex; "llama-bpe": Llama-3's Split), built from the same pipeline pieces as a tokenizer.json;
// its "llama" model is SentencePiece-style (scores, byte fallback: tokenizer/spm_tokenizer.h).
// Token types: 1 normal, 3 control (special added tokens, matched in text), 4 user-defined (non-special added
// tokens), 5 unused (padding rows), 2 unknown, 6 byte.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mambacpp/tokenizer.h"

namespace mambacpp {

// The tokenizer.* metadata, read by the caller from the file (the tokenizer layer does not parse GGUF).
struct GgufVocab {
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string> tokens;
  std::vector<int64_t> token_types;  // empty: every token normal
  std::vector<std::string> merges;   // "left right"
  std::vector<float> scores;         // tokenizer.ggml.scores ("llama")
  // The flags as the file gives them (absent: the model's default in llama.cpp, e.g. BOS added for "llama").
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  int64_t bos_id = -1, eos_id = -1, unk_id = -1;
};

// Throws naming `source` and the key for a vocabulary it cannot reproduce exactly (another model type, an unknown
// pre-tokenizer, a placeholder "none" vocabulary: run those from token ids).
std::unique_ptr<Tokenizer> tokenizer_from_gguf_vocab(const GgufVocab& vocab, const std::string& source);

}  // namespace mambacpp
