// Launchers of the CUDA kernels, callable from plain C++ (cuda_backend.cpp). Pointers are device pointers; row
// strides are in elements. Shapes and dtypes have been checked by CudaBackend before any launcher runs. Every
// launcher enqueues on `stream` and checks the launch; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "mambacpp/dtype.h"

namespace mambacpp::cuda {

// A 2-D f32 activation: row t starts at data + t * stride.
struct F32Rows {
  float* data = nullptr;
  int64_t stride = 0;
};
struct ConstF32Rows {
  const float* data = nullptr;
  int64_t stride = 0;
};

// A weight in its device dtype (f32, f16 or bf16). data == nullptr means absent (optional bias).
struct DevWeight {
  const void* data = nullptr;
  DType dtype = DType::F32;
};

// ---- elementwise.cu ---------------------------------------------------------------------------------------------
// Up to kCopyRegionBatch device-to-device copies of disjoint regions in one launch (Backend::copy_many); the batch
// is a kernel parameter (3 KB of the 4 KB a launch takes): a 64-layer model's slot is one launch.
inline constexpr int kCopyRegionBatch = 128;
struct CopyRegionBatch {
  void* dst[kCopyRegionBatch];
  const void* src[kCopyRegionBatch];
  uint64_t bytes[kCopyRegionBatch];
  int n = 0;
};
void launch_copy_regions(const CopyRegionBatch& b, cudaStream_t stream);

// dst[i] = src[i] converted (f32/f16/bf16 -> f32/f16/bf16), n contiguous elements.
void launch_convert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t stream);
// y [T, D] rounded to bf16 values in place (nearest even), as a GEMM's bf16 output holds them.
void launch_round_bf16(F32Rows y, int64_t T, int64_t D, cudaStream_t stream);
// out[t, :] = table[ids[t], :]. table: [V, D] contiguous.
void launch_embed(DevWeight table, int64_t D, const int32_t* ids, int64_t T, F32Rows out, cudaStream_t stream);
// out = src as f32; src: [rows, cols] with a row stride in its own dtype.
void launch_to_f32(const void* src, DType from, int64_t src_stride, int64_t rows, int64_t cols, F32Rows out,
                   cudaStream_t stream);
// acc[t, :] += x[t, :]. [T, D].
void launch_add_inplace(F32Rows acc, ConstF32Rows x, int64_t T, int64_t D, cudaStream_t stream);
// y[t, :] *= silu(z[t, :]). [T, D].
void launch_silu_gate(F32Rows y, ConstF32Rows z, int64_t T, int64_t D, cudaStream_t stream);
// out[i, :] = x[rows[i], :] for element size 2, 4 or 8 bytes. rows: device array of n indices.
void launch_gather_rows(const void* x, int64_t x_stride, const int64_t* rows, int64_t n, int64_t cols,
                        size_t elem_size, void* out, int64_t out_stride, cudaStream_t stream);
// y[t, :] = bias (f32 broadcast of each row), for the GEMM path's beta = 1 accumulation.
void launch_broadcast_bias(DevWeight bias, F32Rows y, int64_t T, int64_t out, cudaStream_t stream);

// ---- norms.cu ---------------------------------------------------------------------------------------------------
void launch_rmsnorm(ConstF32Rows x, DevWeight w, float eps, F32Rows out, int64_t T, int64_t D, cudaStream_t stream);
// out [T, D] contiguous, dtype `to` (bf16/f16) = rmsnorm over each run of group_size features times w (f32 [D]) of
// x, or of x * silu(gate) when gate.data is set; w absent: that only rounded. D % group_size == 0. Rows with 16-byte
// alignment round the f32 values launch_rmsnorm / launch_gated_rmsnorm write for them (one kernel at every T).
void launch_rmsnorm_round(ConstF32Rows x, ConstF32Rows gate, DevWeight w, int64_t group_size, float eps, DType to,
                          void* out, int64_t T, int64_t D, cudaStream_t stream);
// The same with x in bf16 (raw bits, row stride x_stride elements): the same bits as for x's values in f32 rows.
void launch_rmsnorm_round_bf16_x(const uint16_t* x, int64_t x_stride, ConstF32Rows gate, DevWeight w,
                                 int64_t group_size, float eps, DType to, void* out, int64_t T, int64_t D,
                                 cudaStream_t stream);
