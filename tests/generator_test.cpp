// Generation tests on a tiny random Mamba-2 checkpoint, through the serving engine: against a full-recompute greedy
// reference, batched == alone (greedy and seeded sampling), stop tokens / EOS / stop strings / max tokens, UTF-8
// safe streaming, and perplexity against one AllLogits pass per window. tests/engine_test.cpp covers scheduling and
// the prefix cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "mambacpp/perplexity.h"
#include "engine/utf8_stream.h"
#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/tokenizer.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

// ---- helpers ---------------------------------------------------------------------------------------------------

std::unique_ptr<Model> load_tiny(const test::TempDir& dir, const ModelConfig& cfg, uint64_t seed = 11) {
  test::write_random_model(dir.path(), cfg, seed);
  LoadOptions opt;
  opt.device = DeviceChoice::CPU;
  return Model::load(dir.path(), opt);
}

class TinyMamba2Engine : public ::testing::Test {
 protected:
  void SetUp() override { model = load_tiny(dir, test::tiny_mamba2_config()); }
  test::TempDir dir{"mambacpp_gen"};
  std::unique_ptr<Model> model;
};

SamplingParams greedy() {
  SamplingParams s;
  s.temperature = 0.0f;
  return s;
}

SamplingParams wide_sampling(uint64_t seed) {  // every token possible, so that a wrong RNG use shows
  SamplingParams s;
  s.temperature = 1.0f;
  s.top_k = 0;
  s.top_p = 1.0f;
  s.min_p = 0.0f;
  s.seed = seed;
  s.seed_given = true;
  return s;
}

GenerateRequest request(std::vector<int32_t> prompt, int max_new, SamplingParams s) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  r.sampling = s;
  return r;
}

int32_t argmax(std::span<const float> row) {
  int32_t best = 0;
  for (size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

// Byte strings per token, mixing ASCII with pieces of multi-byte characters (é = C3 A9, € = E2 82 AC,
// 😀 = F0 9F 98 80) so that tokens split characters the way byte-level BPE does. Only what the generator uses
// is implemented.
class FakeTokenizer : public Tokenizer {
 public:
  explicit FakeTokenizer(int64_t vocab) : vocab_(vocab) {}
  std::vector<int32_t> encode(std::string_view) const override { fail("FakeTokenizer::encode is not used"); }
  std::string decode(std::span<const int32_t> ids, bool) const override {
    std::string s;
    for (int32_t id : ids) s += token_bytes(id);
    return s;
  }
  std::string token_bytes(int32_t id) const override {
    static const char* const pieces[] = {"a", "b ", "\xC3", "\xA9", "\xE2\x82", "\xAC", "cd", "\xF0\x9F\x98\x80",
                                         "\xF0\x9F", "\x98\x80", "\xC3\xA9", "x"};
    MAMBACPP_ASSERT(id >= 0 && id < vocab_);
    return pieces[id % 12];
  }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> token_to_id(std::string_view) const override { return std::nullopt; }
  bool is_special(int32_t) const override { return false; }

 private:
  int64_t vocab_;
};

// Strict UTF-8 check (no overlongs, no surrogates, <= U+10FFFF).
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

// inside[b] is true when byte offset b falls strictly inside a well-formed multi-byte character of `s` (a lead
// byte followed by the continuation bytes it needs).
std::vector<bool> inside_characters(std::string_view s) {
  std::vector<bool> inside(s.size() + 1, false);
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 1;
    size_t k = 1;
    while (k < n && i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80) ++k;
    if (k == n) {
      for (size_t j = 1; j < n; ++j) inside[i + j] = true;
      i += n;
    } else {
      ++i;  // not a character: its bytes stand alone
    }
  }
  return inside;
}

// ---- generation ------------------------------------------------------------------------------------------------

TEST_F(TinyMamba2Engine, GreedyEqualsFullRecomputeReference) {
  // Reference without any state carrying: each next token is the argmax of a fresh forward over the whole text.
  const std::vector<int32_t> prompt = {5, 17, 3, 40, 22};
  const int n_new = 12;
  std::vector<int32_t> seq = prompt, want;
  for (int i = 0; i < n_new; ++i) {
    auto st = model->create_state(1);
    const Sequence s = Sequence::tokens(seq, 0);
    const int32_t t = argmax(model->forward(*st, std::span(&s, 1), Output::LastLogits).row(0));
    want.push_back(t);
    seq.push_back(t);
  }
  const GenerateResult r = test::run_alone(*model, request(prompt, n_new, greedy()));
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.finish_reason, FinishReason::Length);
  EXPECT_TRUE(r.text.empty());
  EXPECT_GE(r.timings.prompt_ms, 0.0);
  EXPECT_GE(r.timings.generate_ms, 0.0);
}

