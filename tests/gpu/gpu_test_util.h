// Helpers for the CUDA backend tests: skipping without a GPU, random inputs, uploading host values as device views
// (optionally as strided column slices of a wider buffer), rounding host values to a storage dtype so that fp64
// references see exactly what the kernels see, and the error measure max|got - ref| / max|ref| (NaN never passes).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/weight.h"
#include "mambacpp/dtype.h"
#include "mambacpp/tensor.h"

namespace mambacpp::gputest {

// GPU tests fail (never skip) without a GPU; CI leaves them out by their CTest label (ctest -LE gpu).
#define MAMBACPP_REQUIRE_GPU() \
  ASSERT_TRUE(::mambacpp::cuda_available()) << "the GPU tests need a usable CUDA GPU (ctest -LE gpu leaves them out)"

// max|got - ref| / max|ref| over all elements; +inf on any NaN/inf or a size mismatch.
inline double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    if (!std::isfinite(g) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(g - ref[i]));
    mag = std::max(mag, std::fabs(ref[i]));
  }
  if (mag == 0.0) return err == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return err / mag;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  std::vector<float> vec(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(lo, hi);
    return v;
  }
  int64_t index(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(gen_); }

 private:
  std::mt19937_64 gen_;
};

// The values as stored in dtype t (f32 unchanged; f16/bf16 rounded to nearest even).
inline std::vector<float> rounded(const std::vector<float>& v, DType t) {
  if (t == DType::F32) return v;
  std::vector<uint16_t> bits(v.size());
  convert_from_f32(v.data(), bits.data(), t, static_cast<int64_t>(v.size()));
  std::vector<float> out(v.size());
  convert_to_f32(bits.data(), t, out.data(), static_cast<int64_t>(v.size()));
  return out;
}

// fp64 reference of the (gated) RMSNorm per group of `group` features: y * silu(z) when z is given, else y.
inline std::vector<double> gated_rmsnorm_ref(const std::vector<float>& y, const std::vector<float>* z,
                                             const std::vector<float>& w, int64_t T, int64_t D, int64_t group,
                                             float eps) {
  std::vector<double> ref(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g0 = 0; g0 < D; g0 += group) {
      double ss = 0;
      std::vector<double> g(static_cast<size_t>(group));
      for (int64_t i = 0; i < group; ++i) {
        const double yy = y[t * D + g0 + i];
        if (z) {
          const double zz = (*z)[t * D + g0 + i];
          g[i] = yy * zz / (1.0 + std::exp(-zz));
        } else {
          g[i] = yy;
        }
        ss += g[i] * g[i];
      }
      const double s = 1.0 / std::sqrt(ss / group + eps);
      for (int64_t i = 0; i < group; ++i) ref[t * D + g0 + i] = g[i] * s * w[g0 + i];
    }
  return ref;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Owns the device buffers of one test and makes views of them.
class DeviceArena {
 public:
  explicit DeviceArena(Backend& backend) : backend_(backend) {}

  // Uploads `values` stored as dtype `t` with the given shape (contiguous).
  TensorView upload(const std::vector<float>& values, DType t, std::initializer_list<int64_t> dims) {
    TensorView v(nullptr, t, dims, Device::CUDA);
    EXPECT_EQ(static_cast<size_t>(v.numel()), values.size());
    v.data = alloc(v.nbytes());
    put(v.data, values, t);
    return v;
  }

  // A [rows, cols] f32 view that is the column slice [offset, offset + cols) of a [rows, width] buffer, holding
  // `values` (row-major [rows, cols]); the other columns hold `fill`.
  TensorView upload_strided(const std::vector<float>& values, int64_t rows, int64_t cols, int64_t width,
                            int64_t offset, float fill = 1e30f) {
    std::vector<float> wide(static_cast<size_t>(rows * width), fill);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) wide[static_cast<size_t>(r * width + offset + c)] = values[static_cast<size_t>(r * cols + c)];
    TensorView full = upload(wide, DType::F32, {rows, width});
    return full.cols(offset, cols);
  }

  // An output filled with NaN, so unwritten elements fail the comparison.
  TensorView poisoned(std::initializer_list<int64_t> dims) {
    TensorView v(nullptr, DType::F32, dims, Device::CUDA);
    v.data = alloc(v.nbytes());
    put(v.data, std::vector<float>(static_cast<size_t>(v.numel()), std::nanf("")), DType::F32);
    return v;
  }

  // Reads a (possibly strided) f32 2-D view, or any contiguous view, as floats (bf16 converted).
  std::vector<float> download(const TensorView& v) {
    if (v.ndim == 2 && !v.contiguous()) {
      const int64_t rows = v.dim(0), cols = v.dim(1), stride = v.stride0();
      std::vector<float> wide(static_cast<size_t>((rows - 1) * stride + cols));
      backend_.copy_to_host(wide.data(), v.data, wide.size() * sizeof(float));
      std::vector<float> out(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(r * cols + c)] = wide[static_cast<size_t>(r * stride + c)];
      return out;
    }
    std::vector<unsigned char> raw(v.nbytes());
    backend_.copy_to_host(raw.data(), v.data, raw.size());
    std::vector<float> out(static_cast<size_t>(v.numel()));
    convert_to_f32(raw.data(), v.dtype, out.data(), v.numel());
    return out;
  }

  void* alloc(size_t bytes) {
    buffers_.emplace_back(backend_, bytes);
    return buffers_.back().data();
  }

 private:
  void put(void* dst, const std::vector<float>& values, DType t) {
    std::vector<unsigned char> raw(values.size() * dtype_size(t));
    convert_from_f32(values.data(), raw.data(), t, static_cast<int64_t>(values.size()));
    backend_.copy_from_host(dst, raw.data(), raw.size());
  }

  Backend& backend_;
  std::vector<DeviceBuffer> buffers_;
};

