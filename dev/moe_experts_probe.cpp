// The CPU's MoE expert layer alone at a released shape (granite-4.0-h-tiny by default: D 1536, 64 experts of width
// 512, SwiGLU, top-6, bf16), decode-sized blocks, interleaved in one process: A, the per-expert path the backend ran
// before issue 48's change (each expert's gate-up and down as their own linear_f32 calls, one fork-join each, then the
// slot-order sum), against B, CpuBackend::moe_experts. The weights of `layers` MoE layers (random, far larger than
// the caches) rotate per call, each token picks k distinct experts at random, and a plain read of the same chosen
// experts' bytes on the same threads gives the floor. Prints the medians (ms per layer call, GB/s of expert bytes,
// share of the plain read) and checks that A and B give the same bits. CPU machine.
//   g++ -O3 -std=c++20 -fopenmp -Isrc -Iinclude dev/moe_experts_probe.cpp build/libmambacpp.a \
//       $(pkg-config --libs libhwy libpcre2-8 libutf8proc zlib) -o build/moe_experts_probe
//   build/moe_experts_probe [threads=2] [T=1] [iters=200] [layers=4] [D=1536] [I=512] [E=64] [k=6]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/moe_routing.h"
#include "core/weight.h"
#include "mambacpp/dtype.h"

