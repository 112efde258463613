// Tokenizer tests. Two kinds:
//  * small tokenizer.json files written here, with expectations worked out by hand from the BPE rules (each one
//    explained next to it), covering merges order, the GPT-2 split regex, NFC, added tokens and their options,
//    the byte-level decoder and the error messages;
//  * the GPT-NeoX tokenizer and cases produced by the HF `tokenizers` library (fixtures/tokenizer/, made by the
//    fixture script): encode must equal the reference ids token for token and decode the reference text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"
#include "support/test_support.h"
#include "tokenizer/normalizer.h"

namespace mambacpp {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// --- A tiny byte-level tokenizer --------------------------------------------------------------------------------

// GPT-2's byte alphabet, written out independently of the library: printable bytes stand for themselves, the
// rest take U+0100.. in byte order. Checked against well-known values below (space -> U+0120 'Ġ').
std::string alphabet_char(int byte) {
  bool printable = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
  int cp = byte;
  if (!printable) {
    cp = 256;
    for (int b = 0; b < byte; ++b) {
      bool p = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      if (!p) ++cp;
    }
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

TEST(TokenizerAlphabet, KnownCharacters) {
  EXPECT_EQ(alphabet_char(' '), "\u0120");   // Ġ
  EXPECT_EQ(alphabet_char('\n'), "\u010A");  // Ċ
  EXPECT_EQ(alphabet_char(0xAD), "\u0143");  // Ń, the last of the remapped bytes
  EXPECT_EQ(alphabet_char('a'), "a");
}

// Vocab: ids 0..255 are the alphabet characters, id == byte value (so 'a' is 97 and the space 'Ġ' is 32). Then
// merged tokens in merge order. Merges (rank: left right -> id):
//   0: Ġ t -> Ġt 256     1: h e -> he 257     2: Ġt he -> Ġthe 258   3: l l -> ll 259
//   4: e ll -> ell 260   5: h ell -> hell 261 6: hell o -> hello 262 7: Ġ Ġ -> ĠĠ 263
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"\u0120", "t"}, {"h", "e"}, {"\u0120t", "he"}, {"l", "l"},
    {"e", "ll"},     {"h", "ell"}, {"hell", "o"},   {"\u0120", "\u0120"}};

json tiny_vocab() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet_char(b)] = b;
  int id = 256;
  for (const auto& [l, r] : kMerges) vocab[l + r] = id++;
  return vocab;
}

