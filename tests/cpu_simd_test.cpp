// The vector kernels of src/backend/cpu/simd.h against plain fp64 references, on every SIMD target this machine and
// build have (each forced in turn), over sizes that are not multiples of any vector width (tails of 1..15 lanes).
// Tolerances come from the f32 error model, with u = 2^-24 the unit roundoff:
// - a dot product of n terms summed in any order is within (n + 1) u sum|x_i w_i| of the exact value (Higham 3.1;
//   the 16 lanes' tree adds log2(16) levels, inside the + 16 kept below);
// - Highway's Exp and Log1p are within 4 ulp; a state update chains at most 8 such roundings: 64 u of the terms'
//   magnitudes bounds it with margin;
// - a bf16 state element is the f32 result rounded once more: 2^-8 relative.
// A NaN never passes: every check is `error <= bound`.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"
#include "mambacpp/dtype.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

namespace simd = cpu::simd;
constexpr double kU = 0x1p-24;

// Runs body once per available target, forced, and returns to the best one afterwards.
template <class F>
void on_every_target(F&& body) {
  const std::vector<std::string> targets = simd::available_targets();
  ASSERT_FALSE(targets.empty());
  for (const std::string& t : targets) {
    SCOPED_TRACE("SIMD target " + t);
    simd::force_target(t);
    EXPECT_EQ(simd::target_name(), t);
    body();
  }
  simd::force_target("");
}

std::vector<float> uniform(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Weights stored as `dt`, and their exact f32 values (what the kernel must see).
struct StoredWeights {
  std::vector<uint16_t> half;
  std::vector<float> f32;
  const void* data(DType dt) const { return dt == DType::F32 ? static_cast<const void*>(f32.data()) : half.data(); }
};
StoredWeights stored(const std::vector<float>& v, DType dt) {
  StoredWeights w;
  w.f32 = v;
  if (dt == DType::F32) return w;
  w.half.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    w.half[i] = dt == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    w.f32[i] = dt == DType::BF16 ? bf16_to_f32(w.half[i]) : f16_to_f32(w.half[i]);
  }
  return w;
}

TEST(CpuSimd, TargetsAreReportedAndForcible) {
  const std::vector<std::string> targets = simd::available_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(simd::target_name(), targets.front());  // the best one by default
  EXPECT_THROW(simd::force_target("NO_SUCH_TARGET"), Error);
  EXPECT_EQ(simd::target_name(), targets.front());  // a failed force changes nothing
}

TEST(CpuSimd, DotRowsMatchesFp64OverOddShapes) {
  on_every_target([] {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      for (int64_t in : {1, 3, 7, 8, 13, 17, 31, 67, 300, 769}) {
        for (int64_t rows : {1, 3, 4, 5, 11}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " in=" + std::to_string(in) + " rows=" + std::to_string(rows));
          const std::vector<float> x = uniform(static_cast<size_t>(in), 7 + in);
          const StoredWeights w = stored(uniform(static_cast<size_t>(in * rows), 11 + in * rows), dt);
          std::vector<float> out(static_cast<size_t>(rows), -1.0f);
          simd::dot_rows(x.data(), w.data(dt), dt, in, rows, out.data());
          for (int64_t r = 0; r < rows; ++r) {
            double want = 0.0, mag = 0.0;
            for (int64_t i = 0; i < in; ++i) {
              const double t = static_cast<double>(x[i]) * w.f32[static_cast<size_t>(r * in + i)];
              want += t;
              mag += std::fabs(t);
            }
            EXPECT_LE(std::fabs(out[static_cast<size_t>(r)] - want), (in + 16) * kU * mag) << "row " << r;
          }
          // A row's result does not depend on how many rows share the call.
          for (int64_t r = 0; r < rows; ++r) {
            float alone = 0.0f;
            simd::dot_rows(x.data(), static_cast<const char*>(w.data(dt)) + r * in * dtype_size(dt), dt, in, 1, &alone);
            EXPECT_EQ(alone, out[static_cast<size_t>(r)]) << "row " << r;
          }
        }
      }
    }
  });
}

