// Mixture-of-experts ops of the CUDA backend, on the device only (the kernels and their design: moe_kernels.cuh).
//
// moe_route: one routing thread per token, the host's rules step for step (ties to the lower expert index).
// moe_experts:
// - up to kGemvMaxTokens tokens (decode steps and short pieces), and any number inside a graph capture: the sort,
//   the grouped GEMVs (up with the activation fused, then down) over the active experts only, the combine (up to
//   kPairMaxTokens tokens: the streaming up GEMV per pair, then the down GEMV per token with the combine, no sort). No host
//   copy or wait, fixed launch shapes for a given token count: a decode step with MoE layers is captured as a graph.
//   Each (token, slot)'s dot products are summed in an order that does not depend on the other tokens, so a token's
//   output is the same bits in any batch.
// - more tokens (prefill): rounds of kPrefillBlock tokens; the sort, one copy of the expert offsets to the host, the
//   rows gathered in expert order and split once into bf16/f16 hi + lo halves, per active expert the cuBLASLt GEMMs
//   on the plan pinned for its weight shape (so a row's result does not depend on how many rows its expert got), the
//   activation over all rows at once, the down projections alike, the combine in slot order. f32 weights: linear.
// adopt_matrix: fused [E, out, in] expert tensors take the weight dtype (bf16 by default) like 2-D matrices, so the
// experts' bytes are what the decode floor counts.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/moe_routing.h"

