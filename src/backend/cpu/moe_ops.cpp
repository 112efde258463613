// The mixture-of-experts ops on the CPU. Routing: tokens split over the threads, each routed by moe::route_token
// (the default's code, so the same bits). Experts: a counting sort groups the (token, slot) pairs of a block of
// tokens by expert (ascending tokens within an expert). An expert with many rows runs its projections through
// linear_f32 (the tiled GEMM), in parallel over experts when enough of them have work (one thread each) and one
// after another on all threads otherwise. The experts with at most kStreamTokens rows (every expert of a decode
// step) run together as two parallel passes: the first over the row blocks of all their up (and gate) weights, each
// block's activation computed as soon as its gate and up outputs are there; the second over blocks of the output
// columns, each streaming those rows of every such expert's down weight and then summing its columns of every token
// in slot order. Two fork-joins per layer instead of two per expert, and each thread streams long runs of weight
// rows. Every output element is still one dot_rows call over a whole row (what linear_f32 computes) and the
// activations and the sum are elementwise, so a token's result never depends on which tokens share its block or its
// experts, nor on the split. Experts no token chose are not read.
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/linear_shares.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"
#include "backend/moe_routing.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

using cpu::kMinShareBytes;
using cpu::kRowsPerBlock;
using cpu::kSharesPerThread;
using cpu::kStreamTokens;
using cpu::Rows;
using cpu::WeightRef;
namespace simd = cpu::simd;

constexpr int64_t kBlock = 512;          // tokens per round: bounds the grouped buffers to kBlock * top_k rows
constexpr int64_t kRouteGrain = 16;      // tokens per routing task

WeightRef expert_weight(const Weight& w) {
  const TensorView& v = w.dense_view("moe_experts");
  if (!v.contiguous()) fail("moe_experts: expert weights must be contiguous, found a strided ", w.describe());
  return {v.data, v.dtype};
}

// A reusable f32 buffer per thread (grows to the largest block).
float* scratch(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The experts of a block with at most kStreamTokens rows each: expert e's rows are [r0, r0 + n) of the grouped
// buffers (xg [np, D] in; h [np, hc] the up outputs, [gate | up] when gated; act [np, I] when gated; y [np, D] out).
struct SmallExpert {
  int64_t e, r0, n;
};

struct SmallExpertPass {
  const MoeExpertsArgs& a;
  const std::vector<SmallExpert>& experts;
  int64_t D, I, hc;
  bool gated, fused_gate;
  const float* xg;
  float *h, *act, *y;
  int threads;

  int64_t value_bytes() const {  // of the experts' weights (the shares' sizes count the first expert's dtype)
    return static_cast<int64_t>(dtype_size(expert_weight(a.up[static_cast<size_t>(experts[0].e)]).dtype));
  }

  // Shares of `units` units of `unit_bytes` weight bytes each, as linear_f32 cuts a GEMV: at least kMinShareBytes
  // per share, kSharesPerThread shares per thread, taken by whichever thread is free.
  void run_shares(int64_t units, int64_t unit_bytes, const std::function<void(int64_t, int64_t)>& fn) const {
    const int64_t grain = std::max<int64_t>(1, (kMinShareBytes + unit_bytes - 1) / std::max<int64_t>(unit_bytes, 1));
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(units / grain, threads * kSharesPerThread));
    cpu::parallel_tasks(threads, parts, [&](int64_t p) { fn(units * p / parts, units * (p + 1) / parts); });
  }

  // Pass 1: unit u is rows [16 b, 16 b + 16) of the intermediate of expert u / nb (b = u % nb): its gate and up
  // rows (or up alone), then their activation, for each of the expert's tokens.
  void up() const {
    const int64_t nb = (I + kRowsPerBlock - 1) / kRowsPerBlock;
    const int64_t unit_bytes = kRowsPerBlock * D * value_bytes() * (gated ? 2 : 1);
    run_shares(static_cast<int64_t>(experts.size()) * nb, unit_bytes, [&](int64_t u0, int64_t u1) {
      // Rows [r, ...) of an expert's [rows, D] weight.
      auto rows_of = [&](const Weight& w, int64_t r) {
        const WeightRef ref = expert_weight(w);
        return WeightRef{static_cast<const char*>(ref.data) + static_cast<size_t>(r * D) * dtype_size(ref.dtype),
                         ref.dtype};
      };
      float s[kRowsPerBlock];
      for (int64_t u = u0; u < u1; ++u) {
        const SmallExpert& se = experts[static_cast<size_t>(u / nb)];
        const auto ue = static_cast<size_t>(se.e);
        const int64_t i0 = (u % nb) * kRowsPerBlock, nr = std::min(kRowsPerBlock, I - i0);
        const WeightRef gate_rows = !gated ? WeightRef{} : rows_of(fused_gate ? a.up[ue] : a.gate[ue], i0);
        const WeightRef up_rows = rows_of(a.up[ue], gated && fused_gate ? I + i0 : i0);
        for (int64_t r = se.r0; r < se.r0 + se.n; ++r) {
          const float* xr = xg + r * D;
          float* hr = h + r * hc;
          if (!gated) {
            simd::dot_rows(xr, up_rows.data, up_rows.dtype, D, nr, hr + i0);
            cpu::relu2_f32(Rows<float>{hr + i0, hc}, 1, nr, 1);
            continue;
          }
          simd::dot_rows(xr, gate_rows.data, gate_rows.dtype, D, nr, hr + i0);
          simd::dot_rows(xr, up_rows.data, up_rows.dtype, D, nr, hr + I + i0);
          // silu_mul_f32's arithmetic on this block's columns (silu is elementwise, so the same bits as a whole row)
          simd::silu(hr + i0, s, nr);
          float* ar = act + r * I + i0;
          for (int64_t i = 0; i < nr; ++i) ar[i] = s[i] * hr[I + i0 + i];
        }
      }
    });
  }

  // Pass 2: unit b is output columns [16 b, 16 b + 16); a share streams its columns' down rows of each expert in
  // turn, then done(c0, c1) sums those columns of every token.
  void down(const std::function<void(int64_t, int64_t)>& done) const {
    const int64_t nb = (D + kRowsPerBlock - 1) / kRowsPerBlock;
    const int64_t unit_bytes = static_cast<int64_t>(experts.size()) * kRowsPerBlock * I * value_bytes();
    run_shares(nb, unit_bytes, [&](int64_t b0, int64_t b1) {
      const int64_t c0 = b0 * kRowsPerBlock, c1 = std::min(b1 * kRowsPerBlock, D);
      for (const SmallExpert& se : experts) {
        const WeightRef w = expert_weight(a.down[static_cast<size_t>(se.e)]);
        const size_t wsize = dtype_size(w.dtype);
        for (int64_t c = c0; c < c1; c += kRowsPerBlock) {
          const int64_t nr = std::min(kRowsPerBlock, c1 - c);
          const void* rows = static_cast<const char*>(w.data) + static_cast<size_t>(c * I) * wsize;
          for (int64_t r = se.r0; r < se.r0 + se.n; ++r)
            simd::dot_rows(gated ? act + r * I : h + r * hc, rows, w.dtype, I, nr, y + r * D + c);
        }
      }
      done(c0, c1);
    });
  }
};

}  // namespace

