// The multi-token-prediction block as a draft source (model/mtp.h, --draft-mtp), on a tiny Nemotron-H checkpoint with
// MTP tensors written here: greedy output with MTP drafts is token for token the plain output (alone, beside other
// requests, from a cached prefix, across prefill pieces); the block's state rolls back exactly (one pass equals pieces
// with drafts run and undone in between); its config keys parse; a model without MTP layers, or a checkpoint that
// lacks them, is refused naming what is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "mambacpp/config.h"
#include "mambacpp/engine.h"
#include "mambacpp/model.h"
#include "model/mtp.h"
#include "model/weights.h"
#include "server/api_error.h"
#include "server/completion_request.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

// Nemotron-H with Mamba-2, MoE, attention and MLP layers, and an MTP block of Nemotron 3 Super's kind (attention,
// then MoE).
const char* kConfig = R"({
  "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 61, "hidden_size": 32,
  "hybrid_override_pattern": "ME*-", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
  "intermediate_size": 24, "mlp_hidden_act": "relu2", "ssm_state_size": 8, "mamba_num_heads": 8,
  "mamba_head_dim": 8, "n_groups": 2, "conv_kernel": 4, "chunk_size": 8, "layer_norm_epsilon": 1e-5,
  "tie_word_embeddings": false, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
  "moe_shared_expert_intermediate_size": 20, "n_group": 2, "topk_group": 1, "norm_topk_prob": true,
  "routed_scaling_factor": 2.0, "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E"})";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

test::HostTensor random_tensor(const std::string& name, const std::vector<int64_t>& shape, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  test::HostTensor t;
  t.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const float fan_in = shape.size() >= 2 ? static_cast<float>(shape.back()) : 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (ends_with(name, "norm.weight") || ends_with(name, "norm_f.weight")) v = 1.0f + 0.2f * nd(rng);
    else if (ends_with(name, "A_log")) v = std::log(1.0f + 15.0f * ud(rng));
    else if (ends_with(name, ".D")) v = 0.5f + ud(rng);
    else if (ends_with(name, "dt_bias")) v = -1.5f + 0.5f * nd(rng);
    else if (ends_with(name, "e_score_correction_bias")) v = 0.1f * nd(rng);
    else v = nd(rng) / std::sqrt(fan_in);
    t.values.push_back(v);
  }
  return t;
}

// The model's tensors and the MTP block's: the block's layers under mtp.layers.*, with enorm, hnorm and eh_proj in
// layer 0 and final_layernorm in the last (the released checkpoints' names).
std::map<std::string, test::HostTensor> checkpoint_tensors(const ModelConfig& c, uint64_t seed, bool with_mtp = true) {
  std::mt19937_64 rng(seed);
  std::map<std::string, test::HostTensor> out;
  for (const auto& [name, shape] : hybrid_weight_shapes(c)) out[name] = random_tensor(name, shape, rng);
  if (!with_mtp) return out;
  ModelConfig block = c;
  block.layers = c.mtp_layers;
  block.n_layer = static_cast<int64_t>(block.layers.size());
  for (const auto& [name, shape] : hybrid_weight_shapes(block)) {
    if (name.rfind("model.layers.", 0) != 0) continue;
    const std::string as = "mtp." + name.substr(6);
    out[as] = random_tensor(as, shape, rng);
  }
  const int64_t d = c.d_model;
  out["mtp.layers.0.enorm.weight"] = random_tensor("enorm.weight", {d}, rng);
  out["mtp.layers.0.hnorm.weight"] = random_tensor("hnorm.weight", {d}, rng);
  out["mtp.layers.0.eh_proj.weight"] = random_tensor("eh_proj.weight", {d, 2 * d}, rng);
  out["mtp.layers." + std::to_string(block.n_layer - 1) + ".final_layernorm.weight"] =
      random_tensor("final_layernorm.weight", {d}, rng);
  return out;
}

