// The mixture-of-experts ops (backend.h: moe_route, moe_experts) against plain double-precision references written
// here from the definitions (transformers' routers and experts), on the CPU backend and through the default
// implementations every backend starts from (Backend::moe_route / Backend::moe_experts, called explicitly).
// Routing: ids exactly (ties where torch.topk on the CPU puts them), weights within f32 rounding. Experts: within f32 rounding of the
// reference; the CPU and default paths bit for bit equal; a token's output bit for bit the same alone, in any batch
// and with any thread count; an expert no token chose is never read (its weights are NaN here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

struct RouteCase {
  MoeScoring scoring;
  int64_t E, k, n_group = 1, topk_group = 1;
  bool renormalize = false;
  float scale = 1.0f;
  bool bias = false;
};

// Indices of the k largest of v among `eligible`, best first, ties to the lower index (a stable sort).
std::vector<int64_t> ref_top_k(const std::vector<double>& v, int64_t k, const std::vector<bool>& eligible) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i)
    if (eligible[static_cast<size_t>(i)]) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

// transformers' routing of one token, in double (from the f32 inputs).
void ref_route(const RouteCase& rc, const float* logits, const float* bias, std::vector<int64_t>& ids,
               std::vector<double>& w) {
  const int64_t E = rc.E;
  std::vector<bool> all(static_cast<size_t>(E), true);
  std::vector<double> s(static_cast<size_t>(E));
  if (rc.scoring == MoeScoring::SigmoidGrouped) {
    std::vector<double> choice(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
      choice[e] = s[e] + (bias ? bias[e] : 0.0);
    }
    const int64_t per = E / rc.n_group;
    std::vector<double> group(static_cast<size_t>(rc.n_group));
    for (int64_t g = 0; g < rc.n_group; ++g) {
      std::vector<double> c(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(c.rbegin(), c.rend());
      group[g] = c[0] + (per > 1 ? c[1] : 0.0);
    }
    std::vector<bool> eligible(static_cast<size_t>(E), rc.n_group == 1);
    if (rc.n_group > 1)
      for (int64_t g : ref_top_k(group, rc.topk_group, std::vector<bool>(static_cast<size_t>(rc.n_group), true)))
        for (int64_t i = 0; i < per; ++i) eligible[static_cast<size_t>(g * per + i)] = true;
    ids = ref_top_k(choice, rc.k, eligible);
    double sum = 0;
    w.clear();
    for (int64_t e : ids) w.push_back(s[e]), sum += s[e];
    for (double& x : w) x = (rc.renormalize ? x / (sum + 1e-20) : x) * rc.scale;
    return;
  }
  std::vector<double> l(logits, logits + E);
  if (rc.scoring == MoeScoring::SoftmaxAll) {
    const double mx = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(l[e] - mx));
    for (double& x : s) x /= sum;
    ids = ref_top_k(s, rc.k, all);
    w.clear();
    for (int64_t e : ids) w.push_back(s[e]);
    return;
  }
  ids = ref_top_k(l, rc.k, all);
  double sum = 0;
  w.clear();
  for (int64_t e : ids) w.push_back(std::exp(l[e] - l[ids[0]])), sum += w.back();
  for (double& x : w) x /= sum;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed run_route(Backend& be, const RouteCase& rc, std::vector<float>& logits, std::vector<float>& bias, int64_t T,
                 bool use_default) {
  Routed r{std::vector<int32_t>(static_cast<size_t>(T * rc.k)), std::vector<float>(static_cast<size_t>(T * rc.k))};
  MoeRouteArgs a;
  a.logits = TensorView(logits.data(), DType::F32, {T, rc.E});
  if (rc.bias) a.bias = TensorView(bias.data(), DType::F32, {rc.E});
  a.scoring = rc.scoring;
  a.top_k = rc.k;
  a.n_group = rc.n_group;
  a.topk_group = rc.topk_group;
  a.renormalize = rc.renormalize;
  a.scale = rc.scale;
  a.ids = TensorView(r.ids.data(), DType::I32, {T, rc.k});
  a.weights = TensorView(r.weights.data(), DType::F32, {T, rc.k});
  if (use_default)
    be.Backend::moe_route(a);
  else
    be.moe_route(a);
  return r;
}

const std::vector<RouteCase> kRouteCases = {
    {MoeScoring::SigmoidGrouped, 16, 3, 4, 2, true, 2.5f, true},   // Nemotron-style, group-limited
    {MoeScoring::SigmoidGrouped, 8, 3, 2, 1, true, 1.0f, true},    // one group of two eligible
    {MoeScoring::SigmoidGrouped, 6, 6, 1, 1, false, 1.0f, false},  // top-k = E, no renormalisation
    {MoeScoring::SoftmaxChosen, 6, 2},                              // Granite
    {MoeScoring::SoftmaxChosen, 3, 3},                              // top-k = E: softmax over all
    {MoeScoring::SoftmaxAll, 4, 2},                                 // Jamba
    {MoeScoring::SoftmaxAll, 5, 5},
};

TEST(MoeRoute, MatchesTheReferenceOnRandomLogits) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int64_t T = 97;
  for (size_t ci = 0; ci < kRouteCases.size(); ++ci) {
    const RouteCase& rc = kRouteCases[ci];
    SCOPED_TRACE("case " + std::to_string(ci));
    std::vector<float> logits(static_cast<size_t>(T * rc.E)), bias(static_cast<size_t>(rc.E));
    for (float& v : logits) v = nd(rng);
    for (float& v : bias) v = 0.1f * nd(rng);
    for (bool use_default : {false, true}) {
      const Routed r = run_route(*be, rc, logits, bias, T, use_default);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int64_t> ids;
        std::vector<double> w;
        ref_route(rc, logits.data() + t * rc.E, rc.bias ? bias.data() : nullptr, ids, w);
        for (int64_t j = 0; j < rc.k; ++j) {
          ASSERT_EQ(r.ids[static_cast<size_t>(t * rc.k + j)], ids[static_cast<size_t>(j)]) << "token " << t << " slot " << j;
          EXPECT_NEAR(r.weights[static_cast<size_t>(t * rc.k + j)], w[static_cast<size_t>(j)],
                      2e-6 * std::max(1.0, std::abs(w[static_cast<size_t>(j)])));
        }
      }
    }
  }
}

