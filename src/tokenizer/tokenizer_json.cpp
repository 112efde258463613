// Tokenizer::load: reads an HF tokenizer.json and builds the byte-level BPE tokenizer, rejecting (with the file
// and the part named) every component whose behaviour we do not reproduce exactly.
#include <climits>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"

namespace mambacpp {
namespace {

using nlohmann::json;

// The "type" field of a component, or "?" when it has none.
std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "?";
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) fail(where, ".", key, ": expected true or false, found ", j[key].dump());
  return j[key].get<bool>();
}

void parse_normalizer(const json& j, const std::string& where, std::vector<tok::NormalizerKind>& steps) {
  if (j.is_null()) return;
  std::string type = type_of(j);
  if (type == "NFC") {
    steps.push_back(tok::NormalizerKind::NFC);
  } else if (type == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
    for (size_t i = 0; i < j["normalizers"].size(); ++i) {
      parse_normalizer(j["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]", steps);
    }
  } else {
    fail(where, ": unsupported normalizer type '", type, "' (supported: NFC, Sequence of NFC, null)");
  }
}

tok::ByteLevelOptions parse_pre_tokenizer(const json& j, const std::string& where) {
  std::string type = type_of(j);
  if (type != "ByteLevel") {
    fail(where, ": unsupported pre_tokenizer type '", j.is_null() ? std::string("null") : type,
         "' (supported: ByteLevel)");
  }
  tok::ByteLevelOptions o;
  o.add_prefix_space = flag(j, "add_prefix_space", true, where);
  o.trim_offsets = flag(j, "trim_offsets", true, where);
  o.use_regex = flag(j, "use_regex", true, where);
  return o;
}

void check_decoder(const json& j, const std::string& where) {
  std::string type = type_of(j);
  if (type != "ByteLevel") {
    fail(where, ": unsupported decoder type '", j.is_null() ? std::string("null") : type, "' (supported: ByteLevel)");
  }
}

std::optional<std::string> optional_string(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_string()) fail(where, ".", key, ": expected a string or null, found ", j[key].dump());
  return j[key].get<std::string>();
}

std::unique_ptr<tok::BpeModel> parse_model(const json& j, const std::string& where) {
  std::string type = type_of(j);
  if (type != "BPE") fail(where, ": unsupported model type '", type, "' (supported: BPE)");
  if (j.contains("dropout") && !j["dropout"].is_null()) {
    fail(where, ".dropout: expected null (deterministic BPE), found ", j["dropout"].dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (auto v = optional_string(j, key, where); v && !v->empty()) {
      fail(where, ".", key, ": expected null (byte-level BPE has none), found '", *v, "'");
    }
  }
  tok::BpeOptions options;
  options.unk_token = optional_string(j, "unk_token", where);
  options.fuse_unk = flag(j, "fuse_unk", false, where);
  options.byte_fallback = flag(j, "byte_fallback", false, where);
  options.ignore_merges = flag(j, "ignore_merges", false, where);

  if (!j.contains("vocab") || !j["vocab"].is_object()) fail(where, ".vocab: expected an object of token -> id");
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(j["vocab"].size());
  std::unordered_map<int32_t, std::string> seen_ids;
  for (const auto& [token, id] : j["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      fail(where, ".vocab['", token, "']: expected a non-negative 32-bit id, found ", id.dump());
    }
    int32_t v = id.get<int32_t>();
    if (auto [it, fresh] = seen_ids.emplace(v, token); !fresh) {
      fail(where, ".vocab: id ", v, " is given to both '", it->second, "' and '", token, "'");
    }
    vocab.emplace(token, v);
  }

  std::vector<std::pair<std::string, std::string>> merges;
  if (j.contains("merges")) {
    if (!j["merges"].is_array()) fail(where, ".merges: expected an array");
    merges.reserve(j["merges"].size());
    for (size_t i = 0; i < j["merges"].size(); ++i) {
      const json& m = j["merges"][i];
      if (m.is_string()) {
        // "left right": byte-level tokens never contain a real space, so exactly one space separates the parts.
        const std::string& s = m.get_ref<const std::string&>();
        size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          fail(where, ".merges[", i, "]: expected \"left right\" with one space, found \"", s, "\"");
        }
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        fail(where, ".merges[", i, "]: expected \"left right\" or [\"left\", \"right\"], found ", m.dump());
      }
    }
  }
  return std::make_unique<tok::BpeModel>(std::move(vocab), merges, std::move(options), where);
}

std::vector<tok::AddedToken> parse_added_tokens(const json& j, const std::string& where) {
  std::vector<tok::AddedToken> out;
  if (j.is_null()) return out;
  if (!j.is_array()) fail(where, ": expected an array");
  for (size_t i = 0; i < j.size(); ++i) {
    const json& t = j[i];
    std::string at = where + "[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() > INT32_MAX || !t.contains("content") || !t["content"].is_string()) {
      fail(at, ": expected {\"id\": non-negative int, \"content\": string, ...}, found ", t.dump());
    }
    tok::AddedToken a;
    a.id = t["id"].get<int32_t>();
    a.content = t["content"].get<std::string>();
    a.special = flag(t, "special", false, at);
    a.single_word = flag(t, "single_word", false, at);
    a.lstrip = flag(t, "lstrip", false, at);
    a.rstrip = flag(t, "rstrip", false, at);
    a.normalized = flag(t, "normalized", !a.special, at);  // HF's default: special tokens are not normalised
    if (a.content.empty()) continue;                         // HF ignores empty added tokens
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("tokenizer: cannot open '", path, "'");
  std::ostringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::parse_error& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  if (!j.is_object()) fail(path, ": expected a JSON object at the top level");
  const std::string where = path;
  if (!j.contains("model")) fail(where, ": no 'model' section");
  // encode() must equal HF's encode without truncation or padding, so a file that asks for either is refused.
  for (const char* key : {"truncation", "padding"}) {
    if (j.contains(key) && !j[key].is_null()) fail(where, ": ", key, " is set (", j[key].dump(), "); expected null");
  }
  // The post-processor only adds special tokens (not asked for here) and trims offsets (not reported): any is fine.
  std::vector<tok::NormalizerKind> steps;
  parse_normalizer(j.value("normalizer", json()), where + ": normalizer", steps);
  tok::ByteLevelOptions pre = parse_pre_tokenizer(j.value("pre_tokenizer", json()), where + ": pre_tokenizer");
  check_decoder(j.value("decoder", json()), where + ": decoder");
  auto model = parse_model(j["model"], where + ": model");
  auto added = parse_added_tokens(j.value("added_tokens", json()), where + ": added_tokens");
  return std::make_unique<tok::ByteLevelBpeTokenizer>(std::move(model), tok::Normalizer(std::move(steps)), pre,
                                                      std::move(added));
}

}  // namespace mambacpp