namespace mambacpp {

using namespace cuda;

namespace {

constexpr int64_t kGemvMaxTokens = 256;
// Up to this many tokens (16-bit weights) the GEMVs take one pair / one token per grid row, without the sort, and
// stream the rows (moe_kernels.cuh); above it, the sort and one warp per row over each expert's pairs. Measured on
// H100 (docs/perf-log/moe-gpu-2026-12-07.md): at 1 token the pair kernels take 18 us against the sorted path's 35
// (Granite-4.0-H Tiny) and 58 against 127 (Nemotron 3 Nano); at 32 and 128 tokens the sorted path wins (294 vs 393,
// 818 vs 1200 us), since an expert shared by several tokens is read once there. The crossover between 1 and 32
// was not measured: 8 is the largest count the pair kernels were built for (at 8 tokens they read ~1.4x the
// distinct experts' bytes, at near 2x the sorted path's bandwidth, so they should still win). Both sides give a
// token the same bits.
constexpr int64_t kPairMaxTokens = 8;
constexpr int64_t kPrefillBlock = 1024;

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MAMBACPP_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  return status != cudaStreamCaptureStatusNone;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The sort's outputs, packed in the kMoeSort slot.
struct SortBuffers {
  int32_t *offsets, *active, *sorted, *pos;
};

}  // namespace

Weight CudaBackend::adopt_matrix(const Weight& host) {
  if (host.dense() && host.data.ndim == 3 && host.data.contiguous() && host.data.dtype != DType::F64) {
    const TensorView& h = host.data;
    const TensorView dev = adopt_weight(h.reshaped({h.dim(0) * h.dim(1), h.dim(2)}));
    return Weight(dev.reshaped({h.dim(0), h.dim(1), h.dim(2)}));
  }
  return Backend::adopt_matrix(host);
}

void CudaBackend::moe_route(const MoeRouteArgs& a) {
  check_moe_route(a);
  check_f32_2d(a.logits, "moe_route: logits");
  const int64_t T = a.logits.dim(0), E = a.logits.dim(1);
  need(E <= kMoeMaxExperts, "moe_route: ", E, " experts; the CUDA routing takes at most ", kMoeMaxExperts);
  need(a.scoring != MoeScoring::SigmoidGrouped || a.n_group <= kMoeMaxGroups, "moe_route: n_group = ", a.n_group,
       "; the CUDA routing takes at most ", kMoeMaxGroups, " groups");
  need(a.ids.device == Device::CUDA && a.weights.device == Device::CUDA &&
           (a.bias.empty() || a.bias.device == Device::CUDA),
       "moe_route: ids, weights and bias must be on cuda");
  need(a.bias.empty() || a.bias.dtype == DType::F32, "moe_route: the CUDA routing reads an f32 bias, found ",
       dtype_name(a.bias.dtype), " (adopt_weight widens vectors to f32)");
  MoeRouteLaunch p;
  p.logits = a.logits.ptr<float>();
  p.logits_stride = a.logits.stride0();
  p.bias = a.bias.empty() ? nullptr : a.bias.ptr<float>();
  p.T = T;
  p.E = E;
  p.k = a.top_k;
  p.n_group = a.n_group;
  p.topk_group = a.topk_group;
  p.rule = a.scoring == MoeScoring::SigmoidGrouped ? MoeRouteRule::SigmoidGrouped
           : a.scoring == MoeScoring::SoftmaxAll   ? MoeRouteRule::SoftmaxAll
                                                   : MoeRouteRule::SoftmaxChosen;
  p.renormalize = a.renormalize;
  p.scale = a.scale;
  p.ids = a.ids.ptr<int32_t>();
  p.weights = a.weights.ptr<float>();
  launch_moe_route(p, stream());
}

void CudaBackend::moe_experts(const MoeExpertsArgs& a) {
  check_moe_experts(a);
  check_f32_2d(a.x, "moe_experts: x");
  check_f32_2d(a.out, "moe_experts: out");
  const int64_t T = a.x.dim(0), D = a.x.dim(1), I = a.expert_size, k = a.ids.dim(1);
  const int64_t E = static_cast<int64_t>(a.up.size());
  need(a.ids.device == Device::CUDA && a.weights.device == Device::CUDA, "moe_experts: ids and weights must be on cuda");
  need(E <= kMoeMaxExperts, "moe_experts: ", E, " experts; the CUDA kernels take at most ", kMoeMaxExperts);
  if (T == 0 || D == 0) return;
  if (T > kGemvMaxTokens && !capturing(stream())) {
    moe_experts_prefill(a);
    return;
  }
  const bool gated = a.act == MoeExpertAct::SiluGated, separate_gate = !a.gate.empty();

  // The experts' weights: dense, one dtype, contiguous; their pointer tables (uploaded once per layer).
  const DType wd = a.up[0].dense_view("moe_experts").dtype;
  need(is_float_dtype(wd), "moe_experts: expert weights must be f32, f16 or bf16, found ", dtype_name(wd));
  bool aligned = true;
  auto table = [&](const std::vector<Weight>& ws, const char* name) -> const void* const* {
    if (ws.empty()) return nullptr;
    std::vector<const void*> ptrs;
    ptrs.reserve(ws.size());
    for (const Weight& w : ws) {
      const TensorView& v = w.dense_view("moe_experts");
      need(v.dtype == wd && v.contiguous() && v.device == Device::CUDA, "moe_experts: every expert's ", name,
           " must be a contiguous ", dtype_name(wd), " matrix on cuda like expert 0's up, found ", w.describe(), " on ",
           device_name(v.device));
      aligned = aligned && aligned16(v.data);
      ptrs.push_back(v.data);
    }
    return moe_tables_.get(ptrs);
  };
  const void* const* up_t = table(a.up, "up");
  const void* const* gate_t = table(a.gate, "gate");
  const void* const* down_t = table(a.down, "down");
  const int64_t per16 = 16 / static_cast<int64_t>(dtype_size(wd));  // weights per 16-byte load

  const int64_t P = T * k;
  char* sort_base = static_cast<char*>(grow(Slot::kMoeSort, align(size_t(E + 1) * 4) + align(size_t(E) * 4) +
                                                                2 * align(size_t(P) * 4)));
  SortBuffers sb;
  sb.offsets = reinterpret_cast<int32_t*>(sort_base);
  sb.active = reinterpret_cast<int32_t*>(sort_base + align(size_t(E + 1) * 4));
  sb.sorted = reinterpret_cast<int32_t*>(sort_base + align(size_t(E + 1) * 4) + align(size_t(E) * 4));
  sb.pos = reinterpret_cast<int32_t*>(sort_base + align(size_t(E + 1) * 4) + align(size_t(E) * 4) +
                                      align(size_t(P) * 4));
  float* act = static_cast<float*>(grow(Slot::kMoeHidden, size_t(P * I) * 4));
  float* y = static_cast<float*>(grow(Slot::kMoeOut, size_t(P * D) * 4));

  MoeGemvLaunch up;
  up.dtype = wd;
  up.in = D;
  up.out = I;
  up.x = a.x.ptr<float>();
  up.x_stride = a.x.stride0();
  up.by_token = true;
  up.k = k;
  up.offsets = sb.offsets;
  up.sorted = sb.sorted;
  up.active = sb.active;
  up.max_active = std::min(E, P);
  up.y = act;
  up.y_stride = I;
  up.vec = aligned && D % per16 == 0 && aligned16(up.x) && (up.x_stride * 4) % 16 == 0;
  if (!gated) {
    up.a = up_t;
    up.epilogue = MoeEpilogue::Relu2;
  } else if (separate_gate) {
    up.a = gate_t;
    up.b = up_t;
    up.epilogue = MoeEpilogue::SiluMul;
  } else {  // [2 I, D]: gate rows, then up rows
    up.a = up_t;
    up.b = up_t;
    up.b_row0 = I;
    up.epilogue = MoeEpilogue::SiluMul;
  }
  MoeGemvLaunch down = up;
  down.a = down_t;
  down.b = nullptr;
  down.a_row0 = down.b_row0 = 0;
  down.in = I;
  down.out = D;
  down.x = act;
  down.x_stride = I;
  down.by_token = false;
  down.epilogue = MoeEpilogue::Plain;
  down.y = y;
  down.y_stride = D;
  down.vec = aligned && I % per16 == 0 && aligned16(act);

  if (T <= kPairMaxTokens && wd != DType::F32 && up.vec && down.vec && k <= kMoeCombineMaxSlots) {
    // Few tokens: no sort and no separate combine (the same bits as below).
    up.rows = MoeGemvRows::Pairs;
    up.ids = a.ids.ptr<int32_t>();
    up.E = E;
    up.n_rows = P;
    launch_moe_gemv(up, stream());
    down.rows = MoeGemvRows::DownCombine;
    down.ids = up.ids;
    down.E = E;
    down.n_rows = T;
    down.combine_weights = a.weights.ptr<float>();
    down.y = a.out.ptr<float>();
    down.y_stride = a.out.stride0();
    launch_moe_gemv(down, stream());
    return;
  }
  launch_moe_sort(a.ids.ptr<int32_t>(), P, E, sb.offsets, sb.sorted, sb.pos, sb.active, stream());
  launch_moe_gemv(up, stream());
  launch_moe_gemv(down, stream());
  launch_moe_combine(y, D, sb.pos, a.weights.ptr<float>(), T, k, D, a.out.ptr<float>(), a.out.stride0(), stream());
}

void CudaBackend::moe_experts_prefill(const MoeExpertsArgs& a) {
  const int64_t T = a.x.dim(0), D = a.x.dim(1), I = a.expert_size, k = a.ids.dim(1);
  const int64_t E = static_cast<int64_t>(a.up.size());
  const bool gated = a.act == MoeExpertAct::SiluGated, separate_gate = !a.gate.empty();
  const int64_t hc = gated ? 2 * I : I;  // columns of the up output: [gate | up] or up
  const Device dev = Device::CUDA;
  const DType wd = a.up[0].dense_view("moe_experts").dtype;
  need(D <= INT_MAX && hc <= INT_MAX && kPrefillBlock * k <= INT_MAX, "moe_experts: dimensions beyond cuBLAS's "
       "32-bit limits: d_model ", D, ", expert rows ", hc);
  std::vector<int32_t> offsets(static_cast<size_t>(E + 1));

  // Each active expert's rows [o, o + n) of xs (in columns) through its weight w into y (rows ldy apart). 16-bit
  // weights: the rows split once into hi + lo halves (as linear does: an f32-accurate product; fast precision: hi
  // only), then per expert the cuBLASLt GEMMs on the plan pinned for the weight's shape, so a row's result does not
  // depend on how many rows its expert received. f32 weights: linear (cuBLAS in f32).
  auto project = [&](const TensorView& xs, int64_t in, const std::vector<Weight>& ws, const TensorView& yv) {
    const int64_t P = xs.dim(0), out = yv.dim(1), ldy = yv.stride0();
    if (wd == DType::F32) {
      for (int64_t e = 0; e < E; ++e) {
        const int64_t o = offsets[static_cast<size_t>(e)], n = offsets[static_cast<size_t>(e) + 1] - o;
        if (n > 0) linear(xs.rows(o, n), ws[static_cast<size_t>(e)], {}, yv.rows(o, n));
      }
      return;
    }
    const size_t half = static_cast<size_t>(P * in) * 2;
    char* hi = static_cast<char*>(grow(Slot::kSplit, fast_ ? half : 2 * half));
    char* lo = fast_ ? nullptr : hi + half;
    launch_split_hi_lo(crows(xs), P, in, wd, hi, lo, stream());
    cublas();  // the shared workspace exists
    const cudaDataType_t ab = wd == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t o = offsets[static_cast<size_t>(e)], n = offsets[static_cast<size_t>(e) + 1] - o;
      if (n == 0) continue;  // an expert no token chose: its weights are not read
      const TensorView& w = ws[static_cast<size_t>(e)].dense_view("moe_experts");
      need(w.dtype == wd && w.contiguous(), "moe_experts: expert ", e, " weight ", ws[static_cast<size_t>(e)].describe(),
           ", expected contiguous ", dtype_name(wd));
      const size_t at = static_cast<size_t>(o * in) * 2;
      float* y = yv.ptr<float>() + o * ldy;
      lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, w.data, hi + at, y, static_cast<int>(out),
              static_cast<int>(n), static_cast<int>(in), ldy, 0.0f, LtMatmul::Pin::Decode);
      if (lo)
        lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, w.data, lo + at, y, static_cast<int>(out),
                static_cast<int>(n), static_cast<int>(in), ldy, 1.0f, LtMatmul::Pin::Decode);
    }
  };

  for (int64_t t0 = 0; t0 < T; t0 += kPrefillBlock) {
    const int64_t nt = std::min(kPrefillBlock, T - t0), P = nt * k;
    char* sort_base = static_cast<char*>(grow(Slot::kMoeSort, align(size_t(E + 1) * 4) + align(size_t(E) * 4) +
                                                                  2 * align(size_t(P) * 4)));
    SortBuffers sb;
    sb.offsets = reinterpret_cast<int32_t*>(sort_base);
    sb.active = reinterpret_cast<int32_t*>(sort_base + align(size_t(E + 1) * 4));
    sb.sorted = reinterpret_cast<int32_t*>(sort_base + align(size_t(E + 1) * 4) + align(size_t(E) * 4));
    sb.pos = reinterpret_cast<int32_t*>(sort_base + align(size_t(E + 1) * 4) + align(size_t(E) * 4) +
                                        align(size_t(P) * 4));
    char* hidden = static_cast<char*>(grow(Slot::kMoeHidden, align(size_t(P * hc) * 4) + size_t(P * I) * 4));
    float* y = static_cast<float*>(grow(Slot::kMoeOut, size_t(P * D) * 4));
    float* xs = static_cast<float*>(grow(Slot::kMoeGather, size_t(P * D) * 4));

    launch_moe_sort(a.ids.ptr<int32_t>() + t0 * k, P, E, sb.offsets, sb.sorted, sb.pos, sb.active, stream());
    copy_to_host(offsets.data(), sb.offsets, offsets.size() * 4);  // waits: the per-expert GEMMs need the counts
    launch_moe_gather(a.x.ptr<float>() + t0 * a.x.stride0(), a.x.stride0(), sb.sorted, P, k, D, xs, D, stream());

    const TensorView xv(xs, DType::F32, {P, D}, dev), hv(hidden, DType::F32, {P, hc}, dev),
        av(hidden + align(size_t(P * hc) * 4), DType::F32, {P, I}, dev), yv(y, DType::F32, {P, D}, dev);
    if (separate_gate) {
      project(xv, D, a.gate, hv.cols(0, I));
      project(xv, D, a.up, hv.cols(I, I));
    } else {
      project(xv, D, a.up, hv);
    }
    TensorView actv = av;
    if (gated) {
      silu_mul(hv.cols(0, I), hv.cols(I, I), av);
    } else {
      relu2(hv);
      actv = hv;
    }
    project(actv, I, a.down, yv);
    launch_moe_combine(y, D, sb.pos, a.weights.ptr<float>() + t0 * k, nt, k, D,
                       a.out.ptr<float>() + t0 * a.out.stride0(), a.out.stride0(), stream());
  }
}

}  // namespace mambacpp
