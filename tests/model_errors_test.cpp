// Bad input gets a clear error that names what was wrong, what was expected and what was found — never a crash and
// never a silently wrong result. Each case checks its message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "mambacpp/error.h"
#include "backend/backend.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using test::error_of;

class ModelErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = test::tiny_mamba2_config();
    test::write_random_model(dir_.path(), config_, 42);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    model_ = Model::load(dir_.path(), lo);
    state_ = model_->create_state(2);
  }
  test::TempDir dir_;
  ModelConfig config_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<StateCache> state_;
};

TEST_F(ModelErrors, TokenIdOutOfRange) {
  std::vector<int32_t> ids = {1, 2, 47};
  Sequence s = Sequence::tokens(ids);
  EXPECT_THAT(error_of([&] { model_->forward(*state_, {&s, 1}, Output::LastLogits); }),
              AllOf(HasSubstr("token id 47"), HasSubstr("[0, 47)"), HasSubstr("position 2")));
  ids = {-1};
  EXPECT_THAT(error_of([&] { model_->forward(*state_, {&s, 1}, Output::LastLogits); }), HasSubstr("token id -1"));
}

TEST_F(ModelErrors, RejectedInputLeavesStateUntouched) {
  std::vector<int32_t> good = {1, 2, 3}, bad = {4, 999};
  std::vector<Sequence> seqs = {Sequence::tokens(good, 0), Sequence::tokens(bad, 1)};
  auto before = state_->read_slot(0);
  EXPECT_THROW(model_->forward(*state_, seqs, Output::LastLogits), Error);
  EXPECT_EQ(state_->read_slot(0), before);
}

TEST_F(ModelErrors, EmbeddingWidthNotDModel) {
  std::vector<float> e(5 * 17, 0.5f);
  Sequence s = Sequence::embeds(TensorView(e.data(), DType::F32, {5, 17}));
  EXPECT_THAT(error_of([&] { model_->forward(*state_, {&s, 1}, Output::LastLogits); }),
              AllOf(HasSubstr("input embeddings"), HasSubstr("[L, 18]"), HasSubstr("found [5, 17]")));
  std::vector<float> batch(2 * 3 * 17, 0.5f);
  EXPECT_THAT(error_of([&] { model_->forward(*state_, TensorView(batch.data(), DType::F32, {2, 3, 17}), Output::LastLogits); }),
              AllOf(HasSubstr("[B, L, 18]"), HasSubstr("found [2, 3, 17]")));
}

TEST_F(ModelErrors, EmbeddingDtype) {
  std::vector<double> e(3 * 18, 0.5);
  Sequence s = Sequence::embeds(TensorView(e.data(), DType::F64, {3, 18}));
  EXPECT_THAT(error_of([&] { model_->forward(*state_, {&s, 1}, Output::LastLogits); }),
              AllOf(HasSubstr("expected dtype f32, f16 or bf16"), HasSubstr("found f64")));
}

TEST_F(ModelErrors, EmptySequence) {
  std::vector<int32_t> none;
  Sequence s = Sequence::tokens(none);
  EXPECT_THAT(error_of([&] { model_->forward(*state_, {&s, 1}, Output::LastLogits); }),
              AllOf(HasSubstr("L == 0"), HasSubstr("at least one token")));
  std::vector<int32_t> ids;
  EXPECT_THAT(error_of([&] { model_->forward(*state_, TensorView(ids.data(), DType::I32, {1, 0}), Output::LastLogits); }),
              HasSubstr("L >= 1"));
}

TEST_F(ModelErrors, SlotOutOfRange) {
  std::vector<int32_t> ids = {1};
  Sequence s = Sequence::tokens(ids, 2);
  EXPECT_THAT(error_of([&] { model_->forward(*state_, {&s, 1}, Output::LastLogits); }),
              AllOf(HasSubstr("slot 2 out of range"), HasSubstr("[0, 2)")));
  EXPECT_THAT(error_of([&] { state_->reset(-1); }), HasSubstr("slot -1 out of range"));
  EXPECT_THAT(error_of([&] { state_->copy(0, 5); }), HasSubstr("destination slot 5 out of range"));
  std::vector<Sequence> twice = {Sequence::tokens(ids, 1), Sequence::tokens(ids, 1)};
  EXPECT_THAT(error_of([&] { model_->forward(*state_, twice, Output::LastLogits); }),
              HasSubstr("slot 1 is used by two sequences"));
}

TEST_F(ModelErrors, StateFromAnotherModel) {
  test::TempDir other_dir;
  test::write_random_model(other_dir.path(), config_, 43);  // same config, other weights
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  auto other = Model::load(other_dir.path(), lo);
  auto other_state = other->create_state(1);
  const std::string path = dir_.file("other.state");
  other_state->save(0, path);
  EXPECT_THAT(error_of([&] { state_->load(0, path); }),
              AllOf(HasSubstr("written by another model"), HasSubstr("weights hash")));

  test::TempDir m1_dir;
  test::write_random_model(m1_dir.path(), test::tiny_mamba1_config(), 1);
  auto m1 = Model::load(m1_dir.path(), lo);
  const std::string m1_path = dir_.file("m1.state");
  m1->create_state(1)->save(0, m1_path);
  EXPECT_THAT(error_of([&] { state_->load(0, m1_path); }), AllOf(HasSubstr("written by another model"), HasSubstr("config")));

  std::ofstream(dir_.file("junk.state")) << "not a state";
  EXPECT_THAT(error_of([&] { state_->load(0, dir_.file("junk.state")); }), HasSubstr("not a mambacpp state file"));
}

