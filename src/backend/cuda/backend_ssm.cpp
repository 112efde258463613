// SSM ops of the CUDA backend: conv1d (conv1d.cu), the Mamba-1 selective scan (mamba1_scan.cu, and
// mamba1_chunked_scan.cu for prompts of kMamba1ChunkedMinLen tokens and more), the Mamba-2 SSD (the step kernel for
// decode batches, the chunked kernels of mamba2_ssd*.cu otherwise), its plan, and conv1d fused into the fast SSD.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fused_ops.h"

namespace mambacpp {

using namespace cuda;

void CudaBackend::conv1d_silu(const TensorView& x, const TensorView& w, const TensorView& bias, TensorView state,
                              const BatchLayout& batch, TensorView out) {
  launch_conv1d_silu(conv_launch(x, w, bias, state, batch, out), stream());
}

Conv1dLaunch CudaBackend::conv_launch(const TensorView& x, const TensorView& w, const TensorView& bias,
                                      TensorView state, const BatchLayout& batch, TensorView out) {
  const bool x16 = x.dtype == DType::BF16;  // Mamba2Plan::proj_dtype
  if (x16)
    need(x.ndim == 2 && x.device == Device::CUDA, "conv1d: x must be a 2-D CUDA tensor, found ", x.shape_string());
  else
    check_f32_2d(x, "conv1d: x");
  check_f32_2d(out, "conv1d: out");
  need(same_2d(x, out), "conv1d: x ", x.shape_string(), " vs out ", out.shape_string());
  const int64_t C = x.dim(1);
  need(w.ndim >= 2 && w.dim(0) == C && w.numel() % C == 0, "conv1d: w ", w.shape_string(), " for ", C, " channels");
  const int64_t K = w.numel() / C;
  need(K >= 1, "conv1d: kernel width must be >= 1");
  need(bias.empty() || bias.numel() == C, "conv1d: bias has ", bias.numel(), " elements, expected ", C);
  check_state(state, "conv1d: state", {C, K - 1});
  const SeqSpan* seqs = device_seqs(batch, state.dim(0), x.dim(0), "conv1d");
  Conv1dLaunch p;
  if (x16) {
    p.x16 = x.ptr<uint16_t>();
    p.x.stride = x.stride0();
  } else {
    p.x = crows(x);
  }
  p.w = weight(w);
  p.bias = bias.empty() ? DevWeight{} : weight(bias);
  p.state = state.data;
  p.state_bf16 = state.dtype == DType::BF16;
  p.out = rows(out);
  p.T = std::min(x.dim(0), n_mapped_tokens_);
  p.C = C;
  p.K = K;
  p.seqs = seqs;
  p.token_seq = token_seq_;
  p.n_seqs = n_prepared_seqs_;
  p.all_single = !batch.seqs.empty() && step_batch(batch);
  return p;
}

void CudaBackend::mamba1_scan(const Mamba1ScanArgs& a, const BatchLayout& batch) {
  for (const TensorView* v : {&a.x, &a.dt, &a.B, &a.C, &a.z, &a.y}) check_f32_2d(*v, "mamba1_scan: activation");
  const int64_t T = a.x.dim(0), DI = a.x.dim(1);
  need(a.A_log.ndim == 2 && a.A_log.dim(0) == DI, "mamba1_scan: A_log ", a.A_log.shape_string(), " for d_inner ", DI);
  const int64_t N = a.A_log.dim(1);
  const bool low_rank = !a.dt_proj.empty();
  if (low_rank)
    need(a.dt_proj.ndim == 2 && a.dt_proj.dim(0) == DI && a.dt_proj.contiguous() && a.dt.dim(0) == T &&
             a.dt.dim(1) == a.dt_proj.dim(1),
         "mamba1_scan: dt_proj ", a.dt_proj.shape_string(), " and low-rank dt ", a.dt.shape_string(), " must be [", DI,
         ", r] and [", T, ", r]");
  for (const TensorView* v : {&a.dt, &a.z, &a.y})
    if (v != &a.dt || !low_rank)
      need(v->dim(0) == T && v->dim(1) == DI, "mamba1_scan: expected [", T, ", ", DI, "], found ", v->shape_string());
  for (const TensorView* v : {&a.B, &a.C})
    need(v->dim(0) == T && v->dim(1) == N, "mamba1_scan: B/C expected [", T, ", ", N, "], found ", v->shape_string());
  need(a.D.numel() == DI && a.dt_bias.numel() == DI, "mamba1_scan: D/dt_bias must have ", DI, " elements");
  check_state(a.state, "mamba1_scan: state", {DI, N});
  Mamba1Launch p;
  p.x = crows(a.x);
  if (low_rank && fast_ && a.dt_proj.dtype != DType::F32 && (batch_invariant_ || T > kFusedMaxRows)) {
    // Fast precision: dt_proj as the pinned GEMM (the same at every T), not folded into the scan, where every
    // (sequence, channel) would re-read its dt_proj row, which makes large decode batches slow.
    TensorView dt(decode_scratch(Slot::kM1Dt, T, DI, sizeof(float)), DType::F32, {T, DI}, Device::CUDA);
    linear_fast(a.dt, a.dt_proj, DevWeight{}, dt, decode_scratch(Slot::kFastX16, T, a.dt.dim(1), 2));
    p.dt = crows(dt);
  } else if (low_rank) {
    p.dt_low = crows(a.dt);
    p.dt_proj = weight(a.dt_proj);
    p.dt_rank = a.dt_proj.dim(1);
  } else {
    p.dt = crows(a.dt);
  }
  p.B = crows(a.B);
  p.C = crows(a.C);
  p.z = crows(a.z);
  p.A_log = weight(a.A_log);
  p.D = weight(a.D);
  p.dt_bias = weight(a.dt_bias);
  p.state = a.state.data;
  p.state_bf16 = a.state.dtype == DType::BF16;
  p.y = rows(a.y);
  p.d_inner = DI;
  p.d_state = N;
  p.seqs = device_seqs(batch, a.state.dim(0), T, "mamba1_scan");
  p.n_seqs = n_prepared_seqs_;
  // Step pieces (checked by step_batch: 1..kStepMaxLen tokens each, in row order) take the sequence kernel, each token
  // a decode step; the one-token step kernel stays for plain decode batches.
  p.step_pieces = batch.step_pieces && step_batch(batch);
  p.single_tokens = !p.step_pieces && one_token_each(batch);
  if (!p.single_tokens && !p.step_pieces) mark_prompt_scan();
  auto long_seq = [](const SeqSpan& s) { return s.len >= kMamba1ChunkedMinLen; };
  if (N == kMamba1PieceStates && !p.dt_proj.data && std::any_of(batch.seqs.begin(), batch.seqs.end(), long_seq)) {
    p.n_pieces = upload_chunk_table(batch, kMamba1Piece);
    p.pieces = static_cast<const SsdChunk*>(scratch_.get(Slot::kChunkTable));
    p.seq_pieces = reinterpret_cast<const SsdSeqChunks*>(static_cast<const char*>(scratch_.get(Slot::kChunkTable)) +
                                                         chunk_seq_offset_);
    p.piece_states = static_cast<float*>(grow(Slot::kM1Pieces, static_cast<size_t>(p.n_pieces * DI * (N + 1)) * 4));
    p.piece_dt = p.piece_states + p.n_pieces * DI * N;
    p.has_short_seqs = !std::all_of(batch.seqs.begin(), batch.seqs.end(), long_seq);
    p.fast = fast_ && weight_dtype_ != DType::F32;  // as Mamba2Launch::fast
  }
  launch_mamba1_scan(p, stream());
}

// The checked launch of mamba2_ssd (nullopt: no sequences); fast and has_single_seqs set, the scratch not yet.
std::optional<Mamba2Launch> CudaBackend::mamba2_launch(const Mamba2ScanArgs& a, const BatchLayout& batch) {
  const int64_t H = a.n_heads, P = a.head_dim, G = a.n_groups, N = a.d_state;
  need(H > 0 && G > 0 && H % G == 0, "mamba2_ssd: n_heads ", H, " must be a positive multiple of n_groups ", G);
  need(P >= 0 && N >= 0 && a.chunk_size > 0, "mamba2_ssd: bad head_dim ", P, " / d_state ", N, " / chunk_size ",
       a.chunk_size);
  for (const TensorView* v : {&a.x, &a.B, &a.C}) check_f32_2d(*v, "mamba2_ssd: activation");
  const bool dt_bf16 = a.dt.dtype == DType::BF16;  // Mamba2Plan::proj_dtype
  if (!dt_bf16) check_f32_2d(a.dt, "mamba2_ssd: dt");
  const bool y_bf16 = a.y.dtype == DType::BF16;  // Mamba2Plan::y_dtype
  if (!y_bf16) check_f32_2d(a.y, "mamba2_ssd: y");
  const int64_t T = a.x.dim(0);
  need(a.x.dim(1) == H * P && a.y.dim(0) == T && a.y.dim(1) == H * P, "mamba2_ssd: x/y must be [", T, ", ", H * P,
       "], found ", a.x.shape_string(), " / ", a.y.shape_string());
  need(a.dt.dim(0) == T && a.dt.dim(1) == H, "mamba2_ssd: dt must be [", T, ", ", H, "], found ", a.dt.shape_string());
  for (const TensorView* v : {&a.B, &a.C})
    need(v->dim(0) == T && v->dim(1) == G * N, "mamba2_ssd: B/C must be [", T, ", ", G * N, "], found ",
         v->shape_string());
  need(a.A_log.numel() == H && a.D.numel() == H && a.dt_bias.numel() == H, "mamba2_ssd: A_log/D/dt_bias must have ", H,
       " elements");
  if (!a.z.empty()) {
    check_f32_2d(a.z, "mamba2_ssd: z");
    need(a.z.dim(0) == T && a.z.dim(1) == H * P, "mamba2_ssd: z must be [", T, ", ", H * P, "], found ",
         a.z.shape_string());
  }
  check_state(a.state, "mamba2_ssd: state", {H, P, N});
  Mamba2Launch p;
  p.x = crows(a.x);
  if (dt_bf16) {
    p.dt16 = a.dt.ptr<uint16_t>();
    p.dt.stride = a.dt.stride0();
  } else {
    p.dt = crows(a.dt);
  }
  p.B = crows(a.B);
  p.C = crows(a.C);
  p.A_log = weight(a.A_log);
  p.D = weight(a.D);
  p.dt_bias = weight(a.dt_bias);
  p.dt_min = a.dt_min;
  p.dt_max = a.dt_max;
  p.n_heads = H;
  p.head_dim = P;
  p.n_groups = G;
  p.d_state = N;
  p.chunk_size = a.chunk_size;
  p.state = a.state.data;
  p.state_bf16 = a.state.dtype == DType::BF16;
  if (y_bf16) {
    p.y16 = a.y.ptr<uint16_t>();
    p.y.stride = a.y.stride0();
  } else {
    p.y = rows(a.y);
  }
  if (!a.z.empty()) p.z = crows(a.z);
  p.T = T;
  p.seqs = device_seqs(batch, a.state.dim(0), T, "mamba2_ssd");
  p.n_seqs = n_prepared_seqs_;
  if (p.n_seqs == 0) return std::nullopt;
  p.fast = fast_ && weight_dtype_ != DType::F32;  // fast precision covers 16-bit weights only
  // Step pieces count as single tokens: every one of their rows takes the step kernel.
  p.has_single_seqs = batch.step_pieces ||
                      std::any_of(batch.seqs.begin(), batch.seqs.end(), [](const SeqSpan& s) { return s.len == 1; });
  if (batch.step_pieces) p.step_max_len = kStepMaxLen;
  if (y_bf16)
    need(a.y.ndim == 2 && a.y.device == Device::CUDA && a.z.empty() && p.fast && !p.has_single_seqs && ssd_fast_path(p),
         "mamba2_ssd: y in bf16 is for fast precision's prompts (Mamba2Plan::y_dtype), found ", a.y.shape_string(),
         a.z.empty() ? "" : " with a gate", p.has_single_seqs ? " in a batch with one-token sequences" : "");
  if (dt_bf16)
    need(a.dt.ndim == 2 && a.dt.device == Device::CUDA && p.fast && !p.has_single_seqs && ssd_fast_path(p),
         "mamba2_ssd: dt in bf16 is for fast precision's prompts (Mamba2Plan::proj_dtype), found ", a.dt.shape_string(),
         p.has_single_seqs ? " in a batch with one-token sequences" : "");
  return p;
}

// y: bf16 where the fast chunked kernels write every row of it (no one-token sequences: those take the step
// kernel), which round it to bf16 in either dtype. proj: bf16 where, besides, the batch is all prompts on the
// prefill GEMM plan (LtMatmul::kPrefillMinRows tokens and more) and conv1d runs on the window kernel; fast precision
// rounds prompt rows of an f32 proj alike (docs/benchmarks.md, decisions).
Mamba2Plan CudaBackend::plan_mamba2(const Mamba2Shape& shape, const BatchLayout& batch) const {
  Mamba2Plan plan;
  Mamba2Launch p;
  p.fast = fast_ && weight_dtype_ != DType::F32;
  p.head_dim = shape.head_dim;
  p.d_state = shape.d_state;
  p.chunk_size = shape.chunk_size;
  // Step pieces are decode rows: the f32 plan of a decode step.
  const bool prompts_only = !batch.seqs.empty() && !batch.step_pieces &&
                            std::none_of(batch.seqs.begin(), batch.seqs.end(), [](const SeqSpan& s) { return s.len == 1; });
  if (prompts_only && ssd_fast_path(p)) plan.y_dtype = DType::BF16;
  if (shape.in_proj_bias) return plan;  // the bf16 output plans add no bias
  plan.round_proj_prompt_rows = true;
  const bool long_prompts = std::all_of(batch.seqs.begin(), batch.seqs.end(),
                                        [](const SeqSpan& s) { return s.len >= LtMatmul::kPrefillMinRows; });
  Conv1dLaunch c;
  c.K = shape.conv_kernel;
  c.T = batch.total_tokens;
  if (plan.y_dtype == DType::BF16 && long_prompts && conv1d_bf16_outputs_supported(c)) plan.proj_dtype = DType::BF16;
  return plan;
}

void CudaBackend::mamba2_ssd(const Mamba2ScanArgs& a, const BatchLayout& batch) {
  if (std::optional<Mamba2Launch> p = mamba2_launch(a, batch)) run_mamba2(*p, batch, nullptr);
}

// Fast precision's multi-token batches: conv1d writes the SSD's bf16 x, B and C itself (Conv1dLaunch::out16), so
// the f32 conv output and the rounding pass are gone (docs/benchmarks.md, decisions). Batches with single tokens
// keep the two steps: those rows take the step kernel, which reads the f32 rows.
void CudaBackend::mamba2_conv_ssd(const TensorView& xbc, const TensorView& conv_w, const TensorView& conv_bias,
                                  TensorView conv_state, TensorView conv_out, const Mamba2ScanArgs& ssd,
                                  const BatchLayout& batch) {
  Conv1dLaunch c = conv_launch(xbc, conv_w, conv_bias, conv_state, batch, conv_out);
  std::optional<Mamba2Launch> p = mamba2_launch(ssd, batch);
  const int64_t HP = ssd.n_heads * ssd.head_dim, GN = ssd.n_groups * ssd.d_state;
  const bool x_B_C_of_conv = ssd.x.data == conv_out.data && ssd.B.data == conv_out.ptr<float>() + HP &&
                             ssd.C.data == conv_out.ptr<float>() + HP + GN && c.C == HP + 2 * GN;
  // The fast SSD rounds x, B and C to bf16 whether conv1d writes them so or not: the same silu either way.
  c.fast_silu = p && ssd_fast_path(*p) && x_B_C_of_conv;
  const bool fuse =
      p && p->fast && !p->has_single_seqs && ssd_fast_path(*p) && x_B_C_of_conv && conv1d_bf16_outputs_supported(c);
  if (!fuse) {
    launch_conv1d_silu(c, stream());
    if (p) run_mamba2(*p, batch, nullptr);
    return;
  }
  p->inputs_bf16 = true;
  p->x = p->B = p->C = ConstF32Rows{};
  c.split[0] = HP;
  c.split[1] = HP + GN;
  run_mamba2(*p, batch, &c);
}

// The step kernel, or the chunked path; `conv` (set: the fused conv1d) is launched once the scratch it writes
// into exists.
void CudaBackend::run_mamba2(Mamba2Launch& p, const BatchLayout& batch, Conv1dLaunch* conv) {
  const int64_t T = p.T, H = p.n_heads, P = p.head_dim, G = p.n_groups, N = p.d_state;
  if (step_batch(batch)) {
    need(p.n_seqs <= INT_MAX && H <= 65535, "mamba2_ssd: too many sequences/heads for one launch");
    launch_mamba2_step(p, stream());
    return;
  }
  mark_prompt_scan();
  const int64_t n_chunks = upload_chunk_table(batch, p.chunk_size);
  need(n_chunks <= INT_MAX && H <= 65535, "mamba2_ssd: too many chunks/heads for one launch");
  SsdScratch sc;
  sc.chunk_states = static_cast<float*>(
      grow(Slot::kSsdStates, static_cast<size_t>(std::max<int64_t>(n_chunks * H * P * N, 1)) * sizeof(float)));
  if (!ssd_fast_path(p)) {  // dt and the f64 cumulative sums (the fast kernels keep theirs in cum2 and w2)
    sc.dt = static_cast<float*>(grow(Slot::kSsdDt, static_cast<size_t>(std::max<int64_t>(T * H, 1)) * sizeof(float)));
    sc.cum =
        static_cast<double*>(grow(Slot::kSsdCum, static_cast<size_t>(std::max<int64_t>(T * H, 1)) * sizeof(double)));
  } else {  // bf16 copies of x, B, C and of the entering states, the scores, the f32 decays (mamba2_ssd_fast.cu)
    auto part = [](int64_t elems) { return align(static_cast<size_t>(std::max<int64_t>(elems, 1)) * 2); };
    const size_t bx = part(T * H * P), bg = part(T * G * N), bs = part(n_chunks * H * P * N);
    const size_t bscores = align(static_cast<size_t>(std::max<int64_t>(n_score_tiles_ * G, 1)) * kSsdFastTile *
                                 kSsdFastTile * sizeof(float));
    const size_t bdecay = align(static_cast<size_t>(std::max<int64_t>(T * H, 1)) * sizeof(float));
    char* base = static_cast<char*>(grow(Slot::kSsdFast, bx + 2 * bg + bs + bscores + 2 * bdecay));
    sc.x16 = reinterpret_cast<uint16_t*>(base);
    sc.B16 = reinterpret_cast<uint16_t*>(base + bx);
    sc.C16 = reinterpret_cast<uint16_t*>(base + bx + bg);
    sc.states16 = reinterpret_cast<uint16_t*>(base + bx + 2 * bg);
    sc.scores = reinterpret_cast<float*>(base + bx + 2 * bg + bs);
    sc.cum2 = reinterpret_cast<float*>(base + bx + 2 * bg + bs + bscores);
    sc.w2 = reinterpret_cast<float*>(base + bx + 2 * bg + bs + bscores + bdecay);
  }
  const auto* chunks = static_cast<const SsdChunk*>(scratch_.get(Slot::kChunkTable));
  const auto* seq_chunks = reinterpret_cast<const SsdSeqChunks*>(
      static_cast<const char*>(scratch_.get(Slot::kChunkTable)) + chunk_seq_offset_);
  if (conv) {
    conv->out16[0] = sc.x16;
    conv->out16[1] = sc.B16;
    conv->out16[2] = sc.C16;
    launch_conv1d_silu(*conv, stream());
  }
  launch_mamba2_chunked(p, chunks, n_chunks, seq_chunks, sc, stream());
  if (p.z.data) launch_silu_gate(p.y, p.z, T, H * P, stream());  // the step kernel gates inside, this path after
}

// Cuts the batch's sequences into chunks of at most chunk_size tokens and uploads the table, unless it is already
// there for this batch and chunk size (every layer of a forward piece reuses it). Returns the number of chunks.
int64_t CudaBackend::upload_chunk_table(const BatchLayout& b, int64_t chunk_size) {
  if (chunk_table_generation_ == batch_generation_ && chunk_table_chunk_size_ == chunk_size) return n_chunks_;
  std::vector<SsdChunk> chunks;
  std::vector<SsdSeqChunks> per_seq(b.seqs.size());
  int64_t score_tiles = 0;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const SeqSpan& sp = b.seqs[s];
    per_seq[s].first = static_cast<int32_t>(chunks.size());
    for (int64_t off = 0; off < sp.len; off += chunk_size) {
      const int64_t len = std::min(chunk_size, sp.len - off);
      need(score_tiles <= INT32_MAX, "mamba2_ssd: too many chunks for one call");
      chunks.push_back({sp.start + off, static_cast<int32_t>(len), static_cast<int32_t>(s),
                        static_cast<int32_t>(score_tiles), sp.len == 1 ? 1 : 0});
      if (sp.len > 1) score_tiles += ssd_score_tiles(len);  // single tokens take the step kernel
    }
    per_seq[s].count = static_cast<int32_t>(chunks.size()) - per_seq[s].first;
  }
  n_score_tiles_ = score_tiles;
  chunk_seq_offset_ = align(chunks.size() * sizeof(SsdChunk));
  std::vector<unsigned char> host(chunk_seq_offset_ + per_seq.size() * sizeof(SsdSeqChunks));
  if (!chunks.empty()) std::memcpy(host.data(), chunks.data(), chunks.size() * sizeof(SsdChunk));
  if (!per_seq.empty())
    std::memcpy(host.data() + chunk_seq_offset_, per_seq.data(), per_seq.size() * sizeof(SsdSeqChunks));
  void* buf = grow(Slot::kChunkTable, std::max<size_t>(host.size(), 1));
  copy_from_host(buf, host.data(), host.size());
  chunk_table_generation_ = batch_generation_;
  chunk_table_chunk_size_ = chunk_size;
  n_chunks_ = static_cast<int64_t>(chunks.size());
  return n_chunks_;
}

// Nsight Compute's window (ncu --profile-from-start off; dev/gpu_prefill_profile.sh, dev/gpu_kernel_stalls.sh) opens
// at the second multi-token SSD or Mamba-1 scan call of a backend: past the load-time launches (weight conversions)
// and the first layer, whose GEMMs probe their plans (gemm_lt.h), so every layer in it is a steady one. Without a
// profiler attached cudaProfilerStart does nothing.
void CudaBackend::mark_prompt_scan() {
  if (++prompt_scans_ == 2) MAMBACPP_CUDA_CHECK(cudaProfilerStart());
}

}  // namespace mambacpp
