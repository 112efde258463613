// The fp8 prefill GEMM (backend/cuda/quant_fp8_gemm.cpp, quant_fp8_act.cu; fast precision, fp8 weights, more rows
// than the GEMV takes, behind MAMBACPP_FP8_PREFILL_GEMM=1 while it is measured): x's rows quantized to e4m3 with one
// scale per row, the FP8 tensor-core GEMM, the row and channel scales and the bias applied after.
// - Against fp64 over the same quantized operands (the host's fp8_quantize_rows gives the bytes the device must
//   give): the tensor cores multiply e4m3 values exactly, and cuBLASLt's FP8 accumulation (promoted to f32 at
//   intervals, FAST_ACCUM off) leaves ~2^-14 relative per partial sum: 1e-3 of each row's largest value, per row, so a
//   row of tiny activations (1e-3) or an all-zero row is checked on its own scale. A wrong scale, byte or row moves
//   results by O(1).
// - Against fp64 over the unquantized x: e4m3 keeps 3 mantissa bits (2^-4 relative per element), which moves a dot of
//   n random terms by ~2^-4 / sqrt(3) / sqrt(n) of its terms' norm: 5e-2 per row.
// - A row's bits at T = 64, 301 and 1000 rows: the same (one algorithm per weight shape).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "core/fp8.h"
#include "core/weight.h"
#include "gpu/gpu_test_util.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;

// Sets MAMBACPP_FP8_PREFILL_GEMM=1 for the test's lifetime.
struct Fp8GemmOn {
  Fp8GemmOn() { setenv("MAMBACPP_FP8_PREFILL_GEMM", "1", 1); }
  ~Fp8GemmOn() { unsetenv("MAMBACPP_FP8_PREFILL_GEMM"); }
};

struct Shape {
  int64_t out, in;
  bool per_tensor;
};

// The rows checked against the fp64 references (the host loops would take minutes over every row): the first 17,
// every 37th, the last.
std::vector<int64_t> checked_rows(int64_t T) {
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < T; ++t)
    if (t < 17 || t % 37 == 0 || t == T - 1) rows.push_back(t);
  return rows;
}

// Over the checked rows, the bias taken off both sides (so a row of tiny activations is measured on its own scale):
// max |got - ref| / max |ref| of each row (+inf on NaN; an all-zero reference row must be matched exactly). ref holds
// the checked rows only, in order, without the bias.
double worst_row_err(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<int64_t>& rows,
                     const std::vector<float>& bias, int64_t out) {
  double worst = 0.0;
  for (size_t k = 0; k < rows.size(); ++k) {
    double err = 0.0, mag = 0.0;
    for (int64_t o = 0; o < out; ++o) {
      const double g = double(got[rows[k] * out + o]) - bias[o], r = ref[k * out + o];
      if (!std::isfinite(g)) return INFINITY;
      err = std::max(err, std::fabs(g - r));
      mag = std::max(mag, std::fabs(r));
    }
    worst = std::max(worst, mag > 0 ? err / mag : (err == 0 ? 0.0 : INFINITY));
  }
  return worst;
}