// torch.topk on the CPU (ATen's topk_impl_loop): (value, index) pairs by value alone; std::partial_sort of the first
// k when k * 64 <= n, else std::nth_element at k - 1 and std::sort of the first k - 1. At exact ties this is not the
// lowest index (transformers' granite_moe_f32 fixture, whose router rows tie, shows torch keeping higher ones).
std::vector<int32_t> aten_cpu_top_k(const std::vector<float>& v, int64_t k) {
  std::vector<std::pair<float, int64_t>> q;
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) q.emplace_back(v[static_cast<size_t>(i)], i);
  auto gt = [](const auto& x, const auto& y) { return x.first > y.first; };
  if (k * 64 <= static_cast<int64_t>(q.size())) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), gt);
  } else {
    std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), gt);
    std::sort(q.begin(), q.begin() + (k - 1), gt);
  }
  std::vector<int32_t> ids;
  for (int64_t j = 0; j < k; ++j) ids.push_back(static_cast<int32_t>(q[static_cast<size_t>(j)].second));
  return ids;
}

TEST(MoeRoute, TiesGoWhereTorchTopkPutsThemAndABiasOfMinusTenIsNeverChosen) {
  auto be = make_cpu_backend(1);
  // Every logit equal: torch.topk's choice among equal values (of the groups first, then of the eligible experts).
  for (const RouteCase& rc : kRouteCases) {
    std::vector<float> logits(static_cast<size_t>(2 * rc.E), 0.5f), bias(static_cast<size_t>(rc.E), 0.0f);
    const Routed r = run_route(*be, rc, logits, bias, 2, false);
    std::vector<float> choice(static_cast<size_t>(rc.E), 1.0f);
    if (rc.scoring == MoeScoring::SigmoidGrouped && rc.n_group > 1) {
      const int64_t per = rc.E / rc.n_group;
      std::vector<bool> kept(static_cast<size_t>(rc.n_group), false);
      for (int32_t g : aten_cpu_top_k(std::vector<float>(static_cast<size_t>(rc.n_group), 1.0f), rc.topk_group))
        kept[static_cast<size_t>(g)] = true;
      for (int64_t e = 0; e < rc.E; ++e)
        if (!kept[static_cast<size_t>(e / per)]) choice[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
    }
    const std::vector<int32_t> got(r.ids.begin() + rc.k, r.ids.end());
    EXPECT_EQ(got, aten_cpu_top_k(choice, rc.k)) << "E " << rc.E << " k " << rc.k;
    EXPECT_EQ(std::set<int32_t>(got.begin(), got.end()).size(), static_cast<size_t>(rc.k));
  }
  // A tie across the top-k boundary: experts 1 and 4 share the second-best logit; 1 wins.
  RouteCase granite{MoeScoring::SoftmaxChosen, 6, 2};
  std::vector<float> logits = {0.0f, 1.5f, -1.0f, 0.3f, 1.5f, 2.0f}, none;
  Routed r = run_route(*be, granite, logits, none, 1, false);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 1}));
  // Groups tie as well: groups 0 and 1 score the same, group 0 wins.
  RouteCase grouped{MoeScoring::SigmoidGrouped, 8, 2, 2, 1, true, 1.0f, true};
  logits = {1.0f, 2.0f, 0.0f, 0.0f, 2.0f, 1.0f, 0.0f, 0.0f};
  std::vector<float> bias(8, 0.0f);
  r = run_route(*be, grouped, logits, bias, 1, false);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 0}));
  // The correction bias ranks the choice only: expert 2 has the best score but a bias of -10.
  logits = {0.0f, 0.1f, 5.0f, 0.2f, -1.0f, -2.0f, 0.3f, 0.4f};
  bias[2] = -10.0f;
  r = run_route(*be, grouped, logits, bias, 1, false);
  for (int32_t id : r.ids) EXPECT_NE(id, 2);
}

