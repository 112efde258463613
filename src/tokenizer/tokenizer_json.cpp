// Tokenizer::load: reads an HF tokenizer.json and builds the BPE tokenizer, rejecting (with the file, the JSON path
// of the part and the type found there) every component whose behaviour we do not reproduce exactly.
#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mambacpp/error.h"
#include "core/file_bytes.h"
#include "core/json_limits.h"
#include "mambacpp/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/utf8.h"

namespace mambacpp {
namespace {

using nlohmann::json;

// Token ids size the id -> token tables (two strings and a flag per id), so they are bounded: below 2^22 (4,194,304)
// ids the tables stay under about 300 MB, and the largest real vocabularies have about 262,144 entries.
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

// The "type" field of a component, or "?" when it has none.
std::string type_of(const json& j) {
  if (j.is_null()) return "null";
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "?";
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) fail(where, ".", key, ": expected true or false, found ", json_excerpt(j[key]));
  return j[key].get<bool>();
}

std::string string_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) {
    fail(where, ".", key, ": expected a string, found ", j.contains(key) ? json_excerpt(j[key]) : std::string("nothing"));
  }
  return j[key].get<std::string>();
}

std::optional<std::string> optional_string(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_string()) fail(where, ".", key, ": expected a string or null, found ", json_excerpt(j[key]));
  return j[key].get<std::string>();
}

size_t count_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_unsigned()) {
    fail(where, ".", key, ": expected a non-negative integer, found ",
         j.contains(key) ? json_excerpt(j[key]) : std::string("nothing"));
  }
  return j[key].get<size_t>();
}

// One character (Metaspace's replacement, Strip's content), as UTF-8.
std::string char_field(const json& j, const char* key, const std::string& where) {
  std::string s = string_field(j, key, where);
  size_t i = 0;
  if (s.empty() || tok::first_invalid_utf8(s) != s.size() || (tok::next_code_point(s, i), i != s.size())) {
    fail(where, ".", key, ": expected one character, found \"", s, "\"");
  }
  return s;
}

const json& array_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_array()) fail(where, ".", key, ": expected an array");
  return j[key];
}

std::string at_index(const std::string& where, const char* key, size_t i) {
  return where + "." + key + "[" + std::to_string(i) + "]";
}

// {"String": s} or {"Regex": r}, as the Split pre-tokenizer and the Replace normaliser and decoder hold patterns.
std::shared_ptr<const tok::SplitPattern> parse_pattern(const json& j, const std::string& where) {
  const std::string at = where + ".pattern";
  if (!j.contains("pattern") || !j["pattern"].is_object() || j["pattern"].size() != 1) {
    fail(at, ": expected {\"String\": ...} or {\"Regex\": ...}, found ",
         j.contains("pattern") ? json_excerpt(j["pattern"]) : std::string("nothing"));
  }
  const json& p = j["pattern"];
  if (p.contains("String") && p["String"].is_string()) {
    return std::make_shared<tok::SplitPattern>(tok::SplitPattern::literal(p["String"].get<std::string>()));
  }
  if (p.contains("Regex") && p["Regex"].is_string()) {
    try {
      return std::make_shared<tok::SplitPattern>(tok::SplitPattern::regex(p["Regex"].get<std::string>()));
    } catch (const Error& e) {
      fail(at, ".Regex: ", e.what());
    }
  }
  fail(at, ": expected {\"String\": ...} or {\"Regex\": ...}, found ", json_excerpt(p));
}

void parse_normalizer(const json& j, const std::string& where, std::vector<tok::NormalizerStep>& steps) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  using S = tok::NormalizerStep;
  if (type == "Sequence") {
    const json& list = array_field(j, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i) parse_normalizer(list[i], at_index(where, "normalizers", i), steps);
  } else if (type == "NFC") {
    steps.push_back(S(S::NFC));
  } else if (type == "NFD") {
    steps.push_back(S(S::NFD));
  } else if (type == "NFKC") {
    steps.push_back(S(S::NFKC));
  } else if (type == "NFKD") {
    steps.push_back(S(S::NFKD));
  } else if (type == "Lowercase") {
    steps.push_back(S(S::Lowercase));
  } else if (type == "Strip") {
    S s(S::Strip);
    s.strip_left = flag(j, "strip_left", true, where);
    s.strip_right = flag(j, "strip_right", true, where);
    steps.push_back(s);
  } else if (type == "Prepend") {
    S s(S::Prepend);
    s.text = string_field(j, "prepend", where);
    steps.push_back(s);
  } else if (type == "Replace") {
    S s(S::Replace);
    s.pattern = parse_pattern(j, where);
    s.text = string_field(j, "content", where);
    steps.push_back(s);
  } else {
    fail(where, ": unsupported normalizer type '", type,
         "' (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, null)");
  }
}

