// Short pieces on the GPU (issues 53 and 54): a sequence of at most kStepPieceMaxLen tokens in a forward gives bit for
// bit the logits, the Mamba state and the conv state that the same tokens give as successive decode steps, in both
// precisions, alone and beside a long prompt and other sequences' decode rows.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "mambacpp/model.h"
#include "mambacpp/precision.h"
#include "mambacpp/shapes.h"
#include "model/model_impl.h"
#include "model/step_pieces.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

std::unique_ptr<Model> gpu_model(const std::string& shape, Precision precision) {
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  lo.precision = precision;
  ModelConfig c = named_shape(shape);
  c.n_layer = 4;  // the real widths, few layers
  return Model::random(c, lo, 21, DType::BF16);
}

// The slot's state as the state file writes it: every layer's conv and SSM state, byte for byte.
std::string state_bytes(const StateCache& st, int64_t slot, const std::string& path) {
  st.save_snapshot(st.snapshot(slot), path, {});
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<int32_t> prefix(int64_t vocab, uint64_t seed) { return test::random_tokens(37, vocab, seed); }

using Param = std::tuple<std::string, Precision, DType>;
class GpuStepPieces : public ::testing::TestWithParam<Param> {};

// A prompt, then k tokens as one piece (all logits) vs as k decode steps (one forward of one token each).
TEST_P(GpuStepPieces, PieceEqualsDecodeSteps) {
  MAMBACPP_REQUIRE_GPU();
  const auto& [shape, precision, state_dtype] = GetParam();
  auto model = gpu_model(shape, precision);
  const int64_t V = model->config().vocab_size;
  test::TempDir dir;
  for (int64_t k : {2, 5, 9, 16}) {
    SCOPED_TRACE("k " + std::to_string(k));
    ASSERT_LE(k, kStepPieceMaxLen);
    auto piece_st = model->create_state(1, state_dtype);
    auto step_st = model->create_state(1, state_dtype);
    const std::vector<int32_t> p = prefix(V, 5 + static_cast<uint64_t>(k));
    for (StateCache* st : {piece_st.get(), step_st.get()}) {
      const Sequence s = Sequence::tokens(p, 0);
      model->forward(*st, {&s, 1}, Output::None);
    }
    const std::vector<int32_t> toks = test::random_tokens(k, V, 100 + static_cast<uint64_t>(k));
    const Sequence piece = Sequence::tokens(toks, 0);
    const ForwardResult got = model->forward(*piece_st, {&piece, 1}, Output::AllLogits);
    ASSERT_EQ(got.rows, k);
    for (int64_t t = 0; t < k; ++t) {
      const Sequence one = Sequence::tokens(std::span<const int32_t>(toks).subspan(static_cast<size_t>(t), 1), 0);
      const ForwardResult want = model->forward(*step_st, {&one, 1}, Output::LastLogits);
      EXPECT_TRUE(same_bits(got.row(t), want.row(0))) << "position " << t;
    }
    EXPECT_EQ(state_bytes(*piece_st, 0, dir.path() + "/piece.state"), state_bytes(*step_st, 0, dir.path() + "/step.state"));
  }
}

// One forward holding a long prompt (slot 1), a short piece (slot 0, 5 tokens) and two decode rows (slots 2 and 3):
// the short piece and the decode rows give the bits of decode steps over the same rows (round r: token r of each),
// the long prompt those of its prefill alone. In fast precision the decode step is batch invariant, so the short
// rows also equal each sequence's decode steps alone.
TEST_P(GpuStepPieces, ShortPieceBesideLongPromptAndDecodeRows) {
  MAMBACPP_REQUIRE_GPU();
  const auto& [shape, precision, state_dtype] = GetParam();
  auto model = gpu_model(shape, precision);
  const int64_t V = model->config().vocab_size;
  test::TempDir dir;
  auto mixed = model->create_state(4, state_dtype);
  auto rounds = model->create_state(4, state_dtype);
  auto alone = model->create_state(4, state_dtype);
  std::vector<std::vector<int32_t>> prefixes = {prefix(V, 1), {}, prefix(V, 2), prefix(V, 3)};
  for (StateCache* st : {mixed.get(), rounds.get(), alone.get()})
    for (int64_t slot : {0, 2, 3}) {
      const Sequence s = Sequence::tokens(prefixes[static_cast<size_t>(slot)], slot);
      model->forward(*st, {&s, 1}, Output::None);
    }
  const std::vector<int32_t> short_toks = test::random_tokens(5, V, 31), long_toks = test::random_tokens(40, V, 32);
  const std::vector<int32_t> d2 = test::random_tokens(1, V, 33), d3 = test::random_tokens(1, V, 34);
  const std::vector<Sequence> seqs = {Sequence::tokens(long_toks, 1), Sequence::tokens(short_toks, 0),
                                      Sequence::tokens(d2, 2), Sequence::tokens(d3, 3)};
  const ForwardResult got = model->forward(*mixed, seqs, Output::AllLogits);
  ASSERT_EQ(got.rows, 40 + 5 + 2);

  // The long prompt alone.
  const ForwardResult long_alone = model->forward(*rounds, {&seqs[0], 1}, Output::AllLogits);
  for (int64_t t = 0; t < 40; ++t) EXPECT_TRUE(same_bits(got.row(t), long_alone.row(t))) << "long row " << t;
  // Decode steps over the same rows: round 0 = {short[0], d2, d3}, rounds 1..4 = {short[r]}.
  for (int64_t r = 0; r < 5; ++r) {
    std::vector<Sequence> step = {Sequence::tokens(std::span<const int32_t>(short_toks).subspan(static_cast<size_t>(r), 1), 0)};
    if (r == 0) step.push_back(seqs[2]), step.push_back(seqs[3]);
    const ForwardResult want = model->forward(*rounds, step, Output::LastLogits);
    EXPECT_TRUE(same_bits(got.row(40 + r), want.row(0))) << "short row " << r;
    if (r == 0) {
      EXPECT_TRUE(same_bits(got.row(45), want.row(1))) << "decode row of slot 2";
      EXPECT_TRUE(same_bits(got.row(46), want.row(2))) << "decode row of slot 3";
    }
  }
  for (int64_t slot = 0; slot < 4; ++slot)
    EXPECT_EQ(state_bytes(*mixed, slot, dir.path() + "/a.state"), state_bytes(*rounds, slot, dir.path() + "/b.state"))
        << "slot " << slot;

  if (precision != Precision::Fast) return;
  // Fast precision: each sequence's decode steps alone.
  for (int64_t r = 0; r < 5; ++r) {
    const Sequence one = Sequence::tokens(std::span<const int32_t>(short_toks).subspan(static_cast<size_t>(r), 1), 0);
    const ForwardResult want = model->forward(*alone, {&one, 1}, Output::LastLogits);
    EXPECT_TRUE(same_bits(got.row(40 + r), want.row(0))) << "short row " << r << " vs alone";
  }
  for (int64_t slot : {2, 3}) {
    const ForwardResult want = model->forward(*alone, {&seqs[static_cast<size_t>(slot)], 1}, Output::LastLogits);
    EXPECT_TRUE(same_bits(got.row(43 + slot), want.row(0))) << "decode row of slot " << slot << " vs alone";
  }
}

// LastLogits and forward_top_k over pieces of different lengths: each sequence's last row as its decode steps give it.
TEST_P(GpuStepPieces, LastLogitsOfShortPiecesOfDifferentLengths) {
  MAMBACPP_REQUIRE_GPU();
  const auto& [shape, precision, state_dtype] = GetParam();
  auto model = gpu_model(shape, precision);
  const int64_t V = model->config().vocab_size;
  auto a = model->create_state(3, state_dtype);
  auto b = model->create_state(3, state_dtype);
  const std::vector<std::vector<int32_t>> toks = {test::random_tokens(3, V, 41), test::random_tokens(16, V, 42),
                                                  test::random_tokens(1, V, 43)};
  std::vector<Sequence> seqs;
  for (size_t i = 0; i < toks.size(); ++i) seqs.push_back(Sequence::tokens(toks[i], static_cast<int64_t>(i)));
  const ForwardResult got = model->forward(*a, seqs, Output::LastLogits);
  std::vector<std::vector<float>> want(toks.size());
  for (int64_t r = 0; r < 16; ++r) {
    std::vector<Sequence> step;
    std::vector<size_t> who;
    for (size_t i = 0; i < toks.size(); ++i)
      if (r < static_cast<int64_t>(toks[i].size()))
        step.push_back(Sequence::tokens(std::span<const int32_t>(toks[i]).subspan(static_cast<size_t>(r), 1),
                                        static_cast<int64_t>(i))),
            who.push_back(i);
    const ForwardResult out = model->forward(*b, step, Output::LastLogits);
    for (size_t j = 0; j < who.size(); ++j)
      if (r + 1 == static_cast<int64_t>(toks[who[j]].size()))
        want[who[j]].assign(out.row(static_cast<int64_t>(j)).begin(), out.row(static_cast<int64_t>(j)).end());
  }
  for (size_t i = 0; i < toks.size(); ++i) EXPECT_TRUE(same_bits(got.row(static_cast<int64_t>(i)), want[i])) << i;

  // forward_top_k of the same pieces (fresh slots): the candidates and log-probabilities of each last row as its
  // decode steps give them. Different requests per sequence, one with a repeat penalty.
  auto c = model->create_state(3, state_dtype);
  auto d = model->create_state(3, state_dtype);
  std::vector<TopKRequest> reqs(toks.size());
  reqs[0].k = 5;
  reqs[0].logprobs = 3;
  reqs[1].k = 8;
  reqs[1].repeat_penalty = 1.3f;
  reqs[1].penalized = {toks[1][0], toks[1][1]};
  reqs[2].k = 2;
  reqs[2].logprobs = 0;
  if (reqs[1].penalized[0] == reqs[1].penalized[1]) reqs[1].penalized.pop_back();
  const ForwardResult got_k = model->forward_top_k(*c, seqs, reqs);
  ASSERT_EQ(got_k.candidates.size(), toks.size());
  std::vector<TopKCandidates> want_k(toks.size());
  std::vector<RowLogprobs> want_lp(toks.size());
  for (int64_t r = 0; r < 16; ++r) {
    std::vector<Sequence> step;
    std::vector<TopKRequest> step_reqs;
    std::vector<size_t> who;
    for (size_t i = 0; i < toks.size(); ++i)
      if (r < static_cast<int64_t>(toks[i].size())) {
        step.push_back(Sequence::tokens(std::span<const int32_t>(toks[i]).subspan(static_cast<size_t>(r), 1),
                                        static_cast<int64_t>(i)));
        step_reqs.push_back(reqs[i]);
        who.push_back(i);
      }
    const ForwardResult out = model->forward_top_k(*d, step, step_reqs);
    for (size_t j = 0; j < who.size(); ++j)
      if (r + 1 == static_cast<int64_t>(toks[who[j]].size())) {
        want_k[who[j]] = out.candidates[j];
        want_lp[who[j]] = out.logprobs[j];
      }
  }
  for (size_t i = 0; i < toks.size(); ++i) {
    SCOPED_TRACE("top-k of sequence " + std::to_string(i));
    EXPECT_EQ(got_k.candidates[i].ids, want_k[i].ids);
    EXPECT_TRUE(same_bits(got_k.candidates[i].logits, want_k[i].logits));
    EXPECT_EQ(got_k.logprobs[i].ids, want_lp[i].ids);
    EXPECT_TRUE(same_bits(got_k.logprobs[i].logprobs, want_lp[i].logprobs));
    EXPECT_EQ(std::memcmp(&got_k.logprobs[i].log_normalizer, &want_lp[i].log_normalizer, sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(ShapePrecisionState, GpuStepPieces,
                         ::testing::Combine(::testing::Values(std::string("mamba2-130m"), std::string("mamba-130m")),
                                            ::testing::Values(Precision::Fast, Precision::Exact),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           std::string s = std::get<0>(i.param) + "_" + precision_name(std::get<1>(i.param)) + "_" +
                                           dtype_name(std::get<2>(i.param));
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// Mamba-1 (fast precision): many short pieces of different lengths in one forward, against rounds of decode steps
// over the same sequences. Rounds of four sequences or more take the one-thread-per-channel step kernel and the
// piece the sequence kernel (mamba1_scan.cu), so this also checks that the two agree token by token, with the state
// rounded between tokens as a store would.
class GpuStepPiecesMamba1 : public ::testing::TestWithParam<DType> {};

TEST_P(GpuStepPiecesMamba1, ManyPiecesEqualDecodeRounds) {
  MAMBACPP_REQUIRE_GPU();
  const DType state_dtype = GetParam();
  auto model = gpu_model("mamba-130m", Precision::Fast);
  const int64_t V = model->config().vocab_size;
  test::TempDir dir;
  const std::vector<int64_t> lens = {2, 5, 1, 9, 16, 3};
  const int64_t n = static_cast<int64_t>(lens.size());
  auto a = model->create_state(n, state_dtype);
  auto b = model->create_state(n, state_dtype);
  std::vector<std::vector<int32_t>> toks;
  std::vector<Sequence> seqs;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t> p = prefix(V, 60 + static_cast<uint64_t>(i));
    for (StateCache* st : {a.get(), b.get()}) {
      const Sequence s = Sequence::tokens(p, i);
      model->forward(*st, {&s, 1}, Output::None);
    }
    toks.push_back(test::random_tokens(lens[static_cast<size_t>(i)], V, 70 + static_cast<uint64_t>(i)));
  }
  int64_t total = 0;
  std::vector<int64_t> first(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    seqs.push_back(Sequence::tokens(toks[static_cast<size_t>(i)], i));
    first[static_cast<size_t>(i)] = total;
    total += lens[static_cast<size_t>(i)];
  }
  const ForwardResult got = model->forward(*a, seqs, Output::AllLogits);
  ASSERT_EQ(got.rows, total);
  for (int64_t r = 0; r < 16; ++r) {
    std::vector<Sequence> step;
    std::vector<int64_t> who;
    for (int64_t i = 0; i < n; ++i)
      if (r < lens[static_cast<size_t>(i)]) {
        step.push_back(Sequence::tokens(
            std::span<const int32_t>(toks[static_cast<size_t>(i)]).subspan(static_cast<size_t>(r), 1), i));
        who.push_back(i);
      }
    const ForwardResult want = model->forward(*b, step, Output::LastLogits);
    for (size_t j = 0; j < who.size(); ++j)
      EXPECT_TRUE(same_bits(got.row(first[static_cast<size_t>(who[j])] + r), want.row(static_cast<int64_t>(j))))
          << "sequence " << who[j] << " token " << r;
  }
  for (int64_t slot = 0; slot < n; ++slot)
    EXPECT_EQ(state_bytes(*a, slot, dir.path() + "/a.state"), state_bytes(*b, slot, dir.path() + "/b.state"))
        << "slot " << slot;
}

INSTANTIATE_TEST_SUITE_P(State, GpuStepPiecesMamba1, ::testing::Values(DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// Which calls take the one-forward route (step_pieces_one_forward) on a Mamba-1 model: its predicate over a model's
// internals (config, options, a CUDA backend, the projections' formats; the weights' values play no part), so the
// tests above compare the one forward, not successive decode forwards, with the decode steps.
TEST(GpuStepPiecesRoute, Mamba1ShortPiecesTakeOneForward) {
  MAMBACPP_REQUIRE_GPU();
  std::vector<uint16_t> bf16(16);
  std::vector<float> f32(16);
  const TensorView w16(bf16.data(), DType::BF16, {4, 4}), w32(f32.data(), DType::F32, {4, 4});
  auto impl = [&](const std::string& shape, Precision precision) {
    auto m = std::make_unique<Model::Impl>();
    m->options.device = DeviceChoice::CUDA;
    m->options.precision = precision;
    m->backend = make_backend(m->options);
    m->config = named_shape(shape);
    m->config.n_layer = 2;
    m->weights.lm_head = w16;
    for (int64_t l = 0; l < m->config.n_layer; ++l) {
      LayerWeights w;
      w.kind = m->config.arch == Arch::Mamba1 ? LayerKind::Mamba1 : LayerKind::Mamba2;
      w.in_proj = w.out_proj = w16;
      if (m->config.arch == Arch::Mamba1) w.x_proj = w.dt_proj = w16;
      m->weights.layers.push_back(w);
    }
    return m;
  };
  const std::vector<int32_t> five = {1, 2, 3, 4, 5}, sixteen(16, 7), one = {9};
  const std::vector<Sequence> piece = {Sequence::tokens(five, 0)};
  const std::vector<Sequence> mixed = {Sequence::tokens(five, 0), Sequence::tokens(sixteen, 1),
                                       Sequence::tokens(one, 2)};
  const std::vector<Sequence> singles = {Sequence::tokens(one, 0), Sequence::tokens(one, 1)};

  for (const char* shape : {"mamba-130m", "mamba-2.8b"}) {
    SCOPED_TRACE(shape);
    auto m = impl(shape, Precision::Fast);
    ASSERT_EQ(m->config.arch, Arch::Mamba1);
    ASSERT_EQ(m->backend->device(), Device::CUDA);
    for (Output o : {Output::None, Output::LastLogits, Output::AllLogits}) {
      EXPECT_TRUE(step_pieces_one_forward(*m, piece, o));
      EXPECT_TRUE(step_pieces_one_forward(*m, mixed, o));
    }
    EXPECT_FALSE(step_pieces_one_forward(*m, singles, Output::LastLogits));  // a plain decode step
    EXPECT_FALSE(step_pieces_one_forward(*m, piece, Output::AllLogitsAndHidden));
    // An f32 dt_proj or x_proj takes kernels whose bits depend on the row count: successive forwards.
    m->weights.layers[1].dt_proj = w32;
    EXPECT_FALSE(step_pieces_one_forward(*m, piece, Output::LastLogits));
    m->weights.layers[1].dt_proj = w16;
    m->weights.layers[0].x_proj = w32;
    EXPECT_FALSE(step_pieces_one_forward(*m, piece, Output::LastLogits));
    m->weights.layers[0].x_proj = w16;
    // FalconMamba's normed dt/B/C: another decode recipe.
    m->config.mixer_rms_eps = 1e-6;
    EXPECT_FALSE(step_pieces_one_forward(*m, piece, Output::LastLogits));
    m->config.mixer_rms_eps = 0.0;
    EXPECT_TRUE(step_pieces_one_forward(*m, piece, Output::LastLogits));
    // Exact precision keeps the successive decode forwards.
    EXPECT_FALSE(step_pieces_one_forward(*impl(shape, Precision::Exact), piece, Output::LastLogits));
  }
}

}  // namespace
}  // namespace mambacpp
