// The backend seam. The model (src/model/) is written once against this table of operations; each backend
// (src/backend/cpu/, src/backend/cuda/) fills it. A backend may also offer fused operations for decode steps (a
// linear with the norm before it and the conv or residual add after it folded in): the model's layer recipes ask
// supports_fused_linear for every piece of a block before running any, and run the plain ops otherwise. Backends
// know tensors and plain parameters only, never a model's layer structure (the build enforces it: this layer cannot
// include src/model/).
//
// Conventions for every op:
// - Activations are f32, laid out as packed tokens: dim 0 is the token index t in [0, T) of a BatchLayout, with
//   each sequence's tokens contiguous and in order. Views may have a row stride (column slices of a wider buffer).
// - Matrix weights (linear, embedding) are typed Weights (core/weight.h): dense f32/f16/bf16, or a block or FP8 format
//   where the backend runs it (supports_weight_format); other weights (norms, conv kernels, A, D) are f32/f16/bf16
//   views. Either way they stay in their stored format and are converted on the fly inside the kernels.
// - State tensors have dim 0 = slot; each sequence reads its initial state from its slot and writes its final
//   state back there. State dtype is f32 (or bf16 where a backend supports it).
// - All pointers in views live on the backend's device, except where a comment says "host".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/weight.h"
#include "mambacpp/precision.h"
#include "mambacpp/tensor.h"
#include "mambacpp/top_k.h"

