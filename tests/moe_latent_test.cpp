// Nemotron-H's latent MoE (moe_latent_size, Nemotron 3 Super): the routed experts run in a latent width between
// fc1_latent_proj [L, hidden] and fc2_latent_proj [hidden, L], while the router and the shared expert read the full
// hidden state. Checked here without transformers: a latent model whose projections only select coordinates equals
// the model without latent projections whose experts read and write only those coordinates (bit for bit when the
// selection is the first L coordinates, so the kernels sum the same terms in the same lanes); the config key is read,
// validated and refused by name; and a latent model keeps the invariances of every MoE model (any split into calls,
// token by token, a batch member alone). The transformers reference is in moe_fixtures_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "mambacpp/config.h"
#include "mambacpp/model.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

constexpr int64_t kHidden = 32, kLatent = 16, kExperts = 6, kExpertSize = 12;

nlohmann::json nemotron_json() {
  return nlohmann::json::parse(R"({
    "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 53, "hidden_size": 32,
    "hybrid_override_pattern": "ME*E", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "intermediate_size": 24, "mlp_hidden_act": "relu2", "mlp_bias": true, "ssm_state_size": 8,
    "mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 2, "conv_kernel": 4, "chunk_size": 8,
    "layer_norm_epsilon": 1e-5, "tie_word_embeddings": false, "n_routed_experts": 6, "num_experts_per_tok": 2,
    "moe_intermediate_size": 12, "moe_shared_expert_intermediate_size": 20, "n_group": 2, "topk_group": 1,
    "norm_topk_prob": true, "routed_scaling_factor": 2.5})");
}

nlohmann::json latent_json(int64_t latent = kLatent) {
  auto j = nemotron_json();
  j["moe_latent_size"] = latent;
  return j;
}

ModelConfig parse(const nlohmann::json& j) { return parse_model_config(j.dump(), "config.json"); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every tensor the config needs (fused expert layout), with values that make each matter.
std::map<std::string, test::HostTensor> random_tensors(const ModelConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::map<std::string, test::HostTensor> out;
  for (const auto& [name, shape] : hybrid_weight_shapes(c)) {
    test::HostTensor t;
    t.shape = shape;
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
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
    out[name] = std::move(t);
  }
  return out;
}

struct Pair {
  std::map<std::string, test::HostTensor> plain, latent;
};

// From random non-latent tensors: the latent model whose fc1 picks coordinates sel[j] of the hidden state and whose
// fc2 puts latent j back at sel[j] (biases zero, or fc2's bias `out_bias`), and the non-latent model that equals it:
// its experts' up columns and down rows outside `sel` are zero, and fc2's bias moves to the shared expert's down bias.
Pair selection_pair(const std::vector<int64_t>& sel, float out_bias, uint64_t seed) {
  const ModelConfig plain_c = parse(nemotron_json());
  Pair p;
  p.plain = random_tensors(plain_c, seed);
  const int64_t L = static_cast<int64_t>(sel.size()), D = kHidden, E = kExperts, I = kExpertSize;
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::map<std::string, test::HostTensor> latent_only;  // what the latent model holds instead of the plain one's
  for (const std::string layer : {"1", "3"}) {  // the E layers of "ME*E"
    const std::string x = "model.layers." + layer + ".mixer.";
    test::HostTensor& up = p.plain.at(x + "experts.up_proj");      // [E, I, D]
    test::HostTensor& down = p.plain.at(x + "experts.down_proj");  // [E, D, I]
    EXPECT_EQ(up.shape, (std::vector<int64_t>{E, I, D}));
    test::HostTensor lup{{E, I, L}, {}}, ldown{{E, L, I}, {}};
    lup.values.resize(static_cast<size_t>(E * I * L));
    ldown.values.resize(static_cast<size_t>(E * L * I));
    std::vector<bool> picked(static_cast<size_t>(D), false);
    for (int64_t s : sel) picked[static_cast<size_t>(s)] = true;
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t j = 0; j < L; ++j)
          lup.values[static_cast<size_t>((e * I + i) * L + j)] =
              up.values[static_cast<size_t>((e * I + i) * D + sel[static_cast<size_t>(j)])];
        for (int64_t d = 0; d < D; ++d)
          if (!picked[static_cast<size_t>(d)]) up.values[static_cast<size_t>((e * I + i) * D + d)] = 0.0f;
      }
      for (int64_t j = 0; j < L; ++j)
        for (int64_t i = 0; i < I; ++i)
          ldown.values[static_cast<size_t>((e * L + j) * I + i)] =
              down.values[static_cast<size_t>((e * D + sel[static_cast<size_t>(j)]) * I + i)];
      for (int64_t d = 0; d < D; ++d)
        if (!picked[static_cast<size_t>(d)])
          for (int64_t i = 0; i < I; ++i) down.values[static_cast<size_t>((e * D + d) * I + i)] = 0.0f;
    }
    test::HostTensor fc1{{L, D}, std::vector<float>(static_cast<size_t>(L * D), 0.0f)};
    test::HostTensor fc2{{D, L}, std::vector<float>(static_cast<size_t>(D * L), 0.0f)};
    for (int64_t j = 0; j < L; ++j) {
      fc1.values[static_cast<size_t>(j * D + sel[j])] = 1.0f;
      fc2.values[static_cast<size_t>(sel[j] * L + j)] = 1.0f;
    }
    test::HostTensor b1{{L}, std::vector<float>(static_cast<size_t>(L), 0.0f)}, b2{{D}, {}};
    for (int64_t d = 0; d < D; ++d) b2.values.push_back(out_bias * nd(rng));
    latent_only[x + "experts.up_proj"] = lup;
    latent_only[x + "experts.down_proj"] = ldown;
    latent_only[x + "fc1_latent_proj.weight"] = fc1;
    latent_only[x + "fc2_latent_proj.weight"] = fc2;
    latent_only[x + "fc1_latent_proj.bias"] = b1;
    latent_only[x + "fc2_latent_proj.bias"] = b2;
    test::HostTensor& shared_bias = p.plain.at(x + "shared_experts.down_proj.bias");
    latent_only[x + "shared_experts.down_proj.bias"] = shared_bias;
    for (int64_t d = 0; d < D; ++d) shared_bias.values[static_cast<size_t>(d)] += b2.values[static_cast<size_t>(d)];
  }
  p.latent = p.plain;
  for (const auto& [name, t] : latent_only) p.latent[name] = t;
  return p;
}

