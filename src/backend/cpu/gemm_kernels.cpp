// The prefill GEMM of gemm.h, compiled per SIMD target like simd_kernels.cpp. A register tile of MR token rows by
// NR weight rows keeps MR * NR vector accumulators: per vector block of the packed rows it loads NR weight vectors and
// MR token vectors and issues MR * NR MulAdds, so each load feeds several FMAs (the GEMV feeds one). The lanes run
// along the inner dimension, as in dot_rows: each element's four chains are the GEMV's chains, run one after the
// other over the contiguous phase of the packed rows, and reduced in the GEMV's order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/gemm_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "hwy/aligned_allocator.h"
#include "hwy/contrib/math/math-inl.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/gemm.h"
#include "backend/cpu/simd_load-inl.h"
#include "mambacpp/error.h"

HWY_BEFORE_NAMESPACE();
namespace mambacpp::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tile shape by register file: 16 vector registers (AVX2, SSE4) hold 4 x 3 accumulators, 3 weight vectors and one
// token vector; AVX-512's 32 hold 8 x 3.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr int kMR = 8;
#else
constexpr int kMR = 4;
#endif
constexpr int kNR = 3;

// Vector blocks of a packed row per chain (block b of the row feeds chain b % 4), and where each chain starts.
struct Phases {
  int64_t count[4];
  int64_t offset[4];  // in floats
  explicit Phases(int64_t in) {
    const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
    const int64_t nb = (in + L - 1) / L;
    int64_t off = 0;
    for (int c = 0; c < 4; ++c) {
      count[c] = nb > c ? (nb - c + 3) / 4 : 0;
      offset[c] = off;
      off += count[c] * L;
    }
  }
};

int64_t PackedRowFloats(int64_t in) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  return (in + L - 1) / L * L;
}
int64_t GemmTileTokens() { return kMR; }
int64_t GemmTileRows() { return kNR; }

template <class W>
void pack_rows_t(const W* src, int64_t src_stride, int64_t rows, int64_t in, float* dst) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df)), Kp = PackedRowFloats(in), nb = Kp / L;
  const Phases ph(in);
  for (int64_t r = 0; r < rows; ++r) {
    const W* s = src + r * src_stride;
    float* d = dst + r * Kp;
    for (int64_t b = 0; b < nb; ++b) {
      float* db = d + ph.offset[b % 4] + (b / 4) * L;
      const int64_t i = b * L;
      if (i + L <= in) {
        hn::StoreU(load_w(df, s + i), df, db);
      } else {
        for (int64_t k = 0; k < L; ++k) db[k] = i + k < in ? weight_scalar(s, i + k) : 0.0f;
      }
    }
  }
}

void PackRows(const void* src, DType dtype, int64_t src_stride, int64_t rows, int64_t in, float* dst) {
  switch (dtype) {
    case DType::F32: return pack_rows_t(static_cast<const float*>(src), src_stride, rows, in, dst);
    case DType::BF16: return pack_rows_t(static_cast<const hwy::bfloat16_t*>(src), src_stride, rows, in, dst);
    case DType::F16: return pack_rows_t(static_cast<const hwy::float16_t*>(src), src_stride, rows, in, dst);
    default: fail("pack_rows: rows must be f32, bf16 or f16, found ", dtype_name(dtype));
  }
}

