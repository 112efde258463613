// The public model API: load a checkpoint directory, create a state cache, run a stateful forward pass.
//
//   auto model = mambacpp::Model::load("models/default");
//   auto state = model->create_state(/*n_slots=*/1);
//   std::vector<int32_t> ids = {...};
//   auto out = model->forward(*state, {mambacpp::Sequence::tokens(ids, /*slot=*/0)}, mambacpp::Output::LastLogits);
//
// Weights are immutable after load; all per-sequence state lives in StateCache, so one model serves many states.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mambacpp/config.h"
#include "mambacpp/precision.h"
#include "mambacpp/state.h"
#include "mambacpp/tensor.h"
#include "mambacpp/top_k.h"

namespace mambacpp {

class Backend;
struct ModelWeights;

enum class DeviceChoice : uint8_t { Auto, CPU, CUDA };
DeviceChoice parse_device_choice(const std::string& s);  // "auto" | "cpu" | "cuda"; throws otherwise

// Largest LoadOptions::threads: OpenMP fails beyond what it can create (100000 crashed), and no machine needs more.
constexpr int kMaxThreads = 1024;

// Default prefill piece sizes (LoadOptions::max_batch_tokens = 0). On the GPU each piece has a fixed cost (the chunk
// table, ~13 launches per layer, a state pass) that 8192 tokens amortise, measured against smaller and larger pieces
// (docs/benchmarks.md, "Piece size"), for a workspace of ~170 KB per token at mamba2-2.7b (1.4 GB). On the CPU a piece's fixed cost is small against its GEMMs; 2048 bounds memory.
constexpr int64_t kGpuPieceTokens = 8192;
constexpr int64_t kCpuPieceTokens = 2048;

struct LoadOptions {
  DeviceChoice device = DeviceChoice::Auto;
  DType weight_dtype = DType::BF16;  // GPU only: dtype of the weights on the device (CPU keeps the stored dtype)
  int threads = 0;                   // CPU threads in [0, kMaxThreads]; 0 = all hardware threads (load throws otherwise)
  bool progress = false;             // report loading progress on stderr
  int64_t max_batch_tokens = 0;      // prefill runs in pieces of at most this many tokens (bounds memory); 0 = the
                                     // device's default (kGpuPieceTokens on a GPU, kCpuPieceTokens on the CPU)
  bool cuda_graphs = true;           // GPU decode steps replay a captured CUDA graph (false: the same kernels, eagerly)
  int64_t kv_page_tokens = 64;      // hybrid models: KV rows per page (a slot's KV memory grows by pages)
  int64_t ctx_size = 0;             // models with attention: positions a slot may hold; 0 = the config's limit
                                    // (max_position_embeddings where it binds) or none. A prompt past it is refused.
  bool fused_decode = true;          // decode steps run each block as a few fused kernels, and prefill folds the
                                     // norms and the residual add into its projections, where the backend has them
                                     // (false: the plain per-op kernels; for comparisons and tests)
  Precision precision = Precision::Fast;  // GPU, 16-bit weights: how activations enter the matrix products
                                          // (mambacpp/precision.h); Exact for verification
  bool batch_invariant = true;  // fast precision: one GEMM algorithm at every decode batch size (false: batches of
                                // up to 8 rows take the fused GEMVs, f32 activations, whose sums differ in order)
};

// One sequence of a forward call: token ids or embeddings [L, d_model], continuing from state slot `slot`.
struct Sequence {
  int64_t slot = 0;
  std::span<const int32_t> token_ids;  // either this...
  TensorView embeddings;               // ...or this: [L, d_model] f32/f16/bf16 on the host

