// Tensor parallelism's arithmetic on one CPU (issue 57): the shard plan and its refusals, the weight slices, and the
// proof that N ranks' shards, summed, compute what the whole model computes: a Mamba-2 layer through the public
// Mixer API (each rank a Mixer of n_heads / N heads and n_groups / N groups), attention and MLP sublayers, and whole
// models (logits and greedy tokens) through SimulatedTensorParallel, for N = 2 and 4.
//
// Tolerance: the shards compute the same products as the whole model, but a row-parallel projection (out_proj,
// o_proj, the MLP's down) sums its d_inner (or q_dim, mlp_size) terms as N partial dot products added afterwards, in
// another order than one dot product, and the GEMM kernels tile the narrower matrices differently. That is f32
// reassociation: a relative error of a few 1e-7 per sublayer (measured: below 1e-6 through whole models). The bound
// 1e-5 of the largest value is issue 57's bound for exact precision, ~10-100x above that, while a slicing mistake (a
// wrong head, group or channel range, a bias added N times) moves outputs by 1e-2 or more.
// The Mixer API normalises a rank's channels alone, so a gated norm that spans the ranks (one norm group over the
// whole d_inner, TpPlan::norm_all_reduce) is checked through SimulatedTensorParallel only.
#include "model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "mambacpp/error.h"
#include "mambacpp/mixer.h"
#include "mambacpp/model.h"
#include "support/tensor_parallel_reference.h"
#include "model/weights.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

constexpr double kTol = 1e-5;

LoadOptions cpu_options() {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 1;  // tiny models; the machine's cores are shared
  return lo;
}

std::unique_ptr<Model> random_model(const ModelConfig& c, const test::TempDir& dir, uint64_t seed) {
  test::write_random_model(dir.path(), c, seed);
  return Model::load(dir.path(), cpu_options());
}

// A Mamba-2 config whose heads (8) and groups (4) split over 4 ranks, with biases, an untied lm_head and a
// vocabulary that leaves the last rank only padding.
ModelConfig mamba2_four_way_config() {
  ModelConfig c = test::tiny_mamba2_config();
  c.d_model = 24;
  c.n_layer = 3;
  c.vocab_size = 300;
  c.n_heads = 8;
  c.head_dim = 6;
  c.d_inner = 48;
  c.n_groups = 4;
  c.use_bias = true;
  c.tie_embeddings = false;
  return c;
}

nlohmann::json hybrid_fixture_json(const std::string& name) {
  std::ifstream f(test::fixture_dir() + "/hybrid/" + name + "/config.json");
  return nlohmann::json::parse(f);
}

ModelConfig hybrid_fixture_config(const std::string& name) {
  return parse_model_config(hybrid_fixture_json(name).dump(), name);
}

std::string plan_error(const ModelConfig& c, int64_t n) {
  return test::error_of([&] { plan_tensor_parallel(c, n); });
}