// A packed batch: sequences laid out in order, each with its own slot.
inline BatchLayout make_batch(const std::vector<int64_t>& lens, const std::vector<int64_t>& slots) {
  BatchLayout b;
  int64_t start = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    b.seqs.push_back({start, lens[i], slots[i]});
    start += lens[i];
  }
  b.total_tokens = start;
  return b;
}

// Row r of a T-row linear is the bits of the 1-row product of that row alone, for T = 1..max_rows (the GEMVs' batch
// invariance); `what` names the case in failures.
inline void expect_rows_independent_of_row_count(Backend& be, const Weight& w, int64_t out, int64_t in,
                                                 int64_t max_rows, Rng& rng, const std::string& what) {
  DeviceArena arena(be);
  const auto x = rng.vec(static_cast<size_t>(max_rows * in));
  std::vector<std::vector<float>> alone(static_cast<size_t>(max_rows));
  for (int64_t r = 0; r < max_rows; ++r) {
    const std::vector<float> xr(x.begin() + r * in, x.begin() + (r + 1) * in);
    const TensorView yv = arena.poisoned({1, out});
    be.linear(arena.upload(xr, DType::F32, {1, in}), w, TensorView(), yv);
    alone[static_cast<size_t>(r)] = arena.download(yv);
  }
  for (int64_t T = 1; T <= max_rows; ++T) {
    const std::vector<float> xs(x.begin(), x.begin() + T * in);
    const TensorView yv = arena.poisoned({T, out});
    be.linear(arena.upload(xs, DType::F32, {T, in}), w, TensorView(), yv);
    const auto y = arena.download(yv);
    const size_t row_bytes = static_cast<size_t>(out) * sizeof(float);
    for (int64_t r = 0; r < T; ++r)
      EXPECT_EQ(std::memcmp(&y[r * out], alone[static_cast<size_t>(r)].data(), row_bytes), 0)
          << what << ": row " << r << " of " << T << " differs from the row alone";
  }
}

}  // namespace mambacpp::gputest
