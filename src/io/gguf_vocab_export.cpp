#include "io/gguf_vocab_export.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mambacpp/error.h"

namespace mambacpp {

namespace {

// llama.cpp's token types (llama_token_type).
constexpr int64_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

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

nlohmann::ordered_json read_ordered_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open");
  try {
    return nlohmann::ordered_json::parse(in);
  } catch (const std::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whether a tokenizer.json is SentencePiece-style (Llama-2, Mistral, Jamba): a BPE with byte fallback over text whose
// spaces became U+2581 with one put in front, by a Prepend + Replace normaliser or a Metaspace pre-tokenizer that
// does not split. llama.cpp's "llama" vocabulary does the same.
bool is_sentencepiece_style(const nlohmann::json& j) {
  const std::string mark = "\xE2\x96\x81";  // U+2581
  if (!j.contains("model") || j["model"].value("type", "") != "BPE" || !j["model"].value("byte_fallback", false))
    return false;
  const nlohmann::json norm = j.value("normalizer", nlohmann::json()), pre = j.value("pre_tokenizer", nlohmann::json());
  if (norm.is_object() && norm.value("type", "") == "Sequence" && pre.is_null()) {
    const auto& n = norm.value("normalizers", nlohmann::json::array());
    return n.size() == 2 && n[0].value("type", "") == "Prepend" && n[0].value("prepend", "") == mark &&
           n[1].value("type", "") == "Replace" && n[1].value("content", "") == mark && n[1].contains("pattern") &&
           n[1]["pattern"].value("String", "") == " ";
  }
  if (norm.is_null() && pre.is_object() && pre.value("type", "") == "Metaspace")
    return pre.value("replacement", "") == mark && !pre.value("split", true) &&
           pre.value("prepend_scheme", "always") != "never";
  return false;
}

// llama.cpp's "llama" vocabulary from a SentencePiece-style tokenizer.json. llama.cpp merges the adjacent pair whose
// concatenation is the token of highest score; a BPE merges the pair of lowest rank. So a token's score is minus the
// rank of the first merge that makes it (tokens no merge makes rank below all of them), which gives the BPE's order
// whenever the merges list every pair that forms a token, as SentencePiece-converted tokenizers do.
void add_spm_vocab(const nlohmann::json& j, const std::string& path, const ModelConfig& config, GgufWriter& w) {
  const nlohmann::json& model = j["model"];
  std::map<int64_t, std::string> by_id;
  std::map<int64_t, int64_t> types;
  for (const auto& [tok, id] : model.at("vocab").items()) {
    by_id[id.get<int64_t>()] = tok;
    const bool byte = tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>';
    types[id.get<int64_t>()] = byte ? kByte : kNormal;
  }
  std::map<std::string, int64_t> id_of;
  for (const auto& [id, tok] : by_id) id_of.emplace(tok, id);
  if (model.contains("unk_token") && model["unk_token"].is_string())
    if (auto it = id_of.find(model["unk_token"].get<std::string>()); it != id_of.end()) {
      types[it->second] = kUnknown;
      w.set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(it->second));
    }
  if (j.contains("added_tokens"))
    for (const auto& t : j["added_tokens"]) {
      const int64_t id = t.at("id").get<int64_t>();
      by_id[id] = t.at("content").get<std::string>();
      if (types.count(id) && types[id] == kUnknown) continue;
      types[id] = t.value("special", false) ? kControl : kUserDefined;
    }
  const int64_t n = std::max<int64_t>(config.vocab_size, by_id.empty() ? 0 : by_id.rbegin()->first + 1);
  if (n > config.vocab_size)
    fail(path, ": token id ", n - 1, " lies past the embedding's ", config.vocab_size,
         " rows; llama.cpp needs one row per token");
  const nlohmann::json merges = model.value("merges", nlohmann::json::array());
  std::map<std::string, double> score_of;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& m = merges[r];
    std::string joined;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) fail(path, ": model.merges[", r, "] is \"", s, "\"; expected \"a b\"");
      joined = s.substr(0, space) + s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      joined = m[0].get<std::string>() + m[1].get<std::string>();
    } else {
      fail(path, ": model.merges holds ", m.dump().substr(0, 80), "; expected \"a b\" or [a, b]");
    }
    score_of.emplace(joined, -static_cast<double>(r));  // the first merge that makes it
  }
  const double unmerged = -static_cast<double>(merges.size()) - 1.0;
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<int64_t> toktypes(static_cast<size_t>(n), kUnused);
  std::vector<double> scores(static_cast<size_t>(n), unmerged);
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
      continue;
    }
    tokens[static_cast<size_t>(i)] = it->second;
    toktypes[static_cast<size_t>(i)] = types[i];
    if (auto s = score_of.find(it->second); s != score_of.end()) scores[static_cast<size_t>(i)] = s->second;
    else if (types[i] == kNormal && it->second.size() > 1) scores[static_cast<size_t>(i)] = unmerged;
    else scores[static_cast<size_t>(i)] = 0.0;  // characters, bytes and special tokens: never a merge's result
  }
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  // The tokens the post-processor puts around a text are the BOS (and EOS) llama.cpp adds: their ids and flags.
  bool add_bos = false, add_eos = false;
  const nlohmann::json pp = j.value("post_processor", nlohmann::json());
  if (pp.is_object() && pp.value("type", "") == "TemplateProcessing" && pp.contains("single") && !pp["single"].empty()) {
    const nlohmann::json& single = pp["single"];
    auto special_id = [&](const nlohmann::json& piece) -> int64_t {
      if (!piece.contains("SpecialToken")) return -1;
      const std::string name = piece["SpecialToken"].value("id", "");
      for (int64_t i = 0; i < n; ++i)
        if (tokens[static_cast<size_t>(i)] == name) return i;
      return -1;
    };
    if (const int64_t bos = special_id(single.front()); bos >= 0) {
      add_bos = true;
      w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
    }
    if (const int64_t eos = single.size() > 1 ? special_id(single.back()) : -1; eos >= 0) {
      add_eos = true;
      w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos));
    }
  }
  gguf_add_chat_template(std::filesystem::path(path).parent_path().string(), tokens, w);
  w.set_strings("tokenizer.ggml.tokens", std::move(tokens));
  w.set_floats("tokenizer.ggml.scores", std::move(scores));
  w.set_ints("tokenizer.ggml.token_type", GgufType::I32, std::move(toktypes));
  w.set_bool("tokenizer.ggml.add_bos_token", add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", add_eos);
  w.set_bool("tokenizer.ggml.add_space_prefix", true);
}

}  // namespace

