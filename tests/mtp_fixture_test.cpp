// The MTP block's logits against transformers (fixtures/mtp, scripts/make_mtp_fixtures.py): a tiny Nemotron-H
// checkpoint with an attention + MoE MTP block, whose next-next-token logits were computed in float64 from
// transformers' own NemotronH blocks with the glue (enorm, hnorm, eh_proj) as vLLM writes it. The model's hidden
// states are checked first (they are the block's input), then the block's logits from those hidden states, and the
// greedy output with --draft-mtp against the plain one on this checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "mambacpp/engine.h"
#include "mambacpp/model.h"
#include "mambacpp/npy.h"
#include "model/mtp.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

std::string dir() { return test::fixture_dir() + "/mtp"; }

std::vector<float> as_f32(const NpyArray& a) { return std::vector<float>(a.values.begin(), a.values.end()); }

TEST(MtpFixture, BlockLogitsMatchTransformers) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 1;
  auto model = Model::load(dir() + "/model", lo);
  const NpyArray tok = read_npy(dir() + "/tokens.npy");
  const NpyArray hid = read_npy(dir() + "/hidden.npy");
  const NpyArray ref = read_npy(dir() + "/mtp_logits.npy");
  const int64_t L = tok.numel(), d = model->config().d_model, V = model->config().vocab_size;
  ASSERT_EQ(hid.shape, (std::vector<int64_t>{L, d}));
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{L - 1, V}));
  std::vector<int32_t> ids;
  for (double v : tok.values) ids.push_back(static_cast<int32_t>(v));

  // The model's final hidden states (after norm_f): the block's input.
  auto st = model->create_state(1);
  Sequence s = Sequence::tokens(ids, 0);
  const std::vector<float> hidden = model->forward(*st, {&s, 1}, Output::Hidden).values;
  EXPECT_LT(test::max_rel_diff(hidden, as_f32(hid)), 1e-4);

  // The block from the reference hidden states (so that its own error is measured), then from ours.
  const auto head = MtpHead::load(*model);
  const std::vector<float> h_ref = as_f32(hid);
  for (const std::vector<float>* h : {&h_ref, &hidden}) {
    auto mst = head->create_state(1);
    const MtpSequence seq{0, std::span<const int32_t>(ids).subspan(1),
                          std::span<const float>(*h).first(static_cast<size_t>((L - 1) * d))};
    const ForwardResult out = head->forward(*mst, {&seq, 1}, Output::AllLogitsAndHidden);
    const std::vector<float> want = as_f32(ref);
    EXPECT_LT(test::max_rel_diff(out.values, want), 2e-4) << (h == &h_ref ? "reference hidden" : "our hidden");
    for (int64_t p = 0; p < L - 1; ++p) {  // the argmax, where the reference is not near a tie
      const auto row = std::span<const float>(want).subspan(static_cast<size_t>(p * V), static_cast<size_t>(V));
      std::vector<float> sorted(row.begin(), row.end());
      std::sort(sorted.begin(), sorted.end());
      if (sorted[static_cast<size_t>(V - 1)] - sorted[static_cast<size_t>(V - 2)] < 1e-3f) continue;
      const auto got = std::span<const float>(out.values).subspan(static_cast<size_t>(p * V), static_cast<size_t>(V));
      EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(), std::max_element(row.begin(), row.end()) - row.begin())
          << "row " << p;
    }
  }

  // Greedy with MTP drafts is the plain output on this checkpoint too.
  GenerateRequest r;
  r.prompt.assign(ids.begin(), ids.begin() + 9);
  r.max_new_tokens = 20;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  const GenerateResult plain = test::run_alone(*model, r);
  r.speculative.draft_mtp = true;
  EngineOptions o;
  o.draft_mtp = true;
  const GenerateResult spec = test::run_alone(*model, r, nullptr, o);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.draft_tokens, 0);
}

}  // namespace
}  // namespace mambacpp
