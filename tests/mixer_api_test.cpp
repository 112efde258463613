// The public mixer (mambacpp/mixer.h): a Mamba-1 / Mamba-2 mixer built from weights in memory equals the fp64
// reference of its definition and the model's own layer (block(x) - x for the normed input), carries its state
// across chunks and steps like one pass, keeps batch rows apart, reads 16-bit weights as their f32 values, and
// refuses bad weights, configs, states and inputs with messages that name them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "cpu_kernel_reference.h"
#include "mambacpp/block.h"
#include "mambacpp/error.h"
#include "mambacpp/mixer.h"
#include "model/weights.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using ::testing::HasSubstr;

std::vector<double> to_f64(const TensorView& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, f.data(), t.numel());
  return {f.begin(), f.end()};
}

std::vector<float> random_floats(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

class MixerApi : public ::testing::TestWithParam<Arch> {
 protected:
  void SetUp() override {
    config_ = GetParam() == Arch::Mamba1 ? test::tiny_mamba1_config() : test::tiny_mamba2_config();
    if (GetParam() == Arch::Mamba2) config_.use_bias = true;  // every optional weight in play
    test::write_random_model(dir_.path(), config_, 77);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    lo.threads = 1;
    model_ = Model::load(dir_.path(), lo);
    config_ = model_->config();
  }

  // Layer `l`'s mixer weights by transformers' names: the model's own host views (CPU backend: the checkpoint's).
  std::map<std::string, TensorView> weights_of(int64_t l) const {
    const LayerWeights& w = model_->weights().layers[static_cast<size_t>(l)];
    std::map<std::string, TensorView> m = {{"in_proj.weight", w.in_proj.data}, {"conv1d.weight", w.conv},
                                           {"out_proj.weight", w.out_proj.data}, {"A_log", w.A_log}, {"D", w.D}};
    if (!w.conv_bias.empty()) m["conv1d.bias"] = w.conv_bias;
    if (!w.in_proj_bias.empty()) m["in_proj.bias"] = w.in_proj_bias;
    if (!w.out_proj_bias.empty()) m["out_proj.bias"] = w.out_proj_bias;
    if (GetParam() == Arch::Mamba1) {
      m["x_proj.weight"] = w.x_proj.data;
      m["dt_proj.weight"] = w.dt_proj.data;
      m["dt_proj.bias"] = w.dt_bias;
    } else {
      m["dt_bias"] = w.dt_bias;
      m["norm.weight"] = w.gated_norm;
    }
    return m;
  }

  std::unique_ptr<Mixer> mixer(int64_t l) const {
    MixerOptions o;
    o.device = DeviceChoice::CPU;
    o.threads = 1;
    return Mixer::create(MixerConfig::of(config_), weights_of(l), o);
  }

  // The mixer's definition in fp64, token by token, for rows x [B, L, d_model] from fresh states.
  std::vector<double> reference(int64_t l, const std::vector<float>& x, int64_t B, int64_t L) const {
    const ModelConfig& c = config_;
    const auto w = weights_of(l);
    auto get = [&](const char* n) { return w.count(n) ? to_f64(w.at(n)) : std::vector<double>{}; };
    const int64_t T = B * L, D = c.d_model, di = c.d_inner, ch = c.conv_channels(), N = c.d_state;
    std::vector<SeqSpan> seqs;
    for (int64_t b = 0; b < B; ++b) seqs.push_back({b * L, L, b});
    const std::vector<double> xs(x.begin(), x.end());
    const std::vector<double> proj = ref::linear(xs, get("in_proj.weight"), get("in_proj.bias"), T, D, c.in_proj_size());
    std::vector<double> y(static_cast<size_t>(T * di));
    std::vector<double> conv_state(static_cast<size_t>(B * ch * (c.d_conv - 1)));
    std::vector<double> conv_in(static_cast<size_t>(T * ch)), conv_out(static_cast<size_t>(T * ch));
    if (c.arch == Arch::Mamba1) {
      std::vector<double> z(static_cast<size_t>(T * di));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < di; ++i) {
          conv_in[t * di + i] = proj[t * 2 * di + i];
          z[t * di + i] = proj[t * 2 * di + di + i];
        }
      ref::conv1d_silu(conv_in, ch, c.d_conv, get("conv1d.weight"), get("conv1d.bias"), conv_state, seqs, conv_out);
      const int64_t r = c.dt_rank;
      const std::vector<double> dbc = ref::linear(conv_out, get("x_proj.weight"), {}, T, di, r + 2 * N);
      std::vector<double> dlow(static_cast<size_t>(T * r)), Bm(static_cast<size_t>(T * N)), Cm(static_cast<size_t>(T * N));
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t k = 0; k < r; ++k) dlow[t * r + k] = dbc[t * (r + 2 * N) + k];
        for (int64_t n = 0; n < N; ++n) {
          Bm[t * N + n] = dbc[t * (r + 2 * N) + r + n];
          Cm[t * N + n] = dbc[t * (r + 2 * N) + r + N + n];
        }
      }
      const std::vector<double> dt = ref::linear(dlow, get("dt_proj.weight"), {}, T, r, di);
      std::vector<double> ssm(static_cast<size_t>(B * di * N));
      ref::mamba1_scan(conv_out, dt, Bm, Cm, z, get("A_log"), get("D"), get("dt_proj.bias"), ssm, di, N, seqs, y);
    } else {
      const int64_t G = c.n_groups, NH = c.n_heads, P = c.head_dim;
      std::vector<double> z(static_cast<size_t>(T * di)), dt(static_cast<size_t>(T * NH));
      for (int64_t t = 0; t < T; ++t) {
        const double* row = proj.data() + t * c.in_proj_size();
        for (int64_t i = 0; i < di; ++i) z[t * di + i] = row[i];
        for (int64_t i = 0; i < ch; ++i) conv_in[t * ch + i] = row[di + i];
        for (int64_t h = 0; h < NH; ++h) dt[t * NH + h] = row[di + ch + h];
      }
      ref::conv1d_silu(conv_in, ch, c.d_conv, get("conv1d.weight"), get("conv1d.bias"), conv_state, seqs, conv_out);
      std::vector<double> xi(static_cast<size_t>(T * di)), Bm(static_cast<size_t>(T * G * N)), Cm(Bm.size());
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < di; ++i) xi[t * di + i] = conv_out[t * ch + i];
        for (int64_t i = 0; i < G * N; ++i) {
          Bm[t * G * N + i] = conv_out[t * ch + di + i];
          Cm[t * G * N + i] = conv_out[t * ch + di + G * N + i];
        }
      }
      std::vector<double> ssm(static_cast<size_t>(B * NH * P * N)), yu(static_cast<size_t>(T * di));
      ref::mamba2_scan(xi, dt, Bm, Cm, get("A_log"), get("D"), get("dt_bias"), c.dt_min, c.dt_max, NH, P, G, N, ssm,
                       seqs, yu);
      y = ref::rmsnorm(yu, z, get("norm.weight"), T, di, di / c.norm_groups(), c.norm_eps);
    }
    return ref::linear(y, get("out_proj.weight"), get("out_proj.bias"), T, di, D);
  }

  test::TempDir dir_;
  ModelConfig config_;
  std::unique_ptr<Model> model_;
};

