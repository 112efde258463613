#include "io/gguf_vocab_export.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mambacpp/error.h"

namespace mambacpp {

namespace {

// llama.cpp's token types (llama_token_type).
constexpr int64_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// The pre-tokenizer regex of Llama-3 (llama.cpp's "llama-bpe").
constexpr const char* kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

// llama.cpp's name for the pre-tokenizer of a tokenizer.json, or an error naming what it found.
std::string pre_name(const nlohmann::json& pre, const std::string& path) {
  if (pre.is_object() && pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true) &&
      !pre.value("add_prefix_space", false))
    return "gpt-2";  // the GPT-2 split regex, as GPT-NeoX's ByteLevel applies it
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers")) {
    const auto& seq = pre["pretokenizers"];
    if (seq.size() == 2 && seq[0].value("type", "") == "Split" && seq[0].contains("pattern") &&
        seq[0]["pattern"].value("Regex", "") == kLlama3Split && seq[1].value("type", "") == "ByteLevel" &&
        !seq[1].value("use_regex", true))
      return "llama-bpe";
  }
  fail(path, ": pre_tokenizer ", pre.dump().substr(0, 200),
       " has no llama.cpp pre-tokenizer known to mambacpp (supported: GPT-2/GPT-NeoX ByteLevel, Llama-3's Split); "
       "llama.cpp would split text differently");
}

}  // namespace

void gguf_add_vocab(const std::string& path, const ModelConfig& config, GgufWriter& w) {
  const nlohmann::json j = read_json(path);
  if (!j.contains("model") || j["model"].value("type", "") != "BPE")
    fail(path, ": model.type must be BPE to be written as llama.cpp's gpt2 vocabulary");
  const nlohmann::json& model = j["model"];
  const std::string pre = pre_name(j.value("pre_tokenizer", nlohmann::json()), path);
  std::map<int64_t, std::string> by_id;
  std::map<int64_t, int64_t> types;
  for (const auto& [tok, id] : model.at("vocab").items()) {
    by_id[id.get<int64_t>()] = tok;
    types[id.get<int64_t>()] = kNormal;
  }
  if (j.contains("added_tokens"))
    for (const auto& t : j["added_tokens"]) {
      const int64_t id = t.at("id").get<int64_t>();
      by_id[id] = t.at("content").get<std::string>();
      types[id] = t.value("special", false) ? kControl : kUserDefined;
    }
  const int64_t n = std::max<int64_t>(config.vocab_size, by_id.empty() ? 0 : by_id.rbegin()->first + 1);
  if (n > config.vocab_size)
    fail(path, ": token id ", n - 1, " lies past the embedding's ", config.vocab_size,
         " rows; llama.cpp needs one row per token");
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<int64_t> toktypes(static_cast<size_t>(n), kUnused);
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";  // as llama.cpp's converter pads
    } else {
      tokens[static_cast<size_t>(i)] = it->second;
      toktypes[static_cast<size_t>(i)] = types[i];
    }
  }
  std::vector<std::string> merges;
  for (const auto& m : model.value("merges", nlohmann::json::array())) {
    if (m.is_string()) merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else fail(path, ": model.merges holds ", m.dump().substr(0, 80), "; expected \"a b\" or [a, b]");
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_strings("tokenizer.ggml.tokens", std::move(tokens));
  w.set_ints("tokenizer.ggml.token_type", GgufType::I32, std::move(toktypes));
  w.set_strings("tokenizer.ggml.merges", std::move(merges));
  // A post-processor that puts a special token first (Llama-3's TemplateProcessing) means "add BOS".
  bool add_bos = false;
  const nlohmann::json pp = j.value("post_processor", nlohmann::json());
  if (pp.is_object() && pp.value("type", "") == "TemplateProcessing" && pp.contains("single") && !pp["single"].empty())
    add_bos = pp["single"][0].contains("SpecialToken");
  w.set_bool("tokenizer.ggml.add_bos_token", add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  const std::string cfg = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  if (std::filesystem::exists(cfg)) {
    const nlohmann::json tc = read_json(cfg);
    if (tc.contains("chat_template") && tc["chat_template"].is_string())
      w.set_string("tokenizer.chat_template", tc["chat_template"].get<std::string>());
  }
}

void gguf_copy_vocab(const GgufFile& from, GgufWriter& w) {
  for (const std::string& k : from.keys())
    if (k.rfind("tokenizer.", 0) == 0) w.set(k, *from.find(k));
}

}  // namespace mambacpp
