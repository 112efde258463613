// Model loading and the stateful forward pass: inputs are validated up front, then the packed batch runs through
// the blocks in pieces of at most `max_batch_tokens` tokens, so memory does not grow with L. A sequence that does
// not fit in one piece continues in the next from the state the previous piece left in its slot.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "mambacpp/error.h"
#include "model/decode_step.h"
#include "model/layer_stack.h"
#include "model/model_impl.h"
#include "model/moe_layer.h"
#include "model/pieces.h"
#include "model/step_pieces.h"
#include "core/system_memory.h"

namespace mambacpp {

DeviceChoice parse_device_choice(const std::string& s) {
  if (s == "auto") return DeviceChoice::Auto;
  if (s == "cpu") return DeviceChoice::CPU;
  if (s == "cuda" || s == "gpu") return DeviceChoice::CUDA;
  fail("--device: expected auto, cpu or cuda, found '", s, "'");
}

namespace {
// KV rows per page: a page is allocated whole at a sequence's first token (2 x rows x kv_dim elements per layer).
constexpr int64_t kMaxKvPageTokens = 65536;
}  // namespace

std::unique_ptr<Backend> make_backend(LoadOptions& options) {
  // Checked here, where every loader passes, not only by the CLI: OpenMP crashes past the threads it can create.
  if (options.threads < 0 || options.threads > kMaxThreads)
    fail("threads (--threads): expected 0 (all hardware threads) to ", kMaxThreads, ", found ", options.threads);
  // The other sizes every loader reads, for the bindings as for the CLI: a negative batch-token count ran as 1, a
  // negative ctx_size as none, and a page of 2^40 tokens asked for terabytes at the first token.
  if (options.max_batch_tokens < 0 || options.max_batch_tokens > INT32_MAX)
    fail("max_batch_tokens (--batch-tokens): expected 0 (the device's default) to ", INT32_MAX, ", found ",
         options.max_batch_tokens);
  if (options.ctx_size < 0 || options.ctx_size > INT32_MAX)
    fail("ctx_size (--ctx-size): expected 0 (the config's limit) to ", INT32_MAX, ", found ", options.ctx_size);
  if (options.kv_page_tokens < 1 || options.kv_page_tokens > kMaxKvPageTokens)
    fail("kv_page_tokens: expected 1 to ", kMaxKvPageTokens, ", found ", options.kv_page_tokens);
  const bool use_cuda = options.device == DeviceChoice::CUDA || (options.device == DeviceChoice::Auto && cuda_available());
  if (options.max_batch_tokens == 0) options.max_batch_tokens = use_cuda ? kGpuPieceTokens : kCpuPieceTokens;
  return use_cuda ? make_cuda_backend(options.weight_dtype, options.precision, options.batch_invariant) : make_cpu_backend(options.threads);
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
std::unique_ptr<Model> Model::Impl::wrap(std::unique_ptr<Impl> impl) {
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->options = options;
  const bool gguf = dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0;  // a GGUF file, not a directory
  if (gguf) impl->gguf = std::make_unique<GgufModel>(dir);
  else impl->checkpoint = std::make_unique<Checkpoint>(dir);
  impl->config = gguf ? impl->gguf->config() : impl->checkpoint->config();
  impl->config.validate();
  impl->backend = make_backend(impl->options);
  std::function<void(int64_t, int64_t)> progress;
  if (options.progress)
    progress = [](int64_t done, int64_t total) {
      std::fprintf(stderr, "\rloading weights: layer %lld / %lld", static_cast<long long>(done),
                   static_cast<long long>(total));
      if (done == total) std::fprintf(stderr, "\r\033[K");
    };
  if (gguf) {
    const GgufModel& g = *impl->gguf;
    impl->weights = bind_weights(impl->config, [&g](const std::string& name) { return g.find(name); }, g.names(),
                                 *impl->backend, dir, progress);
  } else {
    const Checkpoint& ck = *impl->checkpoint;
    // Checkpoint::weight pairs FP8 weights with their scales (ModelOpt, compressed-tensors); weight_names leaves
    // out the scale tensors it folded in.
    impl->weights = bind_weights(
        impl->config, [&ck](const std::string& name) { return ck.weight(name); }, ck.weight_names(), *impl->backend,
        dir, progress);
  }
  impl->backend->synchronize();
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

const ModelConfig& Model::config() const { return impl_->config; }
Device Model::device() const { return impl_->backend->device(); }
const LoadOptions& Model::load_options() const { return impl_->options; }
std::string Model::device_description() const { return impl_->backend->description(); }

int64_t Model::weight_bytes() const {
  const ModelWeights& w = impl_->weights;
  int64_t sum = static_cast<int64_t>(w.norm_f.nbytes() + w.lm_head.nbytes());
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t : {&l.norm, &l.in_proj_bias, &l.conv, &l.conv_bias, &l.A_log, &l.D, &l.dt_bias,
                                &l.out_proj_bias, &l.gated_norm, &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias, &l.mlp_norm,
                                &l.mlp_up_bias, &l.mlp_down_bias})
      if (!t->empty()) sum += static_cast<int64_t>(t->nbytes());
    for (const Weight* t : {&l.in_proj, &l.out_proj, &l.x_proj, &l.dt_proj, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj,
                            &l.mlp_up, &l.mlp_gate, &l.mlp_down})
      if (!t->empty()) sum += static_cast<int64_t>(t->nbytes());
    if (l.moe) sum += moe_weight_bytes(*l.moe);
  }
  return sum;
}

int64_t Model::decode_weight_bytes(int64_t batch) const {
  const MoeConfig& m = impl_->config.moe;
  int64_t total = weight_bytes();
  if (m.n_experts == 0) return total;
  const double E = static_cast<double>(m.n_experts), k = static_cast<double>(m.top_k);
  const double read = batch <= 1 ? k : E * (1.0 - std::pow(1.0 - k / E, static_cast<double>(batch)));
  for (const LayerWeights& l : impl_->weights.layers)
    if (l.moe) {
      const int64_t experts = moe_expert_bytes(*l.moe);
      total += std::llround(static_cast<double>(experts) / E * read) - experts;
    }
  return total;
}

DType Model::weight_dtype() const {
  for (const LayerWeights& l : impl_->weights.layers)  // the first projection (a hybrid's layer 0 may be attention)
    for (const Weight* t : {&l.in_proj, &l.q_proj, &l.mlp_up})
      if (!t->empty()) return t->data.dtype;
  return impl_->weights.lm_head.data.dtype;
}

double Model::measure_copy_bandwidth() const {
  using Clock = std::chrono::steady_clock;
  Backend& be = *impl_->backend;
  const size_t bytes = size_t(256) << 20;
  DeviceBuffer a(be, bytes), b(be, bytes);
  be.fill_zero(a.data(), bytes);
  be.copy(b.data(), a.data(), bytes);
  be.synchronize();
  std::vector<double> times;
  for (int i = 0; i < 10; ++i) {
    const auto t = Clock::now();
    be.copy(b.data(), a.data(), bytes);
    be.synchronize();
    times.push_back(std::chrono::duration<double>(Clock::now() - t).count());
  }
  std::sort(times.begin(), times.end());
  return 2.0 * static_cast<double>(bytes) / (0.5 * (times[4] + times[5]));
}

bool Model::decode_graphs() const { return impl_->options.cuda_graphs && impl_->backend->supports_graphs(); }
const std::string& Model::directory() const { return impl_->dir; }
Backend& Model::backend() const { return *impl_->backend; }
const ModelWeights& Model::weights() const { return impl_->weights; }

uint64_t Model::weights_hash() const {
  std::call_once(impl_->hash_once, [this] {
    // Random models are identified by their seed (mixed so that seed 0 is not hash 0).
    impl_->hash = impl_->checkpoint ? impl_->checkpoint->content_hash() : impl_->gguf ? impl_->gguf->content_hash() : (impl_->random_seed + 1) * 0x9e3779b97f4a7c15ull;
  });
  return impl_->hash;
}

namespace {

// Every slot's fixed-size state is allocated up front: refuse a slot count whose bytes overflow, or exceed the
// machine's memory on the CPU (where an overcommitted allocation would succeed and the process die later). A GPU
// allocation that does not fit fails cleanly by itself.
void check_state_fits(const ModelConfig& c, int64_t n_slots, DType state_dtype, Device device) {
  double slot = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerKind kind = c.layer_kind(l);
    if (kind == LayerKind::Attention || kind == LayerKind::MLP || kind == LayerKind::MoE) continue;
    slot += static_cast<double>(c.conv_state_size() + c.ssm_state_size()) * static_cast<double>(dtype_size(state_dtype));
  }
  const double need = slot * static_cast<double>(n_slots);
  const double have = device == Device::CPU ? physical_memory_bytes() : 0x1p62;
  if (need <= have) return;
  std::ostringstream os;
  os.precision(3);
  os << "create_state: " << n_slots << " state slots of " << slot / (1 << 20) << " MiB each need " << need / 0x1p30
     << " GiB, more than " << (device == Device::CPU ? "this machine's " : "a device's ") << have / 0x1p30
     << " GiB of memory (slots are allocated up front)";
  fail(os.str());
}

}  // namespace

