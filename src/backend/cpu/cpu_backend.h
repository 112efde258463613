// The CPU backend: f32 compute on a thread pool (thread_pool.h) with vector kernels chosen at run time (simd.h),
// weights read in their stored dtype (f32/f16/bf16) from huge-page copies (weight_arena.h) or in place, state in
// f32 or bf16. This class
// only checks arguments and turns views into the raw-pointer parameters of the kernels (conv1d.h,
// selective_scan.h, ssd.h, attention.h, decode_steps.h, linear.cpp, norms.cpp, rows.cpp, activations.cpp,
// fused_linear.cpp).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/weight_arena.h"

namespace mambacpp {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);  // threads <= 0: all hardware threads

  Device device() const override { return Device::CPU; }
  std::string description() const override;
  int threads() const { return threads_; }

  void* allocate(size_t bytes) override;
  void deallocate(void* p) override;
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void synchronize() override {}
  TensorView adopt_weight(const TensorView& host) override;
  void prepare_batch(BatchLayout&) override {}

  void embed(const Weight& table, const TensorView& ids, TensorView out) override;
  void to_f32(const TensorView& src, TensorView out) override;
  void rmsnorm(const TensorView& x, const TensorView& w, float eps, TensorView out) override;
  void add_inplace(TensorView acc, const TensorView& x) override;
  void linear(const TensorView& x, const Weight& w, const TensorView& bias, TensorView y) override;
  // Block formats run on packed_linear.cpp (Q8_0, Q4_K, Q6_K dequantized in registers). FP8 has no kernels on the
  // CPU: adopt_matrix dequantizes it once to f32 (packed_linear.cpp), so FP8 checkpoints run here, at 4 bytes a weight.
  bool supports_weight_format(WeightFormat) const override { return true; }
  Weight adopt_matrix(const Weight& host) override;
  void conv1d_silu(const TensorView& x, const TensorView& w, const TensorView& bias, TensorView state,
                   const BatchLayout& batch, TensorView out) override;
  void mamba1_scan(const Mamba1ScanArgs& args, const BatchLayout& batch) override;
  void mamba2_ssd(const Mamba2ScanArgs& args, const BatchLayout& batch) override;
  void gated_rmsnorm(const TensorView& y, const TensorView& z, const TensorView& w, int64_t group_size, float eps,
                     TensorView out) override;
  void gather_rows(const TensorView& x, const int64_t* rows, int64_t n, TensorView out) override;
  void attention(const AttentionArgs& args, const BatchLayout& batch) override;
  void rope(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
            const std::vector<int64_t>& start_positions, const BatchLayout& batch) override;
  void relu2(TensorView x) override;
  void silu_mul(const TensorView& gate, const TensorView& up, TensorView out) override;
  void scale(TensorView x, float alpha) override;
  // Decode steps (fused_linear.cpp): the prologue norm, the streaming GEMV and the conv / residual epilogue.
  bool supports_fused_linear(const FusedLinearArgs& args, const BatchLayout& batch) const override;
  void fused_linear(const FusedLinearArgs& args, const BatchLayout& batch) override;
  // Mixture of experts (moe_ops.cpp): routing threaded over tokens; each expert's tokens through the GEMM/GEMV
  // kernels, threads over experts when enough of them have work.
  void moe_route(const MoeRouteArgs& args) override;
  void moe_experts(const MoeExpertsArgs& args) override;
  bool moe_ops_capturable() const override { return true; }  // no graphs on the CPU; nothing to wait for
  void row_logsumexp(const TensorView& logits, const std::vector<int64_t>& limits, std::vector<float>& out) override;
  void select_top_k(TensorView logits, const std::vector<TopKRequest>& requests,
                    std::vector<TopKCandidates>& out) override;

 private:
  void packed_linear(const TensorView& x, const Weight& w, const TensorView& bias, TensorView y);  // packed_linear.cpp
  void packed_embed(const Weight& table, const TensorView& ids, TensorView out);                // packed_linear.cpp
  int threads_;
  std::unique_ptr<cpu::WeightArena> weights_;  // null: weights are read in place (no huge pages)
  std::mutex dequantized_mutex_;
  std::vector<std::vector<float>> dequantized_;  // FP8 weights as f32 (adopt_matrix)

  // A = -exp(A_log) of a Mamba-1 layer whose A_log lies in weights_ (its address names it for the backend's life),
  // made once per SIMD target (simd::neg_exp_rows: the bits mamba1_step would compute); null for any other A_log.
  const float* mamba1_neg_a(const TensorView& A_log);
  std::mutex neg_a_mutex_;
  std::map<std::pair<const void*, std::string>, std::vector<float>> neg_a_;
};

}  // namespace mambacpp