TEST(MoeRoute, RefusesBadArguments) {
  auto be = make_cpu_backend(1);
  RouteCase rc{MoeScoring::SoftmaxChosen, 4, 5};
  std::vector<float> logits(4), none;
  EXPECT_NE(test::error_of([&] { run_route(*be, rc, logits, none, 1, false); }).find("top_k = 5"), std::string::npos);
  RouteCase groups{MoeScoring::SigmoidGrouped, 6, 2, 4, 1};
  std::vector<float> l6(6);
  EXPECT_NE(test::error_of([&] { run_route(*be, groups, l6, none, 1, false); }).find("n_group 4"), std::string::npos);
}

// ---- experts -------------------------------------------------------------------------------------------------

struct ExpertSet {
  MoeExpertAct act;
  bool separate_gate;
  int64_t E, I, D;
  std::vector<std::vector<float>> up, gate, down;  // per expert, row-major
  std::vector<Weight> wu, wg, wd;
};

ExpertSet make_experts(MoeExpertAct act, bool separate_gate, int64_t E, int64_t I, int64_t D, int64_t poisoned,
                       std::mt19937& rng) {
  ExpertSet s{act, separate_gate, E, I, D, {}, {}, {}, {}, {}, {}};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t up_rows = act == MoeExpertAct::SiluGated && !separate_gate ? 2 * I : I;
  auto fill = [&](int64_t n, float sd, bool nan) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = nan ? std::numeric_limits<float>::quiet_NaN() : sd * nd(rng);
    return v;
  };
  for (int64_t e = 0; e < E; ++e) {
    const bool nan = e == poisoned;
    s.up.push_back(fill(up_rows * D, 1.0f / std::sqrt(static_cast<float>(D)), nan));
    s.down.push_back(fill(D * I, 1.0f / std::sqrt(static_cast<float>(I)), nan));
    if (separate_gate) s.gate.push_back(fill(I * D, 1.0f / std::sqrt(static_cast<float>(D)), nan));
  }
  for (int64_t e = 0; e < E; ++e) {
    s.wu.push_back(Weight(TensorView(s.up[e].data(), DType::F32, {up_rows, D})));
    s.wd.push_back(Weight(TensorView(s.down[e].data(), DType::F32, {D, I})));
    if (separate_gate) s.wg.push_back(Weight(TensorView(s.gate[e].data(), DType::F32, {I, D})));
  }
  return s;
}