std::unique_ptr<StateCache> Model::create_state(int64_t n_slots, DType state_dtype) const {
  const ModelConfig& c = impl_->config;
  if (n_slots < 1) fail("create_state: n_slots must be >= 1, found ", n_slots);
  if (state_dtype != DType::F32 && state_dtype != DType::BF16)
    fail("state dtype: expected f32 or bf16, found ", dtype_name(state_dtype));
  check_state_fits(c, n_slots, state_dtype, impl_->backend->device());
  auto impl = std::make_unique<StateCache::Impl>();
  impl->model = this;
  impl->backend = impl_->backend.get();
  impl->n_slots = n_slots;
  impl->dtype = state_dtype;
  Backend& be = *impl_->backend;
  const Device dev = be.device();
  if (c.has_attention()) {
    if (impl_->options.kv_page_tokens < 1)
      fail("kv_page_tokens must be >= 1, found ", impl_->options.kv_page_tokens);
    impl->page_tokens = impl_->options.kv_page_tokens;
    impl->positions.assign(static_cast<size_t>(n_slots), 0);
    // One cache entry per layer, two for a parallel layer (its Mamba state, then its KV pages).
    impl->kv_pages.resize(static_cast<size_t>(c.cache_entries()));
  }
  // A cache entry without fixed-size tensors (two empty buffers keep buffers[2 e], buffers[2 e + 1] entry e's, as
  // MambaBlock expects); an attention entry's pages are allocated as its slots grow.
  auto add_entry_without_tensors = [&](bool kv) {
    LayerCache lc;
    lc.kind = kv ? LayerCacheKind::Kv : LayerCacheKind::Stateless;
    if (kv) {
      lc.kv_dim = c.kv_dim();
      impl->kv_pages[impl->layers.size()].resize(static_cast<size_t>(n_slots));
    }
    impl->buffers.emplace_back();
    impl->buffers.emplace_back();
    impl->layers.push_back(lc);
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerCache lc;
    const LayerKind kind = c.layer_kind(l);
    if (kind == LayerKind::Attention || kind == LayerKind::MLP || kind == LayerKind::MoE) {
      add_entry_without_tensors(kind == LayerKind::Attention);
      continue;
    }
    DeviceBuffer conv(be, static_cast<size_t>(n_slots * c.conv_state_size()) * dtype_size(state_dtype));
    DeviceBuffer ssm(be, static_cast<size_t>(n_slots * c.ssm_state_size()) * dtype_size(state_dtype));
    lc.conv = TensorView(conv.data(), state_dtype, {n_slots, c.conv_channels(), c.d_conv - 1}, dev);
    lc.ssm = c.arch == Arch::Mamba1
                 ? TensorView(ssm.data(), state_dtype, {n_slots, c.d_inner, c.d_state}, dev)
                 : TensorView(ssm.data(), state_dtype, {n_slots, c.n_heads, c.head_dim, c.d_state}, dev);
    impl->buffers.push_back(std::move(conv));
    impl->buffers.push_back(std::move(ssm));
    impl->layers.push_back(lc);
    if (kind == LayerKind::ParallelHybrid) add_entry_without_tensors(/*kv=*/true);
  }
  auto state = std::unique_ptr<StateCache>(new StateCache(std::move(impl)));
  state->reset_all();
  return state;
}

