// The CUDA backend: owns the device copies of the weights, one stream, a cuBLAS handle (both created on first use)
// and the scratch buffers the kernels need (scratch_arena.h); checks each op's shapes, then calls the launchers of
// cuda_ops.h and fused_ops.h. All work is enqueued on the one stream, so its order is the program order;
// copy_to_host and synchronize wait.
//
// Dtypes: activations f32; state f32 or bf16 (computed in f32); weights as adopt_weight made them (2-D matrices in
// the backend's weight dtype, vectors and conv kernels in f32: they are a negligible share of the bytes and feed
// exponentials, softplus and normalisations where 16-bit rounding would show).
//
// The class's methods live in rooms by op family:
//   cuda_backend.cpp       construction, memory, weights, prepare_batch, norms and elementwise ops, shared checks
//   backend_linear.cpp     linear, fused_linear (the fused GEMVs of exact decode, fast precision's pinned GEMMs)
//   backend_ssm.cpp        conv1d, the Mamba-1 scan, the Mamba-2 SSD, plan_mamba2, mamba2_conv_ssd
//   backend_attention.cpp  attention over the paged KV cache, rope
//   backend_rows.cpp       embed, gather_rows, select_top_k, row_logsumexp
//   backend_graphs.cpp     CUDA graph capture and replay
//   backend_moe.cpp        moe_route, moe_experts (moe_kernels.cuh)
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/scratch_arena.h"
#include "mambacpp/error.h"