namespace mambacpp {

// One sequence of a packed batch: rows [start, start + len) belong to it, and it uses state slot `slot`.
struct SeqSpan {
  int64_t start = 0;
  int64_t len = 0;
  int64_t slot = 0;
};

// The sequences of one forward piece. `seqs` is the host copy; a device backend may keep its own copy in
// `device_seqs` (filled by Backend::prepare_batch) so kernels can read it.
struct BatchLayout {
  std::vector<SeqSpan> seqs;
  int64_t total_tokens = 0;
  void* device_seqs = nullptr;  // owned by the backend; valid after prepare_batch until the next one
  // A decode forward of short pieces (model/step_pieces.h, CUDA only): every sequence has 1..16 tokens, in row
  // order, and the step kernels run each one's tokens in order, as that many decode steps would.
  bool step_pieces = false;
};

// Mamba-1 selective scan over each sequence, fused with the D skip and the silu(z) gate:
//   dt = softplus(dt_raw + dt_bias);  h = exp(dt * A) * h + dt * B * x;  y = (C . h + D * x) * silu(z)
struct Mamba1ScanArgs {
  TensorView x;        // [T, d_inner] conv output
  TensorView dt;       // [T, d_inner] dt_proj output before its bias
  TensorView A_log;    // [d_inner, d_state] weight; A = -exp(A_log)
  TensorView B;        // [T, d_state] (strided slice of x_proj output)
  TensorView C;        // [T, d_state] (strided slice of x_proj output)
  TensorView D;        // [d_inner] weight
  TensorView dt_bias;  // [d_inner] weight (dt_proj.bias)
  TensorView z;        // [T, d_inner] gate (strided slice of in_proj output)
  TensorView state;    // [n_slots, d_inner, d_state]
  TensorView y;        // [T, d_inner] output
  // Optional: dt_proj folded into the scan (decode steps skip a GEMV launch). When set, `dt` is the low-rank
  // [T, dt_rank] input of dt_proj and the op computes dt[t, c] = dt[t, :] . dt_proj[c, :] itself.
  TensorView dt_proj;  // [d_inner, dt_rank] weight, or empty
};

// Mamba-2 state-space dual: chunked SSD for multi-token sequences, the recurrent step for single tokens.
//   dt = clamp(softplus(dt_raw + dt_bias), dt_min, dt_max);  H = exp(dt * A) * H + dt * x (x) B;  y = H . C + D * x
// Head h reads group h / (n_heads / n_groups). No gate here (the gated RMSNorm follows).
struct Mamba2ScanArgs {
  TensorView x;        // [T, n_heads * head_dim] (strided slice of the conv output)
  TensorView dt;       // [T, n_heads] raw (strided slice of in_proj output)
  TensorView A_log;    // [n_heads] weight
  TensorView B;        // [T, n_groups * d_state] (strided slice of the conv output)
  TensorView C;        // [T, n_groups * d_state] (strided slice of the conv output)
  TensorView D;        // [n_heads] weight
  TensorView dt_bias;  // [n_heads] weight
  float dt_min = 0.0f;
  float dt_max = 0.0f;  // +inf when unlimited
  int64_t n_heads = 0, head_dim = 0, n_groups = 0, d_state = 0;
  int64_t chunk_size = 256;
  TensorView state;    // [n_slots, n_heads, head_dim, d_state]
  TensorView y;        // [T, n_heads * head_dim] output
  // Optional gate: y *= silu(z). Decode steps take the gate out of the gated RMSNorm (whose norm then folds into
  // out_proj's fused_linear); the norm of silu-gated rows is the same either way.
  TensorView z;        // [T, n_heads * head_dim] (strided slice of in_proj output), or empty
};

// The shapes of a Mamba-2 block that Backend::plan_mamba2 decides by.
struct Mamba2Shape {
  int64_t head_dim = 0, d_state = 0, chunk_size = 0, conv_kernel = 0;
  bool in_proj_bias = false;
};

// How one forward piece runs the Mamba-2 blocks of a shape (Backend::plan_mamba2): the dtypes the model allocates the
// intermediates in, and how the projection rounds. The default is f32 throughout, no rounding.
struct Mamba2Plan {
  // in_proj's output [z | xBC | dt], read by conv1d (mamba2_conv_ssd), the SSD's dt and the gated norm's gate:
  // bf16 where the backend holds those rows at bf16 precision anyway (halves the bytes they move).
  DType proj_dtype = DType::F32;
  // With an f32 proj: in_proj's fused_linear rounds the rows of long prompts to bf16 (FusedLinearArgs::
  // round_prompt_rows), so that they hold what a bf16 proj would.
  bool round_proj_prompt_rows = false;
  // The SSD's output y when the gated norm is its only reader: bf16 where the backend rounds y to bf16 anyway.
  DType y_dtype = DType::F32;
};

// One sequence's cached keys and values for Backend::attention. The cache grows by fixed-size pages of
// `page_tokens` rows (so memory follows the tokens held, not a maximum context); each page holds K rows
// [page_tokens, kv_dim] followed by V rows [page_tokens, kv_dim], kv_dim = n_kv_heads * head_dim, elements of
// AttentionArgs::kv_dtype (the state dtype: f32, or bf16 which halves the bytes a decode step reads).
struct KvSequence {
  std::vector<void*> pages;  // host array of device pointers, enough pages for past + this call's rows
  int64_t past = 0;           // rows cached before this call
};

// Causal self-attention of one layer with a KV cache (GQA: query head h reads key/value head
// h / (n_heads / n_kv_heads)). Row i of sequence k (position past + i) attends to cached positions [0, past + i]:
//   out[i, h] = sum_j softmax_j(scale * q[i, h] . K[j, g]) V[j, g]
// The call first appends its k and v rows to the sequence's pages at positions [past, past + len), rounded to
// kv_dtype (bf16: round to nearest even), and reads every key and value from the pages: with bf16 pages the result
// is the f32 result for the rounded k and v rows.
struct AttentionArgs {
  TensorView q;     // [T, n_heads * head_dim] (RoPE already applied)
  TensorView k, v;  // [T, n_kv_heads * head_dim] this call's keys (RoPE applied) and values
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, page_tokens = 0;
  float scale = 0.0f;
  DType kv_dtype = DType::F32;    // the pages' elements: f32 or bf16
  std::vector<KvSequence> cache;  // one per BatchLayout::seqs entry, in order
  TensorView out;   // [T, n_heads * head_dim]
  // Optional, instead of `cache` (decode steps captured as graphs: nothing here is read on the host, so a replay sees
  // the contexts as they are then): the sequence in slot s holds device_lengths[s] rows before this call, in pages
  // device_pages[s * max_pages + p] (device arrays). The keys are split for a context of max_pages * page_tokens
  // rows, so the launch does not depend on the lengths. Backends without it answer false to supports_device_kv().
  const int64_t* device_lengths = nullptr;
  void* const* device_pages = nullptr;
  int64_t max_pages = 0;
};

// A linear over the rows of a batch with pieces of a block folded in (Backend::fused_linear):
//   y = prologue(x) . w^T (+ bias)
// - prologue (norm_w set): RMSNorm of x over each run of `norm_group` consecutive input features (0: all of them),
//   times norm_w; with `gate` set, of x * silu(gate) (Mamba-2's gated RMSNorm);
// - epilogue (conv_w set; decode batches only, sequence i in row i with one token): outputs [conv_begin,
//   conv_begin + conv_channels) go through a one-token causal conv1d + SiLU from the row's slot of conv_state (which
//   shifts by one) into conv_out, and are not written to y; every other output is written to y, or added to it when
//   `accumulate` (the residual add).
// Rounding differs from the unfused ops by f32 reassociation only (a one-group norm scale may be applied after the
// dot product).
struct FusedLinearArgs {
  TensorView x;           // [B, in] f32
  Weight w;               // [out, in]
  TensorView bias;        // [out] or empty
  TensorView norm_w;      // [in] f32, or empty: no norm
  TensorView gate;        // [B, in] f32 (bf16 with a bf16 x: Mamba2Plan::proj_dtype), or empty: no gate
  int64_t norm_group = 0;
  float eps = 0.0f;
  TensorView y;           // [B, out] f32 (bf16 where Mamba2Plan::proj_dtype says so: no bias, accumulate or conv)
  bool accumulate = false;
  // Rows of long prompts rounded to bf16 after the product (Mamba2Plan::round_proj_prompt_rows: the values a bf16 y
  // would hold, so a prompt's bits do not depend on what else its batch holds).
  bool round_prompt_rows = false;
  int64_t conv_begin = 0;
  TensorView conv_w;      // [conv_channels, 1, K] or empty: no conv epilogue
  TensorView conv_bias;   // [conv_channels] or empty
  TensorView conv_state;  // [n_slots, conv_channels, K - 1], as for conv1d_silu
  TensorView conv_out;    // [B, conv_channels] f32
  // Multipliers (Granite's residual multiplier, Falcon-H1's muP multipliers; 1 and empty: none): output o is
  // (x_scale * (prologue(x) . w^T)[o] + bias[o]) * s(o) before the conv or the store / residual add, where s(o) is the
  // scale of the run of outputs o falls in: out_scales holds {end, scale} runs, ends ascending, the last one `out`.
  float x_scale = 1.0f;
  std::vector<std::pair<int64_t, float>> out_scales;
};

// ---- Mixture of experts (Backend::moe_route, Backend::moe_experts) ----------------------------------------------
// How router logits become each token's experts and weights (ties always go to the lower expert index, as torch.topk
// does on the CPU; the chosen experts are listed best first):
// - SigmoidGrouped: s = sigmoid(logits); the choice ranks s + bias among the experts of the topk_group groups (of
//   n_group equal groups) whose two best s + bias sum highest; weights are the chosen s, divided by their sum (plus
//   1e-20) when renormalize, times scale;
// - SoftmaxChosen: the top_k logits; weights are the softmax over those k;
// - SoftmaxAll: p = softmax over all logits; the top_k p as they are.
enum class MoeScoring : uint8_t { SigmoidGrouped, SoftmaxChosen, SoftmaxAll };

struct MoeRouteArgs {
  TensorView logits;   // [T, E] f32
  TensorView bias;     // [E] f32 (SigmoidGrouped's e_score_correction_bias: ranks the choice only), or empty
  MoeScoring scoring = MoeScoring::SoftmaxChosen;
  int64_t top_k = 0, n_group = 1, topk_group = 1;
  bool renormalize = false;
  float scale = 1.0f;
  TensorView ids;      // [T, top_k] i32 output
  TensorView weights;  // [T, top_k] f32 output
};

// The routed experts' combined output: out[t] = sum over j = 0..top_k-1, in that order, of
// weights[t, j] * expert_{ids[t, j]}(x[t]), where expert e is down_e(relu(up_e x)^2) (Relu2) or
// down_e(silu(gate part of up_e x) * up part) (SiluGated). Each token's expert outputs are computed exactly as they
// would be for that token alone (the linear's rows are independent), so grouping tokens by expert changes no bits.
enum class MoeExpertAct : uint8_t { Relu2, SiluGated };

struct MoeExpertsArgs {
  TensorView x;          // [T, D] f32
  TensorView ids;        // [T, top_k] i32 (moe_route's)
  TensorView weights;    // [T, top_k] f32
  MoeExpertAct act = MoeExpertAct::Relu2;
  int64_t expert_size = 0;  // I
  // One weight per expert (2-D; one expert of a packed [E, out, in] checkpoint tensor is that tensor's rows(e, 1)
  // seen as [out, in]):
  std::vector<Weight> up;    // Relu2: [I, D]; SiluGated: [2 I, D] gate rows then up rows, or [I, D] beside `gate`
  std::vector<Weight> gate;  // SiluGated with separate gate projections: [I, D] each; else empty
  std::vector<Weight> down;  // [D, I]
  TensorView out;        // [T, D] f32 (written)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string description() const = 0;  // e.g. "CPU (8 threads)" or "NVIDIA H200 (sm_90)"