// MTP blocks whose drafts are known in advance. The layers add nothing (zero output projections) and the norms have
// unit weights, so the block's output is the normalised row that eh_proj passes through:
// - PassHidden: hnorm(h_p), so its logits are the model's own at p (scaled): every draft, chained or not, is the token
//   that follows p, i.e. the request's `next` when the engine pairs h_p with the right row;
// - PassToken: enorm(embed(t_{p+1})), so a draft is f(t) = argmax_v lm_head[v] . embed(t) of the token it is paired
//   with (the LM head is set to the embeddings, so f is mostly the identity), and a chained draft f(previous draft).
enum class Pass { Hidden, Token };
void make_block_pass(std::map<std::string, test::HostTensor>& t, int64_t d, Pass pass) {
  for (auto& [name, tensor] : t) {
    if (name.rfind("mtp.", 0) != 0) continue;
    if (ends_with(name, "o_proj.weight") || name.find("down_proj") != std::string::npos)
      std::fill(tensor.values.begin(), tensor.values.end(), 0.0f);
    if (ends_with(name, "enorm.weight") || ends_with(name, "hnorm.weight") || ends_with(name, "final_layernorm.weight"))
      std::fill(tensor.values.begin(), tensor.values.end(), 1.0f);
  }
  std::vector<float>& eh = t.at("mtp.layers.0.eh_proj.weight").values;
  std::fill(eh.begin(), eh.end(), 0.0f);
  for (int64_t r = 0; r < d; ++r) eh[static_cast<size_t>(r * 2 * d + (pass == Pass::Hidden ? d : 0) + r)] = 1.0f;
  if (pass == Pass::Token) t.at("lm_head.weight").values = t.at("model.embeddings.weight").values;
}

void write_checkpoint(const std::string& dir, const nlohmann::json& config,
                      const std::map<std::string, test::HostTensor>& tensors) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(1);
  test::write_safetensors(dir + "/model.safetensors", tensors);
}

std::unique_ptr<Model> load_cpu(const std::string& dir, int64_t batch_tokens = 0) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 1;
  lo.max_batch_tokens = batch_tokens;
  return Model::load(dir, lo);
}

GenerateRequest greedy(std::vector<int32_t> prompt, int max_new, int draft_max = 0, bool mtp = false,
                       bool adaptive = true) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  r.speculative.draft_mtp = mtp;
  r.speculative.draft_max = draft_max;
  r.speculative.adaptive = adaptive;
  return r;
}

EngineOptions with_mtp() {
  EngineOptions o;
  o.draft_mtp = true;
  return o;
}

class MtpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("mambacpp_mtp");
    write_checkpoint(dir_->path(), nlohmann::json::parse(kConfig), checkpoint_tensors(parse_model_config(kConfig), 53));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static test::TempDir* dir_;
};
test::TempDir* MtpTest::dir_ = nullptr;

TEST(MtpConfig, TheBlocksLayersComeFromTheListThePatternOrTheDefault) {
  nlohmann::json j = nlohmann::json::parse(kConfig);
  ModelConfig c = parse_model_config(j.dump());
  EXPECT_EQ(c.mtp_layers_ignored, 1);
  EXPECT_EQ(c.mtp_layers, (std::vector<LayerKind>{LayerKind::Attention, LayerKind::MoE}));
  EXPECT_EQ(parse_model_config(c.to_json()).mtp_layers, c.mtp_layers);  // the canonical form keeps them
  j["mtp_layers_block_type"] = {"moe", "full_attention", "mamba"};  // the list wins, as in NemotronHConfig
  EXPECT_EQ(parse_model_config(j.dump()).mtp_layers,
            (std::vector<LayerKind>{LayerKind::MoE, LayerKind::Attention, LayerKind::Mamba2}));
  j.erase("mtp_layers_block_type");
  j.erase("mtp_hybrid_override_pattern");
  EXPECT_EQ(parse_model_config(j.dump()).mtp_layers, (std::vector<LayerKind>{LayerKind::Attention, LayerKind::MoE}));
  j["mtp_hybrid_override_pattern"] = "*X";
  const std::string e = test::error_of([&] { parse_model_config(j.dump()); });
  EXPECT_NE(e.find("mtp_hybrid_override_pattern"), std::string::npos) << e;
  EXPECT_NE(e.find("'X'"), std::string::npos) << e;
  j["num_nextn_predict_layers"] = 0;
  EXPECT_TRUE(parse_model_config(j.dump()).mtp_layers.empty());  // no MTP layers: the pattern is not read
}