// Chain c of one register tile: part[(m * kNR + n) * L ...] = the partial vector of x row m . w row n over the
// chain's blocks (a plain chain of MulAdds from zero, as in dot_rows).
HWY_INLINE void tile_chain(const float* HWY_RESTRICT xk, const float* HWY_RESTRICT wk, int64_t Kp, int64_t count,
                           float* HWY_RESTRICT part) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc[kMR][kNR];
  for (int m = 0; m < kMR; ++m)
    for (int n = 0; n < kNR; ++n) acc[m][n] = hn::Zero(df);
  for (int64_t j = 0; j < count; ++j, xk += L, wk += L) {
    VF wv[kNR];
    for (int n = 0; n < kNR; ++n) wv[n] = hn::LoadU(df, wk + n * Kp);
    for (int m = 0; m < kMR; ++m) {
      const VF xv = hn::LoadU(df, xk + m * Kp);
      for (int n = 0; n < kNR; ++n) acc[m][n] = hn::MulAdd(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < kMR; ++m)
    for (int n = 0; n < kNR; ++n) hn::Store(acc[m][n], df, part + (m * kNR + n) * L);
}

// A tile of x rows runs chain by chain over all the w tiles of the panel, so the chain's quarter of the x rows stays
// in L1 while the w rows stream from L2; the four partial vectors of every element are kept (part: per w tile, per
// chain, kMR * kNR vectors) and reduced as dot_rows does: (a0 + a1) + (a2 + a3), then SumOfLanes.
void GemmPacked(const float* xp, int64_t T, const float* wp, int64_t R, int64_t in, float* y, int64_t y_stride) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t Kp = PackedRowFloats(in), n_wt = (R + kNR - 1) / kNR, tile_floats = kMR * kNR * L;
  const Phases ph(in);
  thread_local hwy::AlignedFreeUniquePtr<float[]> part_buf;
  thread_local int64_t part_size = 0;
  if (part_size < n_wt * 4 * tile_floats) {
    part_size = n_wt * 4 * tile_floats;
    part_buf = hwy::AllocateAligned<float>(static_cast<size_t>(part_size));
    if (!part_buf) fail("gemm_packed: out of memory for ", part_size, " partial sums");
  }
  float* part = part_buf.get();
  for (int64_t t0 = 0; t0 < T; t0 += kMR) {
    const int64_t mt = std::min<int64_t>(kMR, T - t0);
    for (int c = 0; c < 4; ++c)
      for (int64_t wt = 0; wt < n_wt; ++wt)
        tile_chain(xp + t0 * Kp + ph.offset[c], wp + wt * kNR * Kp + ph.offset[c], Kp, ph.count[c],
                   part + (wt * 4 + c) * tile_floats);
    for (int64_t wt = 0; wt < n_wt; ++wt) {
      const float* p = part + wt * 4 * tile_floats;
      const int64_t r0 = wt * kNR, nr = std::min<int64_t>(kNR, R - r0);
      for (int64_t m = 0; m < mt; ++m)
        for (int64_t n = 0; n < nr; ++n) {
          const float* e = p + (m * kNR + n) * L;
          const VF s = hn::Add(hn::Add(hn::Load(df, e), hn::Load(df, e + tile_floats)),
                               hn::Add(hn::Load(df, e + 2 * tile_floats), hn::Load(df, e + 3 * tile_floats)));
          y[(t0 + m) * y_stride + r0 + n] = hn::GetLane(hn::SumOfLanes(df, s));
        }
    }
  }
}

// ---- Outer-product matmul for the SSD's chunk products ----------------------------------------------------------