TEST_P(MixerApi, ForwardEqualsTheFp64Reference) {
  const int64_t B = 2, L = 19, D = config_.d_model;  // L > 2 chunks of the Mamba-2 config's 8
  const std::vector<float> x = random_floats(static_cast<size_t>(B * L * D), 5);
  auto m = mixer(1);
  auto st = m->create_state(B);
  const std::vector<float> y = m->forward(*st, TensorView(const_cast<float*>(x.data()), DType::F32, {B, L, D}));
  const std::vector<double> ref = reference(1, x, B, L);
  const std::vector<double> got(y.begin(), y.end());
  EXPECT_LE(test::max_rel_diff(got, ref), 2e-5);
}

TEST_P(MixerApi, ForwardIsTheModelsLayerWithoutNormAndResidual) {
  const int64_t B = 2, L = 13, D = config_.d_model;
  std::vector<float> x = random_floats(static_cast<size_t>(B * L * D), 6);
  MambaBlock block(*model_, 0);
  auto bst = block.create_state(B);
  const std::vector<float> bout = block.forward(*bst, TensorView(x.data(), DType::F32, {B, L, D}));
  // The block's input to its mixer: rmsnorm(x) * w, rounded to f32 as the model's norm writes it.
  const std::vector<double> nw = to_f64(model_->weights().layers[0].norm);
  std::vector<float> u(x.size());
  std::vector<double> expected(x.size());
  for (int64_t t = 0; t < B * L; ++t) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(x[t * D + d]) * x[t * D + d];
    const double inv = 1.0 / std::sqrt(ss / D + config_.norm_eps);
    for (int64_t d = 0; d < D; ++d) {
      u[t * D + d] = static_cast<float>(x[t * D + d] * inv * nw[d]);
      expected[t * D + d] = double(bout[t * D + d]) - x[t * D + d];
    }
  }
  auto m = mixer(0);
  auto st = m->create_state(B);
  const std::vector<float> y = m->forward(*st, TensorView(u.data(), DType::F32, {B, L, D}));
  EXPECT_LE(test::max_rel_diff(std::vector<double>(y.begin(), y.end()), expected), 1e-5);
  // Same state as the block's after the same input.
  for (int64_t b = 0; b < B; ++b) EXPECT_LE(test::max_rel_diff(st->read_slot(b), bst->read_slot(b)), 1e-5);
}