// Prompts of different lengths and budgets, so that requests leave the batch at different steps.
std::vector<GenerateRequest> mixed_batch(SamplingParams s) {
  return {request({7}, 5, s), request({1, 2, 3}, 14, s), request(test::random_tokens(11, 47, 3), 9, s),
          request({30, 30, 30, 30, 30, 30, 30}, 1, s)};
}

TEST_F(TinyMamba2Engine, BatchedEqualsAloneGreedy) {
  const std::vector<GenerateRequest> reqs = mixed_batch(greedy());
  const std::vector<GenerateResult> batch = test::run_batch(*model, reqs);
  ASSERT_EQ(batch.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerateResult alone = test::run_alone(*model, reqs[i]);
    EXPECT_EQ(batch[i].tokens, alone.tokens) << "request " << i;
    EXPECT_EQ(batch[i].tokens.size(), static_cast<size_t>(reqs[i].max_new_tokens)) << "request " << i;
  }
}

TEST_F(TinyMamba2Engine, BatchedEqualsAloneSeededSampling) {
  std::vector<GenerateRequest> reqs = mixed_batch(wide_sampling(0));
  reqs.push_back(reqs[1]);  // the same prompt twice: different seeds must give different continuations
  assign_batch_seeds(reqs, 1000);
  const std::vector<GenerateResult> batch = test::run_batch(*model, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(batch[i].seed, 1000 + i);
    GenerateRequest alone_req = reqs[i];
    alone_req.sampling.seed = 1000 + i;  // what a user re-running request i alone would pass
    EXPECT_EQ(batch[i].tokens, test::run_alone(*model, alone_req).tokens) << "request " << i;
  }
  EXPECT_NE(batch[1].tokens, batch[4].tokens);

  // Two slots for five requests (they queue and reuse slots), on an engine whose cache holds the earlier states:
  // the same tokens.
  const std::vector<GenerateResult> again = test::run_batch(*model, reqs, nullptr, {}, 2);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(again[i].tokens, batch[i].tokens) << "request " << i;
}

TEST(Generator, BatchedEqualsAloneOnMamba1) {
  test::TempDir dir("mambacpp_gen");
  const auto m1 = load_tiny(dir, test::tiny_mamba1_config());
  for (SamplingParams s : {greedy(), wide_sampling(0)}) {
    std::vector<GenerateRequest> reqs = mixed_batch(s);  // ids < 47, valid in this vocabulary of 53 too
    assign_batch_seeds(reqs, 77);
    const std::vector<GenerateResult> batch = test::run_batch(*m1, reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(batch[i].tokens, test::run_alone(*m1, reqs[i]).tokens) << "request " << i << " T " << s.temperature;
  }
}

TEST_F(TinyMamba2Engine, UnseededSamplingReportsItsSeed) {
  SamplingParams s = wide_sampling(0);
  s.seed_given = false;
  const GenerateResult r = test::run_alone(*model, request({4, 8}, 16, s));
  s.seed = r.seed;
  s.seed_given = true;
  EXPECT_EQ(test::run_alone(*model, request({4, 8}, 16, s)).tokens, r.tokens);
}

// The index of the first occurrence of a token that does not occur at index 0 (so that the cut is visible).
size_t first_cut(const std::vector<int32_t>& tokens) {
  for (size_t k = 1; k < tokens.size(); ++k)
    if (std::find(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(k), tokens[k]) ==
        tokens.begin() + static_cast<std::ptrdiff_t>(k))
      return k;
  return 0;
}

TEST_F(TinyMamba2Engine, StopTokenEndsGenerationAndIsNotIncluded) {
  const GenerateRequest base = request({9, 2, 14}, 20, greedy());
  const std::vector<int32_t> full = test::run_alone(*model, base).tokens;
  const size_t k = first_cut(full);
  ASSERT_GT(k, 0u) << "the greedy continuation repeats one token; pick another prompt";
  GenerateRequest r = base;
  r.stop_tokens = {full[k], 46};
  const GenerateResult got = test::run_alone(*model, r);
  EXPECT_EQ(got.finish_reason, FinishReason::Eos);
  EXPECT_EQ(got.tokens, std::vector<int32_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(k)));
}

