// State slots: reset, fork (copy), save/load round trips — each checked through the logits that follow.
#include <gtest/gtest.h>

#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

class StateSlots : public ::testing::TestWithParam<Arch> {
 protected:
  void SetUp() override {
    config_ = GetParam() == Arch::Mamba1 ? test::tiny_mamba1_config() : test::tiny_mamba2_config();
    test::write_random_model(dir_.path(), config_, 77);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    model_ = Model::load(dir_.path(), lo);
    prefix_ = test::random_tokens(23, config_.vocab_size, 1);
    suffix_ = test::random_tokens(11, config_.vocab_size, 2);
  }
  std::vector<float> continue_from(StateCache& st, int64_t slot) {
    Sequence s = Sequence::tokens(suffix_, slot);
    return model_->forward(st, {&s, 1}, Output::AllLogits).values;
  }
  void feed_prefix(StateCache& st, int64_t slot) {
    Sequence s = Sequence::tokens(prefix_, slot);
    model_->forward(st, {&s, 1}, Output::None);
  }
  test::TempDir dir_;
  ModelConfig config_;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> prefix_, suffix_;
};

TEST_P(StateSlots, FreshStateIsZeroAndResetRestoresIt) {
  auto st = model_->create_state(2);
  for (float v : st->read_slot(1)) ASSERT_EQ(v, 0.0f);
  auto fresh = continue_from(*st, 1);
  feed_prefix(*st, 1);
  auto after_prefix = st->read_slot(1);
  double max_abs = 0;
  for (float v : after_prefix) max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
  EXPECT_GT(max_abs, 1e-3) << "the prefix must leave a visible state";
  st->reset(1);
  for (float v : st->read_slot(1)) ASSERT_EQ(v, 0.0f);
  auto st2 = model_->create_state(2);
  EXPECT_EQ(continue_from(*st2, 1), fresh);
}

TEST_P(StateSlots, ForkGivesTwoIdenticalContinuations) {
  auto st = model_->create_state(3);
  feed_prefix(*st, 0);
  st->copy(0, 2);
  EXPECT_EQ(st->read_slot(0), st->read_slot(2));
  auto a = continue_from(*st, 0);
  auto b = continue_from(*st, 2);
  EXPECT_EQ(a, b);
  // And the continuation differs from a fresh start: the state carries information.
  auto fresh = continue_from(*st, 1);
  EXPECT_GT(test::max_rel_diff(a, fresh), 1e-3);
}

TEST_P(StateSlots, SaveLoadRoundTrip) {
  auto st = model_->create_state(2);
  feed_prefix(*st, 0);
  const std::string path = dir_.file("slot.state");
  st->save(0, path);
  const auto saved = st->read_slot(0);
  const auto expected = continue_from(*st, 0);

  auto other = model_->create_state(4);
  other->load(3, path);
  EXPECT_EQ(other->read_slot(3), saved);
  EXPECT_EQ(continue_from(*other, 3), expected);
  for (float v : other->read_slot(2)) ASSERT_EQ(v, 0.0f) << "loading one slot must not touch the others";
}

INSTANTIATE_TEST_SUITE_P(Arch, StateSlots, ::testing::Values(Arch::Mamba1, Arch::Mamba2),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace mambacpp
