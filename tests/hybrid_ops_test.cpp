// The hybrid-layer ops (attention over paged KV, RoPE, relu2, silu * up, scale) against plain fp64 references written
// from their definitions in backend.h: dense per-sequence K/V (no pages), one query row at a time.
// The kernels are templates: in fp64 they must agree with the references to ~1e-12 (same maths, other order); the
// f32 backend within 1e-5 relative (a few hundred f32 roundings per output).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using Vec = std::vector<double>;

Vec random_vec(std::mt19937_64& rng, size_t n, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// out[t] for each sequence: softmax(scale * q . K[0..past+i]) V, with K/V = the sequence's history ++ its new rows.
Vec attention_ref(const Vec& q, const Vec& k, const Vec& v, const std::vector<Vec>& hist_k, const std::vector<Vec>& hist_v,
                  const std::vector<SeqSpan>& seqs, int64_t NH, int64_t KV, int64_t HD, double scale) {
  const int64_t kvd = KV * HD, qd = NH * HD;
  int64_t T = 0;
  for (const auto& s : seqs) T = std::max(T, s.start + s.len);
  Vec out(static_cast<size_t>(T * qd), 0.0);
  for (size_t si = 0; si < seqs.size(); ++si) {
    const SeqSpan& s = seqs[si];
    Vec K = hist_k[si], V = hist_v[si];
    for (int64_t i = 0; i < s.len; ++i)
      for (int64_t c = 0; c < kvd; ++c) K.push_back(k[(s.start + i) * kvd + c]), V.push_back(v[(s.start + i) * kvd + c]);
    const int64_t past = static_cast<int64_t>(hist_k[si].size()) / kvd;
    for (int64_t i = 0; i < s.len; ++i)
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t g = h / (NH / KV), n = past + i + 1;
        Vec w(static_cast<size_t>(n));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < HD; ++d) dot += q[(s.start + i) * qd + h * HD + d] * K[j * kvd + g * HD + d];
          w[j] = scale * dot;
          mx = std::max(mx, w[j]);
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t d = 0; d < HD; ++d) out[(s.start + i) * qd + h * HD + d] += w[j] / sum * V[j * kvd + g * HD + d];
      }
  }
  return out;
}

struct AttnCase {
  int64_t NH, KV, HD, page;
  std::vector<int64_t> lens, pasts;
};

// Runs one case through cpu::attention<T> with pages of T, against the reference; returns max rel error.
template <class S>
double run_attention_case(const AttnCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t kvd = c.KV * c.HD, qd = c.NH * c.HD;
  std::vector<SeqSpan> seqs;
  int64_t T = 0;
  for (size_t i = 0; i < c.lens.size(); ++i) seqs.push_back({T, c.lens[i], static_cast<int64_t>(i)}), T += c.lens[i];
  const Vec q = random_vec(rng, T * qd), k = random_vec(rng, T * kvd), v = random_vec(rng, T * kvd);
  std::vector<Vec> hk, hv;
  std::vector<std::vector<S>> storage;  // pages
  std::vector<cpu::KvPages<S>> cache(seqs.size());
  for (size_t si = 0; si < seqs.size(); ++si) {
    hk.push_back(random_vec(rng, c.pasts[si] * kvd));
    hv.push_back(random_vec(rng, c.pasts[si] * kvd));
    const int64_t n_pages = (c.pasts[si] + c.lens[si] + c.page - 1) / c.page;
    for (int64_t p = 0; p < n_pages; ++p) storage.emplace_back(static_cast<size_t>(2 * c.page * kvd), S(0));
  }
  size_t next = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const int64_t n_pages = (c.pasts[si] + c.lens[si] + c.page - 1) / c.page;
    for (int64_t p = 0; p < n_pages; ++p) cache[si].pages.push_back(storage[next++].data());
    cache[si].past = c.pasts[si];
    for (int64_t j = 0; j < c.pasts[si]; ++j)
      for (int64_t d = 0; d < kvd; ++d) {
        cpu::kv_row(cache[si], j, c.page, kvd, false)[d] = static_cast<S>(hk[si][j * kvd + d]);
        cpu::kv_row(cache[si], j, c.page, kvd, true)[d] = static_cast<S>(hv[si][j * kvd + d]);
      }
  }
  std::vector<S> qt(q.begin(), q.end()), kt(k.begin(), k.end()), vt(v.begin(), v.end()), out(q.size(), S(-7));
  cpu::AttentionParams<S> p;
  p.q = {qt.data(), qd};
  p.k = {kt.data(), kvd};
  p.v = {vt.data(), kvd};
  p.out = {out.data(), qd};
  p.n_heads = c.NH;
  p.n_kv_heads = c.KV;
  p.head_dim = c.HD;
  p.page_tokens = c.page;
  p.scale = static_cast<S>(0.37);
  p.threads = 2;
  cpu::attention(p, std::span<const SeqSpan>(seqs), std::span<const cpu::KvPages<S>>(cache));
  const Vec want = attention_ref(q, k, v, hk, hv, seqs, c.NH, c.KV, c.HD, static_cast<double>(static_cast<S>(0.37)));
  const Vec got(out.begin(), out.end());
  return test::max_rel_diff(std::span<const double>(got), std::span<const double>(want));
}