tok::SplitBehavior parse_behavior(const json& j, const std::string& where, tok::SplitBehavior fallback) {
  if (!j.contains("behavior")) return fallback;
  const std::string b = j["behavior"].is_string() ? j["behavior"].get<std::string>() : json_excerpt(j["behavior"]);
  if (b == "Removed") return tok::SplitBehavior::Removed;
  if (b == "Isolated") return tok::SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return tok::SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return tok::SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return tok::SplitBehavior::Contiguous;
  fail(where, ".behavior: unsupported split behavior '", b,
       "' (supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

// Metaspace's prepend_scheme, or for files older than it, add_prefix_space (true: always, false: never).
tok::PreTokenizerStep::Prepend parse_prepend_scheme(const json& j, const std::string& where) {
  using P = tok::PreTokenizerStep;
  if (!j.contains("prepend_scheme")) return flag(j, "add_prefix_space", true, where) ? P::Always : P::Never;
  const std::string s = j["prepend_scheme"].is_string() ? j["prepend_scheme"].get<std::string>() : "?";
  if (s == "always") return P::Always;
  if (s == "first") return P::First;
  if (s == "never") return P::Never;
  fail(where, ".prepend_scheme: expected \"always\", \"first\" or \"never\", found ", json_excerpt(j["prepend_scheme"]));
}

std::shared_ptr<const tok::SplitPattern> char_class(tok::CharClass c) {
  return std::make_shared<tok::SplitPattern>(tok::SplitPattern::char_class(c));
}

void parse_pre_tokenizer(const json& j, const std::string& where, std::vector<tok::PreTokenizerStep>& steps) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  using S = tok::PreTokenizerStep;
  auto split = [&](std::shared_ptr<const tok::SplitPattern> pattern, tok::SplitBehavior behavior, bool invert) {
    S s(S::Split);
    s.pattern = std::move(pattern);
    s.behavior = behavior;
    s.invert = invert;
    steps.push_back(s);
  };
  if (type == "Sequence") {
    const json& list = array_field(j, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) parse_pre_tokenizer(list[i], at_index(where, "pretokenizers", i), steps);
  } else if (type == "Split") {
    split(parse_pattern(j, where), parse_behavior(j, where, tok::SplitBehavior::Isolated),
          flag(j, "invert", false, where));
  } else if (type == "ByteLevel") {
    S s(S::ByteLevel);
    s.byte_level.add_prefix_space = flag(j, "add_prefix_space", true, where);
    s.byte_level.trim_offsets = flag(j, "trim_offsets", true, where);
    s.byte_level.use_regex = flag(j, "use_regex", true, where);
    s.byte_level_splitter = std::make_shared<tok::ByteLevelSplitter>(s.byte_level);
    steps.push_back(s);
  } else if (type == "Metaspace") {
    S s(S::Metaspace);
    s.replacement = char_field(j, "replacement", where);
    s.prepend = parse_prepend_scheme(j, where);
    s.metaspace_split = flag(j, "split", true, where);
    s.pattern = std::make_shared<tok::SplitPattern>(tok::SplitPattern::literal(s.replacement));
    steps.push_back(s);
  } else if (type == "Digits") {
    split(char_class(tok::CharClass::Numeric),
          flag(j, "individual_digits", false, where) ? tok::SplitBehavior::Isolated : tok::SplitBehavior::Contiguous,
          false);
  } else if (type == "Punctuation") {
    split(char_class(tok::CharClass::Punctuation), parse_behavior(j, where, tok::SplitBehavior::Isolated), false);
  } else if (type == "Whitespace") {
    // Words and runs of other non-space characters are kept; the whitespace between them goes.
    static const auto words = std::make_shared<tok::SplitPattern>(tok::SplitPattern::regex("\\w+|[^\\w\\s]+"));
    split(words, tok::SplitBehavior::Removed, true);
  } else if (type == "WhitespaceSplit") {
    split(char_class(tok::CharClass::WhiteSpace), tok::SplitBehavior::Removed, false);
  } else if (type == "BertPreTokenizer") {
    split(char_class(tok::CharClass::WhiteSpace), tok::SplitBehavior::Removed, false);
    split(char_class(tok::CharClass::Punctuation), tok::SplitBehavior::Isolated, false);
  } else if (type == "CharDelimiterSplit") {
    split(std::make_shared<tok::SplitPattern>(tok::SplitPattern::literal(char_field(j, "delimiter", where))),
          tok::SplitBehavior::Removed, false);
  } else {
    fail(where, ": unsupported pre_tokenizer type '", type,
         "' (supported: Sequence, Split, ByteLevel, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit, "
         "BertPreTokenizer, CharDelimiterSplit, null)");
  }
}

void parse_decoder(const json& j, const std::string& where, std::vector<tok::DecoderStep>& steps) {
  const std::string type = type_of(j);
  using S = tok::DecoderStep;
  if (type == "Sequence") {
    const json& list = array_field(j, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i) parse_decoder(list[i], at_index(where, "decoders", i), steps);
  } else if (type == "ByteLevel") {
    steps.push_back(S(S::ByteLevel));
  } else if (type == "Replace") {
    S s(S::Replace);
    s.pattern = parse_pattern(j, where);
    s.content = string_field(j, "content", where);
    steps.push_back(s);
  } else if (type == "ByteFallback") {
    steps.push_back(S(S::ByteFallback));
  } else if (type == "Fuse") {
    steps.push_back(S(S::Fuse));
  } else if (type == "Strip") {
    S s(S::Strip);
    s.content = char_field(j, "content", where);
    s.start = count_field(j, "start", where);
    s.stop = count_field(j, "stop", where);
    steps.push_back(s);
  } else if (type == "Metaspace") {
    S s(S::Metaspace);
    s.content = char_field(j, "replacement", where);
    s.prepend = parse_prepend_scheme(j, where) != tok::PreTokenizerStep::Never;
    steps.push_back(s);
  } else {
    fail(where, ": unsupported decoder type '", type,
         "' (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, null)");
  }
}

bool valid_id(const json& id) {
  return id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= kMaxTokenId;
}

// The id of a special token named by a post-processor (["token", id]).
int32_t token_id_field(const json& pair, const std::string& where) {
  if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !valid_id(pair[1])) {
    fail(where, ": expected [\"token\", id in [0, 2^22)], found ", json_excerpt(pair));
  }
  return pair[1].get<int32_t>();
}

