// Decode attention over the paged KV cache, alone: one decode step's attention of one layer (append + attention +
// combine) for a batch of sequences of one context length, with f32 or bf16 pages, staged in place or pipelined.
// Prints, per variant, the median time of the repeats, the bytes the step must read (every cached K and V row of
// the batch) and the bandwidth that is, beside a device-to-device copy's bandwidth measured in the same process.
// Variants: f32 pages staged in place with the keys split for 2 blocks per SM (the kernel as it was before bf16 pages
// and pipelining), then f32 and bf16 pages, in place and pipelined, split for 16 blocks per SM (the backend's choice
// for decode-shaped calls; it pipelines them), then the tensor-core kernel of fast precision (f32 and bf16 pages).
// `prefill` mode times one layer's attention of a whole prompt (append + attention, one sequence, no cache before),
// the f32 kernel against the tensor-core one, in TFLOP/s of the causal products (4 * n_heads * head_dim * T(T+1)/2).
// Built with the GPU tests, not run by ctest (docs/benchmarks.md "Hybrid models on the GPU").
//
//   attention_bench [batch 32] [context 16384] [n_heads 32] [n_kv_heads 8] [head_dim 128] [repeats 20]
//   attention_bench prefill [rows 16384] [n_heads 32] [n_kv_heads 8] [head_dim 128] [repeats 3]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"

using namespace mambacpp;
using namespace mambacpp::cuda;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void* dev_alloc(size_t n, int fill = 0) {
  void* p = nullptr;
  check(cudaMalloc(&p, n), "cudaMalloc");
  check(cudaMemset(p, fill, n), "cudaMemset");
  return p;
}