json added(int id, const std::string& content, bool special, bool normalized, bool single_word = false,
           bool lstrip = false, bool rstrip = false) {
  return {{"id", id},         {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

// The layout of EleutherAI/gpt-neox-20b's tokenizer.json, shrunk.
json tiny_tokenizer_json(bool pair_merges = false) {
  json merges = json::array();
  for (const auto& [l, r] : kMerges) {
    if (pair_merges) {
      merges.push_back(json::array({l, r}));
    } else {
      merges.push_back(l + " " + r);
    }
  }
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = json::array({
      added(300, "<|endoftext|>", true, false),
      added(301, "  ", false, true),   // runs of real spaces, as GPT-NeoX has (normalized, not special)
      added(302, "   ", false, true),
  });
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},          {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},      {"byte_fallback", false},      {"vocab", tiny_vocab()},
                {"merges", merges}};
  return j;
}

std::string write_json(const test::TempDir& dir, const json& j, const std::string& name = "tokenizer.json") {
  std::string path = dir.file(name);
  std::ofstream(path) << j.dump(1);
  return path;
}

std::unique_ptr<Tokenizer> load_json(const json& j) {
  test::TempDir dir("tok");
  return Tokenizer::load(write_json(dir, j));
}

class TinyTokenizer : public ::testing::Test {
 protected:
  void SetUp() override { tok = load_json(tiny_tokenizer_json()); }
  Ids enc(const std::string& s) { return tok->encode(s); }
  std::unique_ptr<Tokenizer> tok;
};

TEST_F(TinyTokenizer, MergesApplyInRankOrder) {
  // "the": t h e; only (h,e) is a merge (rank 1) -> [t, he]; (t, he) is not a merge.
  EXPECT_EQ(enc("the"), (Ids{'t', 257}));
  // " the" is one word: Ġ t h e. Rank 0 (Ġ,t) first -> [Ġt, h, e]; then rank 1 (h,e) -> [Ġt, he]; the new pair
  // (Ġt, he) is rank 2 -> [Ġthe].
  EXPECT_EQ(enc(" the"), (Ids{258}));
  // "hello": (h,e) rank 1 merges before (l,l) rank 3 -> [he, ll, o]. "e ll" and "h ell" can no longer apply, so
  // "hello" (262) is never reached: a longest-match tokenizer would get this wrong.
  EXPECT_EQ(enc("hello"), (Ids{257, 259, 'o'}));
  // "ell": (l,l) rank 3 -> [e, ll]; then (e, ll) rank 4 -> [ell].
  EXPECT_EQ(enc("ell"), (Ids{260}));
  // "lll": two (l,l) candidates of equal rank; the leftmost merges first -> [ll, l].
  EXPECT_EQ(enc("lll"), (Ids{259, 'l'}));
}

TEST_F(TinyTokenizer, Gpt2RegexSplitsWords) {
  // "the the" -> words "the", " the" -> [t, he] + [Ġthe]. Merges never cross words.
  EXPECT_EQ(enc("the the"), (Ids{'t', 257, 258}));
  // "don't": "don" (letters), "'t" (contraction) -> single bytes, no merges among them.
  EXPECT_EQ(enc("don't"), (Ids{'d', 'o', 'n', '\'', 't'}));
  // " 2024": a space joins the digit run -> Ġ 2 0 2 4.
  EXPECT_EQ(enc("x 2024"), (Ids{'x', ' ', '2', '0', '2', '4'}));
  // "a\nb": the newline is its own word (\s+ whose lookahead fails falls back to plain \s+).
  EXPECT_EQ(enc("a\nb"), (Ids{'a', '\n', 'b'}));
  // "a, b!": "a", ",", " b", "!".
  EXPECT_EQ(enc("a, b!"), (Ids{'a', ',', ' ', 'b', '!'}));
  // Trailing whitespace "a\t " -> "a", "\t " (whitespace at the end of text) -> bytes, no merge for (ĉ, Ġ).
  EXPECT_EQ(enc("a\t "), (Ids{'a', '\t', ' '}));
  // Empty text -> nothing.
  EXPECT_EQ(enc(""), Ids{});
}

TEST_F(TinyTokenizer, SpaceRunsUseAddedTokensAndLookahead) {
  // "a  b": the two spaces match added token 301 ("  ", normalized) before the regex sees them -> a, 301, b.
  EXPECT_EQ(enc("a  b"), (Ids{'a', 301, 'b'}));
  // Four spaces: leftmost-longest takes "   " (302) first; the fourth space stays with "b" -> " b" = Ġ b.
  EXPECT_EQ(enc("a    b"), (Ids{'a', 302, ' ', 'b'}));
  // Without the added tokens the regex decides: "a  b" -> "a", " " (\s+(?!\S) backs off one space), " b".
  json j = tiny_tokenizer_json();
  j["added_tokens"] = json::array();
  auto plain = load_json(j);
  EXPECT_EQ(plain->encode("a  b"), (Ids{'a', ' ', ' ', 'b'}));
  // At the end of the text the whole run is one word, and (Ġ,Ġ) merges (rank 7) -> ĠĠ.
  EXPECT_EQ(plain->encode("a  "), (Ids{'a', 263}));
  // Three spaces then a word: "  " (263 after merging) and " the" (258).
  EXPECT_EQ(plain->encode("   the"), (Ids{263, 258}));
}

TEST_F(TinyTokenizer, Utf8BytesAndNfc) {
  // "é" U+00E9 is bytes C3 A9; both are printable in the alphabet (Ã, ©) so the ids are 0xC3 and 0xA9.
  EXPECT_EQ(enc("\u00e9"), (Ids{0xC3, 0xA9}));
  // NFC composes e + U+0301 into U+00E9 first, so the result is the same.
  EXPECT_EQ(enc("e\u0301"), (Ids{0xC3, 0xA9}));
  // Without a normalizer: "e" is a letter word, U+0301 (a mark, not \p{L}) is a separate word of bytes CC 81.
  json j = tiny_tokenizer_json();
  j["normalizer"] = nullptr;
  EXPECT_EQ(load_json(j)->encode("e\u0301"), (Ids{'e', 0xCC, 0x81}));
  // Sequence of NFC is accepted and behaves as NFC.
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  EXPECT_EQ(load_json(j)->encode("e\u0301"), (Ids{0xC3, 0xA9}));
  // Invalid UTF-8 is refused (HF takes only valid strings).
  EXPECT_THROW(tok->encode("a\xC3"), Error);
}

TEST_F(TinyTokenizer, SpecialTokensInText) {
  // <|endoftext|> (normalized: false) is cut out of the raw text; the pieces around it are encoded alone, so
  // "b" after it has no space and " the" keeps its own.
  EXPECT_EQ(enc("a<|endoftext|>b"), (Ids{'a', 300, 'b'}));
  EXPECT_EQ(enc("<|endoftext|> the<|endoftext|>"), (Ids{300, 258, 300}));
  EXPECT_EQ(tok->decode(enc("a<|endoftext|>b")), "a<|endoftext|>b");
  EXPECT_EQ(tok->decode(enc("a<|endoftext|>b"), /*skip_special=*/true), "ab");
  EXPECT_TRUE(tok->is_special(300));
  EXPECT_FALSE(tok->is_special(301));  // space runs are added but not special: kept by skip_special
  EXPECT_EQ(tok->decode(Ids{'a', 301, 'b'}, true), "a  b");
  EXPECT_FALSE(tok->is_special('a'));
}

TEST_F(TinyTokenizer, DecodeAndTokenBytes) {
  EXPECT_EQ(tok->token_bytes(' '), " ");
  EXPECT_EQ(tok->token_bytes(258), " the");
  EXPECT_EQ(tok->token_bytes(263), "  ");
  EXPECT_EQ(tok->token_bytes(301), "  ");  // an added token of real spaces decodes to its content
  EXPECT_EQ(tok->token_bytes(0xC3), "\xC3");  // half of "é": streaming gets the raw byte
  EXPECT_EQ(tok->decode(Ids{0xC3, 0xA9}), "\u00e9");
  // A lone lead byte is an invalid sequence: the decoder gives U+FFFD, as from_utf8_lossy does.
  EXPECT_EQ(tok->decode(Ids{'a', 0xC3}), "a\uFFFD");
  // E2 82 is the incomplete prefix of a 3-byte sequence: one U+FFFD for both bytes, then 'x'.
  EXPECT_EQ(tok->decode(Ids{0xE2, 0x82, 'x'}), "\uFFFDx");
  // Ids past the vocabulary (padded embeddings) decode to nothing, as in HF.
  EXPECT_EQ(tok->decode(Ids{'a', 5000, 'b'}), "ab");
  EXPECT_EQ(tok->token_bytes(5000), "");
  EXPECT_EQ(tok->vocab_size(), 303);  // highest id (302) + 1
  EXPECT_EQ(tok->token_to_id("\u0120the"), 258);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 300);
  EXPECT_EQ(tok->token_to_id("nope"), std::nullopt);
  // Round trip over awkward text: byte-level BPE is lossless up to NFC.
  for (std::string s :
       {"Hello,  world!\n\n\tx", "e\u0301t\u00e9 \U0001F469\u200D\U0001F4BB", "   ", "a<|endoftext|>"}) {
    EXPECT_EQ(tok->decode(tok->encode(s)), tok::nfc(s)) << s;
  }
}

