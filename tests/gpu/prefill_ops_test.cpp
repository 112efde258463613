// CUDA backend, the 16-byte row kernels of prefill (norms.cu rmsnorm_vec_kernel, elementwise.cu add_vec_kernel)
// against plain fp64 loops: rows whose stride and offset keep 16-byte alignment take them, at prefill shapes
// (mamba2-2.7b's d_model 2560 and d_inner 5120, group-wise norms with 8 groups, the largest row a block holds
// (16384) and one past it (the scalar kernel), rows that do not fill the last warp), in place and into a
// NaN-poisoned output. ops_test.cpp covers the scalar kernels with unaligned strided views.
// Tolerance: f32 arithmetic with f32 accumulation, as ops_test.cpp: 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::rel_err;

constexpr double kF32Tol = 1e-5;

TEST(CudaPrefillOps, RmsNormOnAlignedRows) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  Rng rng(31);
  for (int64_t D : {4, 52, 2560, 16384, 16388}) {
    DeviceArena arena(*be);
    const int64_t T = 33, W = D + 12;
    const auto x = rng.vec(static_cast<size_t>(T * D), -3.0f, 3.0f);
    const auto w = rng.vec(static_cast<size_t>(D), 0.5f, 1.5f);
    const float eps = 1e-5f;
    TensorView xv = arena.upload_strided(x, T, D, W, 8);
    TensorView wv = arena.upload(w, DType::F32, {D});
    TensorView out = arena.poisoned({T, D});
    be->rmsnorm(xv, wv, eps, out);
    const auto ref = gputest::gated_rmsnorm_ref(x, nullptr, w, T, D, D, eps);
    EXPECT_LT(rel_err(arena.download(out), ref), kF32Tol) << "D=" << D;
    be->rmsnorm(xv, wv, eps, xv);
    EXPECT_LT(rel_err(arena.download(xv), ref), kF32Tol) << "in place, D=" << D;
  }
}

TEST(CudaPrefillOps, GatedRmsNormOnAlignedRows) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  Rng rng(32);
  struct Case {
    int64_t D, group;
  };
  for (const Case c : {Case{5120, 5120}, Case{5120, 640}, Case{96, 24}, Case{16384, 16384}, Case{16400, 16400}}) {
    DeviceArena arena(*be);
    const int64_t T = 19;
    const auto y = rng.vec(T * c.D, -2, 2), z = rng.vec(T * c.D, -3, 3), w = rng.vec(c.D, 0.5f, 1.5f);
    const float eps = 1e-5f;
    TensorView yv = arena.upload_strided(y, T, c.D, c.D + 4, 4);
    TensorView zv = arena.upload_strided(z, T, c.D, 2 * c.D + 8, c.D);
    TensorView out = arena.poisoned({T, c.D});
    be->gated_rmsnorm(yv, zv, arena.upload(w, DType::F32, {c.D}), c.group, eps, out);
    EXPECT_LT(rel_err(arena.download(out), gputest::gated_rmsnorm_ref(y, &z, w, T, c.D, c.group, eps)), kF32Tol)
        << "D " << c.D << " group " << c.group;
  }
}

TEST(CudaPrefillOps, AddInplaceOnAlignedRows) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  DeviceArena arena(*be);
  Rng rng(33);
  for (int64_t D : {4, 2560, 1000}) {
    const int64_t T = 70;
    const auto a = rng.vec(T * D), b = rng.vec(T * D);
    TensorView av = arena.upload_strided(a, T, D, D + 4, 4);
    TensorView bv = arena.upload_strided(b, T, D, D, 0);
    be->add_inplace(av, bv);
    std::vector<double> ref;
    for (int64_t i = 0; i < T * D; ++i) ref.push_back(double(a[i]) + b[i]);
    EXPECT_LT(rel_err(arena.download(av), ref), 1e-7) << "D=" << D;  // one f32 rounding per element
  }
}

}  // namespace
}  // namespace mambacpp
