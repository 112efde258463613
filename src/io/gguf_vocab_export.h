// The vocabulary llama.cpp reads from GGUF (tokenizer.ggml.*), written from a tokenizer.json of a byte-level BPE
// (the GPT-NeoX family of Mamba models, Llama-3-style Split pre-tokenizers) so that llama.cpp tokenizes text as the
// tokenizer.json does, or copied from another GGUF file.
#pragma once

#include <string>
#include <vector>

#include "io/gguf_file.h"
#include "io/gguf_writer.h"
#include "mambacpp/config.h"

namespace mambacpp {

// tokenizer.ggml.model "gpt2", .pre (the llama.cpp pre-tokenizer of the same split regex), .tokens padded to the
// embedding's rows with [PAD<i>] tokens, .token_type, .merges, the add-bos flag, and the chat template beside it
// (gguf_add_chat_template). Throws naming the part of the tokenizer.json llama.cpp has no equivalent for.
void gguf_add_vocab(const std::string& tokenizer_json_path, const ModelConfig& config, GgufWriter& writer);
// The chat templates of `model_dir` (chat_template.jinja and additional_chat_templates/*.jinja, else
// tokenizer_config.json's chat_template: a string or a list of {name, template}) as llama.cpp stores them
// (tokenizer.chat_template, tokenizer.chat_template.<name>, tokenizer.chat_templates), and the ids of
// tokenizer_config.json's special tokens (bos_token, eos_token, ...) in `tokens` (the written vocabulary; empty for
// none) as tokenizer.ggml.*_token_id.
void gguf_add_chat_template(const std::string& model_dir, const std::vector<std::string>& tokens, GgufWriter& writer);
// Every tokenizer.* key of `from`.
void gguf_copy_vocab(const GgufFile& from, GgufWriter& writer);

}  // namespace mambacpp
