// MambaBlock as a layer: running a model's blocks one after another (then norm_f) reproduces the model's hidden
// states, and a block carries its state across calls like the model does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "mambacpp/block.h"
#include "mambacpp/error.h"
#include "model/weights.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

class Block : public ::testing::TestWithParam<Arch> {
 protected:
  void SetUp() override {
    config_ = GetParam() == Arch::Mamba1 ? test::tiny_mamba1_config() : test::tiny_mamba2_config();
    test::write_random_model(dir_.path(), config_, 31);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    model_ = Model::load(dir_.path(), lo);
  }
  // Embedding rows of `ids` for each of B rows: [B, L, D].
  std::vector<float> embed(const std::vector<std::vector<int32_t>>& ids) const {
    const TensorView& table = model_->weights().embeddings.data;
    const int64_t D = config_.d_model;
    std::vector<float> x;
    for (const auto& row : ids)
      for (int32_t id : row) {
        std::vector<float> r(static_cast<size_t>(D));
        convert_to_f32(table.ptr<char>() + static_cast<size_t>(id * D) * dtype_size(table.dtype), table.dtype, r.data(), D);
        x.insert(x.end(), r.begin(), r.end());
      }
    return x;
  }
  test::TempDir dir_;
  ModelConfig config_;
  std::unique_ptr<Model> model_;
};

TEST_P(Block, StackOfBlocksEqualsModelHiddenStates) {
  const int64_t B = 2, L = 21, D = config_.d_model;
  std::vector<std::vector<int32_t>> ids = {test::random_tokens(L, config_.vocab_size, 1),
                                           test::random_tokens(L, config_.vocab_size, 2)};
  std::vector<float> x = embed(ids);
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    MambaBlock block(*model_, l);
    auto st = block.create_state(B);
    x = block.forward(*st, TensorView(x.data(), DType::F32, {B, L, D}));
  }
  // norm_f on the host, in double.
  const TensorView& nf = model_->weights().norm_f;
  std::vector<float> w(static_cast<size_t>(D));
  convert_to_f32(nf.data, nf.dtype, w.data(), D);
  for (int64_t t = 0; t < B * L; ++t) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(x[t * D + d]) * x[t * D + d];
    const double inv = 1.0 / std::sqrt(ss / D + config_.norm_eps);
    for (int64_t d = 0; d < D; ++d) x[t * D + d] = static_cast<float>(x[t * D + d] * inv * w[d]);
  }
  auto st = model_->create_state(B);
  std::vector<int32_t> flat(ids[0]);
  flat.insert(flat.end(), ids[1].begin(), ids[1].end());
  ForwardResult h = model_->forward(*st, TensorView(flat.data(), DType::I32, {B, L}), Output::Hidden);
  EXPECT_LE(test::max_rel_diff(x, h.values), 1e-5);
}

TEST_P(Block, CarriesStateAcrossCalls) {
  const int64_t L = 17, D = config_.d_model;
  std::vector<float> x = embed({test::random_tokens(L, config_.vocab_size, 3)});
  MambaBlock block(*model_, 1);
  auto whole_state = block.create_state(1);
  auto whole = block.forward(*whole_state, TensorView(x.data(), DType::F32, {1, L, D}));
  auto st = block.create_state(1);
  std::vector<float> pieces;
  for (int64_t at = 0, n; at < L; at += n) {
    n = std::min<int64_t>(L - at, 2 + at % 5);
    auto part = block.forward(*st, TensorView(x.data() + at * D, DType::F32, {1, n, D}));
    pieces.insert(pieces.end(), part.begin(), part.end());
  }
  EXPECT_LE(test::max_rel_diff(pieces, whole), 1e-5);
  EXPECT_LE(test::max_rel_diff(st->read_slot(0), whole_state->read_slot(0)), 1e-5);
}

TEST_P(Block, StatesDoNotMixWithTheModelsOrOtherBlocks) {
  MambaBlock b0(*model_, 0), b1(*model_, 1);
  auto s0 = b0.create_state(1);
  std::vector<float> x(static_cast<size_t>(2 * config_.d_model), 0.5f);
  const TensorView xv(x.data(), DType::F32, {1, 2, config_.d_model});
  EXPECT_THAT(test::error_of([&] { b1.forward(*s0, xv); }), ::testing::HasSubstr("this block's create_state"));
  std::vector<int32_t> ids = {1, 2};
  Sequence s = Sequence::tokens(ids);
  EXPECT_THAT(test::error_of([&] { model_->forward(*s0, {&s, 1}, Output::LastLogits); }),
              ::testing::HasSubstr("MambaBlock's state"));
  test::TempDir d;
  s0->save(0, d.file("b0.state"));
  auto s1 = b1.create_state(1);
  EXPECT_THAT(test::error_of([&] { s1->load(0, d.file("b0.state")); }), ::testing::HasSubstr("holds layers [0, 1)"));
  EXPECT_THAT(test::error_of([&] { model_->create_state(1)->load(0, d.file("b0.state")); }),
              ::testing::HasSubstr("holds layers [0, 1)"));
}

TEST_P(Block, RejectsWrongWidth) {
  MambaBlock block(*model_, 0);
  auto st = block.create_state(1);
  std::vector<float> x(3 * (config_.d_model + 1));
  EXPECT_THROW(block.forward(*st, TensorView(x.data(), DType::F32, {1, 3, config_.d_model + 1})), Error);
  EXPECT_THROW(MambaBlock(*model_, config_.n_layer), Error);
}

INSTANTIATE_TEST_SUITE_P(Arch, Block, ::testing::Values(Arch::Mamba1, Arch::Mamba2),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace mambacpp
