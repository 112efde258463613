// mambacpp/gguf.h: a checkpoint directory or a GGUF file, written as GGUF for llama.cpp.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/gguf_export.h"
#include "io/gguf_model.h"
#include "io/gguf_vocab_export.h"
#include "mambacpp/error.h"
#include "mambacpp/gguf.h"

namespace mambacpp {

QuantizeReport quantize_to_gguf(const std::string& model_path, const std::string& type, const std::string& out_path) {
  namespace fs = std::filesystem;
  const GgufTarget target = parse_gguf_target(type);
  std::error_code ec;
  if (fs::equivalent(model_path, out_path, ec))
    fail("quantize: --out '", out_path, "' is the input model itself; write to another file");
  GgufWriter w;
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<GgufModel> gm;
  ModelConfig config;
  WeightSource source;
  const bool from_gguf = fs::is_regular_file(model_path, ec);
  if (from_gguf) {
    gm = std::make_unique<GgufModel>(model_path);
    config = gm->config();
    source = [g = gm.get()](const std::string& n) { return g->find(n); };
  } else {
    ck = std::make_unique<Checkpoint>(model_path);
    config = ck->config();
    source = gguf_source_of(*ck);
  }
  gguf_add_model(w, config, source, target);
  w.set_string("general.name", fs::path(model_path).filename().string());
  if (from_gguf) gguf_copy_vocab(gm->file(), w);
  else if (fs::exists(fs::path(model_path) / "tokenizer.json"))
    gguf_add_vocab((fs::path(model_path) / "tokenizer.json").string(), config, w);
  else {
    // No vocabulary: a placeholder llama.cpp loads (it needs one) and runs from token ids; mambacpp sees the marker
    // and encodes no text with it.
    std::vector<std::string> tokens;
    for (int64_t i = 0; i < config.vocab_size; ++i) tokens.push_back("<t" + std::to_string(i) + ">");
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "default");
    w.set_strings("tokenizer.ggml.tokens", std::move(tokens));
    w.set_ints("tokenizer.ggml.token_type", GgufType::I32, std::vector<int64_t>(static_cast<size_t>(config.vocab_size), 1));
    w.set_strings("tokenizer.ggml.merges", {});
    w.set_bool("mambacpp.vocab_placeholder", true);
    gguf_add_chat_template(model_path, {}, w);
  }
  w.write(out_path);
  QuantizeReport r;
  r.tensors = static_cast<int64_t>(gguf_tensor_names(config).size());
  r.bytes = static_cast<uint64_t>(fs::file_size(out_path));
  return r;
}

}  // namespace mambacpp