TEST(Tokenizer, MergesInPairFormEqualStringForm) {
  auto a = load_json(tiny_tokenizer_json(false));
  auto b = load_json(tiny_tokenizer_json(true));
  for (std::string s : {" the hello", "lll ell", "a  b the"}) EXPECT_EQ(a->encode(s), b->encode(s)) << s;
  EXPECT_EQ(b->encode(" the"), (Ids{258}));
}

TEST(Tokenizer, ByteLevelPreTokenizerOptions) {
  json j = tiny_tokenizer_json();
  j["added_tokens"] = json::array({added(300, "<|endoftext|>", true, false)});
  // "  a" with the regex: " " (the run backs off one space for the lookahead) and " a" -> Ġ, Ġ a.
  EXPECT_EQ(load_json(j)->encode("  a"), (Ids{' ', ' ', 'a'}));
  // use_regex false: the whole text is one word Ġ Ġ a, and (Ġ,Ġ) merges (rank 7).
  j["pre_tokenizer"]["use_regex"] = false;
  EXPECT_EQ(load_json(j)->encode("  a"), (Ids{263, 'a'}));
  // add_prefix_space: each piece that does not start with a space gets one, also after a special token:
  // "the" -> " the" = Ġthe; "<|endoftext|>the" -> 300, Ġthe; " the" is left alone.
  j["pre_tokenizer"]["use_regex"] = true;
  j["pre_tokenizer"]["add_prefix_space"] = true;
  auto t = load_json(j);
  EXPECT_EQ(t->encode("the"), (Ids{258}));
  EXPECT_EQ(t->encode("<|endoftext|>the"), (Ids{300, 258}));
  EXPECT_EQ(t->encode(" the"), (Ids{258}));
}