namespace {

// The positions a slot of a model with attention may hold (0: unlimited): --ctx-size where given, else the config's.
int64_t context_limit(const ModelConfig& c, const LoadOptions& o) {
  if (!c.has_attention()) return 0;
  return o.ctx_size > 0 ? o.ctx_size : c.max_position;
}

void validate_sequences(const ModelConfig& c, int64_t ctx_limit, const StateCache& state,
                        std::span<const Sequence> seqs) {
  if (seqs.empty()) fail("forward: no sequences given");
  std::set<int64_t> slots;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = seqs[i];
    const bool has_ids = !s.token_ids.empty(), has_emb = !s.embeddings.empty();
    if (has_ids && has_emb) fail("sequence ", i, ": give token ids or embeddings, not both");
    if (has_emb) {
      const TensorView& e = s.embeddings;
      if (e.ndim != 2 || e.dim(1) != c.d_model)
        fail("input embeddings (sequence ", i, "): expected shape [L, ", c.d_model, "] (last dimension = d_model), found ",
             e.shape_string());
      if (e.dtype != DType::F32 && e.dtype != DType::F16 && e.dtype != DType::BF16)
        fail("input embeddings (sequence ", i, "): expected dtype f32, f16 or bf16, found ", dtype_name(e.dtype));
      if (e.device != Device::CPU) fail("input embeddings (sequence ", i, "): expected a host (CPU) tensor");
      if (!e.contiguous()) fail("input embeddings (sequence ", i, "): expected a contiguous tensor");
    }
    if (s.length() == 0) fail("sequence ", i, ": L == 0; expected at least one token");
    for (size_t p = 0; p < s.token_ids.size(); ++p) {
      int32_t id = s.token_ids[p];
      if (id < 0 || id >= c.vocab_size)
        fail("input token ids (sequence ", i, ", position ", p, "): token id ", id, " out of range [0, ", c.vocab_size,
             ")");
    }
    state.check_slot(s.slot, "sequence slot");
    if (!slots.insert(s.slot).second)
      fail("sequence ", i, ": slot ", s.slot, " is used by two sequences of one forward call");
    if (ctx_limit > 0 && state.tokens_held(s.slot) + s.length() > ctx_limit)
      fail("sequence ", i, ": ", state.tokens_held(s.slot), " tokens held + ", s.length(), " new exceed the context ",
           "limit of ", ctx_limit, " positions (", ctx_limit == c.max_position ? "the config's max_position_embeddings" : "ctx_size",
           ")");
  }
}

}  // namespace