const std::vector<AttnCase> kCases = {
    {4, 2, 20, 8, {9, 1, 17}, {0, 13, 5}},   // GQA, head_dim unrelated to anything, pages crossed
    {4, 1, 10, 3, {5, 7}, {2, 0}},           // MQA, odd page size
    {3, 3, 7, 64, {1, 1, 1, 1}, {0, 63, 64, 1}},  // MHA decode rows at page edges
    {8, 2, 16, 1, {12}, {4}},                // one row per page
};

TEST(HybridOps, AttentionFp64MatchesReference) {
  for (size_t i = 0; i < kCases.size(); ++i) EXPECT_LE(run_attention_case<double>(kCases[i], 100 + i), 1e-12) << i;
}

TEST(HybridOps, AttentionF32MatchesReference) {
  for (size_t i = 0; i < kCases.size(); ++i) EXPECT_LE(run_attention_case<float>(kCases[i], 200 + i), 1e-5) << i;
}

// bf16 pages (a bf16 state): each k and v row is rounded to bf16 (nearest even) as it is appended, and everything after
// the load is f32. So the backend's output equals, bit for bit, its f32-page output for the rounded rows, and the fp64
// reference on the rounded rows within the f32 tolerance above; the pages hold exactly the rounded bits.
TEST(HybridOps, BackendAttentionBf16PagesAreRoundedF32Pages) {
  auto be = make_cpu_backend(2);
  for (size_t ci = 0; ci < kCases.size(); ++ci) {
    const AttnCase& c = kCases[ci];
    std::mt19937_64 rng(300 + ci);
    const int64_t kvd = c.KV * c.HD, qd = c.NH * c.HD;
    BatchLayout b;
    int64_t T = 0;
    for (size_t i = 0; i < c.lens.size(); ++i) b.seqs.push_back({T, c.lens[i], static_cast<int64_t>(i)}), T += c.lens[i];
    b.total_tokens = T;
    auto round = [](Vec x) {
      for (double& e : x) e = bf16_to_f32(f32_to_bf16(static_cast<float>(e)));
      return x;
    };
    const Vec q = random_vec(rng, T * qd), k = random_vec(rng, T * kvd), v = random_vec(rng, T * kvd);
    std::vector<Vec> hk, hv;
    for (size_t si = 0; si < b.seqs.size(); ++si) {
      hk.push_back(round(random_vec(rng, c.pasts[si] * kvd)));
      hv.push_back(round(random_vec(rng, c.pasts[si] * kvd)));
    }
    // Runs the backend with pages of `bf16` elements (history written in it) on inputs k_in, v_in.
    auto run = [&](bool bf16, const Vec& k_in, const Vec& v_in, std::vector<std::vector<uint16_t>>* bf16_pages) {
      std::vector<std::vector<float>> f32_pages;
      std::vector<std::vector<uint16_t>> h_pages;
      AttentionArgs a;
      for (size_t si = 0; si < b.seqs.size(); ++si) {
        KvSequence seq;
        seq.past = c.pasts[si];
        const int64_t n_pages = (c.pasts[si] + c.lens[si] + c.page - 1) / c.page;
        for (int64_t pg = 0; pg < n_pages; ++pg) {
          const size_t n = static_cast<size_t>(2 * c.page * kvd);
          if (bf16) h_pages.emplace_back(n, uint16_t{0x7fc0});  // NaN where nothing was written
          else f32_pages.emplace_back(n, NAN);
        }
        a.cache.push_back(seq);
      }
      size_t next = 0;
      for (size_t si = 0; si < b.seqs.size(); ++si) {
        const int64_t n_pages = (c.pasts[si] + c.lens[si] + c.page - 1) / c.page;
        for (int64_t pg = 0; pg < n_pages; ++pg, ++next)
          a.cache[si].pages.push_back(bf16 ? static_cast<void*>(h_pages[next].data()) : f32_pages[next].data());
        for (int64_t j = 0; j < c.pasts[si]; ++j)
          for (int64_t d = 0; d < kvd; ++d)
            for (bool value : {false, true}) {
              const float x = static_cast<float>((value ? hv : hk)[si][j * kvd + d]);
              const int64_t at = ((value ? c.page : 0) + j % c.page) * kvd + d;
              void* page = a.cache[si].pages[static_cast<size_t>(j / c.page)];
              if (bf16) static_cast<uint16_t*>(page)[at] = f32_to_bf16(x);
              else static_cast<float*>(page)[at] = x;
            }
      }
      std::vector<float> qf(q.begin(), q.end()), kf(k_in.begin(), k_in.end()), vf(v_in.begin(), v_in.end());
      std::vector<float> out(static_cast<size_t>(T * qd), -7.0f);
      a.q = TensorView(qf.data(), DType::F32, {T, qd});
      a.k = TensorView(kf.data(), DType::F32, {T, kvd});
      a.v = TensorView(vf.data(), DType::F32, {T, kvd});
      a.out = TensorView(out.data(), DType::F32, {T, qd});
      a.n_heads = c.NH, a.n_kv_heads = c.KV, a.head_dim = c.HD, a.page_tokens = c.page, a.scale = 0.37f;
      a.kv_dtype = bf16 ? DType::BF16 : DType::F32;
      be->attention(a, b);
      if (bf16_pages) *bf16_pages = h_pages;
      return out;
    };
    std::vector<std::vector<uint16_t>> pages;
    const std::vector<float> got = run(true, k, v, &pages);
    const Vec kr = round(k), vr = round(v);
    // The same arithmetic on the same values: bit-identical in the default build. With -march=native
    // (MAMBACPP_NATIVE) the compiler may contract a*b+c into FMAs differently in the two instantiations, one f32
    // rounding per term at most (measured: 1 ulp in a few elements), far inside 1e-6 for these few keys.
    const std::vector<float> same = run(false, kr, vr, nullptr);
    EXPECT_LE(test::max_rel_diff(std::span<const float>(got), std::span<const float>(same)), 1e-6) << ci;
    const Vec want = attention_ref(q, kr, vr, hk, hv, b.seqs, c.NH, c.KV, c.HD, static_cast<double>(0.37f));
    EXPECT_LE(test::max_rel_diff(std::span<const double>(Vec(got.begin(), got.end())), std::span<const double>(want)),
              1e-5) << ci;
    // The appended rows are the rounded bits (sequence 0's first new row, key and value).
    const int64_t pos = c.pasts[0];
    const uint16_t* page = pages[static_cast<size_t>(pos / c.page)].data();
    for (int64_t d = 0; d < kvd; ++d) {
      EXPECT_EQ(page[(pos % c.page) * kvd + d], f32_to_bf16(static_cast<float>(k[d]))) << ci;
      EXPECT_EQ(page[(c.page + pos % c.page) * kvd + d], f32_to_bf16(static_cast<float>(v[d]))) << ci;
    }
    // And the rounding is not the identity: bf16 rows differ from f32 ones (the test above could fail).
    EXPECT_NE(got, run(false, k, v, nullptr)) << ci;
  }
}