// C tile [MR rows, NV vectors] (+)= A[:, :k_end] B[:k_end, :]: per k, NV vectors of B's row k and MR broadcasts of A.
template <int MR, int NV>
HWY_INLINE void mm_tile(int64_t k_end, const float* HWY_RESTRICT A, int64_t lda, const float* HWY_RESTRICT B,
                        int64_t ldb, float* HWY_RESTRICT C, int64_t ldc, bool accumulate) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = accumulate ? hn::LoadU(df, C + m * ldc + v * L) : hn::Zero(df);
  for (int64_t k = 0; k < k_end; ++k) {
    VF b[NV];
    for (int v = 0; v < NV; ++v) b[v] = hn::LoadU(df, B + k * ldb + v * L);
    for (int m = 0; m < MR; ++m) {
      const VF a = hn::Set(df, A[m * lda + k]);
      for (int v = 0; v < NV; ++v) acc[m][v] = hn::MulAdd(a, b[v], acc[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[m][v], df, C + m * ldc + v * L);
}

template <int MR>
HWY_INLINE void mm_rows(int64_t N, int64_t k_end, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                        int64_t ldc, bool accumulate) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t n = 0;
  for (; n + 2 * L <= N; n += 2 * L) mm_tile<MR, 2>(k_end, A, lda, B + n, ldb, C + n, ldc, accumulate);
  for (; n + L <= N; n += L) mm_tile<MR, 1>(k_end, A, lda, B + n, ldb, C + n, ldc, accumulate);
  for (; n < N; ++n) {  // columns past the last whole vector
    for (int m = 0; m < MR; ++m) {
      float s = accumulate ? C[m * ldc + n] : 0.0f;
      for (int64_t k = 0; k < k_end; ++k) s += A[m * lda + k] * B[k * ldb + n];
      C[m * ldc + n] = s;
    }
  }
}

void MatMul(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
            int64_t ldc, bool accumulate, bool causal) {
  constexpr int64_t MR = 4;
  int64_t m = 0;
  for (; m + MR <= M; m += MR) {
    const int64_t k_end = causal ? std::min(K, m + MR) : K;
    mm_rows<MR>(N, k_end, A + m * lda, lda, B, ldb, C + m * ldc, ldc, accumulate);
  }
  for (; m < M; ++m) {
    const int64_t k_end = causal ? std::min(K, m + 1) : K;
    mm_rows<1>(N, k_end, A + m * lda, lda, B, ldb, C + m * ldc, ldc, accumulate);
  }
}

// out[j] = exp(seg[j] += a) * cb[j] * dt[j] for j < i, then out[i] = cb[i] * dt[i], out[i + 1 .. n) = 0.
void SsdDecayRow(int64_t i, int64_t n, float a, float* seg, const float* cb, const float* dt, float* out) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const VF va = hn::Set(df, a);
  int64_t j = 0;
  for (; j + L <= i; j += L) {
    const VF s = hn::Add(hn::LoadU(df, seg + j), va);
    hn::StoreU(s, df, seg + j);
    hn::StoreU(hn::Mul(hn::Mul(hn::Exp(df, s), hn::LoadU(df, cb + j)), hn::LoadU(df, dt + j)), df, out + j);
  }
  if (j < i) {
    HWY_ALIGN float st[kMaxLanes] = {}, ct[kMaxLanes] = {}, dtt[kMaxLanes] = {}, ot[kMaxLanes];
    const int64_t r = i - j;
    for (int64_t k = 0; k < r; ++k) st[k] = seg[j + k] + a, ct[k] = cb[j + k], dtt[k] = dt[j + k];
    hn::Store(hn::Mul(hn::Mul(hn::Exp(df, hn::Load(df, st)), hn::Load(df, ct)), hn::Load(df, dtt)), df, ot);
    for (int64_t k = 0; k < r; ++k) seg[j + k] = st[k], out[j + k] = ot[k];
  }
  seg[i] = 0.0f;
  out[i] = cb[i] * dt[i];
  for (int64_t k = i + 1; k < n; ++k) out[k] = 0.0f;
}

}  // namespace HWY_NAMESPACE
}  // namespace mambacpp::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mambacpp::cpu::simd {

HWY_EXPORT(PackedRowFloats);
HWY_EXPORT(GemmTileTokens);
HWY_EXPORT(GemmTileRows);
HWY_EXPORT(PackRows);
HWY_EXPORT(GemmPacked);
HWY_EXPORT(MatMul);
HWY_EXPORT(SsdDecayRow);

int64_t packed_row_floats(int64_t in) { return HWY_DYNAMIC_DISPATCH(PackedRowFloats)(in); }
int64_t gemm_tile_tokens() { return HWY_DYNAMIC_DISPATCH(GemmTileTokens)(); }
int64_t gemm_tile_rows() { return HWY_DYNAMIC_DISPATCH(GemmTileRows)(); }
void pack_rows(const void* src, DType dtype, int64_t src_stride, int64_t rows, int64_t in, float* dst) {
  HWY_DYNAMIC_DISPATCH(PackRows)(src, dtype, src_stride, rows, in, dst);
}
void gemm_packed(const float* xp, int64_t T, const float* wp, int64_t R, int64_t in, float* y, int64_t y_stride) {
  HWY_DYNAMIC_DISPATCH(GemmPacked)(xp, T, wp, R, in, y, y_stride);
}

void matmul(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
            int64_t ldc, bool accumulate, bool causal) {
  HWY_DYNAMIC_DISPATCH(MatMul)(M, N, K, A, lda, B, ldb, C, ldc, accumulate, causal);
}
void ssd_decay_row(int64_t i, int64_t n, float a, float* seg, const float* cb, const float* dt, float* out) {
  HWY_DYNAMIC_DISPATCH(SsdDecayRow)(i, n, a, seg, cb, dt, out);
}

}  // namespace mambacpp::cpu::simd
#endif  // HWY_ONCE
