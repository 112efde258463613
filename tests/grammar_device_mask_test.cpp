// A grammar's allowed tokens as a bit mask applied by the backend before its top-k selection (TopKRequest::allowed,
// mambacpp/top_k.h): the CPU backend against the plain reference (masked ids never candidates, a NaN there never
// makes the row bad, the mask before the penalty), the mask's size checked, TokenConstraint::allowed_words choosing
// exactly the ids mask() leaves alone, and the engine giving constrained requests the same tokens whether the mask
// goes to the backend (device sampling) or masks whole rows on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/grammar.h"
#include "engine/grammar_mask.h"
#include "mambacpp/engine.h"
#include "mambacpp/error.h"
#include "mambacpp/grammar.h"
#include "mambacpp/model.h"
#include "mambacpp/tokenizer.h"
#include "support/engine_support.h"
#include "support/test_support.h"
#include "support/top_k_reference.h"

namespace mambacpp {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_same(const TopKCandidates& got, const TopKCandidates& want, const std::string& what) {
  EXPECT_EQ(got.bad_id, want.bad_id) << what;
  if (want.bad_id >= 0)
    EXPECT_TRUE(std::memcmp(&got.bad_value, &want.bad_value, sizeof(float)) == 0) << what;
  EXPECT_EQ(got.ids, want.ids) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  EXPECT_TRUE(got.logits.empty() ||
              std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * sizeof(float)) == 0)
      << what << ": logits differ bitwise";
}

bool bit(const std::vector<uint32_t>& words, int64_t id) { return (words[static_cast<size_t>(id / 32)] >> (id % 32)) & 1u; }

bool matches(const std::string& gbnf, const std::string& text) {
  GrammarMatcher m(Grammar::parse(gbnf));
  return m.accept(text) && m.accepting();
}

TEST(SelectTopKMask, RandomMaskedRowsMatchTheReference) {
  auto be = make_cpu_backend(2);
  std::mt19937_64 rng(17);
  int checked = 0, empty = 0;
  for (int64_t V : {1, 31, 32, 33, 1000, 4099}) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<std::vector<float>> rows;
      std::vector<TopKRequest> reqs;
      for (int mask_kind = 0; mask_kind < 5; ++mask_kind) {
        for (int k : {1, 40, 256}) {
          TopKRequest q;
          q.k = k;
          q.limit = (k == 40 && V > 1) ? V - V / 3 : 0;
          if (k != 1) {
            q.repeat_penalty = k == 40 ? 0.5f : 1.3f;
            q.penalized = test::random_distinct_ids(V, 20, rng);
          }
          q.allowed = test::random_mask(V, mask_kind, rng);
          rows.push_back(test::random_row(V, kind, rng));
          reqs.push_back(q);
        }
      }
      reqs.front().allowed.clear();  // an unmasked row beside masked ones
      const int64_t n = static_cast<int64_t>(rows.size());
      std::vector<float> buf;
      for (const auto& r : rows) buf.insert(buf.end(), r.begin(), r.end());
      std::vector<TopKCandidates> got;
      be->select_top_k(TensorView(buf.data(), DType::F32, {n, V}), reqs, got);
      ASSERT_EQ(got.size(), rows.size());
      for (int64_t r = 0; r < n; ++r) {
        const std::string what = "V " + std::to_string(V) + " kind " + std::to_string(kind) + " row " + std::to_string(r);
        const TopKCandidates want = test::reference_top_k(rows[r], reqs[r]);
        expect_same(got[r], want, what);
        for (int32_t id : got[r].ids)
          EXPECT_TRUE(reqs[r].allowed.empty() || bit(reqs[r].allowed, id)) << what << ": id " << id << " is masked";
        empty += got[r].ids.empty() && got[r].bad_id < 0;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 6 * 4 * 15);
  EXPECT_GT(empty, 20);  // "none allowed" rows come back with no candidate (and no bad id)
}

TEST(SelectTopKMask, MaskedNanIsNotBadAndTheMaskPrecedesThePenalty) {
  auto be = make_cpu_backend(1);
  std::vector<float> row = {std::nanf(""), kInf, 2.0f, 4.0f, -1.0f, 3.0f};
  TopKRequest q;
  q.k = 3;
  q.allowed = {0b110100u};  // ids 2, 4, 5
  q.repeat_penalty = 4.0f;
  q.penalized = {0, 1, 5};  // the penalty on masked ids leaves them -inf; 5: 3 / 4
  std::vector<TopKCandidates> got;
  be->select_top_k(TensorView(row.data(), DType::F32, {1, 6}), {q}, got);
  EXPECT_EQ(got[0].bad_id, -1);
  EXPECT_EQ(got[0].ids, (std::vector<int32_t>{2, 5, 4}));
  EXPECT_EQ(got[0].logits, (std::vector<float>{2.0f, 0.75f, -1.0f}));
  EXPECT_EQ(row[0], -kInf);  // in place, as the definition says
  // An allowed NaN still makes the row bad.
  row = {std::nanf(""), 1.0f};
  q = TopKRequest{};
  q.allowed = {0b11u};
  be->select_top_k(TensorView(row.data(), DType::F32, {1, 2}), {q}, got);
  EXPECT_EQ(got[0].bad_id, 0);
}