TEST(Generator, ConfigEosStopsUnlessIgnored) {
  test::TempDir plain_dir("mambacpp_gen"), eos_dir("mambacpp_gen");
  ModelConfig cfg = test::tiny_mamba2_config();
  const auto plain_model = load_tiny(plain_dir, cfg);
  const GenerateRequest req = request({9, 2, 14}, 20, greedy());
  const std::vector<int32_t> full = test::run_alone(*plain_model, req).tokens;
  const size_t k = first_cut(full);
  ASSERT_GT(k, 0u);
  cfg.eos_token_id = full[k];
  const auto eos_model = load_tiny(eos_dir, cfg);  // same seed and shapes: the same weights
  GenerateRequest ignoring = req;
  ignoring.ignore_eos = true;
  const GenerateResult all = test::run_alone(*eos_model, ignoring);
  ASSERT_EQ(all.tokens, full) << "the weights should depend on the seed and shapes only";
  EXPECT_EQ(all.finish_reason, FinishReason::Length);
  const GenerateResult stopped = test::run_alone(*eos_model, req);
  EXPECT_EQ(stopped.finish_reason, FinishReason::Eos);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(k)));

  // eos_token_id as a list (Llama-3-style configs): every entry stops, not only the first.
  test::TempDir list_dir("mambacpp_gen");
  int32_t unused = 0;
  while (std::find(full.begin(), full.end(), unused) != full.end()) ++unused;
  cfg.eos_token_id = unused;
  cfg.extra_eos_token_ids = {full[k]};
  const auto list_model = load_tiny(list_dir, cfg);
  ASSERT_EQ(list_model->config().extra_eos_token_ids, std::vector<int64_t>{full[k]});
  const GenerateResult listed = test::run_alone(*list_model, req);
  EXPECT_EQ(listed.finish_reason, FinishReason::Eos);
  EXPECT_EQ(listed.tokens, stopped.tokens);
  EXPECT_EQ(test::run_alone(*list_model, ignoring).tokens, full);
}

TEST_F(TinyMamba2Engine, MaxNewTokens) {
  for (int n : {0, 1, 7}) {
    const GenerateResult r = test::run_alone(*model, request({3, 1}, n, wide_sampling(5)));
    EXPECT_EQ(r.tokens.size(), static_cast<size_t>(n));
    EXPECT_EQ(r.finish_reason, FinishReason::Length);
  }
}

TEST_F(TinyMamba2Engine, BadRequestsAreRefusedAndRunNothing) {
  Engine engine(*model, nullptr, {.max_seqs = 2});
  auto expect_error = [&](std::vector<GenerateRequest> reqs, const std::string& needle, const Tokenizer* tok = nullptr) {
    Engine with_tok(*model, tok, {.max_seqs = 2});
    Engine& e = tok ? with_tok : engine;
    try {
      e.run(reqs);
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
    }
    EXPECT_EQ(e.stats().queued, 0) << "a rejected batch left requests queued";
    EXPECT_FALSE(e.step()) << "a rejected batch left work";
  };
  const GenerateRequest good = request({5}, 3, greedy());
  expect_error({good, request({}, 3, greedy())}, "BOS");
  expect_error({good, request({3, 47}, 3, greedy())}, "prompt token 1 is 47");
  expect_error({good, request({3}, -1, greedy())}, "max_new_tokens");
  expect_error({good, request({3}, 1 << 30, greedy())}, "max_new_tokens");
  GenerateRequest with_stop = request({3}, 3, greedy());
  with_stop.stop_strings = {"ab"};
  expect_error({good, with_stop}, "tokenizer");
  FakeTokenizer tok(47);
  with_stop.stop_strings = {""};
  expect_error({good, with_stop}, "empty", &tok);
  SamplingParams bad = greedy();
  bad.repeat_penalty = -1.0f;
  expect_error({good, request({3}, 3, bad)}, "repeat_penalty");
  bad = greedy();
  bad.presence_penalty = 2.5f;
  expect_error({good, request({3}, 3, bad)}, "presence_penalty");
  GenerateRequest lp = good;
  lp.logprobs = 21;
  expect_error({good, lp}, "logprobs");
  // The engine still serves good requests, with the tokens they get alone.
  EXPECT_EQ(engine.run({good}).front().tokens, test::run_alone(*model, good).tokens);
}