// The fused [E, out, in] expert tensors as per-expert 2-D ones (the released checkpoints' layout).
std::map<std::string, test::HostTensor> per_expert(const std::map<std::string, test::HostTensor>& fused) {
  std::map<std::string, test::HostTensor> out;
  const std::regex re(R"((.*\.experts)\.(up_proj|down_proj)$)");
  std::smatch m;
  for (const auto& [name, t] : fused) {
    if (!std::regex_match(name, m, re)) {
      out[name] = t;
      continue;
    }
    const int64_t E = t.shape[0], rows = t.shape[1], cols = t.shape[2];
    for (int64_t e = 0; e < E; ++e) {
      test::HostTensor s{{rows, cols}, {}};
      s.values.assign(t.values.begin() + e * rows * cols, t.values.begin() + (e + 1) * rows * cols);
      out[m[1].str() + "." + std::to_string(e) + "." + m[2].str() + ".weight"] = std::move(s);
    }
  }
  return out;
}

void write_model(const std::string& dir, const nlohmann::json& config,
                 const std::map<std::string, test::HostTensor>& tensors) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(1);
  test::write_safetensors(dir + "/model.safetensors", tensors);
}

std::vector<float> logits_of(const std::string& dir) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 2;
  auto model = Model::load(dir, lo);
  std::vector<int32_t> ids(21);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 29 + 3) % model->config().vocab_size);
  auto st = model->create_state(1);
  return test::all_logits(*model, *st, ids);
}

void expect_refused(const nlohmann::json& j, std::initializer_list<std::string> parts) {
  const std::string err = test::error_of([&] { parse(j); });
  for (const std::string& p : parts) EXPECT_NE(err.find(p), std::string::npos) << "'" << p << "' not in: " << err;
}