std::vector<float> random_rows(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// ---- The plan --------------------------------------------------------------------------------------------------

TEST(TensorParallelPlan, SplitsMamba2HeadsWithTheirGroups) {
  const ModelConfig c = test::tiny_mamba2_config();  // 6 heads of 6 channels in 2 groups, vocab 47
  const TpPlan p = plan_tensor_parallel(c, 2);
  ASSERT_EQ(p.ranks.size(), 2u);
  EXPECT_FALSE(p.groups_replicated);
  EXPECT_EQ(p.ranks[0].heads, (TpRange{0, 3}));
  EXPECT_EQ(p.ranks[1].heads, (TpRange{3, 3}));
  EXPECT_EQ(p.ranks[0].groups, (TpRange{0, 1}));
  EXPECT_EQ(p.ranks[1].groups, (TpRange{1, 1}));
  EXPECT_EQ(p.ranks[1].channels, (TpRange{18, 18}));
  EXPECT_EQ(p.padded_vocab, 2 * kVocabPadPerRank);
  EXPECT_EQ(p.ranks[1].vocab, (TpRange{kVocabPadPerRank, kVocabPadPerRank}));
  const ModelConfig rc = p.rank_config(c);
  EXPECT_EQ(rc.n_heads, 3);
  EXPECT_EQ(rc.n_groups, 1);
  EXPECT_EQ(rc.d_inner, 18);
  EXPECT_EQ(rc.norm_groups(), 1);
  EXPECT_EQ(rc.in_proj_size(), 2 * 18 + 2 * 6 + 3);
  EXPECT_EQ(rc.d_model, c.d_model);

  const TpPlan one = plan_tensor_parallel(c, 1);  // one rank owns everything
  EXPECT_EQ(one.ranks[0].heads, (TpRange{0, 6}));
  EXPECT_EQ(one.ranks[0].groups, (TpRange{0, 2}));
  EXPECT_EQ(one.rank_config(c).to_json(), c.to_json());
}

TEST(TensorParallelPlan, SplitsAttentionByKvHeadsAndTheMlp) {
  const ModelConfig c = hybrid_fixture_config("nemotron_h_f32");  // 4 query heads on 2 KV heads, MLP 72, vocab 131
  const TpPlan p = plan_tensor_parallel(c, 2);
  EXPECT_EQ(p.ranks[1].kv_heads, (TpRange{1, 1}));
  EXPECT_EQ(p.ranks[1].q_heads, (TpRange{2, 2}));  // the query heads of KV head 1
  EXPECT_EQ(p.ranks[1].mlp, (TpRange{36, 36}));
  EXPECT_EQ(p.padded_vocab, 256);  // 131 rows: rank 1 holds 3 real rows and 125 of padding
  const ModelConfig rc = p.rank_config(c);
  EXPECT_EQ(rc.n_attn_heads, 2);
  EXPECT_EQ(rc.n_kv_heads, 1);
  EXPECT_EQ(rc.mlp_size, 36);
  EXPECT_EQ(rc.n_heads, 4);
  EXPECT_EQ(rc.n_groups, 1);

  ModelConfig moe = c;  // experts split by expert, the shared expert by channels
  moe.moe.n_experts = 8;
  moe.moe.top_k = 2;
  moe.moe.shared_size = 16;
  const TpPlan pm = plan_tensor_parallel(moe, 2);
  EXPECT_EQ(pm.ranks[1].experts, (TpRange{4, 4}));
  EXPECT_EQ(pm.ranks[1].shared, (TpRange{8, 8}));
}

TEST(TensorParallelPlan, ReplicatesOneGroupWhereNoNormSpansRanks) {
  // Falcon-H1 without the gated norm (mamba_rms_norm false): its one group's B and C are held by every rank.
  ModelConfig c = test::tiny_mamba2_config();
  c.n_groups = 1;
  c.family = Family::FalconH1;
  c.mamba_rms_norm = false;
  const TpPlan p = plan_tensor_parallel(c, 3);
  EXPECT_TRUE(p.groups_replicated);
  for (const TpRankPlan& r : p.ranks) EXPECT_EQ(r.groups, (TpRange{0, 1}));
  EXPECT_EQ(p.ranks[2].heads, (TpRange{4, 2}));
  EXPECT_EQ(p.rank_config(c).n_groups, 1);
}

TEST(TensorParallelPlan, AllReducesAWholeDInnerNorm) {
  ModelConfig c = mamba2_four_way_config();
  c.n_groups = 1;  // mamba2-2.7b's shape: one group, so one gated norm group over the whole d_inner
  const TpPlan p = plan_tensor_parallel(c, 4);
  EXPECT_TRUE(p.groups_replicated);
  EXPECT_TRUE(p.norm_all_reduce);
  EXPECT_EQ(p.ranks[3].groups, (TpRange{0, 1}));
  EXPECT_EQ(p.ranks[3].heads, (TpRange{6, 2}));
  const TpPlan bamba = plan_tensor_parallel(hybrid_fixture_config("bamba_f32"), 2);  // 2 groups, one norm group
  EXPECT_FALSE(bamba.groups_replicated);
  EXPECT_TRUE(bamba.norm_all_reduce);
  EXPECT_FALSE(plan_tensor_parallel(c, 1).norm_all_reduce);
}

TEST(TensorParallelPlan, ReplicatesKvHeadsOverRanksThatSplitTheirQueries) {
  const ModelConfig c = hybrid_fixture_config("granite_h_f32");  // 4 query heads, 1 KV head (MQA)
  const TpPlan p = plan_tensor_parallel(c, 2);
  EXPECT_TRUE(p.kv_heads_replicated);
  EXPECT_EQ(p.ranks[1].kv_heads, (TpRange{0, 1}));
  EXPECT_EQ(p.ranks[1].q_heads, (TpRange{2, 2}));
  EXPECT_EQ(p.rank_config(c).n_kv_heads, 1);
  EXPECT_EQ(p.rank_config(c).n_attn_heads, 2);
  ModelConfig gqa = hybrid_fixture_config("nemotron_h_f32");  // 4 query heads on 2 KV heads, 4 ranks
  gqa.n_groups = 4;
  gqa.gated_norm_groups = 4;
  const TpPlan p4 = plan_tensor_parallel(gqa, 4);
  EXPECT_TRUE(p4.kv_heads_replicated);
  EXPECT_EQ(p4.ranks[2].kv_heads, (TpRange{1, 1}));  // query head 2 belongs to KV head 1
  EXPECT_EQ(p4.ranks[2].q_heads, (TpRange{2, 1}));
  EXPECT_FALSE(plan_tensor_parallel(gqa, 2).kv_heads_replicated);
}

TEST(TensorParallelPlan, RefusesCountsTheRanksDoNotDivide) {
  auto expect_in = [](const std::string& err, std::initializer_list<const char*> parts) {
    for (const char* s : parts) EXPECT_NE(err.find(s), std::string::npos) << "'" << s << "' not in: " << err;
  };
  ModelConfig c = test::tiny_mamba2_config();
  expect_in(plan_error(c, 4), {"4 ranks", "n_heads = 6", "expected a multiple of 4"});
  expect_in(plan_error(c, 0), {"ranks must be >= 1", "found 0"});
  c = mamba2_four_way_config();
  c.n_groups = 2;
  expect_in(plan_error(c, 4), {"n_groups = 2", "expected a multiple of 4 or 1", "never split"});
  c.n_groups = 4;
  c.gated_norm_groups = 2;  // norm groups of 24 channels on ranks of 12
  expect_in(plan_error(c, 4), {"gated_norm_groups = 2", "expected 1 or a multiple of 4"});
  expect_in(plan_error(hybrid_fixture_config("nemotron_h_f32"), 4), {"n_groups = 2", "multiple of 4"});
  auto j = hybrid_fixture_json("nemotron_h_f32");
  j["intermediate_size"] = 71;
  expect_in(plan_error(parse_model_config(j.dump()), 4), {"n_groups"});
  expect_in(plan_error(parse_model_config(j.dump()), 2), {"mlp_size = 71", "multiple of 2"});
  ModelConfig kv = hybrid_fixture_config("nemotron_h_f32");
  kv.n_attn_heads = 6;
  kv.n_kv_heads = 3;
  expect_in(plan_error(kv, 2), {"n_kv_heads = 3", "expected a multiple of 2, or a divisor of 2"});
  kv.n_groups = 4;
  kv.gated_norm_groups = 4;
  kv.n_kv_heads = 2;
  kv.n_attn_heads = 2;  // four ranks would leave two without a query head
  expect_in(plan_error(kv, 4), {"n_kv_heads = 2 (n_attn_heads = 2)", "n_attn_heads a multiple of 4"});
  ModelConfig moe = hybrid_fixture_config("nemotron_h_f32");
  moe.moe.n_experts = 6;
  moe.moe.top_k = 2;
  expect_in(plan_error(moe, 4), {"n_groups"});
  moe.n_groups = 4;
  moe.gated_norm_groups = 4;
  moe.n_kv_heads = 4;
  moe.n_attn_heads = 4;
  expect_in(plan_error(moe, 4), {"moe.n_experts = 6", "by expert"});
  ModelConfig m1 = test::tiny_mamba1_config();  // d_inner 40
  EXPECT_EQ(plan_tensor_parallel(m1, 4).ranks[3].channels, (TpRange{30, 10}));
  expect_in(plan_error(m1, 3), {"d_inner = 40", "multiple of 3"});
}

// ---- The slices ------------------------------------------------------------------------------------------------

std::vector<float> row(const Weight& w, int64_t r) {
  const TensorView& t = w.data;
  const float* p = t.ptr<float>() + r * t.dim(1);
  return {p, p + t.dim(1)};
}

TEST(TensorParallelShards, InProjRowsAreTheRanksZxBCdt) {
  test::TempDir dir;
  const ModelConfig c = test::tiny_mamba2_config();  // d_inner 36, 2 groups of d_state 6, 6 heads
  auto model = random_model(c, dir, 3);
  const TpPlan p = plan_tensor_parallel(c, 2);
  const LayerWeights& full = model->weights().layers[0];
  const LayerShard s = shard_layer(c, p, 1, 0, full);
  const ModelConfig rc = p.rank_config(c);
  ASSERT_EQ(s.w.in_proj.shape_string(), "[51, 18]");
  // Rank 1: z channels 18..35, x channels 18..35, group 1's B and C, heads 3..5's dt.
  const std::vector<std::pair<int64_t, int64_t>> rows = {{0, 18},      {17, 35},          {18, 36 + 18},
                                                         {36, 72 + 6}, {42, 72 + 12 + 6}, {47, 72 + 12 + 11},
                                                         {48, 96 + 3}, {50, 96 + 5}};
  for (const auto& [shard_row, full_row] : rows)
    EXPECT_EQ(row(s.w.in_proj, shard_row), row(full.in_proj, full_row)) << shard_row;
  EXPECT_EQ(s.w.conv.dim(0), rc.conv_channels());
  EXPECT_EQ(s.w.conv.ptr<float>()[18 * c.d_conv], full.conv.ptr<float>()[(36 + 6) * c.d_conv]);  // B of group 1
  EXPECT_EQ(s.w.A_log.ptr<float>()[0], full.A_log.ptr<float>()[3]);
  EXPECT_EQ(s.w.gated_norm.ptr<float>()[0], full.gated_norm.ptr<float>()[18]);
  ASSERT_EQ(s.w.out_proj.shape_string(), "[18, 18]");
  EXPECT_EQ(s.w.out_proj.data.ptr<float>()[1 * 18 + 2], full.out_proj.data.ptr<float>()[1 * 36 + 18 + 2]);

  const VocabShard v = shard_vocab(c, p, 0, model->weights().embeddings, "embeddings");
  ASSERT_EQ(v.w.shape_string(), "[64, 18]");
  EXPECT_EQ(row(v.w, 46), row(model->weights().embeddings, 46));
  EXPECT_EQ(row(v.w, 47), std::vector<float>(18, 0.0f));  // padding
}

TEST(TensorParallelShards, Mamba1ChannelsAndRowParallelXProj) {
  test::TempDir dir;
  const ModelConfig c = test::tiny_mamba1_config();  // d_inner 40, dt_rank 2, d_state 6, biases
  auto model = random_model(c, dir, 4);
  const TpPlan p = plan_tensor_parallel(c, 2);
  const LayerWeights& full = model->weights().layers[1];
  const LayerShard s = shard_layer(c, p, 1, 1, full);
  // Channels 20..39: in_proj's x rows then z rows, conv1d, dt_proj rows; x_proj and out_proj take those columns.
  ASSERT_EQ(s.w.in_proj.shape_string(), "[40, 20]");
  EXPECT_EQ(row(s.w.in_proj, 0), row(full.in_proj, 20));
  EXPECT_EQ(row(s.w.in_proj, 20), row(full.in_proj, 40 + 20));
  EXPECT_EQ(row(s.w.dt_proj, 19), row(full.dt_proj, 39));
  ASSERT_EQ(s.w.x_proj.shape_string(), "[14, 20]");
  EXPECT_EQ(s.w.x_proj.data.ptr<float>()[13 * 20 + 4], full.x_proj.data.ptr<float>()[13 * 40 + 24]);
  EXPECT_EQ(s.w.A_log.dim(0), 20);
  EXPECT_EQ(s.w.A_log.ptr<float>()[5 * c.d_state + 1], full.A_log.ptr<float>()[25 * c.d_state + 1]);
  EXPECT_EQ(s.w.dt_bias.ptr<float>()[0], full.dt_bias.ptr<float>()[20]);
  EXPECT_TRUE(s.w.out_proj_bias.empty());  // rank 0 adds the row-parallel bias
  EXPECT_FALSE(shard_layer(c, p, 0, 1, full).w.out_proj_bias.empty());
}

// ---- A Mamba-2 layer through the public Mixer API --------------------------------------------------------------

std::map<std::string, TensorView> mixer_weights(const LayerWeights& w, const MixerConfig& mc,
                                                std::vector<float>& zeros) {
  std::map<std::string, TensorView> m = {{"in_proj.weight", w.in_proj.data},
                                         {"conv1d.weight", w.conv},
                                         {"out_proj.weight", w.out_proj.data},
                                         {"dt_bias", w.dt_bias},
                                         {"A_log", w.A_log},
                                         {"D", w.D},
                                         {"norm.weight", w.gated_norm}};
  if (mc.use_conv_bias) m["conv1d.bias"] = w.conv_bias;
  if (mc.use_bias) {
    m["in_proj.bias"] = w.in_proj_bias;
    // A row-parallel bias is rank 0's alone: the other ranks' mixers take zeros.
    zeros.assign(static_cast<size_t>(mc.d_model), 0.0f);
    m["out_proj.bias"] = w.out_proj_bias.empty() ? TensorView(zeros.data(), DType::F32, {mc.d_model}) : w.out_proj_bias;
  }
  return m;
}

void expect_mixer_shards_sum_to_mixer(const ModelConfig& c, int64_t n_ranks) {
  test::TempDir dir;
  auto model = random_model(c, dir, 11);
  const TpPlan plan = plan_tensor_parallel(c, n_ranks);
  MixerOptions mo;
  mo.device = DeviceChoice::CPU;
  mo.threads = 1;
  const int64_t B = 2, L = 21;  // L spans several SSD chunks (chunk_size 8)
  std::vector<float> x = random_rows(B * L * c.d_model, 5), x_t = random_rows(B * c.d_model, 6);
  const TensorView xv(x.data(), DType::F32, {B, L, c.d_model}), xtv(x_t.data(), DType::F32, {B, c.d_model});
  for (int64_t layer = 0; layer < c.n_layer; ++layer) {
    const LayerWeights& full = model->weights().layers[static_cast<size_t>(layer)];
    const MixerConfig mc = MixerConfig::of(c);
    std::vector<float> zeros;
    auto whole = Mixer::create(mc, mixer_weights(full, mc, zeros), mo);
    auto ws = whole->create_state(B);
    const std::vector<float> y = whole->forward(*ws, xv), y_t = whole->step(*ws, xtv);

    std::vector<float> sum(y.size(), 0.0f), sum_t(y_t.size(), 0.0f);
    const MixerConfig rmc = MixerConfig::of(plan.rank_config(c));
    for (int64_t r = 0; r < n_ranks; ++r) {
      const LayerShard s = shard_layer(c, plan, r, layer, full);
      std::vector<float> rz;
      auto part = Mixer::create(rmc, mixer_weights(s.w, rmc, rz), mo);
      auto st = part->create_state(B);
      const std::vector<float> p = part->forward(*st, xv), p_t = part->step(*st, xtv);
      // Each rank's partial is a real share of the output, not the whole and not nothing.
      EXPECT_GT(test::max_rel_diff(p, y), 0.1) << "rank " << r;
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
      for (size_t i = 0; i < sum_t.size(); ++i) sum_t[i] += p_t[i];
    }
    EXPECT_LT(test::max_rel_diff(sum, y), kTol) << "layer " << layer << ", " << n_ranks << " ranks";
    EXPECT_LT(test::max_rel_diff(sum_t, y_t), kTol) << "layer " << layer << " step, " << n_ranks << " ranks";
  }
}

TEST(TensorParallelMixer, TwoRanksSumToTheLayer) { expect_mixer_shards_sum_to_mixer(test::tiny_mamba2_config(), 2); }
TEST(TensorParallelMixer, FourRanksWithBiasesSumToTheLayer) {
  expect_mixer_shards_sum_to_mixer(mamba2_four_way_config(), 4);
  expect_mixer_shards_sum_to_mixer(mamba2_four_way_config(), 2);
}

// ---- Attention and MLP sublayers -------------------------------------------------------------------------------

// Every sublayer of a model: the N = 1 simulation (the whole weights) against the sum of the ranks' partials.
void expect_sublayer_shards_sum(const std::string& fixture, int64_t n_ranks) {
  auto model = Model::load(test::fixture_dir() + "/" + fixture, cpu_options());
  const ModelConfig& c = model->config();
  const SimulatedTensorParallel one(*model, 1), many(*model, n_ranks);
  const std::vector<float> normed = random_rows(13 * c.d_model, 9);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (bool mlp : {false, true}) {
      if (mlp && !c.mlp_after_mixer) continue;
      const std::string what =
          fixture + " layer " + std::to_string(l) + " " + (mlp ? "mlp" : layer_kind_name(c.layer_kind(l)));
      const std::vector<float> whole = one.sublayer_partials(l, mlp, normed).at(0);
      const auto parts = many.sublayer_partials(l, mlp, normed);
      std::vector<float> sum(whole.size(), 0.0f);
      for (const auto& p : parts) {
        EXPECT_GT(test::max_rel_diff(p, whole), 0.1) << what;
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
      }
      EXPECT_LT(test::max_rel_diff(sum, whole), kTol) << what;
    }
  }
}