TEST(CudaFp8Prefill, MatchesFp64OverTheQuantizedOperandsAndRowsDoNotDependOnT) {
  MAMBACPP_REQUIRE_GPU();
  Fp8GemmOn on;
  auto be = make_cuda_backend(DType::BF16, Precision::Fast);
  Rng rng(71);
  for (const Shape& s : {Shape{304, 2560, false}, Shape{512, 1024, true}, Shape{2560, 5120, false}}) {
    // Weights: fp8 with per-channel (or one) scale, rows of different magnitudes.
    std::vector<float> wf(static_cast<size_t>(s.out * s.in));
    for (int64_t o = 0; o < s.out; ++o) {
      const float mag = o % 5 == 0 ? 2.0f : 0.05f;
      for (int64_t i = 0; i < s.in; ++i) wf[o * s.in + i] = rng.uniform(-mag, mag);
    }
    std::vector<uint8_t> wq(wf.size());
    std::vector<float> ws(static_cast<size_t>(s.out));
    fp8_quantize_rows(wf.data(), s.out, s.in, wq.data(), ws.data());
    if (s.per_tensor) {
      const float m = *std::max_element(ws.begin(), ws.end());
      for (size_t k = 0; k < wf.size(); ++k) wq[k] = fp8_e4m3_from_float(wf[k] / m);
      ws.assign(1, m);
    }
    const Weight host = Weight::packed(WeightFormat::FP8_E4M3, wq.data(), {s.out, s.in}, Device::CPU,
                                       TensorView(ws.data(), DType::F32, {static_cast<int64_t>(ws.size())}));
    const Weight dw = be->adopt_matrix(host);
    const auto bias = rng.vec(static_cast<size_t>(s.out));
    const TensorView db = be->adopt_weight(TensorView(const_cast<float*>(bias.data()), DType::F32, {s.out}));
    auto w_at = [&](int64_t o, int64_t i) {
      return double(ws[s.per_tensor ? 0 : o]) * fp8_e4m3_to_float(wq[o * s.in + i]);
    };

    constexpr int64_t kMaxT = 1000;
    std::vector<float> x = rng.vec(static_cast<size_t>(kMaxT * s.in), -2.0f, 2.0f);
    for (int64_t i = 0; i < s.in; ++i) x[3 * s.in + i] *= 1e-3f;  // a row of tiny activations
    for (int64_t i = 0; i < s.in; ++i) x[5 * s.in + i] = 0.0f;    // an all-zero row
    std::vector<uint8_t> xq(x.size());
    std::vector<float> xs(static_cast<size_t>(kMaxT));
    fp8_quantize_rows(x.data(), kMaxT, s.in, xq.data(), xs.data());

    std::vector<float> first;  // the first 17 rows at T = 64, for the invariance check
    for (int64_t T : {17, 64, 301, 1000}) {
      const std::vector<int64_t> rows = checked_rows(T);
      std::vector<double> ref_q(rows.size() * static_cast<size_t>(s.out)), ref_x(ref_q.size());
      for (size_t k = 0; k < rows.size(); ++k)
        for (int64_t o = 0; o < s.out; ++o) {
          const int64_t t = rows[k];
          double dq = 0, dx = 0;
          for (int64_t i = 0; i < s.in; ++i) {
            const double w = w_at(o, i);
            dq += double(fp8_e4m3_to_float(xq[t * s.in + i])) * w;
            dx += double(x[t * s.in + i]) * w;
          }
          ref_q[k * s.out + o] = dq * xs[t];
          ref_x[k * s.out + o] = dx;
        }
      DeviceArena arena(*be);
      const std::vector<float> xt(x.begin(), x.begin() + T * s.in);
      const TensorView yv = arena.poisoned({T, s.out});
      be->linear(arena.upload(xt, DType::F32, {T, s.in}), dw, db, yv);
      const auto got = arena.download(yv);
      const double eq = worst_row_err(got, ref_q, rows, bias, s.out),
                   ex = worst_row_err(got, ref_x, rows, bias, s.out);
      std::printf("[fp8-prefill] [%lld, %lld]%s T %4lld: worst row err vs quantized operands %.2e, vs f32 x %.2e\n",
                  static_cast<long long>(s.out), static_cast<long long>(s.in), s.per_tensor ? " per-tensor" : "",
                  static_cast<long long>(T), eq, ex);
      EXPECT_LT(eq, 1e-3) << s.out << "x" << s.in << " T " << T;
      EXPECT_LT(ex, 5e-2) << s.out << "x" << s.in << " T " << T;
      if (T == 17) continue;  // 17 rows may take another algorithm than the prompts' (cuBLASLt's choice at T)
      const std::vector<float> head(got.begin(), got.begin() + 17 * s.out);
      if (first.empty())
        first = head;
      else
        EXPECT_EQ(std::memcmp(first.data(), head.data(), head.size() * 4), 0)
            << s.out << "x" << s.in << ": the first rows at T " << T << " differ from those at T 64";
    }
  }
}

}  // namespace
}  // namespace mambacpp