TEST(MoeLatentConfig, ReadValidatedAndRoundTripped) {
  const ModelConfig c = parse(latent_json());
  EXPECT_EQ(c.moe.latent_size, kLatent);
  EXPECT_EQ(parse_model_config(c.to_json()).to_json(), c.to_json());
  EXPECT_NE(c.to_json().find("\"latent_size\""), std::string::npos);
  // null (what configs without latent experts write) and absent both mean none; the canonical form is unchanged.
  auto j = nemotron_json();
  const std::string plain = parse(j).to_json();
  EXPECT_EQ(plain.find("latent_size"), std::string::npos);
  j["moe_latent_size"] = nullptr;
  EXPECT_EQ(parse(j).moe.latent_size, 0);
  EXPECT_EQ(parse(j).to_json(), plain);
  EXPECT_NO_THROW(parse(latent_json(kHidden)));  // as wide as hidden_size: allowed (transformers does not forbid it)
  expect_refused(latent_json(0), {"moe_latent_size", "0"});
  expect_refused(latent_json(-4), {"moe_latent_size", "-4"});
  expect_refused(latent_json(kHidden + 1), {"moe_latent_size", "33", "hidden_size = 32"});
  // The canonical form is validated too.
  nlohmann::json canon = nlohmann::json::parse(c.to_json());
  canon["moe"]["latent_size"] = kHidden + 8;
  const std::string err = test::error_of([&] { parse_model_config(canon.dump()); });
  EXPECT_NE(err.find("moe.latent_size = 40"), std::string::npos) << err;
  // Split across ranks it is refused by name rather than run wrong.
  const std::string tp = test::error_of([&] { plan_tensor_parallel(c, 2); });
  EXPECT_NE(tp.find("moe.latent_size"), std::string::npos) << tp;
  EXPECT_NO_THROW(plan_tensor_parallel(c, 1));
}

TEST(MoeLatentModel, WeightShapesAndMissingProjection) {
  const ModelConfig c = parse(latent_json());
  const auto shapes = hybrid_weight_shapes(c);
  auto shape_of = [&](const std::string& name) {
    for (const auto& [n, s] : shapes)
      if (n == name) return s;
    return std::vector<int64_t>{};
  };
  const std::string x = "model.layers.1.mixer.";
  EXPECT_EQ(shape_of(x + "fc1_latent_proj.weight"), (std::vector<int64_t>{kLatent, kHidden}));
  EXPECT_EQ(shape_of(x + "fc1_latent_proj.bias"), (std::vector<int64_t>{kLatent}));
  EXPECT_EQ(shape_of(x + "fc2_latent_proj.weight"), (std::vector<int64_t>{kHidden, kLatent}));
  EXPECT_EQ(shape_of(x + "fc2_latent_proj.bias"), (std::vector<int64_t>{kHidden}));
  EXPECT_EQ(shape_of(x + "experts.up_proj"), (std::vector<int64_t>{kExperts, kExpertSize, kLatent}));
  EXPECT_EQ(shape_of(x + "experts.down_proj"), (std::vector<int64_t>{kExperts, kLatent, kExpertSize}));
  EXPECT_EQ(shape_of(x + "gate.weight"), (std::vector<int64_t>{kExperts, kHidden}));  // the router reads hidden
  EXPECT_EQ(shape_of(x + "shared_experts.up_proj.weight"), (std::vector<int64_t>{20, kHidden}));
  auto j = latent_json();
  j["mlp_bias"] = false;  // no biases on the projections then, as transformers builds them
  for (const auto& [n, s] : hybrid_weight_shapes(parse(j)))
    EXPECT_EQ(n.find("latent_proj.bias"), std::string::npos) << n;

  test::TempDir tmp;
  auto tensors = random_tensors(c, 3);
  ASSERT_EQ(tensors.erase("model.layers.3.mixer.fc2_latent_proj.weight"), 1u);
  write_model(tmp.file("broken"), latent_json(), tensors);
  EXPECT_NE(test::error_of([&] { logits_of(tmp.file("broken")); }).find("model.layers.3.mixer.fc2_latent_proj.weight"),
            std::string::npos);
}

// fc1 = the first L rows of the identity, fc2 its transpose, no biases: the latent model computes exactly what the
// non-latent one with those experts does, term for term.
TEST(MoeLatentModel, PrefixSelectionEqualsTheModelWithoutLatentBitForBit) {
  std::vector<int64_t> sel(kLatent);
  std::iota(sel.begin(), sel.end(), 0);
  const Pair p = selection_pair(sel, 0.0f, 11);
  test::TempDir tmp;
  write_model(tmp.file("plain"), nemotron_json(), p.plain);
  write_model(tmp.file("latent"), latent_json(), p.latent);
  write_model(tmp.file("latent_split"), latent_json(), per_expert(p.latent));
  const auto want = logits_of(tmp.file("plain"));
  for (float v : want) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(logits_of(tmp.file("latent")), want);
  EXPECT_EQ(logits_of(tmp.file("latent_split")), want) << "per-expert latent tensors";
}