// ---- text, streaming and stop strings --------------------------------------------------------------------------

TEST_F(TinyMamba2Engine, StreamedTextIsUtf8CompleteAndEqualsTheText) {
  FakeTokenizer tok(47);
  std::vector<GenerateRequest> reqs = {request({1, 2}, 40, wide_sampling(21)),
                                       request({7, 7, 3}, 33, wide_sampling(22))};
  std::vector<test::TextPieces> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) out[i].attach(reqs[i]);
  const std::vector<GenerateResult> res = test::run_batch(*model, reqs, &tok);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(res[i].text, tok.decode(res[i].tokens, false)) << "request " << i;
    EXPECT_EQ(out[i].joined(), res[i].text) << "request " << i;
    EXPECT_GT(out[i].pieces.size(), 3u) << "text should stream as it is generated, not all at the end";
    // No piece boundary falls inside a character that the text completes (bytes that can never form one, such
    // as a lead followed by a new lead, may go out alone).
    const std::vector<bool> inside = inside_characters(res[i].text);
    size_t boundary = 0;
    for (size_t k = 0; k + 1 < out[i].pieces.size(); ++k) {
      boundary += out[i].pieces[k].size();
      EXPECT_FALSE(inside[boundary]) << "request " << i << " piece " << k << " ends inside a character";
    }
  }
}

TEST_F(TinyMamba2Engine, PaddingIdsBeyondTheTokenizerAreNeverSampled) {
  // The tiny model has 47 logits; a tokenizer of 40 tokens leaves 7 padding rows (as mamba_ssm pads vocabularies).
  SamplingParams s = wide_sampling(8);
  s.temperature = 2.0f;
  const GenerateRequest r = request({1, 2, 3}, 80, s);
  const std::vector<int32_t> unmasked = test::run_alone(*model, r).tokens;
  ASSERT_TRUE(std::any_of(unmasked.begin(), unmasked.end(), [](int32_t t) { return t >= 40; }))
      << "without the mask this seed should reach a padding id; otherwise the test shows nothing";
  FakeTokenizer tok(40);
  const std::vector<int32_t> masked = test::run_alone(*model, r, &tok).tokens;
  for (int32_t t : masked) EXPECT_LT(t, 40);
}

TEST_F(TinyMamba2Engine, StopStringCutsTextAndKeepsCompletingToken) {
  FakeTokenizer tok(47);
  const GenerateRequest base = request({5, 6, 7}, 40, wide_sampling(31));
  const GenerateResult full = test::run_alone(*model, base, &tok);
  // Byte offset where each token's bytes end.
  std::vector<size_t> ends;
  for (int32_t t : full.tokens) ends.push_back((ends.empty() ? 0 : ends.back()) + tok.token_bytes(t).size());
  ASSERT_GE(full.tokens.size(), 12u);
  // A stop string straddling the boundary after token 9: its last byte of token 9 and the first two after it.
  const std::string stop = full.text.substr(ends[9] - 1, 3);
  const size_t at = full.text.find(stop);
  // The token whose bytes complete the first occurrence.
  const auto completing = std::lower_bound(ends.begin(), ends.end(), at + stop.size()) - ends.begin();

  GenerateRequest r = base;
  r.stop_strings = {"never in this text \x01", stop};
  test::TextPieces out;
  out.attach(r);
  const GenerateResult got = test::run_alone(*model, r, &tok);
  EXPECT_EQ(got.finish_reason, FinishReason::StopString);
  EXPECT_EQ(got.text, full.text.substr(0, at));
  EXPECT_EQ(got.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + completing + 1));
  EXPECT_EQ(out.joined(), got.text);  // nothing of the stop string was streamed
}

