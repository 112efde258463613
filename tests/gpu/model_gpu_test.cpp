// The whole model on the GPU: logits against the transformers fixtures and against the CPU path, and the chunk- and
// batch-invariance properties, per weight and state dtype.
//
// Tolerances (max|a - b| / max|b|):
// - Weights kept exactly on the device (f32, or the stored dtype itself) with f32 state: 1e-4, as on the CPU — the
//   kernels compute in f32 (GEMMs split activations into hi + lo halves so products are exact), so only f32
//   rounding through a few layers separates them from the fp64 reference (~1e-6 seen on the CPU).
// - Weights rounded to bf16 on the device (from f32/f16 storage): each weight moves by up to 2^-9 relative, which
//   moves logits by ~1e-3..1e-2 of their range on these models: 3e-2.
// - Chunk/batch invariance with f32 state: 1e-5 (only the grouping of SSD chunks and GEMV vs GEMM summation order
//   differ). With bf16 state the state is rounded at every call boundary (2^-9 relative each time): 3e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "backend/backend.h"
#include "mambacpp/model.h"
#include "support/test_support.h"
#include "mambacpp/npy.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

using test::fixture_model_dirs;
using test::read_token_ids;

// The fixture names say the storage dtype (docs/fixtures.md).
DType stored_dtype(const std::string& dir) {
  if (dir.find("bf16") != std::string::npos) return DType::BF16;
  if (dir.find("fp16") != std::string::npos) return DType::F16;
  return DType::F32;
}

std::unique_ptr<Model> load_gpu(const std::string& dir, DType weights, int64_t batch_tokens = 2048,
                                Precision precision = Precision::Exact) {
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  lo.weight_dtype = weights;
  lo.max_batch_tokens = batch_tokens;
  lo.precision = precision;
  return Model::load(dir, lo);
}

std::vector<float> all_logits(const Model& m, std::span<const int32_t> ids, const std::vector<int64_t>& chunks,
                              DType state_dtype = DType::F32) {
  auto st = m.create_state(1, state_dtype);
  std::vector<float> out;
  int64_t at = 0;
  for (int64_t c : chunks) {
    Sequence s = Sequence::tokens(ids.subspan(static_cast<size_t>(at), static_cast<size_t>(c)));
    ForwardResult r = m.forward(*st, {&s, 1}, Output::AllLogits);
    out.insert(out.end(), r.values.begin(), r.values.end());
    at += c;
  }
  return out;
}

// The default piece size on the GPU (LoadOptions::max_batch_tokens 0) is kGpuPieceTokens, and a prompt longer than a
// piece gives the logits of pieces of another size (exact mode: bit for bit is not promised, the tolerance is f32's).
TEST(GpuModel, DefaultPieceSizeIsTheGpusAndPiecesDoNotMatter) {
  const std::string dir = fixture_model_dirs().front();
  auto ids = read_token_ids(dir + "/tokens.txt");
  auto by_default = load_gpu(dir, DType::F32, 0);
  EXPECT_EQ(by_default->load_options().max_batch_tokens, kGpuPieceTokens);
  auto small = load_gpu(dir, DType::F32, 3);
  const int64_t L = static_cast<int64_t>(ids.size());
  ASSERT_GT(L, 3);
  std::vector<float> a = all_logits(*by_default, ids, {L}), b = all_logits(*small, ids, {L});
  ASSERT_EQ(a.size(), b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i])) << i;
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(a[i])));
  }
  EXPECT_LE(worst, 1e-4 * scale);  // f32 activations over a handful of layers: ~1e-6 relative, a wide margin
}

TEST(GpuModel, FixturesMatchTransformers) {
  auto dirs = fixture_model_dirs();
  ASSERT_GE(dirs.size(), 5u);
  for (const std::string& dir : dirs) {
    auto ids = read_token_ids(dir + "/tokens.txt");
    NpyArray ref = read_npy(dir + "/logits.npy");
    std::vector<float> expected(ref.values.begin(), ref.values.end());
    const int64_t L = static_cast<int64_t>(ids.size());
    for (DType wd : {DType::F32, DType::BF16, DType::F16})
      for (Precision pr : {Precision::Exact, Precision::Fast}) {
        SCOPED_TRACE(dir + " weights " + dtype_name(wd) + " " + precision_name(pr));
        auto model = load_gpu(dir, wd, 2048, pr);
        const DType stored = stored_dtype(dir);
        // Fast rounds every GEMM input to 16 bits (2^-9 relative for bf16, as rounding the weights does): 3e-2.
        const bool exact = wd == DType::F32 || (wd == stored && pr == Precision::Exact);
        const double tol = exact ? 1e-4 : 3e-2;
        const auto one = all_logits(*model, ids, {L});
        const double err = test::max_rel_diff(one, expected);
        EXPECT_LE(err, tol) << "one pass";
        EXPECT_LE(test::max_rel_diff(all_logits(*model, ids, {1, 2, 3, 7, 9, 1, L - 23}), expected), tol)
            << "chunked";
        // Greedy agreement: positions whose argmax is the fixture's (teacher-forced on the fixture tokens).
        const size_t V = one.size() / static_cast<size_t>(L);
        int agree = 0;
        for (int64_t t = 0; t < L; ++t) {
          const float* a = one.data() + t * V;
          const float* b = expected.data() + t * V;
          agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
        }
        std::printf("[accuracy] %-40s weights %-4s %-5s max rel logit err %.2e, argmax agrees %d/%lld\n",
                    fs::path(dir).filename().c_str(), dtype_name(wd), precision_name(pr), err, agree,
                    static_cast<long long>(L));
      }
  }
}