TEST_P(MixerApi, ChunksAndStepsEqualOnePass) {
  const int64_t B = 3, L = 23, D = config_.d_model;
  const std::vector<float> x = random_floats(static_cast<size_t>(B * L * D), 7);
  auto m = mixer(1);
  auto whole_state = m->create_state(B);
  const std::vector<float> whole =
      m->forward(*whole_state, TensorView(const_cast<float*>(x.data()), DType::F32, {B, L, D}));
  auto slice = [&](int64_t from, int64_t n) {  // positions [from, from + n) of every row: [B, n, D]
    std::vector<float> s;
    for (int64_t b = 0; b < B; ++b)
      s.insert(s.end(), x.begin() + (b * L + from) * D, x.begin() + (b * L + from + n) * D);
    return s;
  };
  std::vector<float> chunked(x.size()), stepped(x.size());
  auto cst = m->create_state(B), sst = m->create_state(B);
  for (int64_t at = 0, n; at < L; at += n) {
    n = std::min<int64_t>(L - at, 1 + at % 9);  // 1, 2, 4, 8, ... crossing chunk boundaries
    std::vector<float> part = slice(at, n);
    const std::vector<float> y = m->forward(*cst, TensorView(part.data(), DType::F32, {B, n, D}));
    for (int64_t b = 0; b < B; ++b)
      std::copy(y.begin() + b * n * D, y.begin() + (b + 1) * n * D, chunked.begin() + (b * L + at) * D);
  }
  for (int64_t t = 0; t < L; ++t) {
    std::vector<float> row = slice(t, 1);
    const std::vector<float> y = m->step(*sst, TensorView(row.data(), DType::F32, {B, D}));
    for (int64_t b = 0; b < B; ++b) std::copy(y.begin() + b * D, y.begin() + (b + 1) * D, stepped.begin() + (b * L + t) * D);
  }
  EXPECT_LE(test::max_rel_diff(chunked, whole), 1e-5);
  EXPECT_LE(test::max_rel_diff(stepped, whole), 1e-5);
  for (int64_t b = 0; b < B; ++b) {
    EXPECT_LE(test::max_rel_diff(cst->read_slot(b), whole_state->read_slot(b)), 1e-5);
    EXPECT_LE(test::max_rel_diff(sst->read_slot(b), whole_state->read_slot(b)), 1e-5);
  }
}