TEST_F(MtpTest, GreedyOutputIsThePlainOutput) {
  auto model = load_cpu(dir_->path());
  const int64_t vocab = model->config().vocab_size;
  int64_t drafted = 0;
  for (uint64_t s = 0; s < 4; ++s) {
    const std::vector<int32_t> prompt = test::random_tokens(5 + 7 * static_cast<int64_t>(s), vocab, 100 + s);
    const GenerateResult plain = test::run_alone(*model, greedy(prompt, 24));
    ASSERT_EQ(plain.tokens.size(), 24u);
    for (int k : {1, 3, 6})
      for (bool adaptive : {true, false}) {
        SCOPED_TRACE("prompt " + std::to_string(s) + ", draft_max " + std::to_string(k) +
                     (adaptive ? ", adaptive" : ", fixed"));
        const GenerateResult got = test::run_alone(*model, greedy(prompt, 24, k, true, adaptive), nullptr, with_mtp());
        EXPECT_EQ(got.tokens, plain.tokens);
        EXPECT_GT(got.draft_tokens, 0);
        EXPECT_LE(got.accepted_draft_tokens, got.draft_tokens);
        drafted += got.draft_tokens;
      }
  }
  EXPECT_GT(drafted, 100);
}

TEST_F(MtpTest, BatchedPiecedAndCachedRequestsGetTheirPlainTokens) {
  // Prefill in pieces of 5 tokens: the block is fed the model's hidden states piece by piece.
  auto model = load_cpu(dir_->path(), /*batch_tokens=*/5);
  const int64_t vocab = model->config().vocab_size;
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> plain;
  for (uint64_t i = 0; i < 6; ++i) {
    GenerateRequest r = greedy(test::random_tokens(3 + 4 * static_cast<int64_t>(i), vocab, 200 + i), 16,
                               static_cast<int>(i % 4), /*mtp=*/i % 3 != 2);
    if (i == 4) r.speculative.draft_mtp = false, r.speculative.draft_ngram = 2;  // another source beside it
    GenerateRequest alone = r;
    alone.speculative = {};
    plain.push_back(test::run_alone(*model, std::move(alone)).tokens);
    reqs.push_back(std::move(r));
  }
  EngineOptions o = with_mtp();
  o.batch_tokens = 7;
  const std::vector<GenerateResult> got = test::run_batch(*model, reqs, nullptr, o, /*max_seqs=*/4);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, plain[i]) << "request " << i;

  // A second turn that continues the first from the prefix cache: the block starts after the cached prefix.
  Engine engine(*model, nullptr, with_mtp());
  const std::vector<int32_t> prompt = test::random_tokens(12, vocab, 300);
  const GenerateResult turn1 = engine.run({greedy(prompt, 10, 3, true)}).front();
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), turn1.tokens.begin(), turn1.tokens.end());
  next.push_back(7);
  const GenerateResult turn2 = engine.run({greedy(next, 12, 3, true)}).front();
  EXPECT_GT(turn2.cached_prompt_tokens, 0);
  EXPECT_GT(turn2.draft_tokens, 0);
  EXPECT_EQ(turn2.tokens, test::run_alone(*model, greedy(next, 12)).tokens);
}