TEST(Tokenizer, AddedTokenOptions) {
  json j = tiny_tokenizer_json();
  // "<m>" matched only as a single word: in "x<m> <m>" the first is preceded by the word character x and is
  // refused (left to BPE: x < m >, then the space); the second stands alone.
  j["added_tokens"] = json::array({added(310, "<m>", false, false, /*single_word=*/true)});
  EXPECT_EQ(load_json(j)->encode("x<m> <m>"), (Ids{'x', '<', 'm', '>', ' ', 310}));
  // lstrip + rstrip swallow the spaces on both sides: "a <m> b" -> a, 310, b.
  j["added_tokens"] = json::array({added(310, "<m>", false, false, false, /*lstrip=*/true, /*rstrip=*/true)});
  EXPECT_EQ(load_json(j)->encode("a <m> b"), (Ids{'a', 310, 'b'}));
  // normalized: true matches in the NFC text, with the content normalised too: content "e\u0301" (NFD) matches
  // the input "\u00e9", and the input "e\u0301" after NFC.
  j["added_tokens"] = json::array({added(311, "e\u0301", false, true)});
  auto t = load_json(j);
  EXPECT_EQ(t->encode("\u00e9"), (Ids{311}));
  EXPECT_EQ(t->encode("xe\u0301"), (Ids{'x', 311}));
  // normalized: false matches the raw text only: precomposed input does not match a decomposed token.
  j["added_tokens"] = json::array({added(311, "e\u0301", false, false)});
  EXPECT_EQ(load_json(j)->encode("\u00e9"), (Ids{0xC3, 0xA9}));
}