// A scattered selection (fc1 and fc2 are partial permutations, so their orientation matters) and fc2's bias, which
// the non-latent model carries on its shared expert: equal up to the order of the sums.
TEST(MoeLatentModel, ScatteredSelectionWithBiasEqualsTheModelWithoutLatent) {
  std::vector<int64_t> all(kHidden);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(all.begin(), all.end(), rng);
  const std::vector<int64_t> sel(all.begin(), all.begin() + kLatent);
  const Pair p = selection_pair(sel, 0.3f, 29);
  test::TempDir tmp;
  write_model(tmp.file("plain"), nemotron_json(), p.plain);
  write_model(tmp.file("latent"), latent_json(), p.latent);
  const auto want = logits_of(tmp.file("plain"));
  const auto got = logits_of(tmp.file("latent"));
  EXPECT_LE(test::max_rel_diff(got, want), 1e-5);
  // And the selection matters: with fc2 writing back to the wrong coordinates the logits differ.
  Pair wrong = p;
  for (const std::string layer : {"1", "3"}) {
    auto& fc2 = wrong.latent["model.layers." + layer + ".mixer.fc2_latent_proj.weight"];
    std::rotate(fc2.values.begin(), fc2.values.begin() + kLatent, fc2.values.end());  // rows shifted by one
  }
  write_model(tmp.file("wrong"), latent_json(), wrong.latent);
  EXPECT_GT(test::max_rel_diff(logits_of(tmp.file("wrong")), want), 1e-3);
}

TEST(MoeLatentModel, RandomWeightsAreSplitAndBatchInvariant) {
  const ModelConfig c = parse(latent_json());
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 2;
  lo.kv_page_tokens = 5;
  lo.max_batch_tokens = 16;  // prefill pieces of 16: sequences cut inside a call too
  auto model = Model::random(c, lo, 7, DType::F32);
  // A decode step of one token reads top_k of the experts, which run in the latent width.
  const int64_t per_expert = 2 * kExpertSize * kLatent * 4;
  EXPECT_EQ(model->weight_bytes() - model->decode_weight_bytes(1), 2 * (kExperts - 2) * per_expert);
  std::vector<int32_t> ids(37);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
  auto st = model->create_state(1);
  const auto one = test::all_logits(*model, *st, ids);
  for (float v : one) ASSERT_TRUE(std::isfinite(v));
  std::mt19937 rng(3);
  auto st2 = model->create_state(1);
  std::vector<float> got;
  for (size_t at = 0; at < ids.size();) {
    const size_t n = std::min(ids.size() - at, static_cast<size_t>(std::uniform_int_distribution<int>(1, 9)(rng)));
    const auto part = test::all_logits(*model, *st2, std::span<const int32_t>(ids).subspan(at, n));
    got.insert(got.end(), part.begin(), part.end());
    at += n;
  }
  EXPECT_LE(test::max_rel_diff(got, one), 1e-5) << "split into calls";
  auto st3 = model->create_state(1);
  std::vector<float> steps;
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto row = test::all_logits(*model, *st3, std::span<const int32_t>(ids).subspan(t, 1));
    steps.insert(steps.end(), row.begin(), row.end());
  }
  EXPECT_LE(test::max_rel_diff(steps, one), 1e-5) << "token by token";
  const std::vector<int32_t> a(ids.begin(), ids.begin() + 30), b(ids.begin() + 5, ids.begin() + 17),
      d(ids.rbegin(), ids.rbegin() + 23);
  auto sb = model->create_state(3);
  std::vector<Sequence> seqs = {Sequence::tokens(a, 2), Sequence::tokens(b, 0), Sequence::tokens(d, 1)};
  const ForwardResult r = model->forward(*sb, seqs, Output::AllLogits);
  const int64_t V = c.vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto alone = model->create_state(1);
    const auto want = test::all_logits(*model, *alone, seqs[i].token_ids);
    const std::vector<float> part(r.values.begin() + row * V, r.values.begin() + (row + seqs[i].length()) * V);
    // The experts are exact per token, so a batch member equals itself alone as closely as for non-latent MoE.
    EXPECT_LE(test::max_rel_diff(part, want), 1e-5) << "sequence " << i;
    row += seqs[i].length();
  }
}

}  // namespace
}  // namespace mambacpp