  // ---- Memory -------------------------------------------------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Several device-to-device copies of disjoint regions, in any order: a state slot's snapshot is one region per
  // layer tensor, so a device backend does them in one launch instead of one copy call each.
  struct CopyRegion {
    void* dst;
    const void* src;
    size_t bytes;
  };
  virtual void copy_many(const std::vector<CopyRegion>& regions) {
    for (const CopyRegion& r : regions) copy(r.dst, r.src, r.bytes);
  }
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // Makes a weight usable on this backend. `host` is a view of mmap'd checkpoint data. The CPU backend returns the
  // view itself (no copy: weights stay mmap'd in their stored dtype); a device backend copies it, possibly
  // converting to its weight dtype, and owns the copy for its lifetime.
  virtual TensorView adopt_weight(const TensorView& host) = 0;

  // The same for a matrix weight of any format this backend runs (supports_weight_format): a dense one goes through
  // adopt_weight; a packed one is copied byte for byte.
  virtual Weight adopt_matrix(const Weight& host);
  // adopt_matrix's packed case on a device backend: the host weight's bytes in the backend's own layout.
  virtual Weight adopt_packed(const Weight& host);
  // Whether linear, fused_linear and embed run weights of format f (dense f32/f16/bf16 on every backend).
  virtual bool supports_weight_format(WeightFormat f) const { return is_dense(f); }