void parse_post_processor(const json& j, const std::string& where, PostProcessing& out) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  // Each processor wraps what the ones before it produced.
  auto wrap = [&](const std::vector<int32_t>& before, const std::vector<int32_t>& after) {
    out.before.insert(out.before.begin(), before.begin(), before.end());
    out.after.insert(out.after.end(), after.begin(), after.end());
  };
  if (type == "Sequence") {
    const json& list = array_field(j, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) parse_post_processor(list[i], at_index(where, "processors", i), out);
  } else if (type == "ByteLevel") {
    // Only trims offsets, which we do not report.
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    if (!j.contains("cls") || !j.contains("sep")) fail(where, ": expected \"cls\" and \"sep\"");
    wrap({token_id_field(j["cls"], where + ".cls")}, {token_id_field(j["sep"], where + ".sep")});
  } else if (type == "TemplateProcessing") {
    const json& single = array_field(j, "single", where);
    if (!j.contains("special_tokens") || !j["special_tokens"].is_object()) {
      fail(where, ".special_tokens: expected an object");
    }
    std::vector<int32_t> before, after;
    int sequences = 0;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& piece = single[i];
      const std::string at = at_index(where, "single", i);
      if (piece.is_object() && piece.contains("Sequence")) {
        if (!piece["Sequence"].contains("id") || piece["Sequence"]["id"] != "A") {
          fail(at, ": expected the sequence $A in a single-sequence template, found ", json_excerpt(piece));
        }
        ++sequences;
      } else if (piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
                 piece["SpecialToken"]["id"].is_string()) {
        const std::string name = piece["SpecialToken"]["id"].get<std::string>();
        const json& specials = j["special_tokens"];
        if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
          fail(at, ": special token '", name, "' has no ids in ", where, ".special_tokens");
        }
        for (const json& id : specials[name]["ids"]) {
          if (!valid_id(id)) fail(where, ".special_tokens['", name, "'].ids: expected ids in [0, 2^22)");
          (sequences ? after : before).push_back(id.get<int32_t>());
        }
      } else {
        fail(at, ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}, found ", json_excerpt(piece));
      }
    }
    if (sequences != 1) fail(where, ".single: expected $A exactly once, found it ", sequences, " times");
    wrap(before, after);
  } else {
    fail(where, ": unsupported post_processor type '", type,
         "' (supported: Sequence, ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing, null)");
  }
}