TEST(TensorParallelSublayers, AttentionAndMlpShardsSumToTheSublayer) {
  expect_sublayer_shards_sum("hybrid/nemotron_h_f32", 2);  // Mamba-2 with per-group norms, NoPE attention, relu2 MLP
  expect_sublayer_shards_sum("hybrid/bamba_f32",
                             2);  // whole-d_inner norm (all-reduced), RoPE attention, SwiGLU MLP sublayers
  expect_sublayer_shards_sum("hybrid/granite_h_f32", 2);  // one KV head replicated on both ranks, biases, shared_mlp
}

// ---- Whole models ----------------------------------------------------------------------------------------------

std::vector<float> last_row(const std::vector<float>& logits, int64_t vocab) {
  return {logits.end() - vocab, logits.end()};
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Logits of the whole model and of the simulated N ranks agree; greedy continuations (each step a full pass over the
// prefix, for both) pick the same tokens.
void expect_simulated_tp_matches(const Model& model, int64_t n_ranks) {
  const ModelConfig& c = model.config();
  const SimulatedTensorParallel tp(model, n_ranks);
  std::vector<int32_t> ids = test::random_tokens(19, c.vocab_size, 17);
  auto st = model.create_state(1);
  const std::vector<float> want = test::all_logits(model, *st, ids);
  const std::vector<float> got = tp.logits(ids);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::max_rel_diff(got, want), kTol) << n_ranks << " ranks";

  std::vector<int32_t> a = ids, b = ids;
  for (int step = 0; step < 8; ++step) {
    auto s = model.create_state(1);
    a.push_back(argmax(last_row(test::all_logits(model, *s, a), c.vocab_size)));
    b.push_back(argmax(last_row(tp.logits(b), c.vocab_size)));
  }
  EXPECT_EQ(b, a) << n_ranks << " ranks";
}

TEST(TensorParallelModel, Mamba2LogitsAndGreedyTokens) {
  test::TempDir d2, d4;
  expect_simulated_tp_matches(*random_model(test::tiny_mamba2_config(), d2, 21), 2);
  auto four = random_model(mamba2_four_way_config(), d4, 22);
  expect_simulated_tp_matches(*four, 2);
  expect_simulated_tp_matches(*four, 4);
}

TEST(TensorParallelModel, Mamba2OneGroupLogitsAndGreedyTokens) {
  // mamba2-2.7b's layout: one group replicated on every rank, the gated norm's sum of squares all-reduced.
  test::TempDir dir;
  ModelConfig c = mamba2_four_way_config();
  c.n_groups = 1;
  auto model = random_model(c, dir, 24);
  expect_simulated_tp_matches(*model, 2);
  expect_simulated_tp_matches(*model, 4);
}

TEST(TensorParallelModel, BlockQuantizedWeightsSplitByWholeBlocks) {
  // Q8_0 matrices (blocks of 32 along the input): ranks of 32 channels take out_proj's columns as whole blocks.
  ModelConfig c = test::tiny_mamba2_config();
  c.d_model = 32;
  c.vocab_size = 100;
  c.d_state = 8;
  c.n_heads = 8;
  c.head_dim = 8;
  c.d_inner = 64;
  c.n_groups = 4;
  auto model = Model::random_quantized(c, cpu_options(), 25, "q8_0");
  ASSERT_EQ(model->weights().layers[0].out_proj.format, WeightFormat::Q8_0);
  ASSERT_EQ(model->weights().embeddings.format, WeightFormat::Q8_0);  // the vocab shards are whole q8_0 rows
  expect_simulated_tp_matches(*model, 2);
  // Four ranks of 16 channels would split out_proj's blocks.
  const std::string err = test::error_of([&] { SimulatedTensorParallel(*model, 4); });
  EXPECT_NE(err.find("layer 0 out_proj is q8_0 [32, 64]: columns [0, 16) split its blocks of 32"), std::string::npos)
      << err;
}

TEST(TensorParallelModel, BambaLogitsAndGreedyTokens) {
  // The transformers fixture: whole-d_inner gated norm, RoPE attention, an MLP sublayer in every layer.
  expect_simulated_tp_matches(*Model::load(test::fixture_dir() + "/hybrid/bamba_f32", cpu_options()), 2);
}

TEST(TensorParallelSublayers, ExpertShardsSumToTheMixtureOfExperts) {
  expect_sublayer_shards_sum("moe/nemotron_h_moe_f32", 2);  // sigmoid-grouped routing, relu2 experts, shared expert
  expect_sublayer_shards_sum("moe/granite_moe_f32", 2);     // softmax routing, SwiGLU experts, shared_mlp
  expect_sublayer_shards_sum("moe/jamba_f32", 2);           // and Mamba-1 layers with dt/B/C norms
}

TEST(TensorParallelModel, MixtureOfExpertsLogitsAndGreedyTokens) {
  // The transformers fixtures; each rank runs 4 of the 8 (Nemotron-H) or 3 of the 6 (Granite) experts.
  expect_simulated_tp_matches(*Model::load(test::fixture_dir() + "/moe/nemotron_h_moe_f32", cpu_options()), 2);
  expect_simulated_tp_matches(*Model::load(test::fixture_dir() + "/moe/granite_moe_f32", cpu_options()), 2);
}

TEST(TensorParallelModel, GraniteLogitsAndGreedyTokens) {
  // The transformers fixture: whole-d_inner norm, one KV head replicated on both ranks, biases, Granite's
  // embedding, residual and logits multipliers, a SwiGLU shared_mlp after every mixer.
  expect_simulated_tp_matches(*Model::load(test::fixture_dir() + "/hybrid/granite_h_f32", cpu_options()), 2);
}

TEST(TensorParallelModel, NemotronHLogitsAndGreedyTokens) {
  // The transformers fixture (Mamba-2, attention and MLP layers), on 2 ranks.
  expect_simulated_tp_matches(*Model::load(test::fixture_dir() + "/hybrid/nemotron_h_f32", cpu_options()), 2);
  // The same layers with 4 groups and 4 KV heads (random weights), on 4 ranks.
  auto j = hybrid_fixture_json("nemotron_h_f32");
  j["n_groups"] = 4;
  j["num_key_value_heads"] = 4;
  const ModelConfig c = parse_model_config(j.dump(), "nemotron_h (4 groups, 4 KV heads)");
  auto model = Model::random(c, cpu_options(), 23, DType::F32);
  expect_simulated_tp_matches(*model, 4);
  expect_simulated_tp_matches(*model, 2);
}

TEST(TensorParallelModel, Mamba1LogitsAndGreedyTokens) {
  // x_proj row-parallel: its [dt_low | B | C] partial sums all-reduced before dt_proj and the scan.
  test::TempDir dir;
  auto model = random_model(test::tiny_mamba1_config(), dir, 26);  // d_inner 40, biases
  expect_simulated_tp_matches(*model, 2);
  expect_simulated_tp_matches(*model, 4);
}

TEST(TensorParallelModel, JambaLogitsAndGreedyTokens) {
  // The transformers fixture: Mamba-1 layers with dt/B/C norms, attention, experts every other layer.
  expect_simulated_tp_matches(*Model::load(test::fixture_dir() + "/moe/jamba_f32", cpu_options()), 2);
}

TEST(TensorParallelModel, FalconH1LogitsAndGreedyTokens) {
  // The transformers fixtures: Mamba-2 and attention side by side in every layer, the muP multipliers (in_proj's
  // slices, the branches' inputs and outputs, K, the MLP's gate and output); without the gated norm, with it before
  // the gate, and after it.
  for (const char* f : {"falcon_h1_f32", "falcon_h1_norm_tied_f32", "falcon_h1_gate_first_f32"}) {
    SCOPED_TRACE(f);
    expect_simulated_tp_matches(*Model::load(test::fixture_dir() + "/falcon_h1/" + f, cpu_options()), 2);
  }
}

TEST(TensorParallelModel, RefusesWhatItDoesNotSimulate) {
  auto granite = Model::load(test::fixture_dir() + "/hybrid/granite_h_f32", cpu_options());
  EXPECT_NE(test::error_of([&] { SimulatedTensorParallel(*granite, 4); }).find("n_heads = 10"), std::string::npos);
}

}  // namespace
}  // namespace mambacpp