int64_t Model::context_limit() const { return mambacpp::context_limit(impl_->config, impl_->options); }

void select_outputs(Backend& be, TensorView logits, const std::vector<TopKRequest>& reqs,
                    std::vector<TopKCandidates>& cands, std::vector<RowLogprobs>& logprobs) {
  const int64_t V = logits.dim(1);
  logprobs.assign(reqs.size(), RowLogprobs{});
  const bool any = std::any_of(reqs.begin(), reqs.end(), [](const TopKRequest& q) { return q.logprobs >= 0; });
  if (any) {
    // Over every row of the block (cheap next to the LM head); rows that did not ask are dropped.
    std::vector<int64_t> limits(reqs.size());
    std::vector<TopKRequest> raw(reqs.size());  // the most likely ids of the raw row: no penalty
    for (size_t i = 0; i < reqs.size(); ++i) {
      limits[i] = reqs[i].limit == 0 ? V : reqs[i].limit;
      raw[i].k = std::max(1, reqs[i].logprobs);
      raw[i].limit = reqs[i].limit;
    }
    std::vector<float> lse;
    std::vector<TopKCandidates> best;
    be.row_logsumexp(logits, limits, lse);
    be.select_top_k(logits, raw, best);
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i].logprobs < 0) continue;
      RowLogprobs& out = logprobs[i];
      out.log_normalizer = lse[i];
      const size_t n = std::min(best[i].ids.size(), static_cast<size_t>(reqs[i].logprobs));
      out.ids.assign(best[i].ids.begin(), best[i].ids.begin() + static_cast<std::ptrdiff_t>(n));
      for (size_t k = 0; k < n; ++k) out.logprobs.push_back(best[i].logits[k] - lse[i]);
    }
  }
  be.select_top_k(logits, reqs, cands);  // last: it applies the penalty in place
}

