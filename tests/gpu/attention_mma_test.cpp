// Fast-precision attention (the bf16 tensor-core kernel, attention_mma.cu) against an fp64 reference over the same
// bf16-rounded q, k and v, on paged caches whose pages are scattered in memory; then its split invariance, bit for
// bit.
//
// Error model. The kernel rounds q, k and v to bf16 (the reference takes the same rounded values), multiplies them
// exactly on the tensor cores and sums in f32 (a score is off by ~head_dim * 2^-24 of sum |q k|: ~1e-6 here), then
// rounds each softmax weight w_j to bf16 (relative error |d_j| <= u = 2^-8) before weighing the value rows, and divides
// by the sum of the rounded weights. The output out = sum_j w_j (1 + d_j) v_j / sum_j w_j (1 + d_j) then differs from
// the exact one by sum_j w_j d_j (v_j - out) / sum_j w_j (1 + d_j), at most u / (1 - u) * sum_j w_j |v_j - out| per
// channel: the bound each element is held to (the reference computes it from its own weights), widened by the f32
// score, exp2 and accumulation roundings (reference()). A wrong mask, GQA head or page lookup moves rows with few
// keys by 1e-1 or more, far above the bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::make_batch;

float r16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Sequences over a paged KV cache on the device, with the rows the pages hold kept on the host.
class PagedCache {
 public:
  PagedCache(Backend& be, DeviceArena& arena, Rng& rng, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t page_tokens,
             DType kv, const std::vector<int64_t>& pasts, const std::vector<int64_t>& capacity)
      : be_(be), arena_(arena), n_heads_(n_heads), n_kv_(n_kv), hd_(hd), page_(page_tokens), kv_(kv),
        past_(pasts) {
    const size_t n = pasts.size();
    k_.resize(n);
    v_.resize(n);
    pages_.resize(n);
    const int64_t kv_dim = n_kv * hd;
    for (size_t s = 0; s < n; ++s)
      for (int64_t i = 0; i < pasts[s] * kv_dim; ++i) {
        k_[s].push_back(stored(rng.uniform(-2.0f, 2.0f)));
        v_[s].push_back(stored(rng.uniform(-1.0f, 1.0f)));
      }
    // Pages allocated in a shuffled order of (sequence, page), so that a sequence's pages are scattered.
    std::vector<std::pair<size_t, int64_t>> order;
    for (size_t s = 0; s < n; ++s) {
      pages_[s].resize(static_cast<size_t>((capacity[s] + page_ - 1) / page_));
      for (int64_t pg = 0; pg < static_cast<int64_t>(pages_[s].size()); ++pg) order.emplace_back(s, pg);
    }
    std::shuffle(order.begin(), order.end(), std::mt19937_64(rng.index(1 << 30)));
    for (const auto& [s, pg] : order) {
      // Rows not cached yet hold NaN: the kernel must neither read them nor let them reach an output.
      std::vector<float> page(static_cast<size_t>(2 * page_ * kv_dim), std::nanf(""));
      for (int64_t r = 0; r < page_ && pg * page_ + r < pasts[s]; ++r)
        for (int64_t d = 0; d < kv_dim; ++d) {
          const size_t at = static_cast<size_t>((pg * page_ + r) * kv_dim + d);
          page[static_cast<size_t>(r * kv_dim + d)] = k_[s][at];
          page[static_cast<size_t>((page_ + r) * kv_dim + d)] = v_[s][at];
        }
      pages_[s][static_cast<size_t>(pg)] = arena_.upload(page, kv_, {static_cast<int64_t>(page.size())}).data;
    }
  }