  // Makes `layout.seqs` readable by kernels (a device backend uploads it into layout.device_seqs).
  virtual void prepare_batch(BatchLayout& layout) = 0;

  // ---- Ops ----------------------------------------------------------------------------------------------------
  // out[t, :] = table[ids[t], :]. ids: [T] i32 on the device (validated by the caller).
  virtual void embed(const Weight& table, const TensorView& ids, TensorView out) = 0;
  // out = src converted to f32 (src f32/f16/bf16, same shape).
  virtual void to_f32(const TensorView& src, TensorView out) = 0;
  // out[t, :] = x[t, :] * rsqrt(mean(x[t, :]^2) + eps) * w. x: [T, D], w: [D].
  virtual void rmsnorm(const TensorView& x, const TensorView& w, float eps, TensorView out) = 0;
  // acc[t, :] += x[t, :].
  virtual void add_inplace(TensorView acc, const TensorView& x) = 0;
  // y[t, o] = sum_i x[t, i] * w[o, i] (+ bias[o]). x: [T, in], w: [out, in], bias: [out] or empty, y: [T, out].
  virtual void linear(const TensorView& x, const Weight& w, const TensorView& bias, TensorView y) = 0;
  // Causal depthwise conv1d + SiLU per sequence, starting from its slot's conv state (the last K-1 inputs before the
  // sequence; zeros for a fresh slot) and leaving the last K-1 inputs there (also when len < K-1).
  // x: [T, C] (strided), w: [C, 1, K] (stored layout), bias: [C] or empty, state: [n_slots, C, K-1], out: [T, C].
  virtual void conv1d_silu(const TensorView& x, const TensorView& w, const TensorView& bias, TensorView state,
                           const BatchLayout& batch, TensorView out) = 0;
  virtual void mamba1_scan(const Mamba1ScanArgs& args, const BatchLayout& batch) = 0;
  virtual void mamba2_ssd(const Mamba2ScanArgs& args, const BatchLayout& batch) = 0;
  // Mamba-2's conv1d + SiLU over xBC followed by the SSD over its output: conv1d_silu(xbc, conv_w, conv_bias,
  // conv_state, batch, conv_out), then mamba2_ssd(ssd, batch), where ssd.x, ssd.B and ssd.C are conv_out's column
  // slices. A backend may fuse the two (the CUDA one writes the SSD's own copies of x, B and C in fast precision);
  // conv_out's contents afterwards are then unspecified.
  virtual void mamba2_conv_ssd(const TensorView& xbc, const TensorView& conv_w, const TensorView& conv_bias,
                               TensorView conv_state, TensorView conv_out, const Mamba2ScanArgs& ssd,
                               const BatchLayout& batch) {
    conv1d_silu(xbc, conv_w, conv_bias, conv_state, batch, conv_out);
    mamba2_ssd(ssd, batch);
  }
  // The plan of the Mamba-2 blocks of `shape` for this piece, made once per piece before any block runs.
  virtual Mamba2Plan plan_mamba2(const Mamba2Shape& /*shape*/, const BatchLayout& /*batch*/) const { return {}; }
  // Mamba-2 gated RMSNorm (norm_before_gate = false): g = y * silu(z); out = rmsnorm of g over each group of
  // `group_size` channels, times w. y, z (strided), out: [T, d_inner]; w: [d_inner].
  virtual void gated_rmsnorm(const TensorView& y, const TensorView& z, const TensorView& w, int64_t group_size,
                             float eps, TensorView out) = 0;
  // out[i, :] = x[rows[i], :]; rows is a host array of n indices.
  virtual void gather_rows(const TensorView& x, const int64_t* rows, int64_t n, TensorView out) = 0;
  // The top-k candidates of each row of logits [n, V] (f32, may be strided) for requests[i] on row i, as defined in
  // mambacpp/top_k.h, into `out` (host, resized to n). A bad row gets no candidates. `logits` may be modified (the
  // penalty is applied in place). Requests are checked with check_top_k_requests. Waits for the result.
  virtual void select_top_k(TensorView logits, const std::vector<TopKRequest>& requests,
                            std::vector<TopKCandidates>& out) = 0;
  // out[i] = log(sum_{j < limits[i]} exp(logits[i, j])) for each row of logits [n, V] (f32, may be strided), as
  // float from a float max and sum (the normaliser of logprobs; rows holding NaN give NaN). limits[i] in [1, V].
  // Waits for the result.
  virtual void row_logsumexp(const TensorView& logits, const std::vector<int64_t>& limits,
                             std::vector<float>& out) = 0;