// The prefill GEMM over packed rows gives dot_rows' bits for every element (the order is the shared contract), and
// hence the same fp64 bound; odd token and row counts exercise the zero-padded tiles, odd `in` the padded blocks and
// every split of the four accumulator chains.
TEST(CpuSimd, GemmPackedEqualsDotRowsBitForBit) {
  on_every_target([] {
    const int64_t MR = simd::gemm_tile_tokens(), NR = simd::gemm_tile_rows();
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      for (int64_t in : {1, 5, 8, 13, 31, 64, 67, 130}) {
        for (int64_t T : {1, 2, 5, 9}) {
          for (int64_t R : {1, 3, 4, 8}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " in=" + std::to_string(in) + " T=" + std::to_string(T) +
                         " R=" + std::to_string(R));
            const std::vector<float> x = uniform(static_cast<size_t>(T * in), 17 + in * T);
            const StoredWeights w = stored(uniform(static_cast<size_t>(R * in), 19 + in * R), dt);
            const int64_t Kp = simd::packed_row_floats(in);
            ASSERT_GE(Kp, in);
            const int64_t Tp = (T + MR - 1) / MR * MR, Rp = (R + NR - 1) / NR * NR;
            std::vector<float> xp(static_cast<size_t>(Tp * Kp), 0.0f), wp(static_cast<size_t>(Rp * Kp), 0.0f);
            simd::pack_rows(x.data(), DType::F32, in, T, in, xp.data());
            simd::pack_rows(w.data(dt), dt, in, R, in, wp.data());
            const int64_t ys = R + 2;  // a row stride wider than R: the gap must stay untouched
            std::vector<float> y(static_cast<size_t>(T * ys), -7.0f);
            simd::gemm_packed(xp.data(), T, wp.data(), R, in, y.data(), ys);
            for (int64_t t = 0; t < T; ++t) {
              std::vector<float> want(static_cast<size_t>(R));
              simd::dot_rows(x.data() + t * in, w.data(dt), dt, in, R, want.data());
              for (int64_t r = 0; r < R; ++r) {
                EXPECT_EQ(y[static_cast<size_t>(t * ys + r)], want[static_cast<size_t>(r)]) << "t " << t << " r " << r;
                double exact = 0.0, mag = 0.0;
                for (int64_t i = 0; i < in; ++i) {
                  const double p = static_cast<double>(x[static_cast<size_t>(t * in + i)]) * w.f32[static_cast<size_t>(r * in + i)];
                  exact += p;
                  mag += std::fabs(p);
                }
                EXPECT_LE(std::fabs(y[static_cast<size_t>(t * ys + r)] - exact), (in + 16) * kU * mag);
              }
              EXPECT_EQ(y[static_cast<size_t>(t * ys + R)], -7.0f);
              EXPECT_EQ(y[static_cast<size_t>(t * ys + R + 1)], -7.0f);
            }
          }
        }
      }
    }
  });
}

TEST(CpuSimd, DotRowsPropagatesNaN) {
  on_every_target([] {
    std::vector<float> x(19, 1.0f), w(19, 0.5f);
    x[18] = std::nanf("");  // in the tail
    float out = 0.0f;
    simd::dot_rows(x.data(), w.data(), DType::F32, 19, 1, &out);
    EXPECT_TRUE(std::isnan(out));
  });
}

TEST(CpuSimd, HalfToF32IsExactForEveryBitPattern) {
  std::vector<uint16_t> all(65536 + 5);  // + 5: a tail after the full vectors
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  on_every_target([&] {
    for (DType dt : {DType::BF16, DType::F16}) {
      std::vector<float> got(all.size());
      simd::to_f32(all.data(), dt, got.data(), static_cast<int64_t>(all.size()));
      int64_t bad = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        const float want = dt == DType::BF16 ? bf16_to_f32(all[i]) : f16_to_f32(all[i]);
        uint32_t a, b;
        std::memcpy(&a, &got[i], 4);
        std::memcpy(&b, &want, 4);
        const bool both_nan = std::isnan(got[i]) && std::isnan(want);
        if (a != b && !both_nan) ++bad;
      }
      EXPECT_EQ(bad, 0) << dtype_name(dt);
    }
  });
}