TEST(Tokenizer, IgnoreMergesTakesWholeWords) {
  json j = tiny_tokenizer_json();
  j["model"]["vocab"]["hello"] = 400;  // a vocab entry no merge path reaches
  EXPECT_EQ(load_json(j)->encode("hello"), (Ids{257, 259, 'o'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load_json(j)->encode("hello"), (Ids{400}));
}

TEST(Tokenizer, UnknownCharacters) {
  // Drop 'z' from the vocab. With unk_token it becomes <unk> (fused into one per run with fuse_unk); without,
  // HF drops it.
  json j = tiny_tokenizer_json();
  j["model"]["vocab"].erase("z");
  j["model"]["vocab"]["<unk>"] = 500;
  EXPECT_EQ(load_json(j)->encode("azzb"), (Ids{'a', 'b'}));
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(load_json(j)->encode("azzb"), (Ids{'a', 500, 500, 'b'}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(load_json(j)->encode("azzb"), (Ids{'a', 500, 'b'}));
  // byte_fallback: an unknown character becomes the <0xNN> tokens of its UTF-8 bytes when they all exist ('z' is
  // the byte 0x7A) and only otherwise <unk>.
  j["model"]["byte_fallback"] = true;
  j["model"]["vocab"]["<0x7A>"] = 501;
  EXPECT_EQ(load_json(j)->encode("azzb"), (Ids{'a', 501, 501, 'b'}));
  // An unk token absent from the vocab is an error when it is needed, not before (HF loads such files).
  j = tiny_tokenizer_json();
  j["model"]["vocab"].erase("z");
  j["model"]["unk_token"] = "<nope>";
  auto t = load_json(j);
  EXPECT_EQ(t->encode("ab"), (Ids{'a', 'b'}));
  EXPECT_THROW(t->encode("az"), Error);
}

void expect_error(const json& j, const std::vector<std::string>& fragments) {
  test::TempDir dir("tok");
  std::string path = write_json(dir, j);
  try {
    Tokenizer::load(path);
    ADD_FAILURE() << "expected an error mentioning " << fragments[0];
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
  }
}

TEST(Tokenizer, RejectsWhatItCannotReproduce) {
  json j = tiny_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  expect_error(j, {"model", "WordPiece"});
  j = tiny_tokenizer_json();
  j["model"]["type"] = "Unigram";
  expect_error(j, {"model", "Unigram"});
  // Unsupported components name their JSON path (inside Sequences too) and the type found there.
  j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  expect_error(j, {"pre_tokenizer", "UnicodeScripts"});
  j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "Digits"}}, {{"type", "FixedLength"}}})}};
  expect_error(j, {"pre_tokenizer.pretokenizers[1]", "FixedLength"});
  j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  expect_error(j, {"normalizer", "BertNormalizer"});
  j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Precompiled"}}})}};
  expect_error(j, {"normalizer.normalizers[1]", "Precompiled"});
  j = tiny_tokenizer_json();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, {"decoder", "WordPiece"});
  j = tiny_tokenizer_json();
  j["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "Fuse"}}, {{"type", "CTC"}}})}};
  expect_error(j, {"decoder.decoders[1]", "CTC"});
  j = tiny_tokenizer_json();
  j["post_processor"] = {{"type", "Sequence"}, {"processors", json::array({{{"type", "Nonsense"}}})}};
  expect_error(j, {"post_processor.processors[0]", "Nonsense"});
  j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "("}}}, {"behavior", "Isolated"}};
  expect_error(j, {"pre_tokenizer.pattern.Regex"});
  j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
  expect_error(j, {"pre_tokenizer.behavior", "Sideways"});
  j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  expect_error(j, {"pre_tokenizer.replacement", "one character"});
  j = tiny_tokenizer_json();
  j["model"]["dropout"] = 0.1;
  expect_error(j, {"dropout"});
  j = tiny_tokenizer_json();
  j["model"]["continuing_subword_prefix"] = "##";  // the tiny vocab's merges have no "##" right parts
  expect_error(j, {"merges[0]", "continuing_subword_prefix"});
  j = tiny_tokenizer_json();
  j["model"]["merges"].push_back("q \u0120q");  // "Ġq" is not in the vocab: a merge must produce a vocab token
  expect_error(j, {"merges[8]", "'\u0120q' is not in the vocab"});
  j = tiny_tokenizer_json();
  j["model"]["merges"].push_back("abc");
  expect_error(j, {"merges[8]"});
  j = tiny_tokenizer_json();
  j["truncation"] = {{"max_length", 8}};
  expect_error(j, {"truncation"});
}

TEST(Tokenizer, MissingOrBrokenFile) {
  test::TempDir dir("tok");
  try {
    Tokenizer::load(dir.file("absent.json"));
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.json"), std::string::npos) << e.what();
  }
  std::string path = dir.file("broken.json");
  std::ofstream(path) << "{\"model\": ";
  try {
    Tokenizer::load(path);
    ADD_FAILURE() << "no error for truncated JSON";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
  }
}

// --- The GPT-NeoX tokenizer against the HF library --------------------------------------------------------------

std::string neox_dir() { return test::fixture_dir() + "/tokenizer"; }

// Fails (never skips) when a fixture is missing: these cases are the only check against the reference library.
bool require_file(const std::string& path) {
  if (std::ifstream(path).good()) return true;
  ADD_FAILURE() << "missing fixture " << path << " (made by the tokenizer fixture script with HF tokenizers)";
  return false;
}

// The NeoX tokenizer, loaded once for all tests (loading parses a large JSON file); null when the file is missing.
const Tokenizer* neox() {
  static std::unique_ptr<Tokenizer> tok;
  static bool tried = false;
  if (!tried) {
    tried = true;
    if (std::ifstream(neox_dir() + "/tokenizer.json").good()) tok = Tokenizer::load(neox_dir() + "/tokenizer.json");
  }
  return tok.get();
}

json read_cases() {
  std::ifstream in(neox_dir() + "/cases.json");
  return json::parse(in);
}

