// mambacpp/model_tokenizer.h: here, above both io (the GGUF reader) and the tokenizer layer.
#include "mambacpp/model_tokenizer.h"

#include <filesystem>
#include <optional>

#include "io/gguf_file.h"
#include "mambacpp/error.h"
#include "tokenizer/gguf_vocab.h"

namespace mambacpp {

std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& path) {
  const bool gguf = path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
  if (!gguf) {
    const std::string json = path + "/tokenizer.json";
    return std::filesystem::exists(json) ? Tokenizer::load(json) : nullptr;
  }
  const GgufFile f(path);
  GgufVocab v;
  v.model = f.get_string("tokenizer.ggml.model", "none");
  if (v.model == "none" || v.model == "no_vocab" || f.get_bool("mambacpp.vocab_placeholder", false)) return nullptr;
  v.pre = f.get_string("tokenizer.ggml.pre", "");
  auto strings = [&](const char* key) -> std::vector<std::string> {
    const GgufValue* x = f.find(key);
    if (!x) return {};
    if (!x->is_array || x->type != GgufType::STRING) fail(path, ": key '", key, "' must be an array of strings");
    return x->strings;
  };
  v.tokens = strings("tokenizer.ggml.tokens");
  v.merges = strings("tokenizer.ggml.merges");
  if (const GgufValue* t = f.find("tokenizer.ggml.token_type")) {
    if (!t->is_array || !t->is_int()) fail(path, ": key 'tokenizer.ggml.token_type' must be an array of integers");
    v.token_types = t->ints;
  }
  if (const GgufValue* s = f.find("tokenizer.ggml.scores")) {
    if (!s->is_array || !s->is_float()) fail(path, ": key 'tokenizer.ggml.scores' must be an array of floats");
    v.scores.assign(s->floats.begin(), s->floats.end());
  }
  auto flag = [&](const char* key) -> std::optional<bool> {
    if (!f.find(key)) return std::nullopt;
    return f.get_bool(key, false);
  };
  v.add_bos = flag("tokenizer.ggml.add_bos_token");
  v.add_eos = flag("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = flag("tokenizer.ggml.add_space_prefix");
  v.bos_id = f.get_int("tokenizer.ggml.bos_token_id", -1);
  v.eos_id = f.get_int("tokenizer.ggml.eos_token_id", -1);
  v.unk_id = f.get_int("tokenizer.ggml.unknown_token_id", -1);
  return tokenizer_from_gguf_vocab(v, path);
}

}  // namespace mambacpp
