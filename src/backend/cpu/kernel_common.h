// Building blocks shared by the CPU kernels: strided row views over raw pointers, a weight accessor that reads
// f32/f16/bf16/f64 storage as the compute type T, and the scalar activations (softplus, SiLU).
// The kernels are templates on T so that the tests can run the very same algorithms in fp64 against plain
// sequential references; the backend instantiates them with float.
#pragma once

#include <cmath>
#include <cstdint>

#include "mambacpp/dtype.h"

namespace mambacpp::cpu {

// Rows of a 2-D activation: row t starts at data + t * stride (stride in elements, >= the row length).
template <class T>
struct Rows {
  T* data = nullptr;
  int64_t stride = 0;
  T* operator[](int64_t t) const { return data + t * stride; }
};

// A weight tensor in its stored dtype. `data == nullptr` means "absent" (an optional bias).
struct WeightRef {
  const void* data = nullptr;
  DType dtype = DType::F32;

  bool present() const { return data != nullptr; }
};

// Element i of a weight as T. f64 storage is read without going through float, so fp64 tests keep full precision.
template <class T>
inline T weight_at(const WeightRef& w, int64_t i) {
  if (w.dtype == DType::F64) return static_cast<T>(static_cast<const double*>(w.data)[i]);
  return static_cast<T>(load_as_f32(w.data, w.dtype, i));
}

// Elements [offset, offset + n) of a weight as T into dst.
template <class T>
inline void weight_load(const WeightRef& w, int64_t offset, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = weight_at<T>(w, offset + i);
}

// softplus(v) = log(1 + exp(v)), returning v itself above 20 as torch.nn.functional.softplus does (threshold 20).
template <class T>
inline T softplus(T v) {
  return v > T(20) ? v : std::log1p(std::exp(v));
}

// silu(v) = v * sigmoid(v).
template <class T>
inline T silu(T v) {
  return v / (T(1) + std::exp(-v));
}

}  // namespace mambacpp::cpu