// The engine pairs the model's hidden state at p with token p+1 and chains drafts from the block's output: with the
// blocks above, the drafts of every step are known from the plain greedy sequence alone, and so are the counts of
// drafted and kept tokens (fixed draft length).
TEST(MtpAlignment, DraftsPairEachHiddenStateWithTheTokenAfterIt) {
  const ModelConfig c = parse_model_config(kConfig);
  const int64_t d = c.d_model, V = c.vocab_size;
  for (Pass pass : {Pass::Hidden, Pass::Token}) {
    SCOPED_TRACE(pass == Pass::Hidden ? "block passes h_p" : "block passes token p+1");
    test::TempDir tmp;
    auto tensors = checkpoint_tensors(c, 91);
    make_block_pass(tensors, d, pass);
    write_checkpoint(tmp.path(), nlohmann::json::parse(kConfig), tensors);
    auto model = load_cpu(tmp.path());
    const std::vector<float>& head = tensors.at("lm_head.weight").values;
    const std::vector<float>& emb = tensors.at("model.embeddings.weight").values;
    auto f = [&](int32_t t) {  // the PassToken block's draft after token t
      int32_t best = 0;
      double best_v = -1e300;
      for (int32_t v = 0; v < V; ++v) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += double(head[static_cast<size_t>(v * d + i)]) * emb[static_cast<size_t>(t * d + i)];
        if (dot > best_v) best_v = dot, best = v;
      }
      return best;
    };
    const int max_new = 40, k = 3;
    int64_t expected_total = 0;
    std::vector<GenerateRequest> batch;
    std::vector<std::pair<int64_t, int64_t>> counts;  // drafted, accepted
    for (uint64_t s = 0; s < 6; ++s) {
      SCOPED_TRACE("prompt " + std::to_string(s));
      const std::vector<int32_t> prompt = test::random_tokens(6 + static_cast<int64_t>(s), V, 500 + s);
      const GenerateResult plain = test::run_alone(*model, greedy(prompt, max_new));
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), plain.tokens.begin(), plain.tokens.end());
      // The engine's schedule: the first token without drafts, then k drafts a step (fewer near max_new); a verify
      // keeps the leading drafts that equal the tokens after `next`, plus the model's own token.
      int64_t produced = 1, n = static_cast<int64_t>(prompt.size()), drafted = 0, accepted = 0;
      while (produced < max_new) {
        const int64_t kk = std::min<int64_t>(k, max_new - produced - 1);
        int32_t draft = seq[static_cast<size_t>(n)];
        int64_t a = 0;
        for (int64_t j = 0; j < kk; ++j) {
          if (pass == Pass::Token) draft = f(draft);
          if (a < j || draft != seq[static_cast<size_t>(n + 1 + j)]) break;
          ++a;
        }
        drafted += kk, accepted += a;
        produced += a + 1, n += a + 1;
      }
      const GenerateResult got = test::run_alone(*model, greedy(prompt, max_new, k, true, /*adaptive=*/false),
                                                 nullptr, with_mtp());
      EXPECT_EQ(got.tokens, plain.tokens);
      EXPECT_EQ(got.draft_tokens, drafted);
      EXPECT_EQ(got.accepted_draft_tokens, accepted);
      expected_total += accepted;
      batch.push_back(greedy(prompt, max_new, k, true, /*adaptive=*/false));
      counts.emplace_back(drafted, accepted);
    }
    EXPECT_GT(expected_total, 0) << "no draft would be kept: the pairing went untested";
    // All at once, prefill in pieces of 4 tokens: each request's hidden rows are its own.
    EngineOptions o = with_mtp();
    o.batch_tokens = 4;
    const std::vector<GenerateResult> got = test::run_batch(*model, batch, nullptr, o);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].draft_tokens, counts[i].first) << "request " << i << " in a batch";
      EXPECT_EQ(got[i].accepted_draft_tokens, counts[i].second) << "request " << i << " in a batch";
    }
  }
}