using namespace mambacpp;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A: the expert loop as moe_ops.cpp ran it for a decode block before the two-pass change (every expert had at most
// kStreamTokens rows, so each ran on all threads, one after another).
void per_expert(const MoeExpertsArgs& a, int threads, int64_t T, int64_t D, int64_t I, int64_t k) {
  const int32_t* ids = a.ids.ptr<int32_t>();
  const int64_t E = static_cast<int64_t>(a.up.size()), np = T * k, hc = 2 * I;
  std::vector<int64_t> count(static_cast<size_t>(E) + 1), pos(static_cast<size_t>(np));
  for (int64_t p = 0; p < np; ++p) ++count[static_cast<size_t>(ids[p]) + 1];
  for (int64_t e = 0; e < E; ++e) count[static_cast<size_t>(e) + 1] += count[static_cast<size_t>(e)];
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t p = 0; p < np; ++p) pos[static_cast<size_t>(p)] = next[static_cast<size_t>(ids[p])]++;
  static std::vector<float> xg, h, act, y;
  xg.resize(static_cast<size_t>(np * D));
  h.resize(static_cast<size_t>(np * hc));
  act.resize(static_cast<size_t>(np * I));
  y.resize(static_cast<size_t>(np * D));
  const float* x = a.x.ptr<float>();
  for (int64_t p = 0; p < np; ++p)
    std::memcpy(xg.data() + pos[static_cast<size_t>(p)] * D, x + (p / k) * D, static_cast<size_t>(D) * 4);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e) + 1] - r0;
    if (n == 0) continue;
    const TensorView& u = a.up[static_cast<size_t>(e)].dense_view("probe");
    const TensorView& d = a.down[static_cast<size_t>(e)].dense_view("probe");
    const cpu::Rows<float> he{h.data() + r0 * hc, hc}, ae{act.data() + r0 * I, I}, ye{y.data() + r0 * D, D};
    cpu::linear_f32(cpu::Rows<const float>{xg.data() + r0 * D, D}, {u.data, u.dtype}, {}, he, n, D, 2 * I, threads);
    cpu::silu_mul_f32(cpu::Rows<const float>{he.data, hc}, cpu::Rows<const float>{he.data + I, hc}, ae, n, I, threads);
    cpu::linear_f32(cpu::Rows<const float>{ae.data, I}, {d.data, d.dtype}, {}, ye, n, I, D, threads);
  }
  std::vector<const float*> r(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) r[static_cast<size_t>(j)] = y.data() + pos[static_cast<size_t>(t * k + j)] * D;
    moe::combine_token(r.data(), a.weights.ptr<float>() + t * k, k, D, a.out.ptr<float>() + t * D);
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t def) { return argc > i ? std::atoll(argv[i]) : def; };
  const int threads = static_cast<int>(arg(1, 2));
  const int64_t T = arg(2, 1), iters = arg(3, 200), layers = arg(4, 4), D = arg(5, 1536), I = arg(6, 512),
                E = arg(7, 64), k = arg(8, 6);
  auto be = make_cpu_backend(threads);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uf(-0.03f, 0.03f);

  // Random bf16 weights: every expert's [2I, D] gate-up and [D, I] down, `layers` times.
  const int64_t up_n = 2 * I * D, down_n = D * I;
  std::vector<uint16_t> store(static_cast<size_t>(layers * E * (up_n + down_n)));
  {
    std::vector<float> chunk(1 << 16);
    for (size_t i = 0; i < store.size(); i += chunk.size()) {
      const size_t n = std::min(chunk.size(), store.size() - i);
      for (size_t j = 0; j < n; ++j) chunk[j] = uf(rng);
      convert_from_f32(chunk.data(), store.data() + i, DType::BF16, static_cast<int64_t>(n));
    }
  }
  std::vector<std::vector<Weight>> ups(static_cast<size_t>(layers)), downs(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t e = 0; e < E; ++e) {
      uint16_t* base = store.data() + (l * E + e) * (up_n + down_n);
      ups[l].push_back(Weight(TensorView(base, DType::BF16, {2 * I, D})));
      downs[l].push_back(Weight(TensorView(base + up_n, DType::BF16, {D, I})));
    }

  std::vector<float> x(static_cast<size_t>(T * D)), w(static_cast<size_t>(T * k)), outA(x.size()), outB(x.size());
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<double> ta, tb, tr, gb;
  int64_t mismatches = 0;
  for (int64_t it = 0; it < iters; ++it) {
    const int64_t l = it % layers;
    for (float& v : x) v = uf(rng) * 30.0f;
    for (float& v : w) v = std::abs(uf(rng)) * 30.0f;
    std::set<int32_t> chosen;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> perm(static_cast<size_t>(E));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(t * k + j)] = perm[static_cast<size_t>(j)];
      chosen.insert(perm.begin(), perm.begin() + k);
    }
    MoeExpertsArgs a;
    a.x = TensorView(x.data(), DType::F32, {T, D});
    a.ids = TensorView(ids.data(), DType::I32, {T, k});
    a.weights = TensorView(w.data(), DType::F32, {T, k});
    a.act = MoeExpertAct::SiluGated;
    a.expert_size = I;
    a.up = ups[l];
    a.down = downs[l];
    const double bytes = static_cast<double>(chosen.size()) * static_cast<double>(up_n + down_n) * 2.0;

    // The plain read of the chosen experts' bytes: each expert's block cut in two-per-thread shares.
    std::vector<int32_t> ch(chosen.begin(), chosen.end());
    const int64_t shares = static_cast<int64_t>(ch.size()) * 2 * threads;
    std::vector<uint64_t> sink(static_cast<size_t>(shares));
    auto plain = [&] {
      cpu::parallel_tasks(threads, shares, [&](int64_t s) {
        const int64_t e = ch[static_cast<size_t>(s / (2 * threads))], part = s % (2 * threads);
        const auto* p = reinterpret_cast<const uint64_t*>(store.data() + (l * E + e) * (up_n + down_n));
        const int64_t n = (up_n + down_n) / 4, b0 = n * part / (2 * threads), b1 = n * (part + 1) / (2 * threads);
        uint64_t acc = 0;
        for (int64_t i = b0; i < b1; ++i) acc ^= p[i];
        sink[static_cast<size_t>(s)] = acc;
      });
    };
    // The three in a rotating order, so none always runs first on a cold cache line.
    for (int64_t q = 0; q < 3; ++q) {
      const int64_t which = (it + q) % 3;
      const auto t0 = Clock::now();
      if (which == 0) {
        a.out = TensorView(outA.data(), DType::F32, {T, D});
        per_expert(a, threads, T, D, I, k);
        ta.push_back(ms_since(t0));
      } else if (which == 1) {
        a.out = TensorView(outB.data(), DType::F32, {T, D});
        be->moe_experts(a);
        tb.push_back(ms_since(t0));
      } else {
        plain();
        tr.push_back(ms_since(t0));
      }
    }
    if (outA != outB) ++mismatches;
    gb.push_back(bytes);
  }
  const double bytes = median(gb);
  const double a_ms = median(ta), b_ms = median(tb), r_ms = median(tr);
  std::printf(
      "threads %d, T %lld, %lld iters over %lld layers; D %lld, I %lld, E %lld, k %lld, bf16; %.1f MB per call\n",
      threads, static_cast<long long>(T), static_cast<long long>(iters), static_cast<long long>(layers),
      static_cast<long long>(D), static_cast<long long>(I), static_cast<long long>(E), static_cast<long long>(k),
      bytes / 1e6);
  std::printf("plain read  %.3f ms  %.2f GB/s\n", r_ms, bytes / r_ms / 1e6);
  std::printf("A per-expert %.3f ms  %.2f GB/s  %.1f%% of the plain read\n", a_ms, bytes / a_ms / 1e6,
              100 * r_ms / a_ms);
  std::printf("B two-pass   %.3f ms  %.2f GB/s  %.1f%% of the plain read\n", b_ms, bytes / b_ms / 1e6,
              100 * r_ms / b_ms);
  std::printf("B / A time %.3f; outputs differing in %lld of %lld calls\n", b_ms / a_ms,
              static_cast<long long>(mismatches), static_cast<long long>(iters));
  return mismatches == 0 ? 0 : 1;
}
