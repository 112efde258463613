// The property that defines mambacpp: any split of a sequence into chunks, and any batching of sequences, gives the
// logits and final state of one pass over each sequence alone — within 1e-5 as max|a - b| / max|b| (fp32: the only
// differences allowed are rounding from a different grouping of the SSD chunks, ~1e-6 here).
#include <gtest/gtest.h>

#include <random>

#include "mambacpp/model.h"
#include "model/weights.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

constexpr double kTol = 1e-5;

struct Pass {
  std::vector<float> logits;  // [L, vocab]
  std::vector<float> state;   // final state of the slot
};

Pass run_chunked(const Model& model, std::span<const int32_t> ids, const std::vector<int64_t>& chunks) {
  auto state = model.create_state(2);
  Pass p;
  int64_t at = 0;
  for (int64_t c : chunks) {
    Sequence s = Sequence::tokens(ids.subspan(static_cast<size_t>(at), static_cast<size_t>(c)), 1);
    ForwardResult r = model.forward(*state, {&s, 1}, Output::AllLogits);
    p.logits.insert(p.logits.end(), r.values.begin(), r.values.end());
    at += c;
  }
  p.state = state->read_slot(1);
  return p;
}

std::vector<int64_t> random_split(int64_t L, std::mt19937_64& rng, int64_t max_piece) {
  std::uniform_int_distribution<int64_t> d(1, max_piece);
  std::vector<int64_t> out;
  for (int64_t left = L; left > 0;) {
    int64_t c = std::min(left, d(rng));
    out.push_back(c);
    left -= c;
  }
  return out;
}

class ModelInvariance : public ::testing::TestWithParam<Arch> {
 protected:
  void SetUp() override {
    config_ = GetParam() == Arch::Mamba1 ? test::tiny_mamba1_config() : test::tiny_mamba2_config();
    test::write_random_model(dir_.path(), config_, 1234);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    model_ = Model::load(dir_.path(), lo);
  }
  test::TempDir dir_;
  ModelConfig config_;
  std::unique_ptr<Model> model_;
};

TEST_P(ModelInvariance, AnySplitEqualsOnePass) {
  const int64_t L = 61;  // crosses the Mamba-2 chunk_size (8) boundaries many times
  auto ids = test::random_tokens(L, config_.vocab_size, 7);
  Pass whole = run_chunked(*model_, ids, {L});
  ASSERT_EQ(whole.logits.size(), static_cast<size_t>(L * config_.vocab_size));

  std::vector<std::vector<int64_t>> splits = {
      std::vector<int64_t>(static_cast<size_t>(L), 1),      // token by token (the recurrent step)
      {2, 2, 1, 2, 2, 2, 50},                                // chunks shorter than d_conv - 1 = 3
      {8, 8, 16, 8, 21},                                     // aligned with chunk_size
      {7, 9, 3, 13, 29},                                     // crossing chunk_size boundaries
      {1, 60},
      {60, 1},
  };
  std::mt19937_64 rng(99);
  for (int i = 0; i < 40; ++i) splits.push_back(random_split(L, rng, i % 2 ? 5 : 20));
  for (const auto& split : splits) {
    Pass p = run_chunked(*model_, ids, split);
    std::string desc;
    for (int64_t c : split) desc += std::to_string(c) + " ";
    EXPECT_LE(test::max_rel_diff(p.logits, whole.logits), kTol) << "logits, split " << desc;
    EXPECT_LE(test::max_rel_diff(p.state, whole.state), kTol) << "final state, split " << desc;
  }
}

TEST_P(ModelInvariance, InternalPiecesDoNotChangeResults) {
  // max_batch_tokens splits long inputs internally; results must not depend on it.
  const int64_t L = 45;
  auto ids = test::random_tokens(L, config_.vocab_size, 3);
  Pass whole = run_chunked(*model_, ids, {L});
  for (int64_t cap : {1, 3, 8, 13}) {
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    lo.max_batch_tokens = cap;
    auto small = Model::load(dir_.path(), lo);
    Pass p = run_chunked(*small, ids, {L});
    EXPECT_LE(test::max_rel_diff(p.logits, whole.logits), kTol) << "max_batch_tokens " << cap;
    EXPECT_LE(test::max_rel_diff(p.state, whole.state), kTol) << "max_batch_tokens " << cap;
  }
}