// The same with the gate in bf16 too (gate_stride elements; set): the same bits as for both in f32 rows.
void launch_rmsnorm_round_bf16_xz(const uint16_t* x, int64_t x_stride, const uint16_t* gate, int64_t gate_stride,
                                  DevWeight w, int64_t group_size, float eps, DType to, void* out, int64_t T,
                                  int64_t D, cudaStream_t stream);
void launch_gated_rmsnorm(ConstF32Rows y, ConstF32Rows z, DevWeight w, int64_t group_size, float eps, F32Rows out,
                          int64_t T, int64_t D, cudaStream_t stream);

// ---- linear.cu --------------------------------------------------------------------------------------------------
inline constexpr int64_t kGemvMaxRows = 8;  // T up to this goes through the hand-written GEMV
// y[t, o] = sum_i x[t, i] * w[o, i] (+ bias[o]) for T <= kGemvMaxRows. w: [out, in] contiguous.
void launch_gemv(ConstF32Rows x, DevWeight w, DevWeight bias, F32Rows y, int64_t T, int64_t in, int64_t out,
                 cudaStream_t stream);
// Splits f32 activations into hi + lo parts of dtype `to` (bf16 or f16): hi = round(x), lo = round(x - hi).
// hi, lo: [T, in] contiguous; lo may be null (round only: the activations of the fast-precision GEMMs).
void launch_split_hi_lo(ConstF32Rows x, int64_t T, int64_t in, DType to, void* hi, void* lo, cudaStream_t stream);

// ---- conv1d.cu --------------------------------------------------------------------------------------------------
struct Conv1dLaunch {
  ConstF32Rows x;           // [T, C]
  // Set instead of x.data (x.stride its row stride): the input in bf16 (raw bits), as the fast prompts' in_proj writes
  // it. Multi-token batches on the window kernel only (conv1d_bf16_outputs_supported).
  const uint16_t* x16 = nullptr;
  DevWeight w;              // [C, 1, K]
  DevWeight bias;           // [C] or absent
  void* state = nullptr;    // [n_slots, C, K-1], f32 or bf16
  bool state_bf16 = false;
  F32Rows out;              // [T, C]
  int64_t T = 0, C = 0, K = 0;
  const SeqSpan* seqs = nullptr;      // device, n_seqs
  const int32_t* token_seq = nullptr; // device, [T]: sequence index of each token (-1: none)
  int64_t n_seqs = 0;
  // Every sequence has one token (decode), or 1..kStepMaxLen (BatchLayout::step_pieces): one kernel reads the state,
  // runs the sequence's tokens in order as that many steps would, and writes the shifted state.
  bool all_single = false;
  // Optional (conv1d_bf16_outputs_supported): the outputs rounded to bf16 (raw bits) into three row-major tensors
  // instead of `out`: channels [0, split[0]) -> out16[0], [split[0], split[1]) -> out16[1], the rest -> out16[2]
  // (Mamba-2's x, B, C as the fast SSD kernels read them).
  uint16_t* out16[3] = {nullptr, nullptr, nullptr};
  int64_t split[2] = {0, 0};
  // The window kernel's rows of multi-token sequences take silu's approximate form (a few ulp): set where those rows
  // are rounded to bf16 next (the fast SSD's inputs). One-token rows keep the exact form the step kernel uses.
  bool fast_silu = false;
};
void launch_conv1d_silu(const Conv1dLaunch& p, cudaStream_t stream);
// Whether launch_conv1d_silu can write the bf16 outputs for this launch (a multi-token batch on the window kernel);
// the caller asks before setting out16.
bool conv1d_bf16_outputs_supported(const Conv1dLaunch& p);