  // One attention call: lens[s] rows of sequence s (q [T, n_heads * hd], k/v [T, kv_dim]); returns out [T, ...].
  // max_pages > 0: device-resident mode, as captured decode steps call it (lengths and a page table of max_pages
  // per slot on the device, keys split for the table's capacity).
  std::vector<float> call(const std::vector<int64_t>& lens, const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, int64_t max_pages = 0) {
    const int64_t kv_dim = n_kv_ * hd_, q_dim = n_heads_ * hd_;
    std::vector<int64_t> slots(lens.size());
    std::iota(slots.begin(), slots.end(), 0);
    BatchLayout batch = make_batch(lens, slots);
    const int64_t T = batch.total_tokens;
    AttentionArgs a;
    a.n_heads = n_heads_;
    a.n_kv_heads = n_kv_;
    a.head_dim = hd_;
    a.page_tokens = page_;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd_)));
    a.kv_dtype = kv_;
    a.q = arena_.upload_strided(q, T, q_dim, q_dim + 5, 3);  // rows not 16-byte aligned
    a.k = arena_.upload(k, DType::F32, {T, kv_dim});
    a.v = arena_.upload(v, DType::F32, {T, kv_dim});
    a.out = arena_.poisoned({T, q_dim});
    if (max_pages > 0) {
      std::vector<void*> table(lens.size() * static_cast<size_t>(max_pages), nullptr);
      for (size_t s = 0; s < lens.size(); ++s) {
        EXPECT_LE(pages_[s].size(), static_cast<size_t>(max_pages));
        std::copy(pages_[s].begin(), pages_[s].end(), table.begin() + static_cast<std::ptrdiff_t>(s * max_pages));
      }
      void* d_table = arena_.alloc(table.size() * sizeof(void*));
      be_.copy_from_host(d_table, table.data(), table.size() * sizeof(void*));
      auto* d_len = static_cast<int64_t*>(arena_.alloc(past_.size() * sizeof(int64_t)));
      be_.copy_from_host(d_len, past_.data(), past_.size() * sizeof(int64_t));
      a.device_pages = static_cast<void* const*>(d_table);
      a.device_lengths = d_len;
      a.max_pages = max_pages;
    } else {
      for (size_t s = 0; s < lens.size(); ++s) a.cache.push_back({pages_[s], past_[s]});
    }
    be_.prepare_batch(batch);
    be_.attention(a, batch);
    for (size_t s = 0; s < lens.size(); ++s) {
      const SeqSpan& sp = batch.seqs[s];
      for (int64_t i = 0; i < sp.len * kv_dim; ++i) {
        k_[s].push_back(stored(k[static_cast<size_t>(sp.start * kv_dim + i)]));
        v_[s].push_back(stored(v[static_cast<size_t>(sp.start * kv_dim + i)]));
      }
      past_[s] += sp.len;
    }
    return arena_.download(a.out);
  }

  // fp64 reference of row `pos` (absolute position) of sequence s, head h, over the rows cached now (bf16-rounded
  // as the kernel stages them); writes the output and the error bound of each channel.
  void reference(size_t s, int64_t pos, int64_t h, const float* q_row, std::vector<double>& out,
                 std::vector<double>& bound) const {
    const int64_t kv_dim = n_kv_ * hd_, g = h / (n_heads_ / n_kv_);
    const double scale = static_cast<double>(static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd_))));
    std::vector<double> sc(static_cast<size_t>(pos + 1));
    double mx = -INFINITY, abs_dot = 0.0;
    for (int64_t j = 0; j <= pos; ++j) {
      double dot = 0.0, ad = 0.0;
      for (int64_t d = 0; d < hd_; ++d) {
        const double x = static_cast<double>(r16(q_row[d])) * r16(k_[s][static_cast<size_t>(j * kv_dim + g * hd_ + d)]);
        dot += x;
        ad += std::abs(x);
      }
      sc[static_cast<size_t>(j)] = dot * scale;
      mx = std::max(mx, dot * scale);
      abs_dot = std::max(abs_dot, ad);
    }
    double sum = 0.0;
    for (double& x : sc) sum += (x = std::exp(x - mx));
    out.assign(static_cast<size_t>(hd_), 0.0);
    bound.assign(static_cast<size_t>(hd_), 0.0);
    auto val = [&](int64_t j, int64_t d) {
      return static_cast<double>(r16(v_[s][static_cast<size_t>(j * kv_dim + g * hd_ + d)]));
    };
    for (int64_t j = 0; j <= pos; ++j)
      for (int64_t d = 0; d < hd_; ++d) out[static_cast<size_t>(d)] += sc[static_cast<size_t>(j)] / sum * val(j, d);
    // Weights: bf16 rounding (u), plus the f32 score's error (tensor-core sums of hd exact products, truncating
    // adds: hd * 2^-23 of sum |q k|), exp2's ulps and the online rescaling (one approximate exp2 per 64-key tile on
    // the weights before it). Output: the f32 accumulation of the weighted values, one truncating add per 16 keys.
    const double u = std::ldexp(1.0, -8);
    const double e_w = u / (1.0 - u) + static_cast<double>(hd_) * std::ldexp(1.0, -23) * scale * abs_dot + 1e-6 +
                       static_cast<double>(pos / 64 + 1) * std::ldexp(1.0, -21);
    const double e_acc = static_cast<double>(pos + 1) / 16.0 * std::ldexp(1.0, -22);
    for (int64_t j = 0; j <= pos; ++j)
      for (int64_t d = 0; d < hd_; ++d) {
        const double w = sc[static_cast<size_t>(j)] / sum;
        bound[static_cast<size_t>(d)] +=
            w * (e_w * std::abs(val(j, d) - out[static_cast<size_t>(d)]) + e_acc * std::abs(val(j, d)));
      }
    for (double& b : bound) b += 1e-6;
  }

  int64_t past(size_t s) const { return past_[s]; }

 private:
  float stored(float x) const { return kv_ == DType::BF16 ? r16(x) : x; }

  Backend& be_;
  DeviceArena& arena_;
  int64_t n_heads_, n_kv_, hd_, page_;
  DType kv_;
  std::vector<int64_t> past_;
  std::vector<std::vector<float>> k_, v_;
  std::vector<std::vector<void*>> pages_;
};

