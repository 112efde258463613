// CUDA backend, row-wise ops (embed, to_f32, rmsnorm, add_inplace, linear, gated_rmsnorm, gather_rows) against
// plain fp64 loops on the host, on fresh random inputs at odd and real shapes, with strided views and NaN-poisoned
// outputs. Weights are rounded to their storage dtype on the host first, so each reference computes exactly the
// function the kernel should: the tolerances below measure the kernels' own f32 arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::rel_err;
using gputest::rounded;

// f32 arithmetic with f32 accumulation over at most a few thousand terms: ~1e-6 relative in practice; 1e-5 leaves
// room for accumulation order without hiding an indexing error (those show up at O(1)).
constexpr double kF32Tol = 1e-5;

TEST(CudaOps, EmbedGathersRowsOfEveryWeightDtype) {
  MAMBACPP_REQUIRE_GPU();
  for (DType wd : {DType::F32, DType::BF16, DType::F16}) {
    auto be = make_cuda_backend(wd);
    DeviceArena arena(*be);
    Rng rng(11);
    const int64_t V = 37, D = 29, T = 11;
    const auto table = rng.vec(static_cast<size_t>(V * D));
    TensorView host_table(const_cast<float*>(table.data()), DType::F32, {V, D});
    TensorView dev_table = be->adopt_weight(host_table);
    EXPECT_EQ(dev_table.dtype, wd);  // matrices take the backend's weight dtype
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < T; ++t) ids.push_back(static_cast<int32_t>(rng.index(V)));
    TensorView dev_ids(arena.alloc(ids.size() * 4), DType::I32, {T}, Device::CUDA);
    be->copy_from_host(dev_ids.data, ids.data(), ids.size() * 4);
    TensorView out = arena.poisoned({T, D});
    be->embed(dev_table, dev_ids, out);
    const auto table_r = rounded(table, wd);
    std::vector<double> ref;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) ref.push_back(table_r[static_cast<size_t>(ids[static_cast<size_t>(t)] * D + d)]);
    EXPECT_EQ(rel_err(arena.download(out), ref), 0.0) << dtype_name(wd);  // a gather is exact
  }
}

TEST(CudaOps, ToF32ConvertsStridedSixteenBitRows) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  DeviceArena arena(*be);
  Rng rng(12);
  for (DType t : {DType::BF16, DType::F16, DType::F32}) {
    const int64_t R = 7, C = 13, W = 20;
    const auto vals = rng.vec(static_cast<size_t>(R * W), -100.0f, 100.0f);
    TensorView src = arena.upload(vals, t, {R, W}).cols(3, C);
    TensorView out = arena.poisoned({R, C});
    be->to_f32(src, out);
    const auto r = rounded(vals, t);
    std::vector<double> ref;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < C; ++c) ref.push_back(r[static_cast<size_t>(i * W + 3 + c)]);
    EXPECT_EQ(rel_err(arena.download(out), ref), 0.0) << dtype_name(t);  // widening is exact
  }
}

TEST(CudaOps, RmsNormMatchesFp64OnStridedRows) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  DeviceArena arena(*be);
  Rng rng(13);
  for (int64_t D : {1, 37, 1000, 4096}) {
    const int64_t T = 5, W = D + 9;
    const auto x = rng.vec(static_cast<size_t>(T * D), -3.0f, 3.0f);
    const auto w = rng.vec(static_cast<size_t>(D), 0.5f, 1.5f);
    const float eps = 1e-5f;
    TensorView xv = arena.upload_strided(x, T, D, W, 4);
    TensorView out = arena.poisoned({T, D});
    be->rmsnorm(xv, arena.upload(w, DType::F32, {D}), eps, out);
    std::vector<double> ref;
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += double(x[t * D + d]) * x[t * D + d];
      const double s = 1.0 / std::sqrt(ss / D + eps);
      for (int64_t d = 0; d < D; ++d) ref.push_back(x[t * D + d] * s * w[d]);
    }
    EXPECT_LT(rel_err(arena.download(out), ref), kF32Tol) << "D=" << D;
    // In place (out aliases x) gives the same result.
    be->rmsnorm(xv, arena.upload(w, DType::F32, {D}), eps, xv);
    EXPECT_LT(rel_err(arena.download(xv), ref), kF32Tol) << "in place, D=" << D;
  }
}

TEST(CudaOps, AddInplaceOnStridedViews) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  DeviceArena arena(*be);
  Rng rng(14);
  const int64_t T = 9, D = 77;
  const auto a = rng.vec(T * D), b = rng.vec(T * D);
  TensorView av = arena.upload_strided(a, T, D, 100, 5);
  TensorView bv = arena.upload_strided(b, T, D, 90, 1);
  be->add_inplace(av, bv);
  std::vector<double> ref;
  for (int64_t i = 0; i < T * D; ++i) ref.push_back(double(a[i]) + b[i]);
  EXPECT_LT(rel_err(arena.download(av), ref), 1e-7);  // one f32 rounding per element
}