  static Sequence tokens(std::span<const int32_t> ids, int64_t slot = 0) { return {slot, ids, {}}; }
  static Sequence embeds(const TensorView& e, int64_t slot = 0) { return {slot, {}, e}; }
  int64_t length() const { return token_ids.empty() ? (embeddings.ndim ? embeddings.dim(0) : 0) : static_cast<int64_t>(token_ids.size()); }
};

enum class Output : uint8_t {
  None,        // only advance the state
  LastLogits,  // logits of each sequence's last position: [n_seqs, vocab]
  AllLogits,   // logits of every position: [sum L, vocab], sequences in order
  Hidden,      // final hidden states (after norm_f) of every position: [sum L, d_model]
  AllLogitsAndHidden,  // AllLogits in `values`, and Hidden in ForwardResult::hidden (speculative decoding's MTP
                       // drafts read the model's hidden states)
};

struct ForwardResult {
  std::vector<float> values;  // row-major [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<TopKCandidates> candidates;  // forward_top_k only: one per sequence (rows = n_seqs, cols = 0)
  std::vector<RowLogprobs> logprobs;       // forward_top_k only: one per sequence (empty ones where not asked for)
  std::vector<float> hidden;                // Output::AllLogitsAndHidden only: [rows, d_model]
  std::span<const float> row(int64_t i) const { return {values.data() + i * cols, static_cast<size_t>(cols)}; }
};

class Model {
 public:
  // Loads config.json + safetensors (single file or sharded) from `dir`. Throws Error with a clear message.
  static std::unique_ptr<Model> load(const std::string& dir, const LoadOptions& options = {});
  // A model of `config` with random weights stored as `storage`, for benchmarks on real shapes (speed does not
  // depend on weight values). Values are drawn so that activations stay finite.
  static std::unique_ptr<Model> random(const ModelConfig& config, const LoadOptions& options = {}, uint64_t seed = 0,
                                       DType storage = DType::BF16);
  // The same in a stored format named as llama.cpp names it: f32 | f16 | bf16 as `random`, or a ggml block format
  // (q8_0 | q4_0 | q5_0 | q5_1 | q4_k | q5_k | q6_k) for the matrices, quantized with ggml's reference rounding and
  // chosen per tensor as llama.cpp's quantizer does (q4_k: Q4_K_M's embedding and output in q6_k), vectors in f32.
  static std::unique_ptr<Model> random_quantized(const ModelConfig& config, const LoadOptions& options, uint64_t seed,
                                                 const std::string& format);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  Device device() const;
  std::string device_description() const;
  const std::string& directory() const;
  const LoadOptions& load_options() const;
  // Positions a slot may hold: models with attention, ctx_size where given, else the config's max_position; 0 for
  // pure Mamba models (no limit).
  int64_t context_limit() const;

  // A state cache with `n_slots` independent sequences, all fresh (zero state). state_dtype (f32 or bf16) is that of
  // the Mamba layers' conv/SSM state and of the attention layers' KV rows.
  std::unique_ptr<StateCache> create_state(int64_t n_slots, DType state_dtype = DType::F32) const;

  // Runs each sequence from its slot's state, updates the state, and returns the requested output.
  // Sequences in one call must use distinct slots. Throws Error on bad input (token out of range, wrong
  // embedding width or dtype, L == 0, slot out of range), before touching any state.
  // `on_progress` (optional) is called after each internal piece with (tokens done, tokens in total).
  ForwardResult forward(StateCache& state, std::span<const Sequence> seqs, Output output,
                        const std::function<void(int64_t, int64_t)>& on_progress = {}) const;

  // As forward(..., Output::LastLogits), but returns, instead of each sequence's logits row, its top-k candidates
  // for requests[i] (mambacpp/top_k.h): only those leave the device. Throws Error on a bad request (k outside
  // [1, kMaxTopK], limit outside [0, vocab], penalized ids repeated or out of range), before touching any state.
  ForwardResult forward_top_k(StateCache& state, std::span<const Sequence> seqs, std::span<const TopKRequest> requests,
                              const std::function<void(int64_t, int64_t)>& on_progress = {}) const;

  // Convenience for a uniform batch: token ids [B, L] (i32/i64) or embeddings [B, L, d_model] (f32/f16/bf16) on
  // the host; row b uses slot b.
  ForwardResult forward(StateCache& state, const TensorView& input, Output output) const;

  // A 64-bit hash of every weight byte and the config (computed once, on first use). State files carry it.
  uint64_t weights_hash() const;

  // For benchmarks and schedulers.
  int64_t weight_bytes() const;  // every weight a decode step reads (the embedding gather excluded, the LM head in)
  // The weights a decode step of `batch` sequences reads: weight_bytes(), except that a mixture-of-experts layer reads
  // the experts its tokens chose, counted as the expected number of distinct experts under uniform routing,
  // E (1 - (1 - k/E)^batch) of E (exactly k at batch 1). Equal to weight_bytes() for models without experts.
  int64_t decode_weight_bytes(int64_t batch) const;
  DType weight_dtype() const;    // of the projections
  // The backend's copy bandwidth in bytes/s, read plus written (median of 10 copies of a 256 MiB buffer).
  double measure_copy_bandwidth() const;
  // Whether decode steps (every sequence one token) replay captured graphs: then a step is cheapest with its
  // decode rows in a call of their own.
  bool decode_graphs() const;

  // For the library's own layers (MambaBlock, engine); not needed by users.
  Backend& backend() const;
  const ModelWeights& weights() const;

  struct Impl;  // opaque; defined in the library's internal headers

 private:
  friend class MambaBlock;
  explicit Model(std::unique_ptr<Impl> impl);
  // forward and forward_top_k (top_k non-null: output is LastLogits and each last row is reduced to candidates).
  ForwardResult forward_impl(StateCache& state, std::span<const Sequence> seqs, Output output,
                             const std::vector<TopKRequest>* top_k,
                             const std::function<void(int64_t, int64_t)>& on_progress) const;
  std::unique_ptr<Impl> impl_;
};

// The directory of the model shipped with mambacpp (models/default), found next to the source tree, the installed
// data dir, or via $MAMBACPP_MODEL. Throws when none exists.
std::string default_model_dir();

}  // namespace mambacpp
