// The mixture-of-experts ops for any backend, composed of its own ops: the routing runs on the host (logits copied
// there, ids and weights copied back); the experts gather each expert's tokens (gather_rows), run its projections
// (linear, relu2 / silu_mul) and copy the results to the host, where each token's k outputs are weighted and summed
// in slot order and copied back. Correct on any device, not fast on a GPU (what its kernels should be is written
// in docs/MOE_NOTES.md).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/moe_routing.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

// Tokens per round of the default experts op: bounds the host buffer of expert outputs to kBlock * top_k rows.
constexpr int64_t kBlock = 256;

void check_2d(const char* op, const char* name, const TensorView& v, DType dtype, int64_t rows, int64_t cols) {
  if (v.empty() || v.ndim != 2 || v.dtype != dtype || v.dim(0) != rows || v.dim(1) != cols)
    fail(op, ": ", name, " must be ", dtype_name(dtype), " [", rows, ", ", cols, "], found ",
         v.empty() ? std::string("nothing") : std::string(dtype_name(v.dtype)) + " " + v.shape_string());
}

// Rows [r0, r0 + n) of a 2-D view (possibly strided) to or from the host, packed there.
void rows_to_host(Backend& be, const TensorView& v, int64_t r0, int64_t n, void* host) {
  const size_t row = static_cast<size_t>(v.dim(1)) * dtype_size(v.dtype);
  if (v.contiguous()) {
    be.copy_to_host(host, v.rows(r0, n).data, row * static_cast<size_t>(n));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    be.copy_to_host(static_cast<char*>(host) + row * static_cast<size_t>(i), v.rows(r0 + i, 1).data, row);
}

void rows_from_host(Backend& be, TensorView v, int64_t r0, int64_t n, const void* host) {
  const size_t row = static_cast<size_t>(v.dim(1)) * dtype_size(v.dtype);
  if (v.contiguous()) {
    be.copy_from_host(v.rows(r0, n).data, host, row * static_cast<size_t>(n));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    be.copy_from_host(v.rows(r0 + i, 1).data, static_cast<const char*>(host) + row * static_cast<size_t>(i), row);
}

}  // namespace

void check_moe_route(const MoeRouteArgs& a) {
  const char* op = "moe_route";
  if (a.logits.ndim != 2) fail(op, ": logits must be [T, experts], found ", a.logits.shape_string());
  const int64_t T = a.logits.dim(0), E = a.logits.dim(1);
  check_2d(op, "logits", a.logits, DType::F32, T, E);
  if (a.top_k < 1 || a.top_k > E) fail(op, ": top_k = ", a.top_k, ", expected in [1, ", E, "]");
  if (a.scoring == MoeScoring::SigmoidGrouped) {
    if (a.n_group < 1 || E % a.n_group != 0 || a.topk_group < 1 || a.topk_group > a.n_group ||
        (a.n_group > 1 && E / a.n_group < 2) || a.top_k > a.topk_group * (E / a.n_group))
      fail(op, ": n_group ", a.n_group, " / topk_group ", a.topk_group, " do not fit ", E, " experts with top_k ",
           a.top_k);
  }
  // The correction bias is an f32 parameter in transformers; checkpoints converted whole to bf16/f16 hold it narrowed.
  if (!a.bias.empty() && (!is_weight_float(a.bias.dtype) || a.bias.numel() != E || !a.bias.contiguous()))
    fail(op, ": bias must be a contiguous f32/f16/bf16 [", E, "], found ", dtype_name(a.bias.dtype), " ",
         a.bias.shape_string());
  check_2d(op, "ids", a.ids, DType::I32, T, a.top_k);
  check_2d(op, "weights", a.weights, DType::F32, T, a.top_k);
  if (!a.ids.contiguous() || !a.weights.contiguous()) fail(op, ": ids and weights must be contiguous");
}

void check_moe_experts(const MoeExpertsArgs& a) {
  const char* op = "moe_experts";
  if (a.x.ndim != 2) fail(op, ": x must be [T, d_model], found ", a.x.shape_string());
  const int64_t T = a.x.dim(0), D = a.x.dim(1), I = a.expert_size;
  const int64_t E = static_cast<int64_t>(a.up.size());
  check_2d(op, "x", a.x, DType::F32, T, D);
  check_2d(op, "out", a.out, DType::F32, T, D);
  if (a.ids.ndim != 2) fail(op, ": ids must be [T, top_k], found ", a.ids.shape_string());
  const int64_t k = a.ids.dim(1);
  check_2d(op, "ids", a.ids, DType::I32, T, k);
  check_2d(op, "weights", a.weights, DType::F32, T, k);
  if (!a.ids.contiguous() || !a.weights.contiguous()) fail(op, ": ids and weights must be contiguous");
  if (E < 1 || static_cast<int64_t>(a.down.size()) != E || (!a.gate.empty() && static_cast<int64_t>(a.gate.size()) != E))
    fail(op, ": expected one up, down (and gate) weight per expert, found ", a.up.size(), ", ", a.down.size(), " and ",
         a.gate.size());
  if (a.gate.size() && a.act != MoeExpertAct::SiluGated) fail(op, ": separate gate weights need the gated activation");
  const int64_t up_rows = a.act == MoeExpertAct::SiluGated && a.gate.empty() ? 2 * I : I;
  for (int64_t e = 0; e < E; ++e) {
    auto check = [&](const Weight& w, const char* name, int64_t out, int64_t in) {
      if (w.ndim != 2 || w.dim(0) != out || w.dim(1) != in)
        fail(op, ": expert ", e, " ", name, " must be [", out, ", ", in, "], found ", w.empty() ? "nothing" : w.describe());
    };
    check(a.up[static_cast<size_t>(e)], "up", up_rows, D);
    check(a.down[static_cast<size_t>(e)], "down", D, I);
    if (!a.gate.empty()) check(a.gate[static_cast<size_t>(e)], "gate", I, D);
  }
}

void Backend::moe_route(const MoeRouteArgs& a) {
  check_moe_route(a);
  const int64_t T = a.logits.dim(0), E = a.logits.dim(1), k = a.top_k;
  std::vector<float> logits(static_cast<size_t>(T * E)), bias;
  rows_to_host(*this, a.logits, 0, T, logits.data());
  if (!a.bias.empty()) {
    std::vector<char> raw(static_cast<size_t>(E) * dtype_size(a.bias.dtype));
    copy_to_host(raw.data(), a.bias.data, raw.size());
    bias.resize(static_cast<size_t>(E));
    convert_to_f32(raw.data(), a.bias.dtype, bias.data(), E);
  }
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> weights(static_cast<size_t>(T * k));
  moe::RouteScratch sc;
  for (int64_t t = 0; t < T; ++t)
    moe::route_token(a, E, logits.data() + t * E, bias.empty() ? nullptr : bias.data(), ids.data() + t * k,
                     weights.data() + t * k, sc);
  copy_from_host(a.ids.data, ids.data(), ids.size() * 4);
  copy_from_host(a.weights.data, weights.data(), weights.size() * 4);
}

void Backend::moe_experts(const MoeExpertsArgs& a) {
  check_moe_experts(a);
  const int64_t T = a.x.dim(0), D = a.x.dim(1), I = a.expert_size, k = a.ids.dim(1);
  const int64_t E = static_cast<int64_t>(a.up.size());
  const bool gated = a.act == MoeExpertAct::SiluGated;
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> weights(static_cast<size_t>(T * k));
  copy_to_host(ids.data(), a.ids.data, ids.size() * 4);
  copy_to_host(weights.data(), a.weights.data, weights.size() * 4);
  for (int32_t id : ids)
    if (id < 0 || id >= E) fail("moe_experts: expert id ", id, " outside [0, ", E, ")");

  const int64_t rows_cap = std::min<int64_t>(T, kBlock) * k;  // a block's (token, slot) pairs
  const Device dev = device();
  DeviceBuffer xg(*this, static_cast<size_t>(rows_cap * D) * 4), h(*this, static_cast<size_t>(rows_cap * 2 * I) * 4),
      act(*this, static_cast<size_t>(rows_cap * I) * 4), yg(*this, static_cast<size_t>(rows_cap * D) * 4);
  std::vector<float> y(static_cast<size_t>(rows_cap * D)), out(static_cast<size_t>(std::min<int64_t>(T, kBlock) * D));
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(E)), pairs(static_cast<size_t>(E));
  for (int64_t t0 = 0; t0 < T; t0 += kBlock) {
    const int64_t nt = std::min(kBlock, T - t0);
    for (auto& v : tokens) v.clear();
    for (auto& v : pairs) v.clear();
    for (int64_t t = t0; t < t0 + nt; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const auto e = static_cast<size_t>(ids[static_cast<size_t>(t * k + j)]);
        tokens[e].push_back(t);
        pairs[e].push_back((t - t0) * k + j);
      }
    for (int64_t e = 0; e < E; ++e) {
      const auto& rows = tokens[static_cast<size_t>(e)];
      const auto n = static_cast<int64_t>(rows.size());
      if (n == 0) continue;  // an expert no token chose: its weights are not read
      TensorView xe(xg.data(), DType::F32, {n, D}, dev), he(h.data(), DType::F32, {n, 2 * I}, dev),
          ae(act.data(), DType::F32, {n, I}, dev), ye(yg.data(), DType::F32, {n, D}, dev);
      gather_rows(a.x, rows.data(), n, xe);
      const auto ue = static_cast<size_t>(e);
      if (!gated) {
        TensorView up = he.cols(0, I);
        linear(xe, a.up[ue], {}, up);
        relu2(up);
        linear(up, a.down[ue], {}, ye);
      } else {
        if (a.gate.empty()) {
          linear(xe, a.up[ue], {}, he);
        } else {
          linear(xe, a.gate[ue], {}, he.cols(0, I));
          linear(xe, a.up[ue], {}, he.cols(I, I));
        }
        silu_mul(he.cols(0, I), he.cols(I, I), ae);
        linear(ae, a.down[ue], {}, ye);
      }
      std::vector<float> host(static_cast<size_t>(n * D));
      copy_to_host(host.data(), ye.data, host.size() * 4);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(y.data() + pairs[ue][static_cast<size_t>(i)] * D, host.data() + i * D, static_cast<size_t>(D) * 4);
    }
    // Each token's weighted sum over its slots in order j = 0..k-1: the same for a token whatever shares its block.
    std::vector<const float*> rows_of(static_cast<size_t>(k));
    for (int64_t i = 0; i < nt; ++i) {
      for (int64_t j = 0; j < k; ++j) rows_of[static_cast<size_t>(j)] = y.data() + (i * k + j) * D;
      moe::combine_token(rows_of.data(), weights.data() + (t0 + i) * k, k, D, out.data() + i * D);
    }
    rows_from_host(*this, a.out, t0, nt, out.data());
  }
}

}  // namespace mambacpp