TEST(CpuSimd, SiluMatchesFp64) {
  std::vector<float> v = uniform(1003, 5, -30.0f, 30.0f);
  for (float e : {0.0f, -0.0f, 1e-30f, -87.0f, -100.0f, 88.0f, 200.0f, -1e30f}) v.push_back(e);
  on_every_target([&] {
    std::vector<float> got(v.size());
    simd::silu(v.data(), got.data(), static_cast<int64_t>(v.size()));
    for (size_t i = 0; i < v.size(); ++i) {
      const double x = v[i], want = x / (1.0 + std::exp(-x));
      // 4 ulp of exp, one division, one addition; below 1e-35 the capped exp leaves an absolute error.
      EXPECT_LE(std::fabs(got[i] - want), 8 * kU * std::fabs(want) + 1e-35) << "silu(" << v[i] << ")";
    }
  });
}

// The fp64 Mamba-2 decode step of one head.
void ssd_step_ref(std::vector<double>& H, const std::vector<float>& x, const std::vector<float>& B,
                  const std::vector<float>& C, double dt, double dA, double D, int64_t P, int64_t N,
                  std::vector<double>& y, std::vector<double>& h_mag, std::vector<double>& y_mag) {
  for (int64_t i = 0; i < P; ++i) {
    double acc = 0.0, mag = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      double& h = H[static_cast<size_t>(i * N + n)];
      h_mag[static_cast<size_t>(i * N + n)] = std::fabs(dA * h) + std::fabs(dt * x[i] * B[n]);
      h = dA * h + dt * x[i] * B[n];
      acc += h * C[n];
      mag += std::fabs(h * C[n]);
    }
    y[static_cast<size_t>(i)] = acc + D * x[i];
    y_mag[static_cast<size_t>(i)] = mag + std::fabs(D * x[i]);
  }
}

TEST(CpuSimd, SsdStepHeadMatchesFp64) {
  on_every_target([] {
    for (DType sdt : {DType::F32, DType::BF16}) {
      for (auto [P, N] : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {6, 13}, {5, 37}, {7, 128}, {2, 131}}) {
        SCOPED_TRACE(std::string(dtype_name(sdt)) + " P=" + std::to_string(P) + " N=" + std::to_string(N));
        const std::vector<float> x = uniform(static_cast<size_t>(P), 1), B = uniform(static_cast<size_t>(N), 2),
                                 C = uniform(static_cast<size_t>(N), 3);
        std::vector<float> h0 = uniform(static_cast<size_t>(P * N), 4, -3.0f, 3.0f);
        std::vector<uint16_t> h16(h0.size());
        for (size_t i = 0; i < h0.size(); ++i) {  // the kernel's input state, exactly representable in sdt
          h16[i] = f32_to_bf16(h0[i]);
          if (sdt == DType::BF16) h0[i] = bf16_to_f32(h16[i]);
        }
        std::vector<double> H(h0.begin(), h0.end()), y_ref(static_cast<size_t>(P)), h_mag(H.size()), y_mag(y_ref.size());
        const float dt = 0.07f, dA = 0.93f, D = 0.8f;
        ssd_step_ref(H, x, B, C, dt, dA, D, P, N, y_ref, h_mag, y_mag);
        std::vector<float> y(static_cast<size_t>(P));
        void* state = sdt == DType::F32 ? static_cast<void*>(h0.data()) : h16.data();
        simd::ssd_step_head(state, sdt, x.data(), B.data(), C.data(), dt, dA, D, P, N, y.data());
        for (size_t i = 0; i < H.size(); ++i) {
          const double got = sdt == DType::F32 ? h0[i] : bf16_to_f32(h16[i]);
          const double bound = sdt == DType::F32 ? 4 * kU * h_mag[i] : 0x1p-8 * std::fabs(H[i]) + 4 * kU * h_mag[i];
          EXPECT_LE(std::fabs(got - H[i]), bound) << "state " << i;
        }
        for (int64_t i = 0; i < P; ++i)
          EXPECT_LE(std::fabs(y[i] - y_ref[static_cast<size_t>(i)]), (N + 16) * kU * y_mag[static_cast<size_t>(i)])
              << "y " << i;
      }
    }
  });
}