TEST(SelectTopKMask, RejectsAMaskOfTheWrongSize) {
  auto be = make_cpu_backend(1);
  std::vector<float> row(33, 0.0f);
  std::vector<TopKCandidates> got;
  TopKRequest q;
  q.allowed = {1u};  // 33 ids need 2 words
  const std::string e =
      test::error_of([&] { be->select_top_k(TensorView(row.data(), DType::F32, {1, 33}), {q}, got); });
  EXPECT_NE(e.find("row 0: the allowed-token mask must have 2 words (33 ids, 32 per word), found 1"), std::string::npos)
      << e;
}

const Tokenizer& shipped_tokenizer() {
  static const std::unique_ptr<Tokenizer> t = Tokenizer::load(test::source_dir() + "/models/default/tokenizer.json");
  return *t;
}

// allowed_words sets exactly the ids that mask() leaves finite on a row of zeros (stop tokens where the text is
// complete included), at every boundary of a JSON text; ids past the vocabulary are clear.
TEST(TokenConstraintWords, SameIdsAsTheHostMask) {
  const Tokenizer& tok = shipped_tokenizer();
  const auto trie = TokenTrie::from_tokenizer(tok, tok.vocab_size());
  const int64_t row_length = tok.vocab_size() + 45;  // an embedding padded past the tokenizer's ids
  const std::set<int32_t> stops = {0, 2};
  const std::string text = "{\"a\": [1, true], \"b\": \"x\"}";
  const std::vector<int32_t> ids = tok.encode(text, false);
  TokenConstraint c(Grammar::parse(json_object_grammar()), trie);
  std::vector<uint32_t> words;
  int64_t steps = 0;
  for (size_t i = 0; i <= ids.size(); ++i) {
    std::vector<float> row(static_cast<size_t>(row_length), 0.0f);
    c.mask(row, stops);
    c.allowed_words(stops, row_length, words);
    ASSERT_EQ(static_cast<int64_t>(words.size()), (row_length + 31) / 32);
    for (int64_t id = 0; id < row_length; ++id)
      ASSERT_EQ(bit(words, id), row[static_cast<size_t>(id)] == 0.0f) << "step " << i << " id " << id;
    for (int64_t id = row_length; id < static_cast<int64_t>(words.size()) * 32; ++id) ASSERT_FALSE(bit(words, id));
    if (i < ids.size()) c.accept(ids[i]);
    ++steps;
  }
  EXPECT_TRUE(c.complete());
  EXPECT_TRUE(bit(words, 0) && bit(words, 2)) << "stop tokens allowed once the text is complete";
  EXPECT_GT(steps, 5);
}

LoadOptions cpu_options() {
  LoadOptions o;
  o.device = DeviceChoice::CPU;
  return o;
}

// The engine's two paths for a constrained row, on the CPU backend: the mask given to select_top_k (device sampling
// on) and a whole row masked on the host (off) pick the same tokens, greedy and sampled, with the repetition penalty,
// beside unconstrained rows.
TEST(GrammarDeviceMask, SameTokensAsTheHostMask) {
  const auto model = Model::load(test::source_dir() + "/models/default", cpu_options());
  const Tokenizer& tok = shipped_tokenizer();
  const std::string schema = R"({"type":"object","properties":{"ok":{"type":"boolean"},
      "color":{"enum":["red","green"]},"n":{"type":"integer"}},"required":["ok","color"],"additionalProperties":false})";
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt = tok.encode(i % 2 ? "The answer in JSON:" : "def main(", false);
    r.max_new_tokens = i % 4 == 3 ? 12 : 120;
    r.sampling.temperature = i % 3 == 0 ? 0.0f : 1.5f;  // greedy (k = 1) and sampled (top_k 40 / 7)
    r.sampling.top_k = i % 2 ? 7 : 40;
    r.sampling.repeat_penalty = i % 4 == 1 ? 1.3f : 1.0f;
    r.sampling.seed = 70 + static_cast<uint64_t>(i), r.sampling.seed_given = true;
    if (i % 4 != 3) r.grammar = json_schema_to_grammar(schema);
    reqs.push_back(std::move(r));
  }
  EngineOptions host;
  host.device_sampling = false;
  const std::vector<GenerateResult> dev = test::run_batch(*model, reqs, &tok, {}, 8);
  const std::vector<GenerateResult> ref = test::run_batch(*model, reqs, &tok, host, 8);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(dev[i].error.empty()) << i << ": " << dev[i].error;
    EXPECT_EQ(dev[i].tokens, ref[i].tokens) << "request " << i;
    if (!reqs[i].grammar.empty()) {
      EXPECT_EQ(dev[i].finish_reason, FinishReason::Eos) << dev[i].text;
      EXPECT_TRUE(matches(reqs[i].grammar, dev[i].text)) << dev[i].text;
    }
  }
}

// A grammar that no token can continue fails its request with the grammar's message on both paths.
TEST(GrammarDeviceMask, NothingAllowedFailsWithTheGrammarsMessage) {
  const auto model = Model::load(test::source_dir() + "/models/default", cpu_options());
  const Tokenizer& tok = shipped_tokenizer();
  GenerateRequest r;
  r.prompt = tok.encode("x", false);
  r.sampling.temperature = 0.0f;
  r.max_new_tokens = 8;
  r.ignore_eos = true;  // complete after "a", and no stop token may end it
  r.grammar = "root ::= \"a\"";
  for (bool device : {true, false}) {
    EngineOptions o;
    o.device_sampling = device;
    const GenerateResult g = test::run_batch(*model, {r}, &tok, o, 1).front();
    EXPECT_NE(g.error.find("grammar: the text is complete but no stop token can end it"), std::string::npos)
        << device << ": " << g.error;
  }
}

}  // namespace
}  // namespace mambacpp
