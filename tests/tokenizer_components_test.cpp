// Tokenizer components the HF fixtures (tokenizer_families_test.cpp) do not reach, on small tokenizer.json files
// written here, each expectation worked out by hand next to it: the Oniguruma -> PCRE2 translation, the
// long-word cutting of the BPE model, the decoders' edge cases, the pre-tokenizers that are fixed splits, legacy
// Metaspace fields, post-processor composition and the errors for broken components.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"
#include "support/test_support.h"
#include "tokenizer/regex.h"

namespace mambacpp {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// A character-level BPE: ids 0..25 are 'a'..'z', 26 is the space, 27 is "ab" (merge a b), 28 "<unk>",
// 29 "▁", 30..31 "<s>", "</s>" (added, special). No normaliser, pre-tokenizer or decoder unless a test sets one.
json char_tokenizer() {
  json vocab = json::object();
  for (int c = 0; c < 26; ++c) vocab[std::string(1, static_cast<char>('a' + c))] = c;
  vocab[" "] = 26;
  vocab["ab"] = 27;
  vocab["<unk>"] = 28;
  vocab["\u2581"] = 29;
  json j;
  j["added_tokens"] = json::array({{{"id", 30}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                                   {{"id", 31}, {"content", "</s>"}, {"special", true}, {"normalized", false}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = nullptr;
  j["decoder"] = nullptr;
  j["model"] = {
      {"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"vocab", vocab}, {"merges", json::array({"a b"})}};
  return j;
}

std::unique_ptr<Tokenizer> load_json(const json& j) {
  test::TempDir dir("tokc");
  std::string path = dir.file("tokenizer.json");
  std::ofstream(path) << j.dump();
  return Tokenizer::load(path);
}

std::string load_error(const json& j) {
  return test::error_of([&] { load_json(j); });
}

TEST(OnigurumaTranslation, SpellsOutUnicodeClasses) {
  tok::Regex ws(tok::pcre2_from_oniguruma("\\s+"));
  // U+0085 (NEL) is White_Space, as Oniguruma's \s has it.
  std::vector<std::pair<size_t, size_t>> m;
  ws.for_each_match("a\u0085\u3000b", [&](size_t b, size_t e) { m.emplace_back(b, e); });
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{1, 6}));  // 2 bytes of NEL + 3 of U+3000
  // Oniguruma's \w includes marks and the zero-width joiner; \h is a hex digit, not horizontal space.
  EXPECT_TRUE(tok::Regex(tok::pcre2_from_oniguruma("^\\w+$")).matches_at("e\u0301\u200Dx", 0));
  EXPECT_TRUE(tok::Regex(tok::pcre2_from_oniguruma("\\h")).matches_at("F", 0));
  EXPECT_FALSE(tok::Regex(tok::pcre2_from_oniguruma("\\h")).matches_at(" ", 0));
  // Inside a class the sets are spelled out without brackets; a ']' first in a class stays a literal.
  EXPECT_TRUE(tok::Regex(tok::pcre2_from_oniguruma("[\\sx]")).matches_at("\u0085", 0));
  EXPECT_TRUE(tok::Regex(tok::pcre2_from_oniguruma("[]a]")).matches_at("]", 0));
  EXPECT_EQ(tok::pcre2_from_oniguruma("\\p{L}\\d"), "\\p{L}\\p{Nd}");
}

TEST(BpeModel, LongWordsAreCutOnlyWhereNoMergeJoins) {
  auto t = load_json(char_tokenizer());
  // 400 bytes: one word past the cache limit. "a b" is a merge, so no cut may fall between an a and its b:
  // every pair merges -> 200 x "ab".
  std::string abab;
  for (int k = 0; k < 200; ++k) abab += "ab";
  EXPECT_EQ(t->encode(abab), Ids(200, 27));
  // "b a" is no merge: cuts fall between b and a, the ids are unchanged. With a stray "a" first: a, then ab...
  EXPECT_EQ(t->encode("a" + abab), [] {
    Ids ids{0};
    for (int k = 0; k < 200; ++k) ids.push_back(27);
    return ids;
  }());
  // A run of unknown characters (digits) is never cut, so fuse_unk still gives one <unk> for all of it.
  std::string digits = "x" + std::string(300, '7') + "x";
  EXPECT_EQ(t->encode(digits), (Ids{23, 28, 23}));
}

TEST(Decoders, EdgeCasesHfWouldPanicOn) {
  json j = char_tokenizer();
  // Strip of one 'a' at each end: a token "a" is cut to nothing (HF 0.23 panics here; we give "").
  j["decoder"] = {{"type", "Strip"}, {"content", "a"}, {"start", 1}, {"stop", 1}};
  auto t = load_json(j);
  EXPECT_EQ(t->decode(Ids{0, 1, 0}), "b");
  // After Fuse, Strip with stop works on the whole text, also an empty one.
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", "a"}, {"start", 0}, {"stop", 2}}})}};
  t = load_json(j);
  EXPECT_EQ(t->decode(Ids{}), "");
  EXPECT_EQ(t->decode(Ids{1, 0, 0, 0}), "ba");
  // Replace with a regex: each run of vowels becomes '-', in each token separately: "ab" -> "-b", "e" -> "-".
  j["decoder"] = {{"type", "Replace"}, {"pattern", {{"Regex", "[aeiou]+"}}}, {"content", "-"}};
  t = load_json(j);
  EXPECT_EQ(t->decode(Ids{27, 4, 1}), "-b-b");
}

TEST(Decoders, NoDecoderJoinsTokensWithSpaces) {
  auto t = load_json(char_tokenizer());
  EXPECT_EQ(t->decode(Ids{27, 2, 30}), "ab c <s>");
  EXPECT_EQ(t->decode(Ids{27, 2, 30}, /*skip_special=*/true), "ab c");
  // Streaming: each later token brings its space.
  EXPECT_EQ(t->token_bytes(2), " c");
}

TEST(PreTokenizers, FixedSplitsEqualTheirSpelledOutForms) {
  json a = char_tokenizer(), b = char_tokenizer();
  a["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  b["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "WhitespaceSplit"}},
                                                       {{"type", "Punctuation"}, {"behavior", "Isolated"}}})}};
  auto ta = load_json(a), tb = load_json(b);
  for (std::string s : {"ab ab", "ab,ab  a.b", "  x!?y\n"}) EXPECT_EQ(ta->encode(s), tb->encode(s)) << s;
  // WhitespaceSplit drops the spaces: "ab ab" -> ab, ab (and the space token 26 never appears).
  EXPECT_EQ(ta->encode("ab ab"), (Ids{27, 27}));
  // CharDelimiterSplit on 'x' removes the delimiter: "abxab" -> ab, ab; without it, "a b" would stay one word.
  a["pre_tokenizer"] = {{"type", "CharDelimiterSplit"}, {"delimiter", "x"}};
  EXPECT_EQ(load_json(a)->encode("abxab"), (Ids{27, 27}));
}