// The reference: sum over j of w[t, j] * expert(x[t]) in double.
std::vector<double> ref_experts(const ExpertSet& s, const std::vector<float>& x, const std::vector<int32_t>& ids,
                                const std::vector<float>& w, int64_t T, int64_t k) {
  const int64_t D = s.D, I = s.I;
  std::vector<double> out(static_cast<size_t>(T * D), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[static_cast<size_t>(t * k + j)];
      const auto& up = s.up[e];
      std::vector<double> a(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        auto dot = [&](const float* row) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += static_cast<double>(row[c]) * x[static_cast<size_t>(t * D + c)];
          return d;
        };
        if (s.act == MoeExpertAct::Relu2) {
          const double u = std::max(0.0, dot(up.data() + i * D));
          a[i] = u * u;
        } else {
          const double g = s.separate_gate ? dot(s.gate[e].data() + i * D) : dot(up.data() + i * D);
          const double u = s.separate_gate ? dot(up.data() + i * D) : dot(up.data() + (I + i) * D);
          a[i] = g / (1.0 + std::exp(-g)) * u;
        }
      }
      for (int64_t c = 0; c < D; ++c) {
        double d = 0;
        for (int64_t i = 0; i < I; ++i) d += static_cast<double>(s.down[e][static_cast<size_t>(c * I + i)]) * a[i];
        out[static_cast<size_t>(t * D + c)] += w[static_cast<size_t>(t * k + j)] * d;
      }
    }
  return out;
}

std::vector<float> run_experts(Backend& be, const ExpertSet& s, std::vector<float>& x, std::vector<int32_t>& ids,
                               std::vector<float>& w, int64_t T, int64_t k, bool use_default) {
  std::vector<float> out(static_cast<size_t>(T * s.D), -1.0f);
  MoeExpertsArgs a;
  a.x = TensorView(x.data(), DType::F32, {T, s.D});
  a.ids = TensorView(ids.data(), DType::I32, {T, k});
  a.weights = TensorView(w.data(), DType::F32, {T, k});
  a.act = s.act;
  a.expert_size = s.I;
  a.up = s.wu;
  a.gate = s.wg;
  a.down = s.wd;
  a.out = TensorView(out.data(), DType::F32, {T, s.D});
  if (use_default)
    be.Backend::moe_experts(a);
  else
    be.moe_experts(a);
  return out;
}

