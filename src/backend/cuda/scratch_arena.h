// The CUDA backend's scratch: one device buffer per use (Slot) that only grows, and the pinned host buffer of the
// row ops' copies. Growth and the lifetime of old buffers live here, in one place: once a CUDA graph has been captured
// (mark_captured), a replaced buffer may still be written by every replay of an op the graph recorded, so it is
// retired (freed with the arena) instead of freed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mambacpp::cuda {

class ScratchArena {
 public:
  enum Slot : int {
    kBatch,        // prepare_batch: SeqSpan[n] then the token -> sequence map
    kChunkTable,   // SsdChunk[n_chunks] then SsdSeqChunks[n_seqs] (mamba2_ssd, Mamba-1's chunked scan)
    kSsdDt,        // mamba2_ssd's exact chunked path: dt
    kSsdCum,       // ... and its f64 cumulative sums
    kSsdStates,    // mamba2_ssd's chunked path: the chunk states
    kSsdFast,      // its fast-precision bf16 copies, scores and decays (SsdScratch::x16 ...)
    kSplit,        // linear: the hi/lo halves of x; prefill pieces' rounded rows
    kProj32,       // fused_linear: f32 rows for a bf16 y without a bf16-output plan
    kM1Pieces,     // mamba1_scan's chunked path (Mamba1Launch::piece_states, piece_dt)
    kM1Dt,         // decode ops, fast precision: dt_proj's output
    kFastX16,      // decode ops, fast precision: the rows rounded to 16 bits
    kRows,         // gather_rows: row indices
    kSelectIn,     // select_top_k / row_logsumexp: parameters in
    kSelectOut,    // select_top_k: packed candidates out
    kAttnMeta,     // attention: sequences, tiles, page pointers
    kAttnPartial,  // attention: split-key partials
    kRopeMeta,     // rope: positions and inverse frequencies
    kMoeSort,      // moe_experts: expert offsets, active experts, sorted pairs and their places
    kMoeHidden,    // moe_experts: the experts' activations [pairs, I] (and [pairs, 2 I] before the prefill's act)
    kMoeOut,       // moe_experts: the experts' outputs [pairs, d_model]
    kMoeGather,    // moe_experts, prefill path: the gathered input rows [pairs, d_model]
    kQuantDense,   // linear with quantized weights, many rows: the weight dequantized to 16 bits
    kSlotCount
  };

  ScratchArena() = default;
  ~ScratchArena();
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;

  // At least `bytes` in slot s. A larger buffer replaces the old one only after `stream` drains (enqueued kernels
  // may still read the old one).
  void* grow(Slot s, size_t bytes, cudaStream_t stream);
  // Scratch of the decode ops, which captured graphs hold by pointer: sized for kFastMaxRows rows from the first
  // use, so it grows only when a wider row appears -- during the first (eager) step of a model, which runs every op
  // of a step before any graph is captured -- never later under a captured graph. (The prefill-sized slots grow
  // with T, so decode ops must not share them.)
  void* grow_decode(Slot s, int64_t rows, int64_t width, size_t elem, cudaStream_t stream);
  void* get(Slot s) const { return buffers_[s].ptr; }
  // The pinned host buffer: only ever in use inside one call, which drains the stream before returning, so growing
  // it needs no wait.
  void* grow_pinned(size_t bytes);
  // From now on replaced buffers are retired, not freed.
  void mark_captured() { captured_ = true; }

  // Sizes rounded up to 256 bytes, so that parts packed into one buffer stay aligned for any element type.
  static size_t align(size_t n) { return (n + 255) & ~size_t(255); }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t cap = 0;
  };
  Buffer buffers_[kSlotCount];
  bool captured_ = false;       // a graph has been captured: grow() retires old buffers instead of freeing them
  std::vector<void*> retired_;  // buffers captured graphs may still use
  void* pinned_ = nullptr;
  size_t pinned_cap_ = 0;
};

}  // namespace mambacpp::cuda