TEST(GpuModel, MatchesCpuPath) {
  for (const std::string& dir : fixture_model_dirs()) {
    SCOPED_TRACE(dir);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    auto cpu = Model::load(dir, lo);
    auto gpu = load_gpu(dir, DType::F32);
    auto ids = read_token_ids(dir + "/tokens.txt");
    const int64_t L = static_cast<int64_t>(ids.size());
    EXPECT_LE(test::max_rel_diff(all_logits(*gpu, ids, {L}), all_logits(*cpu, ids, {L})), 1e-5);
    EXPECT_LE(test::max_rel_diff(all_logits(*gpu, ids, std::vector<int64_t>(L, 1)), all_logits(*cpu, ids, {L})), 1e-5);
  }
}

class GpuInvariance : public ::testing::TestWithParam<std::tuple<Arch, DType>> {};

TEST_P(GpuInvariance, AnySplitAndAnyBatchEqualsOnePassAlone) {
  const auto [arch, state_dtype] = GetParam();
  test::TempDir dir;
  ModelConfig c = arch == Arch::Mamba1 ? test::tiny_mamba1_config() : test::tiny_mamba2_config();
  test::write_random_model(dir.path(), c, 17);
  auto model = load_gpu(dir.path(), DType::BF16);
  const double tol = state_dtype == DType::F32 ? 1e-5 : 3e-2;
  const int64_t L = 61;
  auto ids = test::random_tokens(L, c.vocab_size, 4);
  auto whole = all_logits(*model, ids, {L}, state_dtype);
  std::mt19937_64 rng(5);
  std::vector<std::vector<int64_t>> splits = {std::vector<int64_t>(L, 1), {2, 2, 1, 56}, {8, 8, 16, 29}, {7, 9, 45}};
  for (int i = 0; i < 10; ++i) {
    std::vector<int64_t> s;
    for (int64_t left = L; left > 0;) {
      int64_t n = std::min<int64_t>(left, std::uniform_int_distribution<int64_t>(1, 13)(rng));
      s.push_back(n);
      left -= n;
    }
    splits.push_back(s);
  }
  for (const auto& s : splits) EXPECT_LE(test::max_rel_diff(all_logits(*model, ids, s, state_dtype), whole), tol);

  // Batch of different lengths and slots == each alone.
  const std::vector<int64_t> lengths = {1, 9, 17, 30, 2}, slots = {3, 0, 4, 1, 2};
  std::vector<std::vector<int32_t>> seq_ids;
  std::vector<Sequence> seqs;
  for (size_t i = 0; i < lengths.size(); ++i) seq_ids.push_back(test::random_tokens(lengths[i], c.vocab_size, 50 + i));
  for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(Sequence::tokens(seq_ids[i], slots[i]));
  auto st = model->create_state(5, state_dtype);
  ForwardResult batched = model->forward(*st, seqs, Output::AllLogits);
  int64_t row = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    auto alone = all_logits(*model, seq_ids[i], {lengths[i]}, state_dtype);
    std::span<const float> mine(batched.values.data() + row * batched.cols, alone.size());
    EXPECT_LE(test::max_rel_diff(mine, alone), tol) << "sequence " << i;
    row += lengths[i];
  }
}

INSTANTIATE_TEST_SUITE_P(ArchState, GpuInvariance,
                         ::testing::Combine(::testing::Values(Arch::Mamba1, Arch::Mamba2),
                                            ::testing::Values(DType::F32, DType::BF16)));

// Decode steps replayed from a captured CUDA graph give exactly the logits of the same kernels run eagerly.
TEST(GpuModel, CudaGraphDecodeEqualsEager) {
  for (Arch arch : {Arch::Mamba1, Arch::Mamba2}) {
    test::TempDir dir;
    ModelConfig c = arch == Arch::Mamba1 ? test::tiny_mamba1_config() : test::tiny_mamba2_config();
    test::write_random_model(dir.path(), c, 23);
    auto decode = [&](bool graphs) {
      LoadOptions lo;
      lo.device = DeviceChoice::CUDA;
      lo.cuda_graphs = graphs;
      auto m = Model::load(dir.path(), lo);
      auto st = m->create_state(3);
      std::vector<std::vector<int32_t>> prompts = {test::random_tokens(5, c.vocab_size, 1),
                                                   test::random_tokens(9, c.vocab_size, 2),
                                                   test::random_tokens(1, c.vocab_size, 3)};
      std::vector<Sequence> seqs;
      for (int64_t i = 0; i < 3; ++i) seqs.push_back(Sequence::tokens(prompts[i], 2 - i));
      ForwardResult r = m->forward(*st, seqs, Output::LastLogits);
      std::vector<float> all;
      std::vector<int32_t> next(3);
      for (int step = 0; step < 12; ++step) {
        for (int64_t i = 0; i < 3; ++i) {
          auto row = r.row(i);
          next[i] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
          seqs[i] = Sequence::tokens(std::span<const int32_t>(&next[i], 1), 2 - i);
        }
        r = m->forward(*st, seqs, Output::LastLogits);
        all.insert(all.end(), r.values.begin(), r.values.end());
      }
      return all;
    };
    EXPECT_EQ(decode(true), decode(false)) << arch_name(arch);
  }
}

TEST(GpuModel, AutoPicksTheGpu) {
  ASSERT_TRUE(cuda_available());
  test::TempDir dir;
  test::write_random_model(dir.path(), test::tiny_mamba2_config(), 1);
  LoadOptions lo;
  auto m = Model::load(dir.path(), lo);
  EXPECT_EQ(m->device(), Device::CUDA);
}

}  // namespace
}  // namespace mambacpp