void CpuBackend::moe_route(const MoeRouteArgs& a) {
  check_moe_route(a);
  const int64_t T = a.logits.dim(0), E = a.logits.dim(1), k = a.top_k, stride = a.logits.stride0();
  const float* logits = a.logits.ptr<float>();
  std::vector<float> widened;
  const float* bias = nullptr;
  if (!a.bias.empty() && a.bias.dtype == DType::F32) bias = a.bias.ptr<float>();
  else if (!a.bias.empty()) {
    widened.resize(static_cast<size_t>(E));
    convert_to_f32(a.bias.data, a.bias.dtype, widened.data(), E);
    bias = widened.data();
  }
  auto* ids = a.ids.ptr<int32_t>();
  auto* weights = a.weights.ptr<float>();
  cpu::parallel_tasks(threads_, (T + kRouteGrain - 1) / kRouteGrain, [&](int64_t task) {
    moe::RouteScratch sc;
    for (int64_t t = task * kRouteGrain; t < std::min(T, (task + 1) * kRouteGrain); ++t)
      moe::route_token(a, E, logits + t * stride, bias, ids + t * k, weights + t * k, sc);
  });
}

void CpuBackend::moe_experts(const MoeExpertsArgs& a) {
  check_moe_experts(a);
  const int64_t T = a.x.dim(0), D = a.x.dim(1), I = a.expert_size, k = a.ids.dim(1);
  const int64_t E = static_cast<int64_t>(a.up.size());
  const bool gated = a.act == MoeExpertAct::SiluGated, fused_gate = gated && a.gate.empty();
  const int64_t hc = gated ? 2 * I : I;  // columns of the up output: [gate | up] or up
  const int32_t* ids = a.ids.ptr<int32_t>();
  const float* weights = a.weights.ptr<float>();
  for (int64_t i = 0; i < T * k; ++i)
    if (ids[i] < 0 || ids[i] >= E) fail("moe_experts: expert id ", ids[i], " outside [0, ", E, ")");
  const Rows<const float> x{a.x.ptr<float>(), a.x.stride0()};
  const Rows<float> out{a.out.ptr<float>(), a.out.stride0()};

  thread_local std::vector<float> xg_buf, h_buf, act_buf, y_buf;
  std::vector<int64_t> count(static_cast<size_t>(E) + 1), pos;
  std::vector<int64_t> big;  // experts with more than kStreamTokens rows in the block
  std::vector<SmallExpert> small;
  for (int64_t t0 = 0; t0 < T; t0 += kBlock) {
    const int64_t nt = std::min(kBlock, T - t0), np = nt * k;
    // Counting sort of the block's pairs by expert: pos[p] is pair p's row in the grouped buffers.
    std::fill(count.begin(), count.end(), 0);
    for (int64_t p = 0; p < np; ++p) ++count[static_cast<size_t>(ids[t0 * k + p]) + 1];
    for (int64_t e = 0; e < E; ++e) count[static_cast<size_t>(e) + 1] += count[static_cast<size_t>(e)];
    pos.resize(static_cast<size_t>(np));
    {
      std::vector<int64_t> next(count.begin(), count.end() - 1);
      for (int64_t p = 0; p < np; ++p) pos[static_cast<size_t>(p)] = next[static_cast<size_t>(ids[t0 * k + p])]++;
    }
    float* xg = scratch(xg_buf, np * D);
    float* h = scratch(h_buf, np * hc);
    float* act = scratch(act_buf, gated ? np * I : 0);
    float* y = scratch(y_buf, np * D);
    cpu::parallel_for(threads_, np, 64, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p)
        std::memcpy(xg + pos[static_cast<size_t>(p)] * D, x[t0 + p / k], static_cast<size_t>(D) * 4);
    });
    big.clear();
    small.clear();
    int64_t np_big = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e) + 1] - r0;
      if (n > kStreamTokens) {
        big.push_back(e);
        np_big += n;
      } else if (n > 0) {
        small.push_back({e, r0, n});
      }
    }

    auto run_expert = [&](int64_t e, int th) {
      const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e) + 1] - r0;
      const auto ue = static_cast<size_t>(e);
      const Rows<const float> xe{xg + r0 * D, D};
      const Rows<float> he{h + r0 * hc, hc}, ye{y + r0 * D, D};
      if (!gated) {
        cpu::linear_f32(xe, expert_weight(a.up[ue]), WeightRef{}, he, n, D, I, th);
        cpu::relu2_f32(he, n, I, th);
        cpu::linear_f32(Rows<const float>{he.data, hc}, expert_weight(a.down[ue]), WeightRef{}, ye, n, I, D, th);
        return;
      }
      if (fused_gate) {
        cpu::linear_f32(xe, expert_weight(a.up[ue]), WeightRef{}, he, n, D, 2 * I, th);
      } else {
        cpu::linear_f32(xe, expert_weight(a.gate[ue]), WeightRef{}, he, n, D, I, th);
        cpu::linear_f32(xe, expert_weight(a.up[ue]), WeightRef{}, Rows<float>{he.data + I, hc}, n, D, I, th);
      }
      const Rows<float> ae{act + r0 * I, I};
      cpu::silu_mul_f32(Rows<const float>{he.data, hc}, Rows<const float>{he.data + I, hc}, ae, n, I, th);
      cpu::linear_f32(Rows<const float>{ae.data, I}, expert_weight(a.down[ue]), WeightRef{}, ye, n, I, D, th);
    };
    const auto n_big = static_cast<int64_t>(big.size());
    if (threads_ > 1 && n_big >= threads_ && np_big >= 4 * threads_) {
      cpu::parallel_tasks(threads_, n_big, [&](int64_t i) { run_expert(big[static_cast<size_t>(i)], 1); });
    } else {
      for (int64_t e : big) run_expert(e, threads_);
    }

    // Columns [c0, c1) of every token's output: its k experts' rows summed in slot order.
    auto combine = [&](int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
      std::vector<const float*> r(static_cast<size_t>(k));
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = 0; j < k; ++j) r[static_cast<size_t>(j)] = y + pos[static_cast<size_t>(i * k + j)] * D + c0;
        moe::combine_token(r.data(), weights + (t0 + i) * k, k, c1 - c0, out[t0 + i] + c0);
      }
    };
    if (small.empty()) {
      cpu::parallel_for(threads_, nt, 8, [&](int64_t i0, int64_t i1) { combine(i0, i1, 0, D); });
      continue;
    }
    const SmallExpertPass pass{a, small, D, I, hc, gated, fused_gate, xg, h, act, y, threads_};
    pass.up();
    pass.down([&](int64_t c0, int64_t c1) { combine(0, nt, c0, c1); });
  }
}

}  // namespace mambacpp