// ---- Utf8Stream ------------------------------------------------------------------------------------------------

TEST(Utf8Stream, HoldsBackSplitCharacters) {
  Utf8Stream s;
  EXPECT_EQ(s.push("a\xC3"), "a");
  EXPECT_EQ(s.push("\xA9"), "\xC3\xA9");
  EXPECT_EQ(s.push("\xF0"), "");
  EXPECT_EQ(s.push("\x9F\x98"), "");
  EXPECT_EQ(s.pending(), 3u);
  EXPECT_EQ(s.push("\x80!"), "\xF0\x9F\x98\x80!");
  EXPECT_EQ(s.push("\xE2\x82"), "");
  EXPECT_EQ(s.flush(), "\xE2\x82");  // the stream ended inside a character: out as-is
  EXPECT_EQ(s.flush(), "");
}

TEST(Utf8Stream, InvalidBytesPassThrough) {
  Utf8Stream s;
  EXPECT_EQ(s.push("\xFF"), "\xFF");      // never valid
  EXPECT_EQ(s.push("\x80\x80"), "\x80\x80");  // stray continuation bytes
  EXPECT_EQ(s.push("\xC3"), "");
  EXPECT_EQ(s.push("z"), "\xC3z");        // the lead was not continued: it can never complete
  EXPECT_EQ(s.push("\xC0"), "\xC0");      // C0/C1 only start overlong encodings
}

TEST(Utf8Stream, EverySplitOfValidTextGivesValidPiecesAndTheSameBytes) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";  // a é € 😀 z: 11 bytes, 10 cut points
  const size_t cuts = text.size() - 1;
  for (uint32_t mask = 0; mask < (1u << cuts); ++mask) {
    Utf8Stream s;
    std::string joined;
    size_t start = 0;
    for (size_t i = 1; i <= text.size(); ++i) {
      if (i < text.size() && !(mask & (1u << (i - 1)))) continue;
      const std::string piece = s.push(std::string_view(text).substr(start, i - start));
      EXPECT_TRUE(valid_utf8(piece)) << "mask " << mask;
      joined += piece;
      start = i;
    }
    EXPECT_EQ(s.flush(), "") << "mask " << mask;
    EXPECT_EQ(joined, text) << "mask " << mask;
  }
}

// ---- perplexity ------------------------------------------------------------------------------------------------

// Sum of -log softmax(row)[next] over one fresh AllLogits pass of `seq` (written here independently of
// perplexity.cpp), and the number of predictions.
std::pair<double, int64_t> reference_nll_sum(const Model& model, std::span<const int32_t> seq) {
  auto st = model.create_state(1);
  const Sequence s = Sequence::tokens(seq, 0);
  const ForwardResult out = model.forward(*st, std::span(&s, 1), Output::AllLogits);
  double sum = 0;
  for (size_t i = 0; i + 1 < seq.size(); ++i) {
    const std::span<const float> row = out.row(static_cast<int64_t>(i));
    double m = row[0];
    for (float v : row) m = std::max(m, static_cast<double>(v));
    double z = 0;
    for (float v : row) z += std::exp(v - m);
    sum += m + std::log(z) - row[static_cast<size_t>(seq[i + 1])];
  }
  return {sum, static_cast<int64_t>(seq.size()) - 1};
}

// Chunked and one-pass forwards agree to f32 rounding (~1e-6 relative on logits of size ~10); the NLL, a smooth
// function of the logits with gradient norm <= 2, then agrees to well under 1e-4 nats.
constexpr double kNllTol = 1e-4;