TEST(CpuSimd, Mamba1StepMatchesFp64) {
  on_every_target([] {
    for (DType sdt : {DType::F32, DType::BF16}) {
      for (auto [n, N] : {std::pair<int64_t, int64_t>{1, 1}, {3, 6}, {9, 16}, {17, 19}, {33, 5}}) {
        SCOPED_TRACE(std::string(dtype_name(sdt)) + " n=" + std::to_string(n) + " N=" + std::to_string(N));
        const size_t cn = static_cast<size_t>(n), sn = static_cast<size_t>(n * N);
        const std::vector<float> x = uniform(cn, 1), dt_raw = uniform(cn, 2, -6.0f, 25.0f), dtb = uniform(cn, 3, -1, 0),
                                 B = uniform(static_cast<size_t>(N), 4), C = uniform(static_cast<size_t>(N), 5),
                                 D = uniform(cn, 6), z = uniform(cn, 7, -8, 8), A_log = uniform(sn, 8, 0.0f, 2.8f);
        std::vector<float> h0 = uniform(sn, 9, -3.0f, 3.0f);
        std::vector<uint16_t> h16(sn);
        for (size_t i = 0; i < sn; ++i) {
          h16[i] = f32_to_bf16(h0[i]);
          if (sdt == DType::BF16) h0[i] = bf16_to_f32(h16[i]);
        }
        std::vector<double> H(h0.begin(), h0.end());
        std::vector<float> y(cn), h0a = h0, ya(cn), A(sn);
        std::vector<uint16_t> h16a = h16;
        simd::mamba1_step(sdt == DType::F32 ? static_cast<void*>(h0.data()) : h16.data(), sdt, x.data(), dt_raw.data(),
                          dtb.data(), A_log.data(), B.data(), C.data(), D.data(), z.data(), n, N, y.data());
        // With A = -exp(A_log) made beforehand by neg_exp_rows: the same bits (the fp64 checks below then cover it).
        simd::neg_exp_rows(A_log.data(), n, N, A.data());
        simd::mamba1_step_a(sdt == DType::F32 ? static_cast<void*>(h0a.data()) : h16a.data(), sdt, x.data(),
                            dt_raw.data(), dtb.data(), A.data(), B.data(), C.data(), D.data(), z.data(), n, N,
                            ya.data());
        EXPECT_EQ(std::memcmp(y.data(), ya.data(), cn * sizeof(float)), 0);
        EXPECT_TRUE(sdt == DType::F32 ? h0a == h0 : h16a == h16);
        for (size_t k = 0; k < sn; ++k)  // A itself against fp64: Highway's Exp, within 4 ulp
          EXPECT_LE(std::fabs(A[k] + std::exp(static_cast<double>(A_log[k]))),
                    4 * 2 * kU * std::exp(static_cast<double>(A_log[k])))
              << "A " << k;
        for (int64_t c = 0; c < n; ++c) {
          const double v = static_cast<double>(dt_raw[c]) + dtb[c];
          const double dtv = v > 20 ? v : std::log1p(std::exp(v));
          double acc = 0.0, mag = 0.0;
          for (int64_t j = 0; j < N; ++j) {
            const size_t k = static_cast<size_t>(c * N + j);
            const double dA = std::exp(dtv * -std::exp(static_cast<double>(A_log[k])));
            const double hm = std::fabs(dA * H[k]) + std::fabs(dtv * x[c] * B[j]);
            H[k] = dA * H[k] + dtv * x[c] * B[j];
            const double got = sdt == DType::F32 ? h0[k] : bf16_to_f32(h16[k]);
            const double bound = 64 * kU * hm + (sdt == DType::BF16 ? 0x1p-8 * std::fabs(H[k]) : 0.0);
            EXPECT_LE(std::fabs(got - H[k]), bound) << "state " << c << "," << j;
            acc += H[k] * C[j];
            mag += 64 * kU * hm * std::fabs(C[j]) + (N + 16) * kU * std::fabs(H[k] * C[j]);
          }
          const double gate = z[c] / (1.0 + std::exp(-static_cast<double>(z[c])));
          const double want = (acc + static_cast<double>(D[c]) * x[c]) * gate;
          const double bound = (mag + 16 * kU * (std::fabs(acc) + std::fabs(D[c] * x[c]))) * std::fabs(gate) +
                               8 * kU * std::fabs(want);
          EXPECT_LE(std::fabs(y[static_cast<size_t>(c)] - want), bound) << "y " << c;
        }
      }
    }
  });
}