std::unique_ptr<tok::BpeModel> parse_model(const json& j, const std::string& where) {
  std::string type = type_of(j);
  if (type != "BPE") fail(where, ": unsupported model type '", type, "' (supported: BPE)");
  if (j.contains("dropout") && !j["dropout"].is_null()) {
    fail(where, ".dropout: expected null (deterministic BPE), found ", json_excerpt(j["dropout"]));
  }
  tok::BpeOptions options;
  options.continuing_subword_prefix = optional_string(j, "continuing_subword_prefix", where).value_or("");
  options.end_of_word_suffix = optional_string(j, "end_of_word_suffix", where).value_or("");
  options.unk_token = optional_string(j, "unk_token", where);
  options.fuse_unk = flag(j, "fuse_unk", false, where);
  options.byte_fallback = flag(j, "byte_fallback", false, where);
  options.ignore_merges = flag(j, "ignore_merges", false, where);

  if (!j.contains("vocab") || !j["vocab"].is_object()) fail(where, ".vocab: expected an object of token -> id");
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(j["vocab"].size());
  std::unordered_map<int32_t, std::string> seen_ids;
  for (const auto& [token, id] : j["vocab"].items()) {
    if (!valid_id(id)) {
      fail(where, ".vocab['", token, "']: expected an id in [0, 2^22), found ", json_excerpt(id));
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
        // "left right": exactly one space separates the parts (HF refuses anything else in this form).
        const std::string& s = m.get_ref<const std::string&>();
        size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          fail(where, ".merges[", i, "]: expected \"left right\" with one space, found \"", s, "\"");
        }
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        fail(where, ".merges[", i, "]: expected \"left right\" or [\"left\", \"right\"], found ", json_excerpt(m));
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
        t["id"].get<int64_t>() > kMaxTokenId || !t.contains("content") || !t["content"].is_string()) {
      fail(at, ": expected {\"id\": int in [0, 2^22), \"content\": string, ...}, found ", json_excerpt(t));
    }
    tok::AddedToken a;
    a.id = t["id"].get<int32_t>();
    a.content = t["content"].get<std::string>();
    a.special = flag(t, "special", false, at);
    a.single_word = flag(t, "single_word", false, at);
    a.lstrip = flag(t, "lstrip", false, at);
    a.rstrip = flag(t, "rstrip", false, at);
    a.normalized = flag(t, "normalized", !a.special, at);  // HF's default: special tokens are not normalised
    if (a.content.empty()) continue;                       // HF ignores empty added tokens
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  const json j = parse_json_bounded(read_file_bytes(path, "tokenizer"), path);
  if (!j.is_object()) fail(path, ": expected a JSON object at the top level");
  const std::string where = path;
  if (!j.contains("model")) fail(where, ": no 'model' section");
  // encode() must equal HF's encode without truncation or padding, so a file that asks for either is refused.
  for (const char* key : {"truncation", "padding"}) {
    if (j.contains(key) && !j[key].is_null()) fail(where, ": ", key, " is set (", json_excerpt(j[key]), "); expected null");
  }
  tok::Pipeline pipeline;
  std::vector<tok::NormalizerStep> normalizer;
  parse_normalizer(j.value("normalizer", json()), where + ": normalizer", normalizer);
  pipeline.normalizer = tok::Normalizer(std::move(normalizer));
  std::vector<tok::PreTokenizerStep> pre_tokenizer;
  parse_pre_tokenizer(j.value("pre_tokenizer", json()), where + ": pre_tokenizer", pre_tokenizer);
  pipeline.pre_tokenizer = tok::PreTokenizer(std::move(pre_tokenizer));
  if (const json d = j.value("decoder", json()); !d.is_null()) {
    std::vector<tok::DecoderStep> decoder;
    parse_decoder(d, where + ": decoder", decoder);
    pipeline.decoder = tok::Decoder(std::move(decoder));
  }
  parse_post_processor(j.value("post_processor", json()), where + ": post_processor", pipeline.post_processing);
  auto model = parse_model(j["model"], where + ": model");
  auto added = parse_added_tokens(j.value("added_tokens", json()), where + ": added_tokens");
  return std::make_unique<tok::BpeTokenizer>(std::move(model), std::move(pipeline), std::move(added));
}

}  // namespace mambacpp