TEST_F(TinyMamba2Engine, PerplexityWholeTextEqualsOnePass) {
  const std::vector<int32_t> toks = test::random_tokens(61, 47, 77);
  const auto [sum, n] = reference_nll_sum(*model, toks);
  for (int64_t batch : {1, 7, 16, 61, 512}) {
    PerplexityOptions opt;
    opt.batch_tokens = batch;
    std::vector<std::pair<int64_t, int64_t>> progress;
    opt.on_progress = [&](int64_t done, int64_t total) { progress.emplace_back(done, total); };
    const PerplexityResult r = perplexity(*model, toks, opt);
    EXPECT_EQ(r.n_predicted, 60);
    EXPECT_NEAR(r.nll, sum / static_cast<double>(n), kNllTol) << "batch_tokens " << batch;
    EXPECT_NEAR(r.ppl, std::exp(r.nll), 1e-12 * r.ppl);
    EXPECT_TRUE(std::isfinite(r.nll));
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back().first, 61);
    EXPECT_EQ(progress.back().second, 61);
    for (size_t k = 1; k < progress.size(); ++k) EXPECT_GT(progress[k].first, progress[k - 1].first);
  }
}

TEST_F(TinyMamba2Engine, PerplexityWindowsEqualSumOfSeparateWindows) {
  for (int64_t n_tokens : {43, 41, 40}) {  // last window of 3 tokens; of 1 token (dropped); none
    const std::vector<int32_t> toks = test::random_tokens(n_tokens, 47, 5);
    double sum = 0;
    int64_t count = 0;
    for (int64_t b = 0; b < n_tokens; b += 10) {
      const int64_t e = std::min<int64_t>(n_tokens, b + 10);
      if (e - b < 2) continue;
      const auto [s, c] =
          reference_nll_sum(*model, std::span(toks).subspan(static_cast<size_t>(b), static_cast<size_t>(e - b)));
      sum += s;
      count += c;
    }
    // batch 512: all windows in one call, one slot each; 25: two windows per call; 4: pieces inside a window.
    for (int64_t batch : {512, 25, 4}) {
      PerplexityOptions opt;
      opt.context = 10;
      opt.batch_tokens = batch;
      const PerplexityResult r = perplexity(*model, toks, opt);
      EXPECT_EQ(r.n_predicted, count) << n_tokens << " tokens, batch " << batch;
      EXPECT_NEAR(r.nll, sum / static_cast<double>(count), kNllTol) << n_tokens << " tokens, batch " << batch;
    }
  }
}

// on_logits sees every scored position once, windows included, with the logits the loss was taken from.
TEST_F(TinyMamba2Engine, PerplexityHandsOverEachScoredPositionsLogits) {
  const std::vector<int32_t> toks = test::random_tokens(43, 47, 9);
  for (int64_t context : {0, 10}) {
    PerplexityOptions opt;
    opt.context = context;
    opt.batch_tokens = 25;
    std::vector<int> seen(toks.size(), 0);
    double sum = 0;
    opt.on_logits = [&](int64_t pos, std::span<const float> logits) {
      ASSERT_EQ(logits.size(), static_cast<size_t>(model->config().vocab_size));
      ++seen[static_cast<size_t>(pos)];
      std::vector<double> lp(logits.size());
      log_softmax(logits, lp);
      sum -= lp[static_cast<size_t>(toks[static_cast<size_t>(pos) + 1])];
    };
    const PerplexityResult r = perplexity(*model, toks, opt);
    for (size_t pos = 0; pos < toks.size(); ++pos) {
      const bool scored = context == 0 ? pos + 1 < toks.size() : (pos % 10 != 9 && pos + 1 < toks.size());
      EXPECT_EQ(seen[pos], scored ? 1 : 0) << "context " << context << " position " << pos;
    }
    EXPECT_NEAR(sum / static_cast<double>(r.n_predicted), r.nll, 1e-12);
  }
}

TEST_F(TinyMamba2Engine, PerplexityRejectsBadInput) {
  const std::vector<int32_t> toks = {1, 2, 3, 4};
  EXPECT_THROW(perplexity(*model, std::span(toks).first(1)), Error);
  PerplexityOptions opt;
  opt.context = 1;
  EXPECT_THROW(perplexity(*model, toks, opt), Error);
  opt.context = -2;
  EXPECT_THROW(perplexity(*model, toks, opt), Error);
  opt = {};
  opt.batch_tokens = 0;
  EXPECT_THROW(perplexity(*model, toks, opt), Error);
  EXPECT_THROW(perplexity(*model, std::vector<int32_t>{1, 47}), Error);
}

}  // namespace
}  // namespace mambacpp