// argmax_first against the scalar scan it replaced in select_top_k (strictly greater wins, so the lowest index of a
// tie; -0 == +0; -inf never picked; the first NaN or +inf reported), over lengths with every tail.
TEST(CpuSimd, ArgmaxFirstMatchesTheScalarScan) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  auto reference = [&](const std::vector<float>& x, int64_t* bad, int64_t* best) {
    *bad = *best = -1;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::isnan(x[i]) || x[i] == kInf) {
        *bad = static_cast<int64_t>(i);
        return;
      }
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != -kInf && (*best < 0 || x[i] > x[static_cast<size_t>(*best)])) *best = static_cast<int64_t>(i);
  };
  on_every_target([&] {
    std::mt19937_64 rng(7);
    for (int64_t n = 0; n <= 70; ++n) {
      for (int variant = 0; variant < 8; ++variant) {
        // Few distinct values, so ties are common; variants add -inf everywhere, zeros of both signs, a NaN or +inf.
        std::vector<float> x(static_cast<size_t>(n));
        for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 5)) - 2.0f;
        for (auto& v : x) {
          if (variant == 1 || variant == 2) v = -kInf;
          if (variant == 3 && v > 0.0f) v = rng() % 2 ? 0.0f : -0.0f;
        }
        if (variant == 2 && n > 0) x[rng() % x.size()] = -0.0f;
        if (variant >= 4 && n > 0) x[rng() % x.size()] = variant % 2 ? kInf : std::nanf("");
        if (variant == 6 && n > 0) x[rng() % x.size()] = std::nanf("");
        int64_t bad, best, want_bad, want_best;
        simd::argmax_first(x.data(), n, &bad, &best);
        reference(x, &want_bad, &want_best);
        EXPECT_EQ(bad, want_bad) << "n " << n << " variant " << variant;
        EXPECT_EQ(best, want_best) << "n " << n << " variant " << variant;
      }
    }
  });
}

TEST(CpuThreadPool, RunsEveryTaskOnceAndRethrows) {
  for (int threads : {1, 2, 3}) {
    std::vector<int> hits(101, 0);
    cpu::parallel_tasks(threads, 101, [&](int64_t i) { ++hits[static_cast<size_t>(i)]; });
    for (int h : hits) EXPECT_EQ(h, 1);
    std::vector<int> ranges(57, 0);
    cpu::parallel_for(threads, 57, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++ranges[static_cast<size_t>(i)];
    });
    for (int h : ranges) EXPECT_EQ(h, 1);
    EXPECT_THROW(cpu::parallel_tasks(threads, 9, [](int64_t i) { if (i == 5) fail("task ", i); }), Error);
    // Nested calls run inline instead of deadlocking.
    std::atomic<int> inner{0};
    cpu::parallel_tasks(threads, 4, [&](int64_t) { cpu::parallel_tasks(threads, 3, [&](int64_t) { ++inner; }); });
    EXPECT_EQ(inner.load(), 12);
  }
}

}  // namespace
}  // namespace mambacpp