TEST(MoeExperts, MatchTheReferenceAndAreInvariantToTheirBatch) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case {
    MoeExpertAct act;
    bool separate_gate;
    int64_t E, k, I, D, T;
  };
  // T = 600 crosses the CPU's 512-token block and the default's 256; expert E - 1 receives no token.
  for (const Case& cs : {Case{MoeExpertAct::Relu2, false, 8, 3, 24, 40, 37}, Case{MoeExpertAct::SiluGated, false, 6, 2, 16, 32, 600},
                         Case{MoeExpertAct::SiluGated, true, 5, 5, 12, 20, 9}, Case{MoeExpertAct::Relu2, false, 4, 1, 8, 16, 70}}) {
    SCOPED_TRACE(std::to_string(cs.E) + " experts, top " + std::to_string(cs.k) + ", T " + std::to_string(cs.T));
    const bool all = cs.k == cs.E;
    const ExpertSet s = make_experts(cs.act, cs.separate_gate, cs.E, cs.I, cs.D, all ? -1 : cs.E - 1, rng);
    std::vector<float> x(static_cast<size_t>(cs.T * cs.D)), w(static_cast<size_t>(cs.T * cs.k));
    std::vector<int32_t> ids(static_cast<size_t>(cs.T * cs.k));
    for (float& v : x) v = nd(rng);
    for (float& v : w) v = std::abs(nd(rng));
    const int64_t live = all ? cs.E : cs.E - 1;
    for (int64_t t = 0; t < cs.T; ++t) {  // k distinct experts per token among the live ones
      std::vector<int32_t> perm(static_cast<size_t>(live));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < cs.k; ++j) ids[static_cast<size_t>(t * cs.k + j)] = perm[static_cast<size_t>(j)];
    }
    const std::vector<double> ref = ref_experts(s, x, ids, w, cs.T, cs.k);
    double scale = 0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    auto be2 = make_cpu_backend(2);
    auto be1 = make_cpu_backend(1);
    const std::vector<float> got = run_experts(*be2, s, x, ids, w, cs.T, cs.k, false);
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - ref[i]));
    EXPECT_LE(err / scale, 1e-5) << "vs the double reference";
    EXPECT_EQ(got, run_experts(*be2, s, x, ids, w, cs.T, cs.k, true)) << "default path";
    EXPECT_EQ(got, run_experts(*be1, s, x, ids, w, cs.T, cs.k, false)) << "one thread";
    // Each token alone, and the tokens in reverse order: the same bits.
    for (int64_t t : {int64_t{0}, cs.T / 2, cs.T - 1}) {
      std::vector<float> xt(x.begin() + t * cs.D, x.begin() + (t + 1) * cs.D);
      std::vector<int32_t> it(ids.begin() + t * cs.k, ids.begin() + (t + 1) * cs.k);
      std::vector<float> wt(w.begin() + t * cs.k, w.begin() + (t + 1) * cs.k);
      const std::vector<float> alone = run_experts(*be2, s, xt, it, wt, 1, cs.k, false);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), got.begin() + t * cs.D)) << "token " << t << " alone";
    }
    std::vector<float> xr, wr;
    std::vector<int32_t> ir;
    for (int64_t t = cs.T - 1; t >= 0; --t) {
      xr.insert(xr.end(), x.begin() + t * cs.D, x.begin() + (t + 1) * cs.D);
      ir.insert(ir.end(), ids.begin() + t * cs.k, ids.begin() + (t + 1) * cs.k);
      wr.insert(wr.end(), w.begin() + t * cs.k, w.begin() + (t + 1) * cs.k);
    }
    const std::vector<float> rev = run_experts(*be2, s, xr, ir, wr, cs.T, cs.k, false);
    for (int64_t t = 0; t < cs.T; ++t)
      ASSERT_TRUE(std::equal(rev.begin() + (cs.T - 1 - t) * cs.D, rev.begin() + (cs.T - t) * cs.D, got.begin() + t * cs.D))
          << "token " << t << " in reverse order";
  }
}