TEST_F(MtpTest, BlockStateRollsBackExactly) {
  auto model = load_cpu(dir_->path());
  const auto head = MtpHead::load(*model);
  const int64_t d = model->config().d_model, vocab = model->config().vocab_size, L = 13;
  const std::vector<int32_t> ids = test::random_tokens(L + 1, vocab, 400);
  auto st = model->create_state(1);
  Sequence s = Sequence::tokens(std::span<const int32_t>(ids).first(static_cast<size_t>(L)), 0);
  const std::vector<float> hidden = model->forward(*st, {&s, 1}, Output::Hidden).values;
  const std::span<const int32_t> next(ids.data() + 1, static_cast<size_t>(L));

  auto once = head->create_state(1);
  const MtpSequence all{0, next, hidden};
  const ForwardResult ref = head->forward(*once, {&all, 1}, Output::AllLogitsAndHidden);
  ASSERT_EQ(ref.rows, L);
  ASSERT_EQ(ref.hidden.size(), static_cast<size_t>(L * d));

  // The same rows in three calls, with three chained drafts run from a snapshot and undone between them.
  auto pieces = head->create_state(1);
  std::vector<float> logits;
  for (auto [from, len] : {std::pair<int64_t, int64_t>{0, 5}, {5, 1}, {6, 7}}) {
    const MtpSequence part{0, next.subspan(static_cast<size_t>(from), static_cast<size_t>(len)),
                           std::span<const float>(hidden).subspan(static_cast<size_t>(from * d), static_cast<size_t>(len * d))};
    const ForwardResult r = head->forward(*pieces, {&part, 1}, Output::AllLogitsAndHidden);
    logits.insert(logits.end(), r.values.begin(), r.values.end());
    const SlotSnapshot snap = pieces->snapshot(0);
    std::vector<float> g(r.hidden.end() - d, r.hidden.end());
    for (int32_t t : {3, 9, 27}) {
      const MtpSequence draft{0, std::span<const int32_t>(&t, 1), g};
      g = head->forward(*pieces, {&draft, 1}, Output::AllLogitsAndHidden).hidden;
    }
    pieces->restore(0, snap);
  }
  EXPECT_LT(test::max_rel_diff(logits, ref.values), 1e-5);
}

TEST_F(MtpTest, GenerateCommandDraftsWithTheBlock) {
  test::TempDir tmp;
  std::ofstream(tmp.file("ids.txt")) << "5 9 13 2 40 7 7 31";
  const std::string base = "generate --device cpu --model " + dir_->path() + " --tokens-file " + tmp.file("ids.txt") +
                           " -n 20 --temp 0 --ignore-eos --json";
  const test::CliResult plain = test::run_cli(base);
  const test::CliResult spec = test::run_cli(base + " --draft-mtp --draft-max 3");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(spec.out);
  EXPECT_EQ(b["tokens"], a["tokens"]);
  EXPECT_EQ(a["draft_tokens"], 0);
  EXPECT_GT(b["draft_tokens"].get<int64_t>(), 0);
  // The flag on a model without MTP layers, and beside another draft source: clear errors.
  const test::CliResult none = test::run_cli("generate --device cpu --model " + test::source_dir() +
                                             "/models/default -p 'x' -n 2 --draft-mtp");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("no multi-token-prediction layers"), std::string::npos) << none.err;
  const test::CliResult both = test::run_cli(base + " --draft-mtp --draft-ngram 2");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("one source"), std::string::npos) << both.err;
}