// ---- mamba1_scan.cu ---------------------------------------------------------------------------------------------
struct SsdChunk;
struct SsdSeqChunks;
struct Mamba1Launch {
  ConstF32Rows x, dt, B, C, z;  // [T, d_inner] / [T, d_state]
  DevWeight A_log;              // [d_inner, d_state]
  DevWeight D, dt_bias;         // [d_inner]
  void* state = nullptr;        // [n_slots, d_inner, d_state]
  bool state_bf16 = false;
  F32Rows y;                    // [T, d_inner]
  // Optional (decode): dt computed here as dt_low[t, :] . dt_proj[c, :] instead of read from `dt`.
  ConstF32Rows dt_low;          // [T, dt_rank]
  DevWeight dt_proj;            // [d_inner, dt_rank]; data null: read `dt`
  int64_t dt_rank = 0;
  int64_t d_inner = 0, d_state = 0;
  const SeqSpan* seqs = nullptr;  // device
  int64_t n_seqs = 0;
  bool single_tokens = false;  // every sequence has one token (decode): the one-thread-per-channel step kernel
  // Step pieces (BatchLayout::step_pieces): sequences of 1..kStepMaxLen tokens, each token a decode step, so the
  // state is rounded to its dtype after every token as a store and reload between steps would (bf16 state).
  bool step_pieces = false;
  // The chunked scan (mamba1_chunked_scan.cu): sequences of at least kMamba1ChunkedMinLen tokens (d_state
  // kMamba1PieceStates, dt given) are cut into pieces of kMamba1Piece tokens (the chunk table at that size: n_pieces
  // rows, seq_pieces per sequence) scanned in parallel; the sequential kernel takes the others. piece_states
  // [n_pieces, d_inner, d_state] and piece_dt [n_pieces, d_inner]: f32 scratch.
  const SsdChunk* pieces = nullptr;
  const SsdSeqChunks* seq_pieces = nullptr;
  int64_t n_pieces = 0;  // > 0: the chunked scan runs
  float* piece_states = nullptr;
  float* piece_dt = nullptr;
  bool has_short_seqs = false;  // with n_pieces > 0: some sequences are shorter (the sequential kernel runs too)
  bool fast = false;  // fast precision (16-bit weights): the chunked scan's decays by the approximate exp2
};
inline constexpr int64_t kMamba1Piece = 64;
inline constexpr int64_t kMamba1ChunkedMinLen = 2 * kMamba1Piece;
inline constexpr int64_t kMamba1PieceStates = 16;
void launch_mamba1_scan(const Mamba1Launch& p, cudaStream_t stream);
// The chunked scan's three kernels (called by launch_mamba1_scan when p.n_pieces > 0).
void launch_mamba1_chunked_scan(const Mamba1Launch& p, cudaStream_t stream);

// ---- mamba2_ssd.cu ----------------------------------------------------------------------------------------------
// One chunk of one sequence (a row of the chunk table).
struct SsdChunk {
  int64_t start = 0;  // first token
  int32_t len = 0;    // tokens in this chunk (1..chunk_size)
  int32_t seq = 0;    // index into the batch's sequences
  // Fast precision: the chunk's first tile in SsdScratch::scores (its ssd_score_tiles(len) tiles follow; one set per
  // group).
  int32_t score_tile = 0;
  // 1: the chunk's sequence is a single token, which takes the step kernel (the chunk kernels skip it without a
  // dependent load of the sequence table).
  int32_t single_token = 0;
};
// The fast chunk kernels' tile (mamba2_ssd_fast.cu): 64 rows i, sources j, columns p.
inline constexpr int kSsdFastTile = 64;
// The longest chunk the fast kernels take (the chunk state kernel keeps one decay per token in shared memory);
// longer chunk sizes take the exact kernels.
inline constexpr int kSsdFastMaxChunk = 1024;
// Score tiles of a chunk of len tokens: the 64 x 64 tiles (i, j) with j <= i.
inline int64_t ssd_score_tiles(int64_t len) {
  const int64_t t = (len + kSsdFastTile - 1) / kSsdFastTile;
  return t * (t + 1) / 2;
}
// The chunks of one sequence: rows [first, first + count) of the chunk table.
struct SsdSeqChunks {
  int32_t first = 0;
  int32_t count = 0;
};

