// The mixture-of-experts ops on the CPU. Routing: tokens split over the threads, each routed by moe::route_token
// (the default's code, so the same bits). Experts: a counting sort groups the (token, slot) pairs of a block of
// tokens by expert (ascending tokens within an expert); each chosen expert runs its projections over its rows
// through linear_f32 (GEMV for a few rows, the tiled GEMM for more), in parallel over experts when enough of them
// have work (one thread each) and one after another on all threads otherwise; then each token sums its k outputs in
// slot order. linear_f32 computes a row's outputs in the same order whatever the number of rows or threads, so a
// token's result never depends on which tokens share its block or its experts. Experts no token chose are not read.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/moe_routing.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

using cpu::Rows;
using cpu::WeightRef;

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
  std::vector<int64_t> active;
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
    active.clear();
    for (int64_t e = 0; e < E; ++e)
      if (count[static_cast<size_t>(e) + 1] > count[static_cast<size_t>(e)]) active.push_back(e);

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
    const auto n_active = static_cast<int64_t>(active.size());
    if (threads_ > 1 && n_active >= threads_ && np >= 4 * threads_) {
      cpu::parallel_tasks(threads_, n_active, [&](int64_t i) { run_expert(active[static_cast<size_t>(i)], 1); });
    } else {
      for (int64_t e : active) run_expert(e, threads_);
    }
    cpu::parallel_for(threads_, nt, 8, [&](int64_t i0, int64_t i1) {
      std::vector<const float*> r(static_cast<size_t>(k));
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = 0; j < k; ++j) r[static_cast<size_t>(j)] = y + pos[static_cast<size_t>(i * k + j)] * D;
        moe::combine_token(r.data(), weights + (t0 + i) * k, k, D, out[t0 + i]);
      }
    });
  }
}

}  // namespace mambacpp