TEST_P(MixerApi, StepEqualsForwardOfOneToken) {
  const int64_t B = 2, D = config_.d_model;
  std::vector<float> x = random_floats(static_cast<size_t>(B * D), 8);
  auto m = mixer(0);
  auto a = m->create_state(B), b = m->create_state(B);
  // From a state that holds something: both continue the same 5 tokens.
  std::vector<float> warm = random_floats(static_cast<size_t>(B * 5 * D), 9);
  m->forward(*a, TensorView(warm.data(), DType::F32, {B, 5, D}));
  b = a->clone();
  const std::vector<float> s = m->step(*a, TensorView(x.data(), DType::F32, {B, D}));
  const std::vector<float> f = m->forward(*b, TensorView(x.data(), DType::F32, {B, 1, D}));
  EXPECT_EQ(s, f);
  EXPECT_EQ(a->read_slot(1), b->read_slot(1));
}

TEST_P(MixerApi, RowsAreIndependentAndStatesCopyAndReset) {
  const int64_t L = 11, D = config_.d_model;
  std::vector<float> x = random_floats(static_cast<size_t>(2 * L * D), 10);
  auto m = mixer(1);
  auto both = m->create_state(2);
  const std::vector<float> y = m->forward(*both, TensorView(x.data(), DType::F32, {2, L, D}));
  auto one = m->create_state(1);
  const std::vector<float> y1 = m->forward(*one, TensorView(x.data() + L * D, DType::F32, {1, L, D}));
  EXPECT_LE(test::max_rel_diff(std::vector<float>(y.begin() + L * D, y.end()), y1), 1e-6);
  both->copy(1, 0);
  EXPECT_EQ(both->read_slot(0), both->read_slot(1));
  both->reset(0);
  for (float v : both->read_slot(0)) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(both->slot_bytes(), both->read_slot(1).size() * sizeof(float));
}

TEST_P(MixerApi, SixteenBitWeightsAreTheirF32Values) {
  // Every weight stored as bf16 (one as f16): the mixer equals the f32 mixer of the rounded values.
  std::map<std::string, std::vector<uint16_t>> half;
  std::map<std::string, std::vector<float>> rounded;
  std::map<std::string, TensorView> w16, w32;
  for (const auto& [name, v] : weights_of(0)) {
    const DType t = name == "D" ? DType::F16 : DType::BF16;
    std::vector<float> f(static_cast<size_t>(v.numel()));
    convert_to_f32(v.data, v.dtype, f.data(), v.numel());
    std::vector<uint16_t>& h = half[name];
    h.resize(f.size());
    convert_from_f32(f.data(), h.data(), t, v.numel());
    std::vector<float>& r = rounded[name];
    r.resize(f.size());
    convert_to_f32(h.data(), t, r.data(), v.numel());
    TensorView hv = v, rv = v;
    hv.data = h.data(), hv.dtype = t;
    rv.data = r.data(), rv.dtype = DType::F32;
    w16[name] = hv;
    w32[name] = rv;
  }
  MixerOptions o;
  o.device = DeviceChoice::CPU;
  o.threads = 1;
  auto m16 = Mixer::create(MixerConfig::of(config_), w16, o);
  auto m32 = Mixer::create(MixerConfig::of(config_), w32, o);
  const int64_t L = 9, D = config_.d_model;
  std::vector<float> x = random_floats(static_cast<size_t>(L * D), 11);
  auto s16 = m16->create_state(1), s32 = m32->create_state(1);
  EXPECT_LE(test::max_rel_diff(m16->forward(*s16, TensorView(x.data(), DType::F32, {1, L, D})),
                               m32->forward(*s32, TensorView(x.data(), DType::F32, {1, L, D}))),
            1e-6);
}