TEST(NeoxTokenizer, MatchesHfTokenizersOnEveryCase) {
  std::string tok_path = neox_dir() + "/tokenizer.json", cases_path = neox_dir() + "/cases.json";
  if (!require_file(tok_path) || !require_file(cases_path)) return;
  const Tokenizer* tok = neox();
  json cases = read_cases();
  ASSERT_TRUE(cases.is_array());
  ASSERT_GT(cases.size(), 0u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    std::string text = c.at("text").get<std::string>();
    Ids want = c.at("ids").get<Ids>();
    Ids got = tok->encode(text);
    EXPECT_EQ(got, want) << "case " << i << ": " << c.at("text").dump();
    EXPECT_EQ(tok->decode(want), c.at("decoded").get<std::string>()) << "case " << i << ": " << c.at("text").dump();
    if (c.contains("decoded_skip_special")) {
      EXPECT_EQ(tok->decode(want, /*skip_special=*/true), c["decoded_skip_special"].get<std::string>())
          << "case " << i << ": " << c.at("text").dump();
    }
    if (c.contains("tokens")) {  // the reference's token strings name the same ids
      const json& tokens = c["tokens"];
      ASSERT_EQ(tokens.size(), want.size()) << "case " << i;
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(tok->token_to_id(tokens[k].get<std::string>()), want[k]) << "case " << i << " token " << k;
      }
    }
    EXPECT_EQ(tok->decode(got), tok::nfc(text)) << "round trip, case " << i << ": " << c.at("text").dump();
    // token_bytes pieces concatenate to the decoded bytes (the streaming path).
    std::string bytes;
    for (int32_t id : want) bytes += tok->token_bytes(id);
    if (c.at("decoded").get<std::string>().find("\uFFFD") == std::string::npos) {
      EXPECT_EQ(bytes, c.at("decoded").get<std::string>()) << "case " << i;
    }
  }
}

TEST(NeoxTokenizer, SpecialTokens) {
  std::string tok_path = neox_dir() + "/tokenizer.json";
  if (!require_file(tok_path)) return;
  const Tokenizer* tok = neox();
  auto eot = tok->token_to_id("<|endoftext|>");
  ASSERT_TRUE(eot.has_value());
  EXPECT_TRUE(tok->is_special(*eot));
  Ids ids = tok->encode("one<|endoftext|>two");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *eot), 1);
  EXPECT_EQ(tok->decode(ids), "one<|endoftext|>two");
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), "onetwo");
}

// One tokenizer serves many sessions: concurrent encodes (sharing the word cache) give the reference ids.
TEST(NeoxTokenizer, ConcurrentEncodesAgree) {
  std::string tok_path = neox_dir() + "/tokenizer.json", cases_path = neox_dir() + "/cases.json";
  if (!require_file(tok_path) || !require_file(cases_path)) return;
  const Tokenizer* tok = neox();
  json cases = read_cases();
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < cases.size(); ++i) {
          size_t k = (i + static_cast<size_t>(t) * 7) % cases.size();  // threads walk the cases in different orders
          if (tok->encode(cases[k].at("text").get<std::string>()) != cases[k].at("ids").get<Ids>()) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// A megabyte of random words (so the word cache cannot hide anything) round-trips through encode and decode.
// (Speed is a benchmark's business, not a unit test's: about 0.15 s of CPU time here in a Release build.)
TEST(NeoxTokenizer, RoundTripsAMegabyteOfRandomWords) {
  std::string tok_path = neox_dir() + "/tokenizer.json";
  if (!require_file(tok_path)) return;
  const Tokenizer* tok = neox();
  std::mt19937 rng(7);
  const std::vector<std::string> pieces = {"a", "e", "i", "o", "u", "th", "st", "n", "r", "l", "m", "\u00e9",
                                           "\u4e2d", "1", "9", ".", ",", "(", ")", "'s", "_", "=", "{", "\U0001F600"};
  const std::vector<std::string> gaps = {" ", " ", " ", " ", "\n", "  ", "\t", ", ", ". ", "\n\n"};
  std::string text;
  while (text.size() < (1u << 20)) {
    int len = 1 + static_cast<int>(rng() % 9);
    for (int k = 0; k < len; ++k) text += pieces[rng() % pieces.size()];
    text += gaps[rng() % gaps.size()];
  }
  Ids ids = tok->encode(text);
  EXPECT_GT(ids.size(), text.size() / 8) << "a byte-level BPE of 4096 tokens cannot compress random words that much";
  EXPECT_EQ(tok->decode(ids), tok::nfc(text));
}

}  // namespace
}  // namespace mambacpp
