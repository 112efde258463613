// Falcon-H1 on the GPU: prefill runs the parallel layer through the same backend ops as on the CPU, decode steps of up
// to 8 rows on the fused GEMVs with the multipliers in their epilogue (fused_hybrid_test.cpp compares the two), so the
// checks are those of the other hybrids: the transformers fixtures (fixtures/falcon_h1, made by
// scripts/make_falcon_h1_fixtures.py), the CPU path (logits and the state left behind), and graph decode against
// eager decode. Tolerances as in hybrid_gpu_test.cpp: f32 weights 1e-4 of the largest logit against the fp64
// reference (f32 rounding through 3-4 layers), bf16 weights 3e-2; GPU vs CPU with f32 weights and state 1e-5
// (summation order only); graph replay bit for bit equal to eager.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "gpu/gpu_test_util.h"
#include "mambacpp/model.h"
#include "mambacpp/npy.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> falcon_dirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(test::fixture_dir()) / "falcon_h1";
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "logits.npy")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::unique_ptr<Model> load(const std::string& dir, DeviceChoice dev, DType weights = DType::F32,
                            Precision precision = Precision::Exact, bool graphs = true, int64_t page_tokens = 8) {
  LoadOptions lo;
  lo.device = dev;
  lo.threads = 1;
  lo.weight_dtype = weights;
  lo.precision = precision;
  lo.kv_page_tokens = page_tokens;
  lo.cuda_graphs = graphs;
  return Model::load(dir, lo);
}

std::vector<float> logits_in_pieces(const Model& m, StateCache& st, std::span<const int32_t> ids,
                                    const std::vector<int64_t>& pieces, int64_t slot = 0) {
  std::vector<float> out;
  size_t at = 0;
  for (int64_t n : pieces) {
    Sequence s = Sequence::tokens(ids.subspan(at, static_cast<size_t>(n)), slot);
    const ForwardResult r = m.forward(st, {&s, 1}, Output::AllLogits);
    out.insert(out.end(), r.values.begin(), r.values.end());
    at += static_cast<size_t>(n);
  }
  return out;
}

TEST(GpuFalconH1, FixturesMatchTransformers) {
  MAMBACPP_REQUIRE_GPU();
  const auto dirs = falcon_dirs();
  ASSERT_EQ(dirs.size(), 3u);
  for (const std::string& dir : dirs) {
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const NpyArray ref = read_npy(dir + "/logits.npy");
    const std::vector<float> expected(ref.values.begin(), ref.values.end());
    const int64_t L = static_cast<int64_t>(ids.size());
    for (DType wd : {DType::F32, DType::BF16})
      for (Precision pr : {Precision::Exact, Precision::Fast}) {
        SCOPED_TRACE(dir + " weights " + dtype_name(wd) + " " + precision_name(pr));
        auto model = load(dir, DeviceChoice::CUDA, wd, pr);
        ASSERT_EQ(model->device(), Device::CUDA);
        const double tol = wd == DType::F32 ? 1e-4 : 3e-2;
        auto st = model->create_state(1);
        const double err = test::max_rel_diff(logits_in_pieces(*model, *st, ids, {L}), expected);
        std::printf("[gpu falcon_h1] %s %s %s: %.3g\n", fs::path(dir).filename().c_str(), dtype_name(wd),
                    precision_name(pr), err);
        EXPECT_LE(err, tol) << "one pass";
        auto st2 = model->create_state(1);
        EXPECT_LE(test::max_rel_diff(logits_in_pieces(*model, *st2, ids, {1, 2, 3, 7, 9, 1, L - 23}), expected), tol)
            << "in pieces";
      }
  }
}

TEST(GpuFalconH1, MatchesCpuPath) {
  MAMBACPP_REQUIRE_GPU();
  for (const std::string& dir : falcon_dirs()) {
    SCOPED_TRACE(dir);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const int64_t L = static_cast<int64_t>(ids.size());
    auto cpu = load(dir, DeviceChoice::CPU);
    auto gpu = load(dir, DeviceChoice::CUDA);
    auto a = cpu->create_state(1), b = gpu->create_state(1);
    EXPECT_LE(test::max_rel_diff(logits_in_pieces(*gpu, *b, ids, {L - 5, 1, 1, 1, 1, 1}),
                                 logits_in_pieces(*cpu, *a, ids, {L - 5, 1, 1, 1, 1, 1})),
              1e-5);
    EXPECT_LE(test::max_rel_diff(b->read_slot(0), a->read_slot(0)), 1e-5) << "Mamba state and KV rows left behind";
  }
}

TEST(GpuFalconH1, GraphDecodeEqualsEagerAndCpu) {
  MAMBACPP_REQUIRE_GPU();
  for (const std::string& dir : falcon_dirs())
    for (int64_t page : {1, 64}) {
      SCOPED_TRACE(dir + " page " + std::to_string(page));
      const auto ids = test::read_token_ids(dir + "/tokens.txt");
      const size_t L = ids.size();
      auto decode = [&](DeviceChoice dev, bool graphs) {
        auto m = load(dir, dev, DType::F32, Precision::Exact, graphs, page);
        auto st = m->create_state(4);
        const std::vector<std::vector<int32_t>> prompts = {{ids.begin(), ids.begin() + 5},
                                                           {ids.begin() + 3, ids.begin() + 12},
                                                           {ids.begin(), ids.begin() + 1}};
        const int64_t slots[] = {3, 0, 2};
        std::vector<Sequence> seqs;
        for (size_t i = 0; i < 3; ++i) seqs.push_back(Sequence::tokens(prompts[i], slots[i]));
        std::vector<float> all = m->forward(*st, seqs, Output::LastLogits).values;
        std::vector<int32_t> next(3);
        for (size_t step = 0; step < 40; ++step) {
          for (size_t i = 0; i < 3; ++i) {
            next[i] = ids[(7 * i + step) % L];
            seqs[i] = Sequence::tokens(std::span<const int32_t>(&next[i], 1), slots[i]);
          }
          const ForwardResult r = m->forward(*st, seqs, Output::LastLogits);
          all.insert(all.end(), r.values.begin(), r.values.end());
        }
        return all;
      };
      const auto graph = decode(DeviceChoice::CUDA, true);
      EXPECT_EQ(graph, decode(DeviceChoice::CUDA, false)) << "graph vs eager";
      EXPECT_LE(test::max_rel_diff(graph, decode(DeviceChoice::CPU, false)), 1e-5) << "vs CPU";
    }
}

}  // namespace
}  // namespace mambacpp
