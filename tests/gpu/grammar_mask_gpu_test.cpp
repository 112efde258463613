// A grammar's allowed-token mask applied on the device (TopKRequest::allowed, src/backend/cuda/token_mask.cu) before
// the top-k selection: the CUDA backend against the CPU backend bitwise on random masked rows (masks of every
// density, rows mixed with unmasked ones, strided rows, row lengths across the 32-id words); the engine on the GPU
// giving constrained requests the same tokens with the mask on the device (device sampling) as with whole rows masked
// on the host; and the time per token of one constrained generation on each path ([perf] lines, not asserted).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"
#include "mambacpp/engine.h"
#include "mambacpp/grammar.h"
#include "mambacpp/model.h"
#include "mambacpp/tokenizer.h"
#include "support/engine_support.h"
#include "support/test_support.h"
#include "support/top_k_reference.h"

namespace mambacpp {
namespace {

void expect_same(const TopKCandidates& gpu, const TopKCandidates& cpu, const std::string& what) {
  EXPECT_EQ(gpu.bad_id, cpu.bad_id) << what;
  if (cpu.bad_id >= 0 && !std::isnan(cpu.bad_value))
    EXPECT_EQ(std::memcmp(&gpu.bad_value, &cpu.bad_value, sizeof(float)), 0) << what;
  EXPECT_EQ(gpu.ids, cpu.ids) << what;
  ASSERT_EQ(gpu.logits.size(), cpu.logits.size()) << what;
  EXPECT_TRUE(gpu.logits.empty() ||
              std::memcmp(gpu.logits.data(), cpu.logits.data(), gpu.logits.size() * sizeof(float)) == 0)
      << what << ": logits differ bitwise";
}

TEST(GpuGrammarMask, SelectTopKMatchesTheCpuBitwise) {
  MAMBACPP_REQUIRE_GPU();
  auto gpu = make_cuda_backend(DType::BF16);
  auto cpu = make_cpu_backend(4);
  std::mt19937_64 rng(23);
  int masked_rows = 0, with_candidates = 0;
  for (int64_t V : {1, 33, 50280, 256000}) {
    std::vector<std::vector<float>> rows;
    std::vector<TopKRequest> reqs;
    int i = 0;
    for (int kind = 0; kind < 4; ++kind) {
      for (int mask_kind = 0; mask_kind < 6; ++mask_kind) {  // 5: no mask
        TopKRequest q;
        q.k = i % 3 == 0 ? 1 : (i % 3 == 1 ? 40 : 256);
        q.limit = (i % 4 == 1 && V > 1) ? V - 3 : 0;
        if (i % 2 == 0) {
          q.repeat_penalty = i % 4 == 0 ? 1.3f : 0.75f;
          q.penalized = test::random_distinct_ids(V, 64, rng);
        }
        if (mask_kind < 5) q.allowed = test::random_mask(V, mask_kind, rng);
        std::vector<float> row = test::random_row(V, kind, rng);
        if (mask_kind == 0 && V > 40) row[static_cast<size_t>(V / 2)] = std::nanf("");  // masked out: not bad
        rows.push_back(std::move(row));
        reqs.push_back(std::move(q));
        ++i;
      }
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    gputest::DeviceArena arena(*gpu);
    const bool strided = V % 2 == 1;
    TensorView dev =
        strided ? arena.upload_strided(flat, n, V, V + 5, 3, std::nanf("")) : arena.upload(flat, DType::F32, {n, V});
    std::vector<TopKCandidates> got, want;
    gpu->select_top_k(dev, reqs, got);
    std::vector<float> host = flat;
    cpu->select_top_k(TensorView(host.data(), DType::F32, {n, V}), reqs, want);
    ASSERT_EQ(got.size(), want.size());
    for (int64_t r = 0; r < n; ++r) {
      expect_same(got[r], want[r], "V " + std::to_string(V) + " row " + std::to_string(r));
      masked_rows += !reqs[r].allowed.empty();
      with_candidates += !want[r].ids.empty() && !reqs[r].allowed.empty();
    }
  }
  EXPECT_EQ(masked_rows, 4 * 4 * 5);
  EXPECT_GT(with_candidates, 20);
}

// The GpuGrammar setup (the shipped model, exact precision, a batch of JSON-schema rows beside free ones), with
// samplers the device selection serves (greedy, top_k 40 / 20, a repetition penalty): device sampling with the mask
// on the device against device sampling off (every row whole on the host, constrained rows masked there).
std::vector<GenerateRequest> constrained_batch(const Tokenizer& tok) {
  const std::string schema = R"({"type":"object","properties":{"ok":{"type":"boolean"},
      "color":{"enum":["red","green"]},"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string",
      "maxLength":4},"maxItems":2}},"required":["ok","color"],"additionalProperties":false})";
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 24; ++i) {
    GenerateRequest r;
    r.prompt = tok.encode(i % 2 ? "The answer in JSON:" : "def main(", false);
    r.max_new_tokens = 300;
    r.sampling.temperature = i % 3 == 0 ? 0.0f : 1.5f;
    r.sampling.top_k = i % 4 == 0 ? 40 : 20;
    r.sampling.repeat_penalty = i % 5 == 2 ? 1.2f : 1.0f;
    r.sampling.seed = 50 + static_cast<uint64_t>(i), r.sampling.seed_given = true;
    if (i % 2 == 0) {
      r.grammar = json_schema_to_grammar(schema);
    } else {
      r.max_new_tokens = 16;
      r.ignore_eos = true;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST(GpuGrammarMask, SameTokensAsTheHostPath) {
  MAMBACPP_REQUIRE_GPU();
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  lo.precision = Precision::Exact;
  const auto model = Model::load(test::source_dir() + "/models/default", lo);
  const auto tok = Tokenizer::load(test::source_dir() + "/models/default/tokenizer.json");
  const std::vector<GenerateRequest> reqs = constrained_batch(*tok);
  EngineOptions host;
  host.device_sampling = false;
  const std::vector<GenerateResult> dev = test::run_batch(*model, reqs, tok.get(), {}, 8);
  const std::vector<GenerateResult> ref = test::run_batch(*model, reqs, tok.get(), host, 8);
  int constrained = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(dev[i].error.empty()) << i << ": " << dev[i].error;
    ASSERT_TRUE(ref[i].error.empty()) << i << ": " << ref[i].error;
    EXPECT_EQ(dev[i].tokens, ref[i].tokens) << "request " << i;
    if (reqs[i].grammar.empty()) continue;
    ++constrained;
    ASSERT_EQ(dev[i].finish_reason, FinishReason::Eos) << dev[i].text;
    const auto v = nlohmann::json::parse(dev[i].text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << dev[i].text;
    EXPECT_TRUE(v["ok"].is_boolean()) << dev[i].text;
    EXPECT_TRUE(v["color"] == "red" || v["color"] == "green") << dev[i].text;
  }
  EXPECT_EQ(constrained, 12);
}

// One greedy json_object generation alone and a batch of 8, each path timed twice (the first run warms up); the
// rows of the A/B: ms per generated token, device mask vs host mask.
TEST(GpuGrammarMask, PerfDeviceAgainstHostMask) {
  MAMBACPP_REQUIRE_GPU();
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  const auto model = Model::load(test::source_dir() + "/models/default", lo);
  const auto tok = Tokenizer::load(test::source_dir() + "/models/default/tokenizer.json");
  for (int batch : {1, 8}) {
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < batch; ++i) {
      GenerateRequest r;
      r.prompt = tok->encode(i % 2 ? "The answer in JSON:" : "Some data: ", false);
      r.max_new_tokens = 256;
      r.sampling.temperature = 0.0f;
      r.grammar = json_object_grammar();
      reqs.push_back(std::move(r));
    }
    for (bool device : {true, false}) {
      EngineOptions o;
      o.device_sampling = device;
      double ms = 0;
      int64_t tokens = 0;
      for (int rep = 0; rep < 2; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<GenerateResult> out = test::run_batch(*model, reqs, tok.get(), o, batch);
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        tokens = 0;
        for (const GenerateResult& g : out) {
          ASSERT_TRUE(g.error.empty()) << g.error;
          tokens += static_cast<int64_t>(g.tokens.size());
        }
      }
      std::printf("[perf] grammar json_object batch %d %s mask: %lld tokens in %.1f ms, %.3f ms/token (~%.3f ms/step)\n",
                  batch, device ? "device" : "host", static_cast<long long>(tokens), ms,
                  ms / static_cast<double>(std::max<int64_t>(tokens, 1)),
                  ms * batch / static_cast<double>(std::max<int64_t>(tokens, 1)));
    }
  }
}

}  // namespace
}  // namespace mambacpp