TEST(HybridOps, BackendAttentionChecksItsPages) {
  auto be = make_cpu_backend(1);
  std::vector<float> q(2 * 8), kv(2 * 4), out(2 * 8), page(2 * 1 * 4);
  AttentionArgs a;
  a.q = TensorView(q.data(), DType::F32, {2, 8});
  a.k = TensorView(kv.data(), DType::F32, {2, 4});
  a.v = a.k;
  a.out = TensorView(out.data(), DType::F32, {2, 8});
  a.n_heads = 2, a.n_kv_heads = 1, a.head_dim = 4, a.page_tokens = 1, a.scale = 0.5f;
  a.cache = {KvSequence{{page.data()}, 0}};  // one page of one row for a two-row sequence
  BatchLayout b;
  b.seqs = {{0, 2, 0}};
  b.total_tokens = 2;
  EXPECT_NE(test::error_of([&] { be->attention(a, b); }).find("pages"), std::string::npos);
  a.n_kv_heads = 3;
  EXPECT_NE(test::error_of([&] { be->attention(a, b); }).find("n_kv_heads dividing"), std::string::npos);
}

// RoPE reference: rotate-half on the first rope_dim channels of each head.
TEST(HybridOps, RopeMatchesReference) {
  for (auto [NH, HD, RD] : {std::tuple<int64_t, int64_t, int64_t>{4, 8, 4}, {2, 20, 20}, {3, 6, 2}}) {
    std::mt19937_64 rng(7 + static_cast<uint64_t>(HD));
    const std::vector<SeqSpan> seqs = {{0, 5, 0}, {5, 3, 1}};
    const std::vector<int64_t> start = {0, 1000};
    const int64_t T = 8, W = NH * HD;
    const double theta = 500.0;
    Vec x = random_vec(rng, T * W), want = x;
    for (const auto& s : seqs)
      for (int64_t i = 0; i < s.len; ++i) {
        const double pos = static_cast<double>(start[static_cast<size_t>(s.slot)] + i);
        for (int64_t h = 0; h < NH; ++h)
          for (int64_t f = 0; f < RD / 2; ++f) {
            const double a = pos / std::pow(theta, 2.0 * f / RD);
            double* e = want.data() + (s.start + i) * W + h * HD;
            const double* o = x.data() + (s.start + i) * W + h * HD;
            e[f] = o[f] * std::cos(a) - o[f + RD / 2] * std::sin(a);
            e[f + RD / 2] = o[f + RD / 2] * std::cos(a) + o[f] * std::sin(a);
          }
      }
    Vec got = x;
    cpu::rope(cpu::Rows<double>{got.data(), W}, NH, HD, RD, theta, std::span<const SeqSpan>(seqs),
              std::span<const int64_t>(start), 1);
    EXPECT_LE(test::max_rel_diff(std::span<const double>(got), std::span<const double>(want)), 1e-12) << HD;
    // The f32 backend op.
    auto be = make_cpu_backend(2);
    std::vector<float> xf(x.begin(), x.end());
    BatchLayout b;
    b.seqs = seqs;
    b.total_tokens = T;
    be->rope(TensorView(xf.data(), DType::F32, {T, W}), NH, HD, RD, theta, start, b);
    const Vec gotf(xf.begin(), xf.end());
    EXPECT_LE(test::max_rel_diff(std::span<const double>(gotf), std::span<const double>(want)), 1e-6) << HD;
  }
}