template <class F>
double median_ms(int repeats, F&& f) {
  f();  // warm-up
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    check(cudaDeviceSynchronize(), "run");
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One prompt of T rows through one layer's attention (bf16 pages), f32 kernel and tensor-core kernel.
int prefill(int argc, char** argv) {
  auto arg = [&](int i, int64_t d) { return argc > i ? std::atoll(argv[i]) : d; };
  const int64_t T = arg(2, 16384), NH = arg(3, 32), KV = arg(4, 8), HD = arg(5, 128);
  const int repeats = static_cast<int>(arg(6, 3));
  const int64_t page = 64, kv_dim = KV * HD, rep = NH / KV, n_pages = (T + page - 1) / page;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("attention_bench prefill: %s; %lld rows, %lld/%lld heads of %lld, bf16 pages of %lld rows\n", prop.name,
              static_cast<long long>(T), static_cast<long long>(NH), static_cast<long long>(KV),
              static_cast<long long>(HD), static_cast<long long>(page));
  auto* q = static_cast<float*>(dev_alloc(static_cast<size_t>(T * NH * HD) * 4));
  auto* k = static_cast<float*>(dev_alloc(static_cast<size_t>(T * kv_dim) * 4));
  auto* v = static_cast<float*>(dev_alloc(static_cast<size_t>(T * kv_dim) * 4));
  auto* out = static_cast<float*>(dev_alloc(static_cast<size_t>(T * NH * HD) * 4));
  std::vector<void*> pages(static_cast<size_t>(n_pages));
  for (void*& p : pages) p = dev_alloc(static_cast<size_t>(2 * page * kv_dim) * 2);
  auto upload = [](const auto& host) {
    const size_t n = host.size() * sizeof(host[0]);
    void* d = dev_alloc(n);
    check(cudaMemcpy(d, host.data(), n, cudaMemcpyHostToDevice), "upload");
    return d;
  };
  const std::vector<AttnSeq> seqs = {{0, T, 0, 0}};
  const std::vector<int32_t> token_seq(static_cast<size_t>(T), 0);
  const auto* d_seqs = static_cast<const AttnSeq*>(upload(seqs));
  const auto* d_token_seq = static_cast<const int32_t*>(upload(token_seq));
  auto* d_pages = static_cast<void* const*>(upload(pages));
  const double flops = 4.0 * static_cast<double>(NH * HD) * static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
  std::printf("%-36s %10s %10s\n", "kernel", "ms", "TFLOP/s");
  for (bool mma : {false, true}) {
    const int step = mma ? kAttnMmaTileItems : kAttnTileItems;
    std::vector<AttnTile> tiles;
    for (int64_t it = 0; it < T * rep; it += step) tiles.push_back({0, static_cast<int32_t>(it)});
    if (mma) std::reverse(tiles.begin(), tiles.end());  // as the backend orders them
    const auto* d_tiles = static_cast<const AttnTile*>(upload(tiles));
    AttentionLaunch p;
    p.q = {q, NH * HD};
    p.k = {k, kv_dim};
    p.v = {v, kv_dim};
    p.out = {out, NH * HD};
    p.T = T;
    p.n_heads = NH;
    p.n_kv_heads = KV;
    p.head_dim = HD;
    p.page_tokens = page;
    p.scale = 0.088f;
    p.seqs = d_seqs;
    p.token_seq = d_token_seq;
    p.tiles = d_tiles;
    p.n_tiles = static_cast<int64_t>(tiles.size());
    p.pages = d_pages;
    p.kv_bf16 = true;
    p.mma = mma;
    p.split_keys = T;
    const double ms = median_ms(mma ? repeats : 1, [&] {
      launch_kv_append(p, nullptr);
      launch_attention(p, nullptr);
    });
    std::printf("%-36s %10.3f %10.1f\n", mma ? "tensor cores (fast precision)" : "f32 (exact precision)", ms,
                flops / (ms * 1e-3) / 1e12);
  }
  check(cudaGetLastError(), "kernels");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "prefill") return prefill(argc, argv);
  auto arg = [&](int i, int64_t d) { return argc > i ? std::atoll(argv[i]) : d; };
  const int64_t B = arg(1, 32), L = arg(2, 16384), NH = arg(3, 32), KV = arg(4, 8), HD = arg(5, 128);
  const int repeats = static_cast<int>(arg(6, 20));
  const int64_t page = 64, kv_dim = KV * HD, rep = NH / KV;
  const int64_t n_pages = (L + 1 + page - 1) / page;  // the context and this step's row
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int64_t sms = prop.multiProcessorCount;

  // Copy bandwidth: 2 GiB copied, counted as read + written (4 GiB), as `mambacpp bench` counts it.
  const size_t copy_bytes = size_t{1} << 31;
  void* a = dev_alloc(copy_bytes);
  void* b = dev_alloc(copy_bytes);
  const double copy_ms = median_ms(10, [&] { check(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice), "copy"); });
  const double copy_tbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e-3) / 1e12;
  cudaFree(a);
  cudaFree(b);
  std::printf("attention_bench: %s, %lld SMs; batch %lld, context %lld, %lld/%lld heads of %lld, pages of %lld rows\n",
              prop.name, static_cast<long long>(sms), static_cast<long long>(B), static_cast<long long>(L),
              static_cast<long long>(NH), static_cast<long long>(KV), static_cast<long long>(HD),
              static_cast<long long>(page));
  std::printf("copy bandwidth (read + write): %.2f TB/s\n", copy_tbs);

  // q, k, v, out rows; one row per sequence (token t is sequence t).
  auto* q = static_cast<float*>(dev_alloc(static_cast<size_t>(B * NH * HD) * 4));
  auto* k = static_cast<float*>(dev_alloc(static_cast<size_t>(B * kv_dim) * 4));
  auto* v = static_cast<float*>(dev_alloc(static_cast<size_t>(B * kv_dim) * 4));
  auto* out = static_cast<float*>(dev_alloc(static_cast<size_t>(B * NH * HD) * 4));
  std::vector<AttnSeq> seqs(static_cast<size_t>(B));
  std::vector<AttnTile> tiles(static_cast<size_t>(B));
  std::vector<int32_t> token_seq(static_cast<size_t>(B));
  for (int64_t s = 0; s < B; ++s) {
    seqs[static_cast<size_t>(s)] = {s, 1, L, s * n_pages};
    tiles[static_cast<size_t>(s)] = {static_cast<int32_t>(s), 0};
    token_seq[static_cast<size_t>(s)] = static_cast<int32_t>(s);
  }
  auto upload = [](const auto& host) {
    const size_t n = host.size() * sizeof(host[0]);
    void* d = dev_alloc(n);
    check(cudaMemcpy(d, host.data(), n, cudaMemcpyHostToDevice), "upload");
    return d;
  };
  const auto* d_seqs = static_cast<const AttnSeq*>(upload(seqs));
  const auto* d_tiles = static_cast<const AttnTile*>(upload(tiles));
  const auto* d_token_seq = static_cast<const int32_t*>(upload(token_seq));

  // Splits as the backend's set_splits chooses them for a decode-shaped call (16 blocks per SM), or as it chose them
  // before (2 per SM: `old splits`).
  const int64_t blocks = B * KV, max_keys = L + 1;
  auto split_count = [&](int64_t per_sm, int64_t* keys_per_split) {
    int64_t splits = 1;
    if (blocks < per_sm * sms && max_keys > 512)
      splits = std::min((per_sm * sms + blocks - 1) / blocks, (max_keys + 255) / 256);
    const int64_t split_keys = ((max_keys + splits - 1) / splits + 31) / 32 * 32;
    splits = (max_keys + split_keys - 1) / split_keys;
    *keys_per_split = splits > 1 ? split_keys : max_keys;
    return splits;
  };
  int64_t unused = 0;
  const int64_t max_splits = std::max(split_count(16, &unused), split_count(2, &unused));
  auto* partial = static_cast<float*>(dev_alloc(static_cast<size_t>(max_splits * B * NH * (HD + 2)) * 4));

  std::printf("%-36s %6s %10s %10s %10s %8s\n", "variant", "splits", "ms", "KV GB", "TB/s", "% copy");
  for (bool bf16 : {false, true}) {
    const size_t elem = bf16 ? 2 : 4;
    // Pages hold a small constant (0x3c bytes: ~0.0115 in f32 and in bf16): the timing does not depend on values.
    std::vector<void*> pages(static_cast<size_t>(B * n_pages));
    for (void*& p : pages) p = dev_alloc(static_cast<size_t>(2 * page * kv_dim) * elem, 0x3c);
    auto* d_pages = static_cast<void* const*>(upload(pages));
    for (int variant = 0; variant < 4; ++variant) {
      const bool pipelined = variant == 2, old_splits = variant == 0, mma = variant == 3;
      if (bf16 && old_splits) continue;
      int64_t split_keys = 0;
      const int64_t splits = split_count(old_splits ? 2 : 16, &split_keys);
      AttentionLaunch p;
      p.q = {q, NH * HD};
      p.k = {k, kv_dim};
      p.v = {v, kv_dim};
      p.out = {out, NH * HD};
      p.T = B;
      p.n_heads = NH;
      p.n_kv_heads = KV;
      p.head_dim = HD;
      p.page_tokens = page;
      p.scale = 0.088f;
      p.seqs = d_seqs;
      p.token_seq = d_token_seq;
      p.tiles = d_tiles;
      p.n_tiles = B;
      p.pages = d_pages;
      p.kv_bf16 = bf16;
      p.mma = mma;  // one tile per sequence either way (rep <= 16 items)
      p.pipelined = (pipelined || mma) && rep <= kAttnTileItems;  // the tensor cores' decode-shaped launch
      p.n_splits = static_cast<int>(splits);
      p.split_keys = split_keys;
      p.partial = partial;
      const double ms = median_ms(repeats, [&] {
        launch_kv_append(p, nullptr);
        launch_attention(p, nullptr);
      });
      const double bytes = static_cast<double>(B * max_keys * 2 * kv_dim) * static_cast<double>(elem);
      const double tbs = bytes / (ms * 1e-3) / 1e12;
      char name[64];
      std::snprintf(name, sizeof name, "%s pages, %s%s", bf16 ? "bf16" : "f32",
                    mma ? "tensor cores" : pipelined ? "pipelined" : "in place", old_splits ? ", old splits" : "");
      std::printf("%-36s %6lld %10.3f %10.2f %10.2f %8.0f\n", name, static_cast<long long>(splits), ms, bytes / 1e9, tbs,
                  100.0 * tbs / copy_tbs);
    }
    for (void* p : pages) cudaFree(p);
    cudaFree(const_cast<void**>(d_pages));
  }
  check(cudaGetLastError(), "kernels");
  return 0;
}