ForwardResult Model::forward(StateCache& state, std::span<const Sequence> seqs, Output output,
                             const std::function<void(int64_t, int64_t)>& on_progress) const {
  return forward_impl(state, seqs, output, nullptr, on_progress);
}

ForwardResult Model::forward_top_k(StateCache& state, std::span<const Sequence> seqs,
                                   std::span<const TopKRequest> requests,
                                   const std::function<void(int64_t, int64_t)>& on_progress) const {
  if (requests.size() != seqs.size())
    fail("forward_top_k: expected one request per sequence (", seqs.size(), "), found ", requests.size());
  std::vector<TopKRequest> reqs(requests.begin(), requests.end());
  for (size_t i = 0; i < reqs.size(); ++i)
    if (reqs[i].logprobs < -1 || reqs[i].logprobs > kMaxTopK)
      fail("forward_top_k: request ", i, ": logprobs must be in [-1, ", kMaxTopK, "], found ", reqs[i].logprobs);
  // The checks of the backend op, here on a shape-only view, so that nothing has run when a request is bad.
  check_top_k_requests(TensorView(nullptr, DType::F32, {static_cast<int64_t>(reqs.size()), impl_->config.vocab_size}),
                       reqs);
  return forward_impl(state, seqs, Output::LastLogits, &reqs, on_progress);
}