void gguf_add_vocab(const std::string& path, const ModelConfig& config, GgufWriter& w) {
  const nlohmann::json j = read_json(path);
  if (is_sentencepiece_style(j)) return add_spm_vocab(j, path, config, w);
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
  gguf_add_chat_template(std::filesystem::path(path).parent_path().string(), tokens, w);
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
}

void gguf_add_chat_template(const std::string& model_dir, const std::vector<std::string>& tokens, GgufWriter& w) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  nlohmann::ordered_json config;
  if (fs::exists(dir / "tokenizer_config.json")) config = read_ordered_json((dir / "tokenizer_config.json").string());
  // (name, template) in the order found; "default" is the one a chat uses unless told otherwise. transformers takes
  // chat_template.jinja (and additional_chat_templates/*.jinja) over tokenizer_config.json's chat_template.
  std::vector<std::pair<std::string, std::string>> templates;
  if (fs::is_regular_file(dir / "chat_template.jinja")) {
    templates.emplace_back("default", read_text(dir / "chat_template.jinja"));
    std::error_code ec;
    std::vector<fs::path> more;
    for (const auto& e : fs::directory_iterator(dir / "additional_chat_templates", ec))
      if (e.path().extension() == ".jinja") more.push_back(e.path());
    std::sort(more.begin(), more.end());
    for (const fs::path& p : more) templates.emplace_back(p.stem().string(), read_text(p));
  } else if (config.is_object() && config.contains("chat_template")) {
    const auto& t = config["chat_template"];
    if (t.is_string()) {
      templates.emplace_back("default", t.get<std::string>());
    } else if (t.is_array()) {
      for (const auto& e : t)
        if (e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") &&
            e["template"].is_string())
          templates.emplace_back(e["name"].get<std::string>(), e["template"].get<std::string>());
    } else if (!t.is_null()) {
      fail((dir / "tokenizer_config.json").string(), ": chat_template: expected a string or a list of {name, template}");
    }
  }
  // As llama.cpp's gguf writer stores them: the default under tokenizer.chat_template, the others under
  // tokenizer.chat_template.<name> (characters other than letters and digits replaced by '_'), listed in
  // tokenizer.chat_templates.
  std::vector<std::string> names;
  for (const auto& [raw_name, text] : templates) {
    std::string name = raw_name;
    for (char& c : name)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    if (name == "default") {
      w.set_string("tokenizer.chat_template", text);
    } else if (!name.empty()) {
      w.set_string("tokenizer.chat_template." + name, text);
      names.push_back(name);
    }
  }
  if (!names.empty()) w.set_strings("tokenizer.chat_templates", names);
  // The special tokens a template reads (bos_token, eos_token, ...) are the texts of the file's special token ids
  // (llama.cpp's converter also takes tokenizer_config.json's over config.json's ids), so a template renders from
  // the GGUF as it does from the directory.
  if (!config.is_object() || tokens.empty()) return;
  static const std::pair<const char*, const char*> kSpecial[] = {
      {"bos_token", "tokenizer.ggml.bos_token_id"},       {"eos_token", "tokenizer.ggml.eos_token_id"},
      {"unk_token", "tokenizer.ggml.unknown_token_id"},   {"pad_token", "tokenizer.ggml.padding_token_id"},
      {"sep_token", "tokenizer.ggml.seperator_token_id"}, {"cls_token", "tokenizer.ggml.cls_token_id"},
      {"mask_token", "tokenizer.ggml.mask_token_id"}};
  for (const auto& [field, key] : kSpecial) {
    if (!config.contains(field)) continue;
    const auto& v = config[field];
    const std::string text = v.is_string()                                                        ? v.get<std::string>()
                             : v.is_object() && v.contains("content") && v["content"].is_string() ? v["content"].get<std::string>()
                                                                                                  : std::string();
    if (text.empty()) continue;
    const auto it = std::find(tokens.begin(), tokens.end(), text);
    if (it != tokens.end()) w.set_u32(key, static_cast<uint32_t>(it - tokens.begin()));
  }
}

void gguf_copy_vocab(const GgufFile& from, GgufWriter& w) {
  for (const std::string& k : from.keys())
    if (k.rfind("tokenizer.", 0) == 0) w.set(k, *from.find(k));
}

}  // namespace mambacpp