TEST(MtpServer, TheDraftMtpFieldPicksTheSourceAndNeedsTheBlock) {
  server::RequestLimits lim;
  lim.vocab_size = 61;
  auto parse = [&](const nlohmann::json& extra) {
    nlohmann::json body = {{"prompt", std::vector<int>{1, 2, 3}}, {"max_tokens", 4}};
    if (extra.is_object()) body.update(extra);
    return server::parse_completion(body, nullptr, lim).base.speculative;
  };
  auto param_of = [&](const nlohmann::json& extra) -> std::string {
    try {
      parse(extra);
    } catch (const server::ApiError& e) {
      return e.param;
    }
    return "(no error)";
  };
  EXPECT_EQ(param_of({{"draft_mtp", true}}), "draft_mtp");  // serve without --draft-mtp
  lim.draft_mtp_loaded = true;
  EXPECT_TRUE(parse({{"draft_mtp", true}}).draft_mtp);
  EXPECT_FALSE(parse({}).draft_mtp);
  EXPECT_EQ(param_of({{"draft_mtp", true}, {"draft_ngram", 2}}), "draft_mtp");
  lim.speculative.draft_mtp = true;  // serve --draft-mtp: the default source
  EXPECT_TRUE(parse({}).draft_mtp);
  const SpeculativeParams ngram = parse({{"draft_ngram", 2}});  // another source turns the default off
  EXPECT_FALSE(ngram.draft_mtp);
  EXPECT_EQ(ngram.draft_ngram, 2);
  EXPECT_FALSE(parse({{"draft_mtp", false}}).enabled());
}

TEST(MtpRefusal, ModelsWithoutMtpLayersAreRefusedClearly) {
  // The hybrid fixture has no MTP layers; the shipped pure Mamba model is of another family.
  for (const std::string dir : {test::fixture_dir() + "/hybrid/nemotron_h_f32", test::source_dir() + "/models/default"}) {
    auto model = load_cpu(dir);
    const std::string e = test::error_of([&] { Engine engine(*model, nullptr, with_mtp()); });
    EXPECT_NE(e.find("no multi-token-prediction layers"), std::string::npos) << e;
    EXPECT_NE(e.find("--draft-mtp"), std::string::npos) << e;
  }
  // MTP layers declared, but the checkpoint holds none of their tensors: the error says so.
  test::TempDir tmp;
  const nlohmann::json j = nlohmann::json::parse(kConfig);
  write_checkpoint(tmp.path(), j, checkpoint_tensors(parse_model_config(kConfig), 7, /*with_mtp=*/false));
  auto model = load_cpu(tmp.path());
  std::string e = test::error_of([&] { Engine engine(*model, nullptr, with_mtp()); });
  EXPECT_NE(e.find("no MTP tensors"), std::string::npos) << e;
  // One of the block's tensors missing: named.
  auto tensors = checkpoint_tensors(parse_model_config(kConfig), 7);
  ASSERT_EQ(tensors.erase("mtp.layers.0.eh_proj.weight"), 1u);
  write_checkpoint(tmp.file("partial"), j, tensors);
  auto partial = load_cpu(tmp.file("partial"));
  e = test::error_of([&] { Engine engine(*partial, nullptr, with_mtp()); });
  EXPECT_NE(e.find("mtp.layers.0.eh_proj.weight"), std::string::npos) << e;
  // A dense model (no MoE layers) that declares the default attention + MoE block: it loads as a dense model, and
  // --draft-mtp says why it cannot run the block.
  nlohmann::json dense = j;
  dense["hybrid_override_pattern"] = "M*-";
  const ModelConfig dc = parse_model_config(dense.dump());
  EXPECT_EQ(dc.moe.n_experts, 0);
  write_checkpoint(tmp.file("dense"), dense, checkpoint_tensors(dc, 8, /*with_mtp=*/false));
  auto dense_model = load_cpu(tmp.file("dense"));
  e = test::error_of([&] { Engine engine(*dense_model, nullptr, with_mtp()); });
  EXPECT_NE(e.find("MoE layers but the model has none"), std::string::npos) << e;
  // A request asking for MTP drafts from an engine that did not load the block.
  Engine plain(*partial, nullptr, {});
  e = test::error_of([&] { plain.submit(greedy({1, 2, 3}, 4, 0, true)); });
  EXPECT_NE(e.find("--draft-mtp"), std::string::npos) << e;
}

}  // namespace
}  // namespace mambacpp