// linear: every weight dtype, GEMV sizes (T <= 8) and GEMM sizes, vectorised (in % 8 == 0) and scalar GEMV paths,
// strided x and y, with and without bias.
// Tolerance: the GEMV sums exact products in f32; the GEMM path's hi/lo split leaves |r| <= 2^-17 |x| (bf16) per
// activation and accumulates in f32. Both land ~1e-6 relative; 2e-5 bounds accumulation over in = 1536 terms.
TEST(CudaOps, LinearMatchesFp64ForEveryWeightDtypeAndRowCount) {
  MAMBACPP_REQUIRE_GPU();
  struct Shape { int64_t in, out; };
  for (DType wd : {DType::F32, DType::BF16, DType::F16}) {
    auto be = make_cuda_backend(wd);
    Rng rng(15);
    for (Shape s : {Shape{768, 1000}, Shape{37, 53}, Shape{1536, 24}}) {
      for (int64_t T : {1, 2, 3, 8, 9, 64, 301}) {
        for (bool with_bias : {false, true}) {
          for (bool strided : {false, true}) {
            DeviceArena arena(*be);
            const auto x = rng.vec(static_cast<size_t>(T * s.in));
            const auto w = rng.vec(static_cast<size_t>(s.out * s.in), -0.1f, 0.1f);
            const auto bias = rng.vec(static_cast<size_t>(s.out));
            TensorView hw(const_cast<float*>(w.data()), DType::F32, {s.out, s.in});
            TensorView dw = be->adopt_weight(hw);
            TensorView hb(const_cast<float*>(bias.data()), DType::F32, {s.out});
            TensorView db = with_bias ? be->adopt_weight(hb) : TensorView();
            TensorView xv = strided ? arena.upload_strided(x, T, s.in, s.in + 5, 3) : arena.upload(x, DType::F32, {T, s.in});
            TensorView yv = strided ? arena.upload_strided(std::vector<float>(T * s.out, std::nanf("")), T, s.out, s.out + 3, 2)
                                    : arena.poisoned({T, s.out});
            be->linear(xv, dw, db, yv);
            const auto wr = rounded(w, wd);
            std::vector<double> ref(static_cast<size_t>(T * s.out));
            for (int64_t t = 0; t < T; ++t)
              for (int64_t o = 0; o < s.out; ++o) {
                double acc = with_bias ? bias[o] : 0.0;
                for (int64_t i = 0; i < s.in; ++i) acc += double(x[t * s.in + i]) * wr[o * s.in + i];
                ref[t * s.out + o] = acc;
              }
            EXPECT_LT(rel_err(arena.download(yv), ref), 2e-5)
                << dtype_name(wd) << " in=" << s.in << " out=" << s.out << " T=" << T << " bias=" << with_bias
                << " strided=" << strided;
          }
        }
      }
    }
  }
}

TEST(CudaOps, GatedRmsNormPerGroup) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  Rng rng(16);
  const int64_t T = 7, D = 96;
  for (int64_t group : {96, 32, 24, 1}) {
    DeviceArena arena(*be);
    const auto y = rng.vec(T * D, -2, 2), z = rng.vec(T * D, -3, 3), w = rng.vec(D, 0.5f, 1.5f);
    const float eps = 1e-5f;
    TensorView yv = arena.upload_strided(y, T, D, 200, 50);
    TensorView zv = arena.upload_strided(z, T, D, 300, 7);
    TensorView out = arena.poisoned({T, D});
    be->gated_rmsnorm(yv, zv, arena.upload(w, DType::F32, {D}), group, eps, out);
    const std::vector<double> ref = gputest::gated_rmsnorm_ref(y, &z, w, T, D, group, eps);
    EXPECT_LT(rel_err(arena.download(out), ref), kF32Tol) << "group " << group;
  }
}

TEST(CudaOps, GatherRowsCopiesRequestedRowsAndRejectsBadOnes) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  DeviceArena arena(*be);
  Rng rng(17);
  const int64_t R = 8, C = 33;
  const auto x = rng.vec(R * C);
  TensorView xv = arena.upload(x, DType::F32, {R, C});
  const std::vector<int64_t> rows = {3, 0, 7, 3};
  TensorView out = arena.poisoned({4, C});
  be->gather_rows(xv, rows.data(), 4, out);
  std::vector<double> ref;
  for (int64_t r : rows)
    for (int64_t c = 0; c < C; ++c) ref.push_back(x[r * C + c]);
  EXPECT_EQ(rel_err(arena.download(out), ref), 0.0);
  const std::vector<int64_t> bad = {8};
  EXPECT_THROW(be->gather_rows(xv, bad.data(), 1, out), Error);
}

TEST(CudaOps, AvailabilityProbeIsRepeatableAndBackendDescribesItself) {
  MAMBACPP_REQUIRE_GPU();
  EXPECT_TRUE(cuda_available());  // a second probe after the first must still succeed (no sticky error)
  auto be = make_cuda_backend(DType::BF16);
  EXPECT_EQ(be->device(), Device::CUDA);
  EXPECT_NE(be->description().find("sm_"), std::string::npos) << be->description();
  EXPECT_THROW(make_cuda_backend(DType::I32), Error);
}

}  // namespace
}  // namespace mambacpp

// Without a GPU, --device cuda is refused with a clear message: tests/model_errors_test.cpp
// (DeviceChoice.CudaIsUsedWhenUsableAndRefusedClearlyOtherwise), which runs in the CPU suite.