struct MmaCase {
  int64_t n_heads, n_kv_heads, head_dim, page_tokens;
  std::vector<int64_t> lens, past;
};

std::unique_ptr<Backend> fast_backend() { return make_cuda_backend(DType::BF16, Precision::Fast); }

void check_against_fp64(const MmaCase& c, uint64_t seed, DType kv, int64_t max_pages = 0) {
  auto be = fast_backend();
  DeviceArena arena(*be);
  Rng rng(seed);
  std::vector<int64_t> cap(c.lens.size());
  for (size_t s = 0; s < cap.size(); ++s) cap[s] = c.past[s] + c.lens[s];
  PagedCache cache(*be, arena, rng, c.n_heads, c.n_kv_heads, c.head_dim, c.page_tokens, kv, c.past, cap);
  const int64_t T = std::accumulate(c.lens.begin(), c.lens.end(), int64_t{0});
  const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const auto q = rng.vec(static_cast<size_t>(T * q_dim), -2.0f, 2.0f);
  const auto k = rng.vec(static_cast<size_t>(T * kv_dim), -2.0f, 2.0f);
  const auto v = rng.vec(static_cast<size_t>(T * kv_dim));
  const auto got = cache.call(c.lens, q, k, v, max_pages);
  std::vector<double> ref, bound;
  double worst = 0.0;  // max |got - ref| / bound
  int64_t t = 0, bad = 0;
  for (size_t s = 0; s < c.lens.size(); ++s)
    for (int64_t i = 0; i < c.lens[s]; ++i, ++t)
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const int64_t pos = c.past[s] + i;
        cache.reference(s, pos, h, q.data() + t * q_dim + h * c.head_dim, ref, bound);
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const float x = got[static_cast<size_t>(t * q_dim + h * c.head_dim + d)];
          const double ratio = std::abs(x - ref[static_cast<size_t>(d)]) / bound[static_cast<size_t>(d)];
          if (!(ratio <= 1.0)) {
            if (bad++ < 5)
              ADD_FAILURE() << "sequence " << s << " position " << pos << " head " << h << " channel " << d << ": got "
                            << x << ", fp64 " << ref[static_cast<size_t>(d)] << ", bound "
                            << bound[static_cast<size_t>(d)];
          }
          if (std::isfinite(ratio)) worst = std::max(worst, ratio);
        }
      }
  EXPECT_EQ(bad, 0) << "elements outside the bound; worst |err| / bound " << worst;
}

void run_cases(const std::vector<MmaCase>& cases, uint64_t seed) {
  for (DType kv : {DType::F32, DType::BF16})
    for (const MmaCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << dtype_name(kv) << " pages, heads " << c.n_heads << "/" << c.n_kv_heads
                                        << " hd " << c.head_dim << " page " << c.page_tokens);
      check_against_fp64(c, seed++, kv);
    }
}

TEST(GpuAttentionMma, PrefillMatchesFp64OnBf16Inputs) {
  MAMBACPP_REQUIRE_GPU();
  // head_dim 40 (padded to 64), 64, 96, 128, 256; GQA 1, 3, 4, 8; lengths and pasts off the 128-item tile, the
  // 64-key tile and the page; the 600-row prompt has few blocks and long keys, so its keys are split.
  run_cases({
                {12, 4, 64, 64, {37, 1, 130}, {0, 5, 129}},
                {32, 8, 128, 64, {300, 3}, {17, 64}},
                {8, 8, 96, 16, {70, 9}, {0, 11}},
                {16, 2, 256, 64, {45}, {200}},
                {6, 2, 40, 8, {150}, {0}},
                {16, 4, 128, 64, {600}, {0}},
            },
            1);
}

