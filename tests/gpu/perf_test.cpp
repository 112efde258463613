// Timings of the CUDA ops at real model shapes (disabled by default; scripts/gpu_check.sh runs them with
// --gtest_also_run_disabled_tests). Each prints the median time of 20 runs after 3 warm-ups (host clock around a
// stream synchronize, so launch overhead is included) and, for memory-bound ops, the bytes that had to move per run
// over that time. They assert only that the op ran; correctness is the other tests' job.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::make_batch;
using gputest::Rng;

double median_us(Backend& be, const std::function<void()>& op) {
  for (int i = 0; i < 3; ++i) op();
  be.synchronize();
  std::vector<double> us;
  for (int i = 0; i < 20; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    be.synchronize();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void report(const char* what, double us, double bytes) {
  if (bytes > 0)
    std::printf("[perf] %-52s %10.1f us  %7.0f GB/s\n", what, us, bytes / us * 1e-3);
  else
    std::printf("[perf] %-52s %10.1f us\n", what, us);
}

TEST(CudaPerf, DISABLED_Linear) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend(DType::BF16);
  DeviceArena arena(*be);
  Rng rng(1);
  struct Case { const char* name; int64_t T, in, out; };
  for (Case c : {Case{"gemv bf16 lm_head 50280x768, T=1", 1, 768, 50280},
                 Case{"gemv bf16 mamba2-2.7b in_proj 10576x2560, T=1", 1, 2560, 10576},
                 Case{"gemv bf16 mamba2-2.7b in_proj, T=8", 8, 2560, 10576},
                 Case{"gemm bf16 mamba2-130m in_proj 3352x768, T=2048", 2048, 768, 3352},
                 Case{"gemm bf16 mamba2-2.7b in_proj, T=2048", 2048, 2560, 10576}}) {
    const auto w = rng.vec(static_cast<size_t>(c.in * c.out), -0.05f, 0.05f);
    TensorView hw(const_cast<float*>(w.data()), DType::F32, {c.out, c.in});
    TensorView dw = be->adopt_weight(hw);
    TensorView x = arena.upload(rng.vec(static_cast<size_t>(c.T * c.in)), DType::F32, {c.T, c.in});
    TensorView y = arena.poisoned({c.T, c.out});
    const double us = median_us(*be, [&] { be->linear(x, dw, TensorView(), y); });
    const double bytes = c.T <= 8 ? 2.0 * c.in * c.out : 0.0;
    report(c.name, us, bytes);
    if (c.T > 8) std::printf("[perf]   = %.0f TFLOP/s (2 bf16 GEMMs)\n", 4.0 * c.T * c.in * c.out / us * 1e-6);
  }
}

TEST(CudaPerf, DISABLED_Mamba2Ssd) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  DeviceArena arena(*be);
  Rng rng(2);
  const int64_t H = 24, P = 64, N = 128, HP = H * P;  // mamba2-130m
  for (auto [lens, name] : {std::pair{std::vector<int64_t>{2048}, "ssd prefill mamba2-130m heads, 1 x 2048"},
                            std::pair{std::vector<int64_t>(8, 256), "ssd prefill mamba2-130m heads, 8 x 256"},
                            std::pair{std::vector<int64_t>(1, 1), "ssd decode step, batch 1"},
                            std::pair{std::vector<int64_t>(64, 1), "ssd decode step, batch 64"}}) {
    std::vector<int64_t> slots(lens.size());
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
    BatchLayout batch = make_batch(lens, slots);
    const int64_t T = batch.total_tokens, S = static_cast<int64_t>(lens.size());
    Mamba2ScanArgs a;
    a.x = arena.upload(rng.vec(T * HP), DType::F32, {T, HP});
    a.dt = arena.upload(rng.vec(T * H), DType::F32, {T, H});
    a.B = arena.upload(rng.vec(T * N), DType::F32, {T, N});
    a.C = arena.upload(rng.vec(T * N), DType::F32, {T, N});
    a.A_log = arena.upload(rng.vec(H, 0, 2), DType::F32, {H});
    a.D = arena.upload(rng.vec(H), DType::F32, {H});
    a.dt_bias = arena.upload(rng.vec(H, -4, 0), DType::F32, {H});
    a.dt_max = 1e30f;
    a.n_heads = H;
    a.head_dim = P;
    a.n_groups = 1;
    a.d_state = N;
    a.state = arena.upload(rng.vec(S * H * P * N), DType::F32, {S, H, P, N});
    a.y = arena.poisoned({T, HP});
    be->prepare_batch(batch);
    const double us = median_us(*be, [&] { be->mamba2_ssd(a, batch); });
    report(name, us, T == S ? 2.0 * S * H * P * N * 4 : 0.0);
  }
}

TEST(CudaPerf, DISABLED_Mamba1ScanAndConv) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend();
  DeviceArena arena(*be);
  Rng rng(3);
  const int64_t DI = 1536, N = 16, T = 2048;  // mamba-130m
  BatchLayout batch = make_batch({T}, {0});
  Mamba1ScanArgs a;
  a.x = arena.upload(rng.vec(T * DI), DType::F32, {T, DI});
  a.dt = arena.upload(rng.vec(T * DI), DType::F32, {T, DI});
  a.z = arena.upload(rng.vec(T * DI), DType::F32, {T, DI});
  a.B = arena.upload(rng.vec(T * N), DType::F32, {T, N});
  a.C = arena.upload(rng.vec(T * N), DType::F32, {T, N});
  a.A_log = arena.upload(rng.vec(DI * N, 0, 2), DType::F32, {DI, N});
  a.D = arena.upload(rng.vec(DI), DType::F32, {DI});
  a.dt_bias = arena.upload(rng.vec(DI, -4, 0), DType::F32, {DI});
  a.state = arena.upload(rng.vec(DI * N), DType::F32, {1, DI, N});
  a.y = arena.poisoned({T, DI});
  be->prepare_batch(batch);
  report("mamba1 scan mamba-130m, 1 x 2048", median_us(*be, [&] { be->mamba1_scan(a, batch); }), 0.0);

  const int64_t C = 1536 + 256, K = 4;  // mamba2-130m conv channels
  TensorView x = arena.upload(rng.vec(T * C), DType::F32, {T, C});
  TensorView w = arena.upload(rng.vec(C * K), DType::F32, {C, 1, K});
  TensorView bias = arena.upload(rng.vec(C), DType::F32, {C});
  TensorView st = arena.upload(rng.vec(C * (K - 1)), DType::F32, {1, C, K - 1});
  TensorView out = arena.poisoned({T, C});
  report("conv1d mamba2-130m, 1 x 2048", median_us(*be, [&] { be->conv1d_silu(x, w, bias, st, batch, out); }),
         2.0 * T * C * 4);
  BatchLayout one = make_batch({1}, {0});
  be->prepare_batch(one);
  TensorView x1 = x.rows(0, 1), out1 = out.rows(0, 1);
  report("conv1d mamba2-130m, decode 1 token", median_us(*be, [&] { be->conv1d_silu(x1, w, bias, st, one, out1); }),
         0.0);
}

}  // namespace
}  // namespace mambacpp
