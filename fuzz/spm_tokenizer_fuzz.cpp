// The SentencePiece-style tokenizer of GGUF "llama" vocabularies (tokenizer/spm_tokenizer.h) on arbitrary bytes.
// The first input byte picks the mode and flags:
//   - bit 0 clear: a committed vocabulary (fixtures/tokenizers/spm_llama2, spm_metaspace) as `quantize` writes it to
//     GGUF and the file's reader builds it back (bit 1 picks which); the rest of the input is the text;
//   - bit 0 set: a vocabulary made from the input (a token count, then per token a header byte: length in bits 0-2,
//     llama.cpp token type 1..6 from bits 3-5; a score byte; the text bytes), the bos/eos/unk ids and
//     add_space_prefix from the flags; bit 1 adds the <0xNN> byte tokens and "▁" the vocabulary lacks. The rest is
//     the text.
// Inputs refused with mambacpp::Error (invalid UTF-8, a repeated token, a character with no token and no byte
// fallback) are expected. Accepted text must give ids in range that decode without failing; and where the made
// vocabulary has every byte token and only normal tokens, decoding gives the text back (what step 2 added removed).
// The same bytes read as ids decode without failing (unknown ids are skipped). Run:
//   ./spm_tokenizer_fuzz -max_len=4096 fuzz/corpus/spm_tokenizer
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_files.h"
#include "fuzz_target.h"
#include "io/gguf_file.h"
#include "io/gguf_vocab_export.h"
#include "io/gguf_writer.h"
#include "mambacpp/config.h"
#include "tokenizer/spm_tokenizer.h"

namespace {

using mambacpp::tok::SpmTokenizer;
using mambacpp::tok::SpmVocab;

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

// fixtures/tokenizers/<name>/tokenizer.json written as a GGUF "llama" vocabulary and read back as the loader reads it.
std::unique_ptr<SpmTokenizer> fixture_tokenizer(const mambacpp::fuzz::ScratchDir& dir, const std::string& name) {
  const std::string json = mambacpp::fuzz::source_dir() + "/fixtures/tokenizers/" + name + "/tokenizer.json";
  const nlohmann::json j = nlohmann::json::parse(mambacpp::fuzz::read_all(json));
  int64_t rows = 0;
  for (const auto& [tok, id] : j["model"]["vocab"].items()) rows = std::max(rows, id.get<int64_t>() + 1);
  for (const auto& t : j.value("added_tokens", nlohmann::json::array())) rows = std::max(rows, t["id"].get<int64_t>() + 1);
  mambacpp::ModelConfig config;
  config.vocab_size = rows;
  mambacpp::GgufWriter w;
  mambacpp::gguf_add_vocab(json, config, w);
  const std::string path = dir.path() + "/" + name + ".gguf";
  w.write(path);
  const mambacpp::GgufFile f(path);
  SpmVocab v;
  v.tokens = f.find("tokenizer.ggml.tokens")->strings;
  for (double s : f.find("tokenizer.ggml.scores")->floats) v.scores.push_back(static_cast<float>(s));
  v.token_types = f.find("tokenizer.ggml.token_type")->ints;
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", true);
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", true);
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  v.bos_id = f.get_int("tokenizer.ggml.bos_token_id", -1);
  v.eos_id = f.get_int("tokenizer.ggml.eos_token_id", -1);
  v.unk_id = f.get_int("tokenizer.ggml.unknown_token_id", -1);
  return std::make_unique<SpmTokenizer>(std::move(v), name);
}

const std::vector<std::unique_ptr<SpmTokenizer>>& fixture_tokenizers() {
  static const auto all = [] {
    const mambacpp::fuzz::ScratchDir dir;
    std::vector<std::unique_ptr<SpmTokenizer>> out;
    for (const char* name : {"spm_llama2", "spm_metaspace"}) out.push_back(fixture_tokenizer(dir, name));
    return out;
  }();
  return all;
}

// Encodes and decodes `text` (and the same bytes as ids); checks ids in range, and the round trip when asked.
void exercise(const SpmTokenizer& tok, std::string_view text, bool round_trip) {
  std::vector<int32_t> raw(text.size() / 4);
  if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * 4);
  (void)tok.decode(raw);
  (void)tok.decode(raw, /*skip_special=*/true);
  for (int32_t id : raw) {
    (void)tok.token_bytes(id);
    (void)tok.is_special(id);
  }
  const std::vector<int32_t> ids = tok.encode(text);
  for (int32_t id : ids) MAMBACPP_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  const std::string back = tok.decode(ids);
  (void)tok.decode(ids, /*skip_special=*/true);
  if (round_trip && text.find(kSpaceMark) == std::string_view::npos) MAMBACPP_FUZZ_CHECK(back == text);
}

}  // namespace

MAMBACPP_FUZZ_TARGET(spm_tokenizer) {
  if (size == 0) return;
  const uint8_t flags = data[0];
  if ((flags & 1) == 0) {
    const auto& all = fixture_tokenizers();
    exercise(*all[(flags >> 1) % all.size()], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1),
             false);
    return;
  }
  size_t pos = 1;
  auto next = [&]() -> int { return pos < size ? data[pos++] : -1; };
  SpmVocab v;
  const int n = next();
  bool only_normal = true;
  for (int i = 0; i < n && pos + 2 <= size; ++i) {
    const int header = next(), score = next();
    const size_t len = std::min<size_t>(static_cast<size_t>(header & 7), size - pos);
    std::string text(reinterpret_cast<const char*>(data) + pos, len);
    pos += len;
    const int64_t type = 1 + ((header >> 3) & 7) % 6;
    only_normal = only_normal && type == 1 && text.compare(0, 3, "<0x") != 0;
    v.tokens.push_back(std::move(text));
    v.scores.push_back(static_cast<float>(static_cast<int8_t>(score)) / 4.0f);
    v.token_types.push_back(type);
  }
  const bool byte_fallback = flags & 2;
  if (byte_fallback) {
    auto has = [&](const std::string& t) {
      for (const std::string& x : v.tokens)
        if (x == t) return true;
      return false;
    };
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string name = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
      if (has(name)) continue;
      v.tokens.push_back(name);
      v.scores.push_back(0.0f);
      v.token_types.push_back(6);
    }
    if (!has(std::string(kSpaceMark))) {
      v.tokens.emplace_back(kSpaceMark);
      v.scores.push_back(0.0f);
      v.token_types.push_back(1);
    }
  }
  const int64_t count = static_cast<int64_t>(v.tokens.size());
  v.add_space_prefix = flags & 4;
  v.add_bos = flags & 8;
  v.add_eos = flags & 16;
  v.bos_id = count ? (flags >> 5) % (count + 1) : -1;
  v.eos_id = count ? (flags >> 6) % (count + 1) : -1;
  v.unk_id = (flags & 128) && count ? count - 1 : -1;
  // A repeated token or an empty vocabulary is refused here (mambacpp::Error).
  const SpmTokenizer tok(std::move(v), "fuzz");
  // A token may equal the text "▁" only when it is the normal one added above; any other merge makes text.
  exercise(tok, std::string_view(reinterpret_cast<const char*>(data) + pos, size - pos),
           byte_fallback && only_normal);
}