TEST_F(ModelErrors, TruncatedStateFile) {
  const std::string path = dir_.file("s.state");
  state_->save(0, path);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  EXPECT_THAT(error_of([&] { state_->load(0, path); }), HasSubstr("truncated"));
}

TEST_F(ModelErrors, StateOfAnotherModelInForward) {
  test::TempDir other_dir;
  test::write_random_model(other_dir.path(), config_, 44);
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  auto other = Model::load(other_dir.path(), lo);
  auto other_state = other->create_state(1);
  std::vector<int32_t> ids = {1};
  Sequence s = Sequence::tokens(ids);
  EXPECT_THAT(error_of([&] { model_->forward(*other_state, {&s, 1}, Output::LastLogits); }), HasSubstr("another model"));
}

// Checkpoints with a missing or misshapen tensor.
class CheckpointErrors : public ::testing::Test {
 protected:
  std::string load_error(const std::map<std::string, test::HostTensor>& tensors) {
    test::TempDir d;
    test::write_random_model(d.path(), test::tiny_mamba1_config(), 1);
    test::write_safetensors(d.file("model.safetensors"), tensors);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    return error_of([&] { Model::load(d.path(), lo); });
  }
  std::map<std::string, test::HostTensor> full() {
    // Mirror of write_random_model's names for the tiny Mamba-1 config (d_model 20, d_inner 40, N 6, R 2, V 53).
    std::map<std::string, test::HostTensor> w;
    auto t = [](std::vector<int64_t> shape) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      return test::HostTensor{shape, std::vector<float>(static_cast<size_t>(n), 0.1f), DType::F32};
    };
    w["backbone.embeddings.weight"] = t({53, 20});
    w["backbone.norm_f.weight"] = t({20});
    w["lm_head.weight"] = t({53, 20});
    for (int i = 0; i < 2; ++i) {
      std::string p = "backbone.layers." + std::to_string(i) + ".";
      w[p + "norm.weight"] = t({20});
      w[p + "mixer.in_proj.weight"] = t({80, 20});
      w[p + "mixer.in_proj.bias"] = t({80});
      w[p + "mixer.conv1d.weight"] = t({40, 1, 4});
      w[p + "mixer.conv1d.bias"] = t({40});
      w[p + "mixer.x_proj.weight"] = t({14, 40});
      w[p + "mixer.dt_proj.weight"] = t({40, 2});
      w[p + "mixer.dt_proj.bias"] = t({40});
      w[p + "mixer.A_log"] = t({40, 6});
      w[p + "mixer.D"] = t({40});
      w[p + "mixer.out_proj.weight"] = t({20, 40});
      w[p + "mixer.out_proj.bias"] = t({20});
    }
    return w;
  }
};

TEST_F(CheckpointErrors, CompleteCheckpointLoads) { EXPECT_EQ(load_error(full()), "(no error)"); }

TEST_F(CheckpointErrors, MissingTensor) {
  auto w = full();
  w.erase("backbone.layers.1.mixer.x_proj.weight");
  EXPECT_THAT(load_error(w), AllOf(HasSubstr("missing tensor 'backbone.layers.1.mixer.x_proj.weight'"), HasSubstr("[14, 40]")));
}

TEST_F(CheckpointErrors, MisshapenTensor) {
  auto w = full();
  w["backbone.layers.0.mixer.A_log"].shape = {6, 40};
  EXPECT_THAT(load_error(w), AllOf(HasSubstr("'backbone.layers.0.mixer.A_log'"), HasSubstr("shape [6, 40]"),
                                   HasSubstr("expected [40, 6]")));
}

TEST_F(CheckpointErrors, UnexpectedTensor) {
  auto w = full();
  w["backbone.layers.2.mixer.D"] = w["backbone.layers.0.mixer.D"];
  EXPECT_THAT(load_error(w), AllOf(HasSubstr("unexpected tensor"), HasSubstr("backbone.layers.2.mixer.D")));
}

TEST_F(CheckpointErrors, EmbeddingNamedTheMambaSsmWay) {
  auto w = full();
  w["backbone.embedding.weight"] = w["backbone.embeddings.weight"];
  w.erase("backbone.embeddings.weight");
  EXPECT_EQ(load_error(w), "(no error)");
}

}  // namespace
}  // namespace mambacpp

namespace mambacpp {
namespace {

TEST(DeviceChoice, CudaIsUsedWhenUsableAndRefusedClearlyOtherwise) {
  test::TempDir d;
  test::write_random_model(d.path(), test::tiny_mamba2_config(), 1);
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  if (cuda_available()) {
    EXPECT_EQ(Model::load(d.path(), lo)->device(), Device::CUDA);
  } else {
    EXPECT_THAT(error_of([&] { Model::load(d.path(), lo); }), ::testing::HasSubstr("cuda"));
    lo.device = DeviceChoice::Auto;  // auto falls back to the CPU
    EXPECT_EQ(Model::load(d.path(), lo)->device(), Device::CPU);
  }
  EXPECT_THAT(error_of([] { parse_device_choice("tpu"); }), ::testing::HasSubstr("expected auto, cpu or cuda"));
}

}  // namespace
}  // namespace mambacpp