// Decode-sized blocks (at most kStreamTokens = 4 rows per expert: the CPU's two passes over all such experts at once)
// beside an expert with more rows (its own linear_f32 calls), at widths that span several 16-row blocks and end in a
// partial one, so that the passes' shares cut the experts' rows and the output columns at many places: bit for bit
// the default path, every thread count, and each token alone; bf16 weights as the released checkpoints store them.
TEST(MoeExperts, DecodeBlocksKeepTheDefaultsBitsWhateverTheSplit) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case {
    MoeExpertAct act;
    bool separate_gate;
    DType dtype;
  };
  const int64_t E = 9, k = 3, I = 72, D = 200;
  for (const Case& cs :
       {Case{MoeExpertAct::SiluGated, false, DType::BF16}, Case{MoeExpertAct::SiluGated, true, DType::F32},
        Case{MoeExpertAct::Relu2, false, DType::BF16}}) {
    ExpertSet s = make_experts(cs.act, cs.separate_gate, E, I, D, E - 1, rng);
    // The weights as bf16 (the f32 copies rounded alike, for the reference); expert E - 1 stays NaN and unchosen.
    std::vector<std::vector<uint16_t>> held;
    auto narrow = [&](std::vector<std::vector<float>>& vs, std::vector<Weight>& ws) {
      for (size_t e = 0; e < vs.size(); ++e) {
        std::vector<uint16_t> b(vs[e].size());
        convert_from_f32(vs[e].data(), b.data(), DType::BF16, static_cast<int64_t>(b.size()));
        convert_to_f32(b.data(), DType::BF16, vs[e].data(), static_cast<int64_t>(b.size()));
        held.push_back(std::move(b));
        ws[e] = Weight(TensorView(held.back().data(), DType::BF16, {ws[e].dim(0), ws[e].dim(1)}));
      }
    };
    if (cs.dtype == DType::BF16) {
      held.reserve(3 * E);
      narrow(s.up, s.wu);
      narrow(s.down, s.wd);
      narrow(s.gate, s.wg);
    }
    for (int64_t T : {1, 2, 5, 8}) {
      SCOPED_TRACE(std::string(dtype_name(cs.dtype)) + (cs.act == MoeExpertAct::Relu2 ? " relu2" : " silu-gated") +
                   (cs.separate_gate ? " (separate gate)" : "") + ", T " + std::to_string(T));
      std::vector<float> x(static_cast<size_t>(T * D)), w(static_cast<size_t>(T * k));
      std::vector<int32_t> ids(static_cast<size_t>(T * k));
      for (float& v : x) v = nd(rng);
      for (float& v : w) v = std::abs(nd(rng));
      for (int64_t t = 0; t < T; ++t) {  // expert 0 in every token's last slot: more than 4 rows once T > 4
        std::vector<int32_t> perm(static_cast<size_t>(E - 2));
        std::iota(perm.begin(), perm.end(), 1);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int64_t j = 0; j + 1 < k; ++j) ids[static_cast<size_t>(t * k + j)] = perm[static_cast<size_t>(j)];
        ids[static_cast<size_t>(t * k + k - 1)] = 0;
      }
      const std::vector<double> ref = ref_experts(s, x, ids, w, T, k);
      double scale = 0;
      for (double v : ref) scale = std::max(scale, std::abs(v));
      auto be2 = make_cpu_backend(2);
      const std::vector<float> got = run_experts(*be2, s, x, ids, w, T, k, false);
      double err = 0;
      for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - ref[i]));
      EXPECT_LE(err / scale, 1e-5) << "vs the double reference";
      EXPECT_EQ(got, run_experts(*be2, s, x, ids, w, T, k, true)) << "default path";
      for (int threads : {1, 3, 4}) {
        auto be = make_cpu_backend(threads);
        EXPECT_EQ(got, run_experts(*be, s, x, ids, w, T, k, false)) << threads << " threads";
      }
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> xt(x.begin() + t * D, x.begin() + (t + 1) * D);
        std::vector<int32_t> it(ids.begin() + t * k, ids.begin() + (t + 1) * k);
        std::vector<float> wt(w.begin() + t * k, w.begin() + (t + 1) * k);
        const std::vector<float> alone = run_experts(*be2, s, xt, it, wt, 1, k, false);
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), got.begin() + t * D)) << "token " << t << " alone";
      }
    }
  }
}

TEST(MoeExperts, RefuseBadIdsAndShapes) {
  std::mt19937 rng(3);
  const ExpertSet s = make_experts(MoeExpertAct::Relu2, false, 4, 8, 16, -1, rng);
  std::vector<float> x(16, 1.0f), w(2, 0.5f);
  std::vector<int32_t> ids = {0, 4};
  auto be = make_cpu_backend(1);
  for (bool use_default : {false, true})
    EXPECT_NE(test::error_of([&] { run_experts(*be, s, x, ids, w, 1, 2, use_default); }).find("expert id 4"),
              std::string::npos);
  ExpertSet bad = s;
  bad.wd[2] = Weight(TensorView(bad.down[2].data(), DType::F32, {8, 16}));
  ids = {0, 1};
  EXPECT_NE(test::error_of([&] { run_experts(*be, bad, x, ids, w, 1, 2, false); }).find("expert 2 down"),
            std::string::npos);
}

}  // namespace
}  // namespace mambacpp