  // ---- Hybrid-model ops (attention and MLP layers) ----------------------------------------------------------------
  // Backends without them throw an Error that says to run hybrid models on the CPU (the CPU and CUDA backends have
  // them).
  virtual void attention(const AttentionArgs& args, const BatchLayout& batch);
  // Rotary position embedding in place, rotate-half form on the first rope_dim channels of each head: for
  // i < rope_dim / 2, with angle = pos * theta^(-2i / rope_dim), (x_i, x_{i + rope_dim/2}) turns by that angle.
  // x: [T, n_heads * head_dim]; row start + i of sequence k of `batch` has position start_positions[k] + i.
  virtual void rope(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                    const std::vector<int64_t>& start_positions, const BatchLayout& batch);
  // As rope, with the start position of each sequence read on the device: device_lengths[slot] (the slot's rows
  // before this call, as AttentionArgs::device_lengths), so that a captured decode step replays at any position.
  virtual void rope_at_lengths(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                               const int64_t* device_lengths, const BatchLayout& batch);
  // Whether attention takes AttentionArgs::device_lengths/device_pages and rope_at_lengths exists.
  virtual bool supports_device_kv() const { return false; }
  // x = relu(x)^2 in place. x: [T, D].
  virtual void relu2(TensorView x);
  // out = silu(gate) * up. gate, up (strided), out: [T, D].
  virtual void silu_mul(const TensorView& gate, const TensorView& up, TensorView out);
  // x *= alpha in place. x: [T, D].
  virtual void scale(TensorView x, float alpha);

