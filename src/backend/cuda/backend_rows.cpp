// Row ops of the CUDA backend: the embedding lookup, row gathers, and the sampler's per-row reductions (top-k
// candidates, log-sum-exp), whose small inputs and outputs go through the scratch arena's pinned buffer.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace mambacpp {

using namespace cuda;

void CudaBackend::embed(const Weight& table_weight, const TensorView& ids, TensorView out) {
  if (!table_weight.dense()) return embed_quant(table_weight, ids, out);  // q8_0 / fp8: quant_linear.cpp
  const TensorView& table = table_weight.dense_view("embed");
  check_f32_2d(out, "embed: out");
  need(table.ndim == 2 && is_float_dtype(table.dtype), "embed: table must be a 2-D float tensor, found ",
       table.shape_string(), " ", dtype_name(table.dtype));
  need(ids.dtype == DType::I32 && ids.numel() == out.dim(0), "embed: ids must be i32 [", out.dim(0), "], found ",
       dtype_name(ids.dtype), " ", ids.shape_string());
  need(table.dim(1) == out.dim(1), "embed: table width ", table.dim(1), " != out width ", out.dim(1));
  launch_embed(weight(table), table.dim(1), ids.ptr<const int32_t>(), out.dim(0), rows(out), stream());
}

void CudaBackend::gather_rows(const TensorView& x, const int64_t* host_rows, int64_t n, TensorView out) {
  need(x.ndim >= 1 && out.ndim >= 1 && x.dtype == out.dtype && x.row_size() == out.row_size() && out.dim(0) >= n,
       "gather_rows: x ", x.shape_string(), " vs out ", out.shape_string());
  const size_t es = dtype_size(x.dtype);
  need(es == 2 || es == 4 || es == 8, "gather_rows: unsupported dtype ", dtype_name(x.dtype));
  if (n <= 0) return;
  for (int64_t i = 0; i < n; ++i)
    need(host_rows[i] >= 0 && host_rows[i] < x.dim(0), "gather_rows: row ", host_rows[i], " outside [0, ", x.dim(0),
         ")");
  void* dev_rows = grow(Slot::kRows, static_cast<size_t>(n) * sizeof(int64_t));
  copy_from_host(dev_rows, host_rows, static_cast<size_t>(n) * sizeof(int64_t));
  launch_gather_rows(x.data, x.stride0(), static_cast<const int64_t*>(dev_rows), n, x.row_size(), es, out.data,
                     out.stride0(), stream());
}