TEST(HybridOps, ElementwiseOpsMatchReference) {
  auto be = make_cpu_backend(2);
  std::mt19937_64 rng(3);
  const int64_t T = 5, D = 13;
  const Vec g = random_vec(rng, T * D, 2.0), u = random_vec(rng, T * D, 2.0);
  std::vector<float> gf(g.begin(), g.end()), uf(u.begin(), u.end()), out(T * D);
  Vec want(T * D);
  for (int64_t i = 0; i < T * D; ++i) want[i] = static_cast<double>(gf[i]) / (1 + std::exp(-static_cast<double>(gf[i]))) * uf[i];
  be->silu_mul(TensorView(gf.data(), DType::F32, {T, D}), TensorView(uf.data(), DType::F32, {T, D}),
               TensorView(out.data(), DType::F32, {T, D}));
  EXPECT_LE(test::max_rel_diff(std::span<const double>(Vec(out.begin(), out.end())), std::span<const double>(want)), 1e-6);

  std::vector<float> r = gf;
  be->relu2(TensorView(r.data(), DType::F32, {T, D}));
  for (int64_t i = 0; i < T * D; ++i) want[i] = gf[i] > 0 ? static_cast<double>(gf[i]) * gf[i] : 0.0;
  EXPECT_LE(test::max_rel_diff(std::span<const double>(Vec(r.begin(), r.end())), std::span<const double>(want)), 1e-7);

  std::vector<float> s = gf;
  be->scale(TensorView(s.data(), DType::F32, {T, D}), 0.4f);
  for (int64_t i = 0; i < T * D; ++i) want[i] = 0.4 * gf[i];
  EXPECT_LE(test::max_rel_diff(std::span<const double>(Vec(s.begin(), s.end())), std::span<const double>(want)), 1e-7);
}

}  // namespace
}  // namespace mambacpp