ForwardResult Model::forward_impl(StateCache& state, std::span<const Sequence> seqs, Output output,
                                  const std::vector<TopKRequest>* top_k,
                                  const std::function<void(int64_t, int64_t)>& on_progress) const {
  const ModelConfig& c = impl_->config;
  if (state.impl_->model != this) fail("forward: this state cache was created by another model");
  if (static_cast<int64_t>(state.layers().size()) != c.cache_entries())
    fail("forward: the state cache has ", state.layers().size(), " layers, expected ", c.cache_entries(),
         " (a MambaBlock's state cannot run the whole model)");
  validate_sequences(c, context_limit(), state, seqs);
  if (step_pieces_apply(*impl_, seqs, output)) {  // each part takes the lock itself
    ForwardResult r = step_pieces(*impl_, seqs, output, top_k,
                                  [&](std::span<const Sequence> part, Output out, const std::vector<TopKRequest>* k) {
                                    return forward_impl(state, part, out, k, {});
                                  });
    if (on_progress) {
      int64_t total = 0;
      for (const Sequence& s : seqs) total += s.length();
      on_progress(total, total);
    }
    return r;
  }
  std::lock_guard<std::mutex> lock(impl_->forward_mutex);

  Backend& be = *impl_->backend;
  const Device dev = be.device();
  Workspace& ws = impl_->workspace;
  const int64_t cap = std::max<int64_t>(1, impl_->options.max_batch_tokens);
  const int64_t logit_block = std::min<int64_t>(cap, 256);  // bounds the logits buffer for AllLogits
  int64_t total = 0;
  for (const Sequence& s : seqs) total += s.length();
  ws.reserve(be, c, std::min(cap, total), std::min<int64_t>(logit_block, std::max<int64_t>(total, 1)));

  ForwardResult result;
  result.cols = output == Output::Hidden ? c.d_model : c.vocab_size;
  result.rows = output == Output::None ? 0 : output == Output::LastLogits ? static_cast<int64_t>(seqs.size()) : total;
  if (output == Output::None || top_k) result.cols = 0;
  result.values.resize(static_cast<size_t>(result.rows * result.cols));
  if (top_k) result.candidates.resize(seqs.size()), result.logprobs.resize(seqs.size());
  if (output == Output::AllLogitsAndHidden) result.hidden.resize(static_cast<size_t>(total * c.d_model));

  if (decode_step_applies(*impl_, seqs, output)) {
    decode_step(*impl_, state, seqs, output, top_k, result);
    return result;
  }

  int64_t global_row = 0;  // rows of `total` done so far
  std::vector<int32_t> ids;
  PieceIterator pieces(seqs, cap);
  Piece piece;
  while (pieces.next(piece)) {
    BatchLayout& batch = piece.batch;
    const auto& origin = piece.origin;
    be.prepare_batch(batch);
    const int64_t T = batch.total_tokens;

    // Input rows -> residual stream.
    TensorView residual = Workspace::f32(ws.residual, dev, T, c.d_model);
    const bool all_tokens = std::all_of(origin.begin(), origin.end(),
                                        [&](const auto& o) { return seqs[o.first].embeddings.empty(); });
    ids.assign(static_cast<size_t>(T), 0);
    for (size_t k = 0; k < batch.seqs.size(); ++k) {
      const Sequence& s = seqs[origin[k].first];
      const SeqSpan& sp = batch.seqs[k];
      if (s.embeddings.empty()) {
        std::copy_n(s.token_ids.data() + origin[k].second, sp.len, ids.begin() + sp.start);
      } else {
        const size_t row_bytes = static_cast<size_t>(c.d_model) * dtype_size(s.embeddings.dtype);
        be.copy_from_host(ws.staging.data(), s.embeddings.ptr<char>() + static_cast<size_t>(origin[k].second) * row_bytes,
                          static_cast<size_t>(sp.len) * row_bytes);
        be.to_f32(TensorView(ws.staging.data(), s.embeddings.dtype, {sp.len, c.d_model}, dev),
                  residual.rows(sp.start, sp.len));
      }
    }
    be.copy_from_host(ws.ids.data(), ids.data(), static_cast<size_t>(T) * 4);
    TensorView id_view(ws.ids.data(), DType::I32, {T}, dev);
    if (all_tokens) {
      be.embed(impl_->weights.embeddings, id_view, residual);
    } else {
      for (size_t k = 0; k < batch.seqs.size(); ++k) {
        const SeqSpan& sp = batch.seqs[k];
        if (seqs[origin[k].first].embeddings.empty())
          be.embed(impl_->weights.embeddings, id_view.rows(sp.start, sp.len), residual.rows(sp.start, sp.len));
      }
    }
    reserve_kv(state, batch, Pass::Prefill);
    run_layers(*impl_, state, batch, Pass::Prefill, residual);
    advance_kv(state, batch);
    TensorView normed = Workspace::f32(ws.normed, dev, T, c.d_model);
    be.rmsnorm(residual, impl_->weights.norm_f, static_cast<float>(c.norm_eps), normed);

    // Outputs of this piece.
    if (output == Output::AllLogitsAndHidden)
      be.copy_to_host(result.hidden.data() + global_row * c.d_model, normed.data, static_cast<size_t>(T * c.d_model) * 4);
    if (output == Output::Hidden) {
      be.copy_to_host(result.values.data() + global_row * c.d_model, normed.data, static_cast<size_t>(T * c.d_model) * 4);
    } else if (output == Output::AllLogits || output == Output::AllLogitsAndHidden) {
      for (int64_t r = 0; r < T; r += logit_block) {
        const int64_t n = std::min(logit_block, T - r);
        TensorView logits = Workspace::f32(ws.logits, dev, n, c.vocab_size);
        lm_head(*impl_, normed.rows(r, n), logits);
        be.copy_to_host(result.values.data() + (global_row + r) * c.vocab_size, logits.data,
                        static_cast<size_t>(n * c.vocab_size) * 4);
      }
    } else if (output == Output::LastLogits) {
      std::vector<int64_t> rows;
      std::vector<size_t> out_index;
      for (size_t k = 0; k < batch.seqs.size(); ++k) {
        const SeqSpan& sp = batch.seqs[k];
        if (piece.ends_sequence(k, seqs)) {
          rows.push_back(sp.start + sp.len - 1);
          out_index.push_back(origin[k].first);
        }
      }
      for (size_t r = 0; r < rows.size(); r += static_cast<size_t>(logit_block)) {
        const int64_t n = std::min<int64_t>(logit_block, static_cast<int64_t>(rows.size() - r));
        TensorView last = Workspace::f32(ws.mixer_out, dev, n, c.d_model);
        be.gather_rows(normed, rows.data() + r, n, last);
        TensorView logits = Workspace::f32(ws.logits, dev, n, c.vocab_size);
        lm_head(*impl_, last, logits);
        if (top_k) {
          std::vector<TopKRequest> reqs;
          for (int64_t i = 0; i < n; ++i) reqs.push_back((*top_k)[out_index[r + static_cast<size_t>(i)]]);
          std::vector<TopKCandidates> cands;
          std::vector<RowLogprobs> lps;
          select_outputs(be, logits, reqs, cands, lps);
          for (int64_t i = 0; i < n; ++i) {
            result.candidates[out_index[r + static_cast<size_t>(i)]] = std::move(cands[static_cast<size_t>(i)]);
            result.logprobs[out_index[r + static_cast<size_t>(i)]] = std::move(lps[static_cast<size_t>(i)]);
          }
          continue;
        }
        std::vector<float> host(static_cast<size_t>(n * c.vocab_size));
        be.copy_to_host(host.data(), logits.data, host.size() * 4);
        for (int64_t i = 0; i < n; ++i)
          std::copy_n(host.begin() + i * c.vocab_size, c.vocab_size,
                      result.values.begin() + static_cast<int64_t>(out_index[r + static_cast<size_t>(i)]) * c.vocab_size);
      }
    }
    global_row += T;
    if (on_progress) on_progress(global_row, total);
  }
  be.synchronize();
  return result;
}