struct Mamba2Launch {
  ConstF32Rows x;       // [T, n_heads * head_dim]
  ConstF32Rows dt;      // [T, n_heads] raw
  const uint16_t* dt16 = nullptr;  // set instead of dt.data (dt.stride its row stride): dt in bf16 (fast chunked path)
  ConstF32Rows B, C;    // [T, n_groups * d_state]
  DevWeight A_log, D, dt_bias;  // [n_heads]
  float dt_min = 0.0f, dt_max = 0.0f;
  int64_t n_heads = 0, head_dim = 0, n_groups = 0, d_state = 0, chunk_size = 256;
  void* state = nullptr;  // [n_slots, n_heads, head_dim, d_state]
  bool state_bf16 = false;
  F32Rows y;              // [T, n_heads * head_dim]; the fast chunked path rounds it to bf16 values
  uint16_t* y16 = nullptr;  // set instead of y.data (y.stride its row stride): y in bf16 (fast chunked path only)
  ConstF32Rows z;         // optional: y *= silu(z) ([T, n_heads * head_dim]; data null: no gate). The step kernel
                          // applies it; after the chunked kernels the backend runs launch_silu_gate
  int64_t T = 0;
  const SeqSpan* seqs = nullptr;  // device
  int64_t n_seqs = 0;
  // Fast precision (16-bit weights): the chunked path's matrix products take bf16 operands, one tensor-core product
  // with f32 accumulation (mamba2_ssd_fast.cu); false: the near-f32 hi/lo products. The step kernel ignores it.
  bool fast = false;
  bool has_single_seqs = false;  // fast chunked path: some sequences have one token (they take the step kernel)
  // The step kernel takes sequences of 1..step_max_len tokens, each token as one decode step (the state rounded to
  // its dtype between tokens); longer ones are the chunked kernels'. > 1 only for BatchLayout::step_pieces.
  int64_t step_max_len = 1;
  // Fast chunked path: conv1d already wrote SsdScratch's bf16 x, B, C (Conv1dLaunch::out16); x, B, C unset.
  bool inputs_bf16 = false;
};

// The longest sequence of a step-pieces batch (BatchLayout::step_pieces; model/step_pieces.h's kStepPieceMaxLen).
inline constexpr int64_t kStepMaxLen = 16;

// Every sequence has 1..p.step_max_len tokens: the recurrent step per token, one block per (sequence, head, rows).
void launch_mamba2_step(const Mamba2Launch& p, cudaStream_t stream);

// Scratch for the chunked path (device): dt after softplus/clamp [T, n_heads] f32, the in-chunk inclusive cumsum of
// dt * A [T, n_heads] f64, and one [head_dim, d_state] state per (chunk, head) in f32.
// The fast kernels (ssd_fast_path) take bf16 copies (raw bits) of x [T, n_heads * head_dim], B and C
// [T, n_groups * d_state] and of the state entering each chunk [n_chunks, n_heads, head_dim, d_state], the scores
// and cum2/w2 instead of dt and cum; the kernels tell the paths apart by which pointers are set, so the caller sets
// exactly those of the path ssd_fast_path names.
struct SsdScratch {
  float* dt = nullptr;
  double* cum = nullptr;
  float* chunk_states = nullptr;
  uint16_t* x16 = nullptr;
  uint16_t* B16 = nullptr;
  uint16_t* C16 = nullptr;
  uint16_t* states16 = nullptr;
  float* scores = nullptr;  // fast: C_i . B_j per score tile and group ([tile][group][64 x 64], SsdChunk::score_tile)
  // Fast: the decays in f32, log2-scaled, [n_heads, T] each, a head's tokens contiguous as the kernels read and write
  // them (the chunk state kernel writes them; dt and cum unused): cum2 = S log2(e), w2 = log2(dt) - cum2, so
  // exp(S_i - S_j) dt_j = exp2(cum2_i + w2_j).
  float* cum2 = nullptr;
  float* w2 = nullptr;
};
// Whether launch_mamba2_chunked takes the fast kernels (mamba2_ssd_fast.cu) for this launch.
bool ssd_fast_path(const Mamba2Launch& p);
// Multi-token batches: chunked SSD over the chunk table (device: chunks [n_chunks], seq_chunks [n_seqs]).
void launch_mamba2_chunked(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                           const SsdSeqChunks* seq_chunks, const SsdScratch& scratch, cudaStream_t stream);

// ---- select_top_k.cu --------------------------------------------------------------------------------------------
// One row's request, resolved: 1 <= k <= kmax <= kMaxTopK, 1 <= limit <= V, penalised ids
// pen_ids[pen_offset, pen_offset + pen_count) distinct and in [0, V).
struct SelectRowParams {
  int32_t k = 1;
  int32_t limit = 0;
  float penalty = 1.0f;
  int32_t pen_offset = 0;
  int32_t pen_count = 0;
};
struct SelectLaunch {
  float* logits = nullptr;  // [n_rows, V] with row stride `stride`; the penalty is applied in place
  int64_t stride = 0;
  int64_t n_rows = 0;
  const SelectRowParams* rows = nullptr;  // device, [n_rows]
  const int32_t* pen_ids = nullptr;       // device
  int32_t* out = nullptr;                 // device, [n_rows, out_stride]; out_stride = 3 + 2 * kmax (layout: .cu)
  int64_t out_stride = 0;
  int32_t kmax = 1;
};
void launch_select_top_k(const SelectLaunch& p, cudaStream_t stream);