TEST(PreTokenizers, MetaspaceLegacyAddPrefixSpace) {
  // Files older than prepend_scheme say add_prefix_space: true means "always", false means "never".
  json a = char_tokenizer(), b = char_tokenizer();
  a["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", true}};
  b["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}};
  // "a b" -> "▁a▁b" -> "▁a", "▁b" -> ▁ a ▁ b (no merge joins ▁ and a).
  EXPECT_EQ(load_json(a)->encode("a b"), (Ids{29, 0, 29, 1}));
  EXPECT_EQ(load_json(b)->encode("a b"), (Ids{29, 0, 29, 1}));
  a["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(load_json(a)->encode("a b"), (Ids{0, 29, 1}));
}

TEST(PostProcessors, SequenceWrapsInOrderAndEncodeAddsThem) {
  json j = char_tokenizer();
  auto special = [](const std::string& s) { return json{{"SpecialToken", {{"id", s}, {"type_id", 0}}}}; };
  json seq = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  json specials = {{"<s>", {{"id", "<s>"}, {"ids", {30}}, {"tokens", {"<s>"}}}},
                   {"</s>", {{"id", "</s>"}, {"ids", {31}}, {"tokens", {"</s>"}}}}};
  // The first wraps the text in <s> ... </s>, the second puts another <s> before all of that.
  j["post_processor"] = {{"type", "Sequence"},
                         {"processors", json::array({{{"type", "TemplateProcessing"},
                                                      {"single", {special("<s>"), seq, special("</s>")}},
                                                      {"pair", json::array()},
                                                      {"special_tokens", specials}},
                                                     {{"type", "TemplateProcessing"},
                                                      {"single", {special("<s>"), seq}},
                                                      {"pair", json::array()},
                                                      {"special_tokens", specials}}})}};
  auto t = load_json(j);
  EXPECT_EQ(t->encode("ab", /*add_special_tokens=*/true), (Ids{30, 30, 27, 31}));
  EXPECT_EQ(t->encode("ab", /*add_special_tokens=*/false), (Ids{27}));
  EXPECT_EQ(t->encode("ab"), (Ids{27}));
  // BertProcessing: [cls] A [sep], ids from the file's pairs.
  j["post_processor"] = {{"type", "BertProcessing"}, {"sep", {"</s>", 31}}, {"cls", {"<s>", 30}}};
  EXPECT_EQ(load_json(j)->encode("c", true), (Ids{30, 2, 31}));
  // A template without $A, or with an unknown special token, is refused with its JSON path.
  j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", {special("<s>")}}, {"special_tokens", specials}};
  EXPECT_NE(load_error(j).find("post_processor.single: expected $A exactly once"), std::string::npos) << load_error(j);
  j["post_processor"] = {
      {"type", "TemplateProcessing"}, {"single", {special("<x>"), seq}}, {"special_tokens", specials}};
  EXPECT_NE(load_error(j).find("post_processor.single[0]: special token '<x>'"), std::string::npos) << load_error(j);
}

TEST(Normalizers, StepsInOrder) {
  json j = char_tokenizer();
  // Lowercase then Replace "b" -> "ab" then Prepend "c": "AB" -> "ab" -> "aab" -> "caab" -> c, a, ab.
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", json::array({{{"type", "Lowercase"}},
                                   {{"type", "Replace"}, {"pattern", {{"String", "b"}}}, {"content", "ab"}},
                                   {{"type", "Prepend"}, {"prepend", "c"}}})}};
  auto t = load_json(j);
  EXPECT_EQ(t->encode("AB"), (Ids{2, 0, 27}));
  // Prepend leaves an empty piece empty: "<s>" alone gives just its id, no "c".
  EXPECT_EQ(t->encode("<s>"), (Ids{30}));
  // Strip (both sides) removes Unicode white space, U+3000 included.
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}};
  EXPECT_EQ(load_json(j)->encode("\u3000 ab\n"), (Ids{27}));
}

}  // namespace
}  // namespace mambacpp