ForwardResult Model::forward(StateCache& state, const TensorView& input, Output output) const {
  const ModelConfig& c = impl_->config;
  const bool ids = input.dtype == DType::I32 || input.dtype == DType::I64;
  if (input.device != Device::CPU || !input.contiguous())
    fail("input: expected a contiguous host tensor, found one on ", device_name(input.device));
  if (ids ? input.ndim != 2 : (input.ndim != 3 || input.dim(2) != c.d_model))
    fail("input: expected token ids [B, L] (i32/i64) or embeddings [B, L, ", c.d_model, "] (f32/f16/bf16), found ",
         input.shape_string(), " of dtype ", dtype_name(input.dtype));
  const int64_t B = input.dim(0), L = input.dim(1);
  if (B == 0 || L == 0) fail("input: expected B >= 1 and L >= 1, found shape ", input.shape_string());
  std::vector<std::vector<int32_t>> id_rows;
  std::vector<Sequence> seqs;
  for (int64_t b = 0; b < B; ++b) {
    if (ids) {
      std::vector<int32_t> row(static_cast<size_t>(L));
      for (int64_t t = 0; t < L; ++t) {
        int64_t v = input.dtype == DType::I32 ? input.ptr<int32_t>()[b * L + t] : input.ptr<int64_t>()[b * L + t];
        if (v < 0 || v >= c.vocab_size)
          fail("input token ids [", b, ", ", t, "]: token id ", v, " out of range [0, ", c.vocab_size, ")");
        row[static_cast<size_t>(t)] = static_cast<int32_t>(v);
      }
      id_rows.push_back(std::move(row));
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    if (ids) {
      seqs.push_back(Sequence::tokens(id_rows[static_cast<size_t>(b)], b));
    } else {
      TensorView e(input.ptr<char>() + static_cast<size_t>(b * L * c.d_model) * dtype_size(input.dtype), input.dtype,
                   {L, c.d_model});
      seqs.push_back(Sequence::embeds(e, b));
    }
  }
  return forward(state, seqs, output);
}

std::string default_model_dir() {
  namespace fs = std::filesystem;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MAMBACPP_MODEL")) candidates.emplace_back(env);
  candidates.emplace_back(MAMBACPP_SOURCE_MODEL_DIR);
  candidates.emplace_back(MAMBACPP_INSTALL_MODEL_DIR);
  // Next to the binary: <repo>/build/mambacpp or <prefix>/bin/mambacpp, wherever the tree was moved.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back((exe.parent_path().parent_path() / "models/default").string());
    candidates.push_back((exe.parent_path().parent_path() / "share/mambacpp/models/default").string());
  }
  for (const std::string& dir : candidates)
    if (fs::exists(fs::path(dir) / "config.json")) return dir;
  fail("no default model found (looked in $MAMBACPP_MODEL, ", MAMBACPP_SOURCE_MODEL_DIR, " and ",
       MAMBACPP_INSTALL_MODEL_DIR, "); pass --model DIR");
}

}  // namespace mambacpp