// One upload (row parameters, then the penalised ids), the kernel, one download of the packed candidates.
void CudaBackend::select_top_k(TensorView logits, const std::vector<TopKRequest>& requests,
                               std::vector<TopKCandidates>& out) {
  const std::vector<int64_t> limits = check_top_k_requests(logits, requests);
  check_f32_2d(logits, "select_top_k: logits");
  const int64_t n = logits.dim(0);
  out.assign(static_cast<size_t>(n), TopKCandidates{});
  if (n == 0) return;
  std::vector<SelectRowParams> params(static_cast<size_t>(n));
  std::vector<int32_t> ids;
  int32_t kmax = 1;
  for (size_t r = 0; r < params.size(); ++r) {
    const TopKRequest& q = requests[r];
    SelectRowParams& pr = params[r];
    pr.k = q.k;
    pr.limit = static_cast<int32_t>(limits[r]);
    pr.penalty = q.repeat_penalty;
    pr.pen_offset = static_cast<int32_t>(ids.size());
    if (q.repeat_penalty != 1.0f) ids.insert(ids.end(), q.penalized.begin(), q.penalized.end());
    pr.pen_count = static_cast<int32_t>(ids.size()) - pr.pen_offset;
    need(ids.size() <= INT32_MAX, "select_top_k: more than 2^31-1 penalized ids in one call");
    kmax = std::max(kmax, q.k);
  }
  // Both copies go through one pinned host buffer (parameters, then the packed output), so that they are truly
  // asynchronous and the call waits once. It is free again when this call returns (the stream has drained).
  const size_t ids_offset = align(params.size() * sizeof(SelectRowParams));
  const size_t in_bytes = ids_offset + ids.size() * sizeof(int32_t);
  const int64_t out_stride = 3 + 2 * int64_t(kmax);
  const size_t out_bytes = static_cast<size_t>(n * out_stride) * sizeof(int32_t);
  auto* pinned = static_cast<unsigned char*>(scratch_.grow_pinned(align(in_bytes) + out_bytes));
  std::memcpy(pinned, params.data(), params.size() * sizeof(SelectRowParams));
  if (!ids.empty()) std::memcpy(pinned + ids_offset, ids.data(), ids.size() * sizeof(int32_t));
  auto* in = static_cast<unsigned char*>(grow(Slot::kSelectIn, in_bytes));
  MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(in, pinned, in_bytes, cudaMemcpyHostToDevice, stream()));
  SelectLaunch p;
  p.logits = logits.ptr<float>();
  p.stride = logits.stride0();
  p.n_rows = n;
  p.rows = reinterpret_cast<const SelectRowParams*>(in);
  p.pen_ids = reinterpret_cast<const int32_t*>(in + ids_offset);
  p.out_stride = out_stride;
  p.kmax = kmax;
  p.out = static_cast<int32_t*>(grow(Slot::kSelectOut, out_bytes));
  launch_select_top_k(p, stream());
  auto* packed = reinterpret_cast<int32_t*>(pinned + align(in_bytes));
  MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(packed, p.out, out_bytes, cudaMemcpyDeviceToHost, stream()));
  MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
  for (int64_t r = 0; r < n; ++r) {
    const int32_t* w = packed + r * p.out_stride;
    TopKCandidates& c = out[static_cast<size_t>(r)];
    c.bad_id = w[1];
    std::memcpy(&c.bad_value, &w[2], sizeof(float));
    c.ids.assign(w + 3, w + 3 + w[0]);
    c.logits.resize(static_cast<size_t>(w[0]));
    std::memcpy(c.logits.data(), w + 3 + kmax, static_cast<size_t>(w[0]) * sizeof(float));
  }
}

void CudaBackend::row_logsumexp(const TensorView& logits, const std::vector<int64_t>& limits, std::vector<float>& out) {
  check_row_logsumexp(logits, limits);
  check_f32_2d(logits, "row_logsumexp: logits");
  const int64_t n = logits.dim(0);
  out.assign(static_cast<size_t>(n), 0.0f);
  if (n == 0) return;
  need(n <= INT32_MAX, "row_logsumexp: at most 2^31-1 rows");
  // Limits in, results out, through the pinned buffer of select_top_k (free between calls).
  const size_t in_bytes = align(static_cast<size_t>(n) * sizeof(int32_t));
  auto* pinned = static_cast<unsigned char*>(scratch_.grow_pinned(in_bytes + static_cast<size_t>(n) * sizeof(float)));
  auto* lim = reinterpret_cast<int32_t*>(pinned);
  for (int64_t r = 0; r < n; ++r) lim[r] = static_cast<int32_t>(limits[static_cast<size_t>(r)]);
  auto* dev = static_cast<unsigned char*>(grow(Slot::kSelectIn, in_bytes + static_cast<size_t>(n) * sizeof(float)));
  MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dev, pinned, in_bytes, cudaMemcpyHostToDevice, stream()));
  auto* dev_out = reinterpret_cast<float*>(dev + in_bytes);
  launch_row_logsumexp(crows(logits), reinterpret_cast<const int32_t*>(dev), n, dev_out, stream());
  MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(pinned + in_bytes, dev_out, static_cast<size_t>(n) * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream()));
  MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
  std::memcpy(out.data(), pinned + in_bytes, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace mambacpp