namespace mambacpp {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, DType weight_dtype, Precision precision, bool batch_invariant);
  ~CudaBackend() override;

  Device device() const override { return Device::CUDA; }
  std::string description() const override { return description_; }

  // ---- Memory (cuda_backend.cpp) ----
  void* allocate(size_t bytes) override;
  void deallocate(void* p) override;
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy_many(const std::vector<CopyRegion>& regions) override;
  void fill_zero(void* dst, size_t bytes) override;
  void synchronize() override;
  TensorView adopt_weight(const TensorView& host) override;
  void prepare_batch(BatchLayout& layout) override;

  // ---- Graphs (backend_graphs.cpp) ----
  bool supports_graphs() const override { return true; }
  void begin_capture() override;
  std::unique_ptr<Graph> end_capture() override;
  void abort_capture() override;
  void replay(Graph& graph) override;

  // ---- Norms and elementwise ops (cuda_backend.cpp) ----
  void to_f32(const TensorView& src, TensorView out) override;
  void rmsnorm(const TensorView& x, const TensorView& w, float eps, TensorView out) override;
  void add_inplace(TensorView acc, const TensorView& x) override;
  void gated_rmsnorm(const TensorView& y, const TensorView& z, const TensorView& w, int64_t group_size, float eps,
                     TensorView out) override;
  void relu2(TensorView x) override;
  void silu_mul(const TensorView& gate, const TensorView& up, TensorView out) override;
  void scale(TensorView x, float alpha) override;

  // ---- Linear (backend_linear.cpp) ----
  void linear(const TensorView& x, const Weight& w, const TensorView& bias, TensorView y) override;
  bool supports_fused_linear(const FusedLinearArgs& a, const BatchLayout& batch) const override;
  void fused_linear(const FusedLinearArgs& a, const BatchLayout& batch) override;

  // ---- Quantized weights (quant_linear.cpp) ----
  void linear_quant(const TensorView& x, const Weight& w, const TensorView& bias, TensorView y);
  void embed_quant(const Weight& table, const TensorView& ids, TensorView out);

  // ---- SSM (backend_ssm.cpp) ----
  void conv1d_silu(const TensorView& x, const TensorView& w, const TensorView& bias, TensorView state,
                   const BatchLayout& batch, TensorView out) override;
  void mamba1_scan(const Mamba1ScanArgs& a, const BatchLayout& batch) override;
  Mamba2Plan plan_mamba2(const Mamba2Shape& shape, const BatchLayout& batch) const override;
  void mamba2_ssd(const Mamba2ScanArgs& a, const BatchLayout& batch) override;
  void mamba2_conv_ssd(const TensorView& xbc, const TensorView& conv_w, const TensorView& conv_bias,
                       TensorView conv_state, TensorView conv_out, const Mamba2ScanArgs& ssd,
                       const BatchLayout& batch) override;

  // ---- Attention (backend_attention.cpp) ----
  void attention(const AttentionArgs& a, const BatchLayout& batch) override;
  bool supports_device_kv() const override { return true; }
  void rope_at_lengths(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                       const int64_t* device_lengths, const BatchLayout& batch) override;
  void rope(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
            const std::vector<int64_t>& start_positions, const BatchLayout& batch) override;

  // ---- Rows and sampling (backend_rows.cpp) ----
  void embed(const Weight& table, const TensorView& ids, TensorView out) override;
  void gather_rows(const TensorView& x, const int64_t* host_rows, int64_t n, TensorView out) override;
  void select_top_k(TensorView logits, const std::vector<TopKRequest>& requests,
                    std::vector<TopKCandidates>& out) override;
  void row_logsumexp(const TensorView& logits, const std::vector<int64_t>& limits, std::vector<float>& out) override;

  // ---- Mixture of experts (backend_moe.cpp) ----
  void moe_route(const MoeRouteArgs& args) override;
  void moe_experts(const MoeExpertsArgs& args) override;
  bool moe_ops_capturable() const override { return true; }
  // A dense stack of matrices (a fused [E, out, in] expert tensor) in the weight dtype, as 2-D matrices are; the
  // rest as Backend::adopt_matrix does.
  Weight adopt_matrix(const Weight& host) override;
  // Quantized weights (quant_linear.cpp): q8_0 and fp8_e4m3 matrices in the device layouts of quant_ops.h.
  bool supports_weight_format(WeightFormat f) const override;
  Weight adopt_packed(const Weight& host) override;

 private:
  using Slot = cuda::ScratchArena::Slot;

  // ---- Linear (backend_linear.cpp) ----
  void linear_fast(const TensorView& x, const TensorView& w, const cuda::DevWeight& b, TensorView y,
                   void* x16 = nullptr);
  bool fast_rows(const FusedLinearArgs& a, const BatchLayout& batch) const;
  bool fast_fused(const FusedLinearArgs& a, const BatchLayout& batch) const;
  void fused_linear_fast(const FusedLinearArgs& a, const BatchLayout& batch);

  // ---- SSM (backend_ssm.cpp) ----
  cuda::Conv1dLaunch conv_launch(const TensorView& x, const TensorView& w, const TensorView& bias, TensorView state,
                                 const BatchLayout& batch, TensorView out);
  std::optional<cuda::Mamba2Launch> mamba2_launch(const Mamba2ScanArgs& a, const BatchLayout& batch);
  void run_mamba2(cuda::Mamba2Launch& p, const BatchLayout& batch, cuda::Conv1dLaunch* conv);
  int64_t upload_chunk_table(const BatchLayout& b, int64_t chunk_size);
  void mark_prompt_scan();

  // ---- Mixture of experts (backend_moe.cpp) ----
  void moe_experts_prefill(const MoeExpertsArgs& a);  // many tokens: per-expert GEMMs (linear) over sorted rows

  // ---- Attention (backend_attention.cpp) ----
  void set_splits(cuda::AttentionLaunch& p, int64_t max_keys, bool decode_shaped);

  // ---- Shared checks and conversions (cuda_backend.cpp) ----
  template <class... Parts>
  static void need(bool ok, const Parts&... parts) {
    if (!ok) fail(parts...);
  }
  static size_t align(size_t n) { return cuda::ScratchArena::align(n); }
  static bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
  static void check_f32_2d(const TensorView& v, const char* what);
  static bool same_2d(const TensorView& a, const TensorView& b) { return a.dim(0) == b.dim(0) && a.dim(1) == b.dim(1); }
  static void check_state(const TensorView& s, const char* what, std::initializer_list<int64_t> inner);
  static cuda::F32Rows rows(const TensorView& v) { return {v.ptr<float>(), v.stride0()}; }
  static cuda::ConstF32Rows crows(const TensorView& v) { return {v.ptr<const float>(), v.stride0()}; }
  static cuda::DevWeight weight(const TensorView& v);
  // Every sequence of the batch has one token (a decode step): the step kernels of conv1d and the scans.
  static bool one_token_each(const BatchLayout& b);
  // A decode batch the fused kernels take: 1..max_rows sequences, sequence i in row i with one token.
  static bool decode_rows(const BatchLayout& b, int64_t max_rows);
  // The step kernels take the batch: one token each, or step pieces (BatchLayout::step_pieces, checked here:
  // 1..kStepMaxLen tokens each, in row order).
  static bool step_batch(const BatchLayout& b);
  // Rows the fast fused_linear's conv step takes: decode_rows, or a step_batch of 1..max_rows rows.
  static bool step_rows(const BatchLayout& b, int64_t max_rows);
  // The device copy of the batch's spans, after checking that it is the one prepare_batch made for this batch and
  // that every span fits the activations (T rows) and the state (n_slots).
  const SeqSpan* device_seqs(const BatchLayout& b, int64_t n_slots, int64_t T, const char* op) const;

  void* grow(Slot s, size_t bytes) { return scratch_.grow(s, bytes, stream()); }
  void* decode_scratch(Slot s, int64_t rows, int64_t width, size_t elem) {
    return scratch_.grow_decode(s, rows, width, elem, stream());
  }
  cudaStream_t stream();
  cublasHandle_t cublas();

  int device_ = 0;
  int sm_count_ = 1;
  DType weight_dtype_ = DType::BF16;
  bool fast_ = false;            // Precision::Fast: 16-bit weights take linear_fast / the fast fused_linear
  bool batch_invariant_ = true;  // fast: the fast fused_linear at every batch size (false: fused GEMVs up to 8 rows)
  int64_t prompt_scans_ = 0;     // multi-token SSD / Mamba-1 scan calls so far (mark_prompt_scan)
  std::string description_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  static constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
  void* cublas_workspace_ = nullptr;  // shared by cuBLAS and cuBLASLt (one stream: never used at once)
  cuda::LtMatmul lt_;                 // the GEMMs with 16-bit weights
  std::vector<void*> owned_;          // adopted weights
  cuda::ScratchArena scratch_;
  cuda::MoePointerTables moe_tables_;  // expert weight pointers per MoE layer

  std::vector<unsigned char> uploaded_batch_;  // what the kBatch slot holds
  const int32_t* token_seq_ = nullptr;
  int64_t n_mapped_tokens_ = 0;
  int64_t n_prepared_seqs_ = 0;
  uint64_t batch_generation_ = 0;

  size_t chunk_seq_offset_ = 0;  // in the kChunkTable slot: where SsdSeqChunks[] starts
  int64_t n_chunks_ = 0;
  int64_t n_score_tiles_ = 0;  // SsdChunk::score_tile's range in the chunk table
  uint64_t chunk_table_generation_ = ~uint64_t(0);
  int64_t chunk_table_chunk_size_ = 0;
};

}  // namespace mambacpp