TEST_P(ModelInvariance, BatchEqualsAlone) {
  const std::vector<int64_t> lengths = {1, 9, 17, 30, 2};
  const std::vector<int64_t> slots = {3, 0, 4, 1, 2};
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < lengths.size(); ++i)
    ids.push_back(test::random_tokens(lengths[i], config_.vocab_size, 100 + i));
  // Give every slot a different history first, so sequences also start from non-zero states.
  std::vector<std::vector<int32_t>> history;
  for (size_t i = 0; i < lengths.size(); ++i) history.push_back(test::random_tokens(5 + i, config_.vocab_size, 200 + i));

  auto batched = model_->create_state(5);
  std::vector<Sequence> seqs;
  for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(Sequence::tokens(history[i], slots[i]));
  model_->forward(*batched, seqs, Output::None);
  seqs.clear();
  for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(Sequence::tokens(ids[i], slots[i]));
  ForwardResult all = model_->forward(*batched, seqs, Output::AllLogits);

  int64_t row = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    auto alone = model_->create_state(1);
    Sequence h = Sequence::tokens(history[i], 0);
    model_->forward(*alone, {&h, 1}, Output::None);
    Sequence s = Sequence::tokens(ids[i], 0);
    ForwardResult r = model_->forward(*alone, {&s, 1}, Output::AllLogits);
    std::span<const float> mine(all.values.data() + row * all.cols, r.values.size());
    EXPECT_LE(test::max_rel_diff(mine, r.values), kTol) << "sequence " << i;
    EXPECT_LE(test::max_rel_diff(batched->read_slot(slots[i]), alone->read_slot(0)), kTol) << "state of sequence " << i;
    row += lengths[i];
  }
}

TEST_P(ModelInvariance, LastLogitsAreTheLastRows) {
  std::vector<std::vector<int32_t>> ids = {test::random_tokens(12, config_.vocab_size, 1),
                                           test::random_tokens(3, config_.vocab_size, 2)};
  auto s1 = model_->create_state(2), s2 = model_->create_state(2);
  std::vector<Sequence> seqs = {Sequence::tokens(ids[0], 0), Sequence::tokens(ids[1], 1)};
  ForwardResult last = model_->forward(*s1, seqs, Output::LastLogits);
  ForwardResult all = model_->forward(*s2, seqs, Output::AllLogits);
  ASSERT_EQ(last.rows, 2);
  EXPECT_LE(test::max_rel_diff(last.row(0), all.row(11)), 0.0);
  EXPECT_LE(test::max_rel_diff(last.row(1), all.row(14)), 0.0);
}

TEST_P(ModelInvariance, EmbeddingsInputEqualsTokenIds) {
  // The embedding rows of the ids, given as embeddings [L, D] (f32, and as bf16 on a bf16-exact copy), give the
  // ids' logits; a batch may mix both kinds of input.
  const int64_t L = 19, D = config_.d_model;
  auto ids = test::random_tokens(L, config_.vocab_size, 5);
  const TensorView& table = model_->weights().embeddings.data;  // CPU: the checkpoint's f32 rows
  std::vector<float> rows(static_cast<size_t>(L * D));
  for (int64_t t = 0; t < L; ++t) convert_to_f32(table.ptr<char>() + static_cast<size_t>(ids[t] * D) * dtype_size(table.dtype), table.dtype, &rows[t * D], D);
  auto st = model_->create_state(2);
  std::vector<Sequence> seqs = {Sequence::tokens(ids, 0), Sequence::embeds(TensorView(rows.data(), DType::F32, {L, D}), 1)};
  ForwardResult r = model_->forward(*st, seqs, Output::AllLogits);
  std::span<const float> from_ids(r.values.data(), static_cast<size_t>(L * r.cols));
  std::span<const float> from_emb(r.values.data() + L * r.cols, static_cast<size_t>(L * r.cols));
  EXPECT_LE(test::max_rel_diff(from_emb, from_ids), kTol);

  std::vector<uint16_t> bf(rows.size());
  std::vector<float> rounded(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    bf[i] = f32_to_bf16(rows[i]);
    rounded[i] = bf16_to_f32(bf[i]);
  }
  auto st2 = model_->create_state(2);
  std::vector<Sequence> pair = {Sequence::embeds(TensorView(rounded.data(), DType::F32, {L, D}), 0),
                                Sequence::embeds(TensorView(bf.data(), DType::BF16, {L, D}), 1)};
  ForwardResult r2 = model_->forward(*st2, pair, Output::AllLogits);
  EXPECT_LE(test::max_rel_diff(std::span<const float>(r2.values.data() + L * r2.cols, L * r2.cols),
                               std::span<const float>(r2.values.data(), L * r2.cols)),
            0.0);
}

INSTANTIATE_TEST_SUITE_P(Arch, ModelInvariance, ::testing::Values(Arch::Mamba1, Arch::Mamba2),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace mambacpp
