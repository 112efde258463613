// The pinned cuBLASLt plans (backend/cuda/gemm_lt.h): a row's result is the same bits at every T, with beta = 0 and
// with beta = 1 (the residual accumulated into y). Decode plans: across the switch from the decode tiles
// (T < kWideMinT) to the wide variant chosen for long batches, and over the blocks of rows a split-K plan runs in
// where it cannot run whole. Prefill plans: from one-row prompts' T = 2 up to a piece of 2,048 rows.
// The shapes are mamba2-2.7b's in_proj and out_proj, mamba-2.8b's x_proj and two odd ones; on the project's H200 a
// wide variant exists for in_proj (asserted: otherwise the switch is not what is tested), and every shape has a
// prefill plan.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemm_lt.h"
#include "gpu/gpu_test_util.h"

namespace mambacpp {
namespace {

template <class T>
struct DeviceVec {
  T* p = nullptr;
  explicit DeviceVec(size_t n) { EXPECT_EQ(cudaSuccess, cudaMalloc(&p, n * sizeof(T))); }
  ~DeviceVec() { cudaFree(p); }
};

TEST(CudaLtMatmul, PinnedRowsAreTheSameBitsAtEveryT) {
  MAMBACPP_REQUIRE_GPU();
  using Pin = cuda::LtMatmul::Pin;
  struct Shape { int out, in; bool wide_expected; };
  constexpr size_t kWs = size_t(32) << 20;
  DeviceVec<char> ws(kWs);
  cuda::LtMatmul lt;
  int64_t expected_wide = 0;
  for (const Shape sh : {Shape{10576, 2560, true}, Shape{2560, 5120, false}, Shape{192, 5120, false},
                         Shape{1320, 256, false}, Shape{40, 24, false}}) {
    SCOPED_TRACE("out " + std::to_string(sh.out) + " in " + std::to_string(sh.in));
    const int Tmax = 2048;
    std::mt19937 rng(sh.out);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<__nv_bfloat16> hw(size_t(sh.out) * sh.in), hx(size_t(Tmax) * sh.in);
    for (auto& v : hw) v = __float2bfloat16(dist(rng) * 0.1f);
    for (auto& v : hx) v = __float2bfloat16(dist(rng) * 2.0f);
    std::vector<float> init(size_t(Tmax) * sh.out);
    for (auto& v : init) v = dist(rng);
    DeviceVec<__nv_bfloat16> w(hw.size()), x(hx.size());
    DeviceVec<float> y(init.size());
    ASSERT_EQ(cudaSuccess, cudaMemcpy(w.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    for (const Pin pin : {Pin::Decode, Pin::Prefill})
      for (const float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(std::string(pin == Pin::Decode ? "decode" : "prefill") + " beta " + std::to_string(beta));
        // y = x[0:T] . w^T + beta * init[0:T], back on the host.
        auto rows = [&](int T) {
          EXPECT_EQ(cudaSuccess, cudaMemcpy(y.p, init.data(), size_t(T) * sh.out * 4, cudaMemcpyHostToDevice));
          lt.run(nullptr, ws.p, kWs, CUDA_R_16BF, w.p, x.p, y.p, sh.out, T, sh.in, sh.out, beta, pin);
          std::vector<float> h(size_t(T) * sh.out);
          EXPECT_EQ(cudaSuccess, cudaMemcpy(h.data(), y.p, h.size() * 4, cudaMemcpyDeviceToHost));
          return h;
        };
        const auto full = rows(Tmax);  // the wide plan where one exists
        for (int T : {1, 2, 7, 64, 511, 512, 700, 1500}) {
          const auto got = rows(T);
          ASSERT_EQ(0, std::memcmp(got.data(), full.data(), got.size() * sizeof(float))) << "T = " << T;
        }
      }
    expected_wide += sh.wide_expected;
    std::printf("[lt] %d x %d: so far wide plans chosen %lld, rejected %lld; prefill plans %lld; blocked plans "
                "%lld, fallbacks %lld\n",
                sh.out, sh.in, static_cast<long long>(lt.wide_chosen()), static_cast<long long>(lt.wide_rejected()),
                static_cast<long long>(lt.prefill_chosen()), static_cast<long long>(lt.pinned_blocked()),
                static_cast<long long>(lt.pinned_fallbacks()));
  }
  EXPECT_GE(lt.wide_chosen(), expected_wide);
  EXPECT_EQ(lt.wide_chosen() + lt.wide_rejected(), 5);
  EXPECT_EQ(lt.prefill_chosen(), 5);
  EXPECT_EQ(lt.pinned_fallbacks(), 0);
}

// The prefill plan's bf16 output (run_prefill_bf16) is its f32 output rounded to nearest even, bit for bit, at piece
// sizes on both sides of the probe's rows. mamba2-2.7b's in_proj (the shape it serves) must have such a plan; the
// other shapes are compared where they have one.
TEST(CudaLtMatmul, PrefillBf16OutputIsTheRoundedF32Output) {
  MAMBACPP_REQUIRE_GPU();
  using Pin = cuda::LtMatmul::Pin;
  constexpr size_t kWs = size_t(32) << 20;
  DeviceVec<char> ws(kWs);
  cuda::LtMatmul lt;
  struct Shape { int out, in; bool required; };
  int64_t without = 0;
  for (const Shape sh : {Shape{10576, 2560, true}, Shape{2560, 5120, false}, Shape{1320, 256, false},
                         Shape{40, 24, false}}) {
    SCOPED_TRACE("out " + std::to_string(sh.out) + " in " + std::to_string(sh.in));
    const int Tmax = 5000;
    std::mt19937 rng(sh.out + 1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<__nv_bfloat16> hw(size_t(sh.out) * sh.in), hx(size_t(Tmax) * sh.in);
    for (auto& v : hw) v = __float2bfloat16(dist(rng) * 0.1f);
    for (auto& v : hx) v = __float2bfloat16(dist(rng) * 2.0f);
    DeviceVec<__nv_bfloat16> w(hw.size()), x(hx.size());
    DeviceVec<float> y32(size_t(Tmax) * sh.out);
    DeviceVec<uint16_t> y16(size_t(Tmax) * sh.out);
    ASSERT_EQ(cudaSuccess, cudaMemcpy(w.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    for (int T : {cuda::LtMatmul::kPrefillMinRows, 300, 2048, Tmax}) {
      SCOPED_TRACE("T = " + std::to_string(T));
      lt.run(nullptr, ws.p, kWs, CUDA_R_16BF, w.p, x.p, y32.p, sh.out, T, sh.in, sh.out, 0.0f, Pin::Prefill);
      const bool has = lt.run_prefill_bf16(nullptr, ws.p, kWs, CUDA_R_16BF, w.p, x.p, y16.p, sh.out, T, sh.in, sh.out);
      if (sh.required) ASSERT_TRUE(has);
      if (!has) {
        ++without;
        continue;
      }
      std::vector<float> h32(size_t(T) * sh.out);
      std::vector<uint16_t> h16(h32.size());
      ASSERT_EQ(cudaSuccess, cudaMemcpy(h32.data(), y32.p, h32.size() * 4, cudaMemcpyDeviceToHost));
      ASSERT_EQ(cudaSuccess, cudaMemcpy(h16.data(), y16.p, h16.size() * 2, cudaMemcpyDeviceToHost));
      size_t bad = 0;
      for (size_t i = 0; i < h32.size(); ++i) {
        ASSERT_TRUE(std::isfinite(h32[i]));
        const uint16_t want = __bfloat16_as_ushort(__float2bfloat16_rn(h32[i]));
        bad += want != h16[i];
      }
      EXPECT_EQ(bad, 0u);
    }
  }
  std::printf("[lt] bf16-output prefill plans: %lld of 4 shapes without one\n",
              static_cast<long long>(lt.prefill_bf16_rejected()));
  EXPECT_EQ(without > 0, lt.prefill_bf16_rejected() > 0);
}

}  // namespace
}  // namespace mambacpp
