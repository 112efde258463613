// The tokenizer pipelines of other model families against the HF `tokenizers` library: each directory of
// fixtures/tokenizers/ holds a tokenizer.json that scripts/make_tokenizer_fixtures.py built and saved with HF
// tokenizers, and the library's own encodings, decodings and DecodeStream output of hard strings (cases.json).
// encode must give the reference ids token for token, with and without the post-processor's special tokens;
// decode must give the reference text exactly; streamed pieces must add up to the streamed reference text.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// Every pipeline the fixture script writes (the manifest is checked against this list below).
const std::vector<std::string> kPipelines = {
    "llama3",     "llama3_merges", "bytelevel_roberta",   "bytelevel_split_behaviours",
    "spm_llama2", "spm_metaspace", "spm_metaspace_split", "spm_never",
    "bert_like",  "suffix_bpe"};

std::string family_dir() { return test::fixture_dir() + "/tokenizers"; }

// Fails (never skips) when a fixture is missing: these cases are the only check against the reference library.
json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "missing fixture " << path << " (made by scripts/make_tokenizer_fixtures.py)";
    return json();
  }
  return json::parse(in);
}

TEST(TokenizerFamilies, ManifestListsEveryPipelineTested) {
  json manifest = read_json(family_dir() + "/manifest.json");
  ASSERT_TRUE(manifest.is_object());
  std::set<std::string> in_manifest, tested(kPipelines.begin(), kPipelines.end());
  for (const auto& [name, _] : manifest.at("pipelines").items()) in_manifest.insert(name);
  EXPECT_EQ(in_manifest, tested);
}

class Family : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = family_dir() + "/" + GetParam();
    tok = Tokenizer::load(dir + "/tokenizer.json");
    cases = read_json(dir + "/cases.json");
    ASSERT_TRUE(cases.is_object()) << dir;
  }
  std::unique_ptr<Tokenizer> tok;
  json cases;
};

std::string label(size_t i, const json& c) { return "case " + std::to_string(i) + ": " + c.at("text").dump(); }

TEST_P(Family, EncodesAsHfTokenizers) {
  const json& rows = cases.at("encode");
  ASSERT_GT(rows.size(), 50u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& c = rows[i];
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(tok->encode(text), c.at("ids").get<Ids>()) << label(i, c);
    EXPECT_EQ(tok->encode(text, /*add_special_tokens=*/true), c.at("ids_special").get<Ids>()) << label(i, c);
    // The reference's token strings name the same ids. HF reports an added token by the text it matched (with
    // the whitespace lstrip/rstrip swallowed, in its normalised form), so such a string is trimmed and, when it
    // still names nothing, left to the id check above.
    const Ids want = c.at("ids").get<Ids>();
    const json& tokens = c.at("tokens");
    ASSERT_EQ(tokens.size(), want.size()) << label(i, c);
    for (size_t k = 0; k < want.size(); ++k) {
      std::string token = tokens[k].get<std::string>();
      if (!tok->token_to_id(token)) {
        token.erase(0, token.find_first_not_of(" \t\n"));
        token.erase(token.find_last_not_of(" \t\n") + 1);
        if (!tok->token_to_id(token)) continue;
      }
      EXPECT_EQ(tok->token_to_id(token), want[k]) << label(i, c) << " token " << k;
    }
  }
}

TEST_P(Family, DecodesAsHfTokenizers) {
  for (const char* section : {"encode", "decode"}) {
    const json& rows = cases.at(section);
    for (size_t i = 0; i < rows.size(); ++i) {
      const json& c = rows[i];
      const Ids ids = c.at("ids").get<Ids>();
      EXPECT_EQ(tok->decode(ids), c.at("decoded").get<std::string>()) << section << " " << i << ": " << c.dump();
      EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), c.at("decoded_skip_special").get<std::string>())
          << section << " " << i << ": " << c.dump();
    }
  }
}

// Streaming a text: the first tokens decoded as a whole (edge rules such as dropping a leading space apply there;
// as few as give whole characters, since a byte-level or byte-fallback token may hold part of one), then each
// later token's raw bytes. Where the text is valid UTF-8 this is what HF's DecodeStream emits in all.
std::string streamed_text(const Tokenizer& tok, const Ids& ids) {
  size_t head = 1;
  while (head < ids.size() && tok.decode(Ids(ids.begin(), ids.begin() + head)).find("\uFFFD") != std::string::npos) {
    ++head;
  }
  std::string text = tok.decode(Ids(ids.begin(), ids.begin() + head));
  for (size_t k = head; k < ids.size(); ++k) text += tok.token_bytes(ids[k]);
  return text;
}

TEST_P(Family, StreamedPiecesAddUpToHfDecodeStream) {
  const json& rows = cases.at("encode");
  int compared = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& c = rows[i];
    const Ids ids = c.at("ids").get<Ids>();
    ASSERT_TRUE(c.at("stream").is_array()) << label(i, c);
    std::string reference;
    for (const json& chunk : c["stream"]) {
      if (!chunk.is_null()) reference += chunk.get<std::string>();
    }
    if (ids.empty() || reference.find("\uFFFD") != std::string::npos) continue;
    EXPECT_EQ(streamed_text(*tok, ids), reference) << label(i, c);
    // The same pieces are what decode() gives for the whole sequence.
    EXPECT_EQ(reference, c.at("decoded").get<std::string>()) << label(i, c);
    ++compared;
  }
  EXPECT_GT(compared, 40);
}

// Byte-level and byte-fallback pipelines without a lossy normaliser lose nothing: random text of all kinds of
// characters (no added token's content in it) decodes back to itself, and encoding never throws.
TEST(TokenizerFamilies, LosslessPipelinesRoundTripRandomText) {
  std::mt19937 rng(11);
  const std::vector<std::string> pieces = {
      "a",      "Q",       "7",      " ",      "  ",     "\n",     "\t",     "'S",
      "\u00e9", "e\u0301", "\u4e2d", "\u3000", "\u00a0", "\u0085", "\u2028", "\U0001F469\u200D\U0001F4BB",
      "\x01",   "\x7f",    "\ufffd", "(",      "::",     "123456"};
  for (const char* name : {"llama3", "llama3_merges", "spm_llama2"}) {
    auto tok = Tokenizer::load(family_dir() + "/" + name + "/tokenizer.json");
    for (int n = 0; n < 300; ++n) {
      std::string text;
      const int len = static_cast<int>(rng() % 40);
      for (int k = 0; k < len; ++k) text += pieces[rng() % pieces.size()];
      EXPECT_EQ(tok->decode(tok->encode(text)), text) << name << ": " << json(text).dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HfFixtures, Family, ::testing::ValuesIn(kPipelines),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace mambacpp