TEST(GpuAttentionMma, SplitDecodeMatchesFp64OnBf16Inputs) {
  MAMBACPP_REQUIRE_GPU();
  // One or two rows per sequence over long pasts: few blocks, keys split over the grid and combined.
  run_cases({
                {32, 8, 128, 64, {1, 1}, {3001, 5000}},
                {12, 4, 64, 16, {1, 2}, {4099, 1500}},
                {16, 2, 256, 64, {1}, {2500}},
                {8, 1, 128, 64, {1, 1, 1}, {63, 64, 1000}},
            },
            100);
}

TEST(GpuAttentionMma, DeviceResidentDecodeMatchesFp64OnBf16Inputs) {
  MAMBACPP_REQUIRE_GPU();
  // A captured decode step's call: lengths and page table on the device, keys split for a table of 200 pages of 64
  // rows (12,800 keys) while the contexts hold 3,000 and 40: the splits are sized to each live context.
  const MmaCase c{32, 8, 128, 64, {1, 1}, {3000, 40}};
  uint64_t seed = 300;
  for (DType kv : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(kv));
    check_against_fp64(c, seed++, kv, 200);
  }
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// A 480-row prompt in one call and in pieces (one of a single row) gives the same rows bit for bit: key tiles are
// anchored at absolute positions and visited in order, whatever the piece (no call here has enough keys to split).
TEST(GpuAttentionMma, PiecesEqualOnePassBitForBit) {
  MAMBACPP_REQUIRE_GPU();
  for (DType kv : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(kv));
    const int64_t NH = 32, KV = 8, HD = 128, L = 480, q_dim = NH * HD, kv_dim = KV * HD;
    auto be = fast_backend();
    DeviceArena arena(*be);
    Rng rng(7);
    const auto q = rng.vec(static_cast<size_t>(L * q_dim), -2.0f, 2.0f);
    const auto k = rng.vec(static_cast<size_t>(L * kv_dim), -2.0f, 2.0f);
    const auto v = rng.vec(static_cast<size_t>(L * kv_dim));
    PagedCache one(*be, arena, rng, NH, KV, HD, 64, kv, {0}, {L});
    const auto whole = one.call({L}, q, k, v);
    PagedCache cut(*be, arena, rng, NH, KV, HD, 64, kv, {0}, {L});
    int64_t at = 0;
    for (int64_t len : {137, 1, 64, 200, 78}) {
      auto slice = [&](const std::vector<float>& x, int64_t w) {
        return std::vector<float>(x.begin() + at * w, x.begin() + (at + len) * w);
      };
      const auto part = cut.call({len}, slice(q, q_dim), slice(k, kv_dim), slice(v, kv_dim));
      EXPECT_TRUE(same_bits(part.data(), whole.data() + at * q_dim, static_cast<size_t>(len * q_dim)))
          << "rows " << at << ".." << at + len;
      at += len;
    }
  }
}

// A sequence's rows are the same bit for bit alone and batched between two others (one of them mid-decode).
TEST(GpuAttentionMma, BatchMemberEqualsItselfAloneBitForBit) {
  MAMBACPP_REQUIRE_GPU();
  for (DType kv : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(kv));
    const int64_t NH = 12, KV = 4, HD = 64, L = 300, q_dim = NH * HD, kv_dim = KV * HD;
    auto be = fast_backend();
    DeviceArena arena(*be);
    Rng rng(11);
    const auto q = rng.vec(static_cast<size_t>(L * q_dim), -2.0f, 2.0f);
    const auto k = rng.vec(static_cast<size_t>(L * kv_dim), -2.0f, 2.0f);
    const auto v = rng.vec(static_cast<size_t>(L * kv_dim));
    PagedCache alone(*be, arena, rng, NH, KV, HD, 64, kv, {0}, {L});
    const auto want = alone.call({L}, q, k, v);

    const int64_t LY = 50, LZ = 1;
    PagedCache batched(*be, arena, rng, NH, KV, HD, 64, kv, {0, 0, 200}, {LY, L, 200 + LZ});
    auto cat = [&](int64_t w, const std::vector<float>& x) {
      std::vector<float> all = rng.vec(static_cast<size_t>(LY * w), -1.0f, 1.0f);
      all.insert(all.end(), x.begin(), x.end());
      const auto z = rng.vec(static_cast<size_t>(LZ * w), -1.0f, 1.0f);
      all.insert(all.end(), z.begin(), z.end());
      return all;
    };
    const auto got = batched.call({LY, L, LZ}, cat(q_dim, q), cat(kv_dim, k), cat(kv_dim, v));
    EXPECT_TRUE(same_bits(got.data() + LY * q_dim, want.data(), static_cast<size_t>(L * q_dim)));
  }
}

}  // namespace
}  // namespace mambacpp