  // ---- Fused linears (optional) --------------------------------------------------------------------------------
  // Decode batches (sequence i is row i of the batch and has one token) take every part; without the conv epilogue
  // the op is row by row, and a backend may take it for prefill pieces too. supports_fused_linear answers, without
  // running anything, whether fused_linear takes these arguments (shapes, dtypes, alignment, batch); the answer
  // depends only on them, so a recipe asks for every piece of a block first and never stops halfway.
  virtual bool supports_fused_linear(const FusedLinearArgs&, const BatchLayout&) const { return false; }
  virtual void fused_linear(const FusedLinearArgs&, const BatchLayout&) { unsupported("fused_linear"); }

  // ---- Mixture-of-experts ops -------------------------------------------------------------------------------
  // Defaults (moe_ops_default.cpp) are composed of the ops above with the routing and the combine done on the host
  // (correct on any device; not capturable in a graph); a backend may run them on the device instead.
  virtual void moe_route(const MoeRouteArgs& args);
  virtual void moe_experts(const MoeExpertsArgs& args);
  // Whether moe_route and moe_experts issue device work only (no host copies or waits), so a decode step with MoE
  // layers may be captured as a graph.
  virtual bool moe_ops_capturable() const { return false; }

  // ---- Graphs (optional; CUDA graphs) ------------------------------------------------------------------------
  // Ops issued between begin_capture() and end_capture() are recorded instead of run; replay() runs them again with
  // the same pointers and shapes. Only device work may be issued while capturing (no host copies, no allocation).
  // After an exception inside a capture, call abort_capture().
  struct Graph {
    virtual ~Graph() = default;
  };
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() { unsupported("begin_capture"); }
  virtual std::unique_ptr<Graph> end_capture() { unsupported("end_capture"); }
  virtual void abort_capture() {}
  virtual void replay(Graph&) { unsupported("replay"); }

 private:
  [[noreturn]] void unsupported(const char* what) const;
  [[noreturn]] void no_hybrid_ops(const char* what) const;
};

// Throws Error unless `logits` is a 2-D f32 view with one row per request and every request is valid for rows of
// V = logits.dim(1) entries: 1 <= k <= kMaxTopK, 0 <= limit <= V, penalty finite and > 0, penalized ids distinct and
// in [0, V). Returns the limit in effect for each row (0 means V).
void check_row_logsumexp(const TensorView& logits, const std::vector<int64_t>& limits);
std::vector<int64_t> check_top_k_requests(const TensorView& logits, const std::vector<TopKRequest>& requests);

// Backends available in this build. make_cuda_backend throws a clear Error when CUDA is not compiled in or no
// usable GPU is present; cuda_available() treats any CUDA error as "no GPU".
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);  // 0: all hardware threads
bool cuda_available();
// precision (mambacpp/precision.h) applies to 16-bit weights; the ops' own tests default to Exact, models take
// LoadOptions::precision (Fast by default).
// batch_invariant (fast precision): the same GEMM at every decode batch size, never the fused GEMVs.
std::unique_ptr<Backend> make_cuda_backend(DType weight_dtype = DType::BF16, Precision precision = Precision::Exact,
                                           bool batch_invariant = true);

// RAII owner of one backend allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& backend, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mambacpp
