// The CPU backend's f32 row-wise ops (linear.cpp, norms.cpp, rows.cpp, select_top_k.cpp): raw pointers and row strides in, checked by
// CpuBackend before the call. Weights are read in their stored dtype through WeightRef.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/cpu/kernel_common.h"
#include "mambacpp/top_k.h"

namespace mambacpp::cpu {

// y[t, o] = sum_i x[t, i] * w[o, i] (+ bias[o]). x: [T, in], w: [out, in] contiguous, y: [T, out].
// Each y[t, o] is summed in the same order whatever T is, so a row's result never depends on the rest of the batch.
// Then, if given, epilogue(o0, n) for every output column range [o0, o0 + n) once its columns of every row are done:
// inside the GEMV's own tasks in decode (the range its thread just wrote), after the whole product otherwise. The
// ranges partition [0, out) and may run concurrently.
using LinearEpilogue = std::function<void(int64_t o0, int64_t n)>;
void linear_f32(Rows<const float> x, WeightRef w, WeightRef bias, Rows<float> y, int64_t T, int64_t in, int64_t out,
                int threads, const LinearEpilogue& epilogue = {});

// out[t, :] = x[t, :] * rsqrt(mean(x[t, :]^2) + eps) * w. x, out: [T, D].
void rmsnorm_f32(Rows<const float> x, WeightRef w, float eps, Rows<float> out, int64_t T, int64_t D, int threads);

// g = y * silu(z); out = g * rsqrt(mean over its group of g^2 + eps) * w, groups of `group_size` channels.
void gated_rmsnorm_f32(Rows<const float> y, Rows<const float> z, WeightRef w, int64_t group_size, float eps,
                       Rows<float> out, int64_t T, int64_t D, int threads);

// acc[t, :] += x[t, :]. [T, D].
void add_inplace_f32(Rows<float> acc, Rows<const float> x, int64_t T, int64_t D, int threads);

// MLP activations and scaling (activations.cpp). x, gate, up, out: [T, D].
void relu2_f32(Rows<float> x, int64_t T, int64_t D, int threads);  // x = relu(x)^2
void silu_mul_f32(Rows<const float> gate, Rows<const float> up, Rows<float> out, int64_t T, int64_t D, int threads);
void scale_f32(Rows<float> x, float alpha, int64_t T, int64_t D, int threads);

// out[t, :] = table[ids[t], :] as f32. table: [V, D] contiguous in any float dtype. Throws on an id outside [0, V).
void embed_f32(WeightRef table, int64_t V, const int32_t* ids, Rows<float> out, int64_t T, int64_t D, int threads);

// select_top_k (backend.h) on rows of logits [n, V] whose requests passed check_top_k_requests; limits[r] is row r's
// limit in effect (select_top_k.cpp).
void select_top_k_f32(Rows<float> logits, std::span<const TopKRequest> requests, std::span<const int64_t> limits,
                      std::vector<TopKCandidates>& out, int threads);

}  // namespace mambacpp::cpu