// ---- row_logsumexp.cu -------------------------------------------------------------------------------------------
// out[r] = log sum_{j < limits[r]} exp(logits[r, j]) (Backend::row_logsumexp); limits and out in device memory.
void launch_row_logsumexp(ConstF32Rows logits, const int32_t* limits, int64_t n_rows, float* out, cudaStream_t stream);

// ---- attention.cu -----------------------------------------------------------------------------------------------
// One sequence of an attention call as the kernels read it: rows [start, start + len) of q/k/v/out, `past` rows
// already cached, its page pointers at pages[page0 ...] (K rows [page_tokens, kv_dim] then V rows per page, f32 or
// bf16: AttentionLaunch::kv_bf16).
struct AttnSeq {
  int64_t start = 0;
  int64_t len = 0;
  int64_t past = 0;
  int64_t page0 = 0;
};
// Up to kAttnTileItems consecutive items of one sequence, item = i * rep + r: query row i, head r of the group.
inline constexpr int kAttnTileItems = 16;
// Items per tile of the tensor-core kernel (AttentionLaunch::mma): 8 warps of 16.
inline constexpr int kAttnMmaTileItems = 128;
struct AttnTile {
  int32_t seq = 0;
  int32_t item0 = 0;
};
struct AttentionLaunch {
  ConstF32Rows q, k, v;  // [T, n_heads * hd], [T, n_kv * hd] x2 (RoPE applied)
  F32Rows out;           // [T, n_heads * hd]
  int64_t T = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, page_tokens = 0;
  float scale = 0.0f;
  const AttnSeq* seqs = nullptr;      // device
  const int32_t* token_seq = nullptr; // device, [T]: sequence index of each row (-1: none)
  const AttnTile* tiles = nullptr;    // device
  int64_t n_tiles = 0;
  void* const* pages = nullptr;       // device
  bool kv_bf16 = false;               // page elements: bf16 (rounded to nearest even on append), else f32
  bool pipelined = false;             // stage keys with the next step's loads in flight (decode-shaped calls)
  // Fast precision: q, k, v rounded to bf16, products on the tensor cores (attention_mma.cu); tiles of
  // kAttnMmaTileItems items; head_dim a multiple of 8, pages 16-byte aligned. Splits are sized per sequence from its
  // live length (split_keys unused).
  bool mma = false;
  // Device-resident mode (AttentionArgs::device_lengths): seqs and tiles are null; sequence k is spans[k] with
  // past = lengths[slot] and its pages at pages[slot * max_pages ...]; block x is tile x % tiles_per_seq of
  // sequence x / tiles_per_seq (tiles past the sequence's items exit).
  const SeqSpan* spans = nullptr;
  const int64_t* lengths = nullptr;
  int64_t max_pages = 0;
  int64_t tiles_per_seq = 0;
  // Keys split over grid.z in runs of split_keys (a multiple of 32) when n_splits > 1; partial holds
  // [n_splits, T, n_heads, head_dim + 2] (unnormalised output, max, sum).
  int n_splits = 1;
  int64_t split_keys = 0;
  float* partial = nullptr;
};
// Writes this call's k and v rows into the pages (positions past + i); run before launch_attention.
void launch_kv_append(const AttentionLaunch& p, cudaStream_t stream);
// head_dim up to 256.
void launch_attention(const AttentionLaunch& p, cudaStream_t stream);

// ---- hybrid_elementwise.cu --------------------------------------------------------------------------------------
// RoPE in place (Backend::rope): positions [T] (device, -1: row untouched), inv_freq [rope_dim / 2] (device).
void launch_rope(F32Rows x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
                 const double* inv_freq, cudaStream_t stream);
// RoPE with positions lengths[spans[token_seq[t]].slot] + (t - start) and inverse frequencies theta^(-2i/rope_dim)
// formed on the device (in double), for captured decode steps.
void launch_rope_at_lengths(F32Rows x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                            const SeqSpan* spans, const int32_t* token_seq, const int64_t* lengths,
                            cudaStream_t stream);
void launch_relu2(F32Rows x, int64_t T, int64_t D, cudaStream_t stream);
void launch_silu_mul(ConstF32Rows gate, ConstF32Rows up, F32Rows out, int64_t T, int64_t D, cudaStream_t stream);
void launch_scale(F32Rows x, float alpha, int64_t T, int64_t D, cudaStream_t stream);

}  // namespace mambacpp::cuda
