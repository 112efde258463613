// Encoding and decoding arbitrary bytes with the committed tokenizer families (fixtures/tokenizers/*, the shipped
// GPT-NeoX one): the first input byte picks the tokenizer, the rest is the text. encode() refuses invalid UTF-8 with
// mambacpp::Error; valid text must give ids in range. The same bytes read as ids (4 bytes each, any value) must
// decode without failing: unknown ids are skipped.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include "fuzz_files.h"
#include "fuzz_target.h"
#include "mambacpp/tokenizer.h"

namespace {

const std::vector<std::unique_ptr<mambacpp::Tokenizer>>& tokenizers() {
  static const auto all = [] {
    std::vector<std::unique_ptr<mambacpp::Tokenizer>> out;
    const std::string root = mambacpp::fuzz::source_dir() + "/fixtures";
    out.push_back(mambacpp::Tokenizer::load(root + "/tokenizer/tokenizer.json"));
    std::vector<std::string> dirs;
    for (const auto& e : std::filesystem::directory_iterator(root + "/tokenizers"))
      if (e.is_directory()) dirs.push_back(e.path().string());
    std::sort(dirs.begin(), dirs.end());
    for (const std::string& d : dirs) out.push_back(mambacpp::Tokenizer::load(d + "/tokenizer.json"));
    return out;
  }();
  return all;
}

}  // namespace

MAMBACPP_FUZZ_TARGET(tokenizer_encode) {
  if (size == 0) return;
  const auto& all = tokenizers();
  const mambacpp::Tokenizer& tok = *all[data[0] % all.size()];
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  (void)tok.decode(raw);
  (void)tok.decode(raw, /*skip_special=*/true);
  for (int32_t id : raw) (void)tok.token_bytes(id);
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<int32_t> ids = tok.encode(text, /*add_special_tokens=*/data[0] & 0x80);
  for (int32_t id : ids) MAMBACPP_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  (void)tok.decode(ids);
}