TEST_P(MixerApi, ErrorsNameTheWeightAndWhatWasExpected) {
  const MixerConfig c = MixerConfig::of(config_);
  MixerOptions o;
  o.device = DeviceChoice::CPU;
  auto create = [&](const std::map<std::string, TensorView>& w) { Mixer::create(c, w, o); };
  auto w = weights_of(0);
  const std::string who = GetParam() == Arch::Mamba1 ? "MambaMixer" : "Mamba2Mixer";

  auto missing = w;
  missing.erase("A_log");
  EXPECT_THAT(test::error_of([&] { create(missing); }), HasSubstr(who + " weight 'A_log' is missing: expected shape ["));

  auto reshaped = w;
  TensorView bad = w.at("out_proj.weight");
  bad.shape[1] -= 1;
  reshaped["out_proj.weight"] = bad;
  const std::string shape_err = test::error_of([&] { create(reshaped); });
  EXPECT_THAT(shape_err, HasSubstr("weight 'out_proj.weight': expected f32, f16 or bf16 of shape [" +
                                   std::to_string(config_.d_model) + ", " + std::to_string(config_.d_inner) + "]"));
  EXPECT_THAT(shape_err, HasSubstr("found f32 [" + std::to_string(config_.d_model) + ", " +
                                   std::to_string(config_.d_inner - 1) + "]"));

  std::vector<int32_t> ints(static_cast<size_t>(w.at("D").numel()));
  auto typed = w;
  TensorView iv = w.at("D");
  iv.data = ints.data(), iv.dtype = DType::I32;
  typed["D"] = iv;
  EXPECT_THAT(test::error_of([&] { create(typed); }), HasSubstr("weight 'D': expected f32, f16 or bf16 of shape"));
  EXPECT_THAT(test::error_of([&] { create(typed); }), HasSubstr("found i32"));

  auto extra = w;
  extra["lm_head.weight"] = w.at("D");
  EXPECT_THAT(test::error_of([&] { create(extra); }), HasSubstr("weight 'lm_head.weight': unexpected"));
  MixerConfig no_bias = c;
  no_bias.use_bias = false;
  EXPECT_THAT(test::error_of([&] { Mixer::create(no_bias, w, o); }),
              HasSubstr("'in_proj.bias': unexpected (config.use_bias is false)"));

  MixerConfig broken = c;
  broken.d_conv = 0;
  EXPECT_THAT(test::error_of([&] { Mixer::create(broken, w, o); }), HasSubstr("mixer config: d_conv"));

  auto m = mixer(0), other = mixer(0);
  auto theirs = other->create_state(1);
  const int64_t D = config_.d_model;
  std::vector<float> x(static_cast<size_t>(3 * (D + 1)));
  EXPECT_THAT(test::error_of([&] { m->forward(*theirs, TensorView(x.data(), DType::F32, {1, 3, D})); }),
              HasSubstr("expected a state made by this mixer's create_state"));
  auto mine = m->create_state(1);
  EXPECT_THAT(test::error_of([&] { m->forward(*mine, TensorView(x.data(), DType::F32, {1, 3, D + 1})); }),
              HasSubstr("input: expected f32 host tensor [B, L, " + std::to_string(D) + "]"));
  EXPECT_THAT(test::error_of([&] { m->forward(*mine, TensorView(x.data(), DType::F32, {2, 1, D})); }),
              HasSubstr("2 rows, but the state holds 1 slots"));
  EXPECT_THAT(test::error_of([&] { m->create_state(0); }), HasSubstr("n_slots must be >= 1"));
}

INSTANTIATE_TEST_SUITE_P(Arch, MixerApi, ::testing::Values(Arch::Mamba1, Arch::Mamba2),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace mambacpp
