#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>

#include "mambacpp/error.h"
#include "model/moe_layer.h"

namespace mambacpp {

namespace {

bool has_kind(const ModelConfig& c, std::initializer_list<LayerKind> kinds) {
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (std::find(kinds.begin(), kinds.end(), c.layer_kind(l)) != kinds.end()) return true;
  return false;
}

bool has_mlp(const ModelConfig& c) {
  return c.mlp_size > 0 && (c.mlp_after_mixer || has_kind(c, {LayerKind::MLP, LayerKind::ParallelHybrid}));
}

// Throws unless n_ranks divides `value` (the config field `key`).
void require_divides(const char* key, int64_t value, int64_t n_ranks, const char* what) {
  if (value % n_ranks != 0)
    fail("tensor parallel over ", n_ranks, " ranks: ", key, " = ", value, ", expected a multiple of ", n_ranks, " (",
         what, ")");
}

TpRange split(int64_t total, int64_t n_ranks, int64_t rank) {
  const int64_t per = total / n_ranks;
  return {rank * per, per};
}

// ---- Slicing ---------------------------------------------------------------------------------------------------

// Bytes of one storage row of w (a row of dim 0's storage: an element of a 1-D tensor, a row of a matrix, a channel
// of conv1d's [C, 1, K]), and storage rows per index of logical dim 0.
struct RowLayout {
  int64_t rows_per_index = 1;
  size_t row_bytes = 0;
};

RowLayout row_layout(const Weight& w, const std::string& name) {
  if (w.device() != Device::CPU) fail("tensor parallel slicing: ", name, " is not in host memory");
  if (!w.data.contiguous()) fail("tensor parallel slicing: ", name, " is not contiguous");
  if (!w.scale.empty())
    fail("tensor parallel slicing: ", name, " is ", w.describe(), "; scaled formats are not sliced");
  const int64_t storage_rows = w.data.dim(0);
  RowLayout r;
  r.rows_per_index = storage_rows / std::max<int64_t>(w.shape[0], 1);
  r.row_bytes = storage_rows > 0 ? w.data.nbytes() / static_cast<size_t>(storage_rows) : 0;
  return r;
}

// A copy of w's dim-0 indices `ranges`, in order, into new storage: shape [sum of counts, rest of w's shape].
Weight gather_rows(const Weight& w, std::initializer_list<TpRange> ranges, std::vector<std::vector<char>>& storage,
                   const std::string& name) {
  if (w.empty()) return {};
  const RowLayout lay = row_layout(w, name);
  int64_t count = 0;
  for (const TpRange& r : ranges) {
    if (r.begin < 0 || r.end() > w.shape[0])
      fail("tensor parallel slicing: ", name, " ", w.shape_string(), ": rows [", r.begin, ", ", r.end(),
           ") out of range");
    count += r.count;
  }
  std::vector<char>& bytes = storage.emplace_back(static_cast<size_t>(count * lay.rows_per_index) * lay.row_bytes);
  size_t at = 0;
  const char* src = static_cast<const char*>(w.data.data);
  for (const TpRange& r : ranges) {
    const size_t n = static_cast<size_t>(r.count * lay.rows_per_index) * lay.row_bytes;
    if (n > 0)
      std::memcpy(bytes.data() + at, src + static_cast<size_t>(r.begin * lay.rows_per_index) * lay.row_bytes, n);
    at += n;
  }
  Weight out = w;
  out.shape[0] = count;
  out.data.data = bytes.data();
  out.data.shape[0] = count * lay.rows_per_index;
  out.data.row_stride = 0;
  return out;
}

TensorView gather_rows(const TensorView& t, std::initializer_list<TpRange> ranges,
                       std::vector<std::vector<char>>& storage, const std::string& name) {
  return t.empty() ? TensorView{} : gather_rows(Weight(t), ranges, storage, name).data;
}

// The whole of t, copied (replicated tensors: every rank holds its own).
TensorView copy_of(const TensorView& t, std::vector<std::vector<char>>& storage, const std::string& name) {
  return t.empty() ? TensorView{} : gather_rows(t, {TpRange{0, t.dim(0)}}, storage, name);
}

// Columns `cols` of a 2-D weight [out, in]: [out, cols.count]. Block formats take whole blocks.
Weight slice_cols(const Weight& w, TpRange cols, std::vector<std::vector<char>>& storage, const std::string& name) {
  if (w.empty()) return {};
  if (w.ndim != 2) fail("tensor parallel slicing: ", name, " ", w.shape_string(), ": expected a matrix");
  const RowLayout lay = row_layout(w, name);
  const WeightFormatInfo& info = weight_format_info(w.format);
  if (cols.begin % info.block_elems != 0 || cols.count % info.block_elems != 0)
    fail("tensor parallel slicing: ", name, " is ", w.describe(), ": columns [", cols.begin, ", ", cols.end(),
         ") split its blocks of ", info.block_elems);
  const int64_t in = w.shape[1];
  const size_t unit = lay.row_bytes / static_cast<size_t>(in / info.block_elems);  // bytes of one block
  const size_t skip = static_cast<size_t>(cols.begin / info.block_elems) * unit;
  const size_t take = static_cast<size_t>(cols.count / info.block_elems) * unit;
  const int64_t rows = w.data.dim(0);
  std::vector<char>& bytes = storage.emplace_back(static_cast<size_t>(rows) * take);
  const char* src = static_cast<const char*>(w.data.data);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(bytes.data() + static_cast<size_t>(r) * take, src + static_cast<size_t>(r) * lay.row_bytes + skip,
                take);
  if (w.dense()) {
    Weight out(TensorView(bytes.data(), w.data.dtype, {w.shape[0], cols.count}));
    return out;
  }
  Weight out = w;
  out.shape[1] = cols.count;
  out.data = TensorView(bytes.data(), DType::U8, {rows, static_cast<int64_t>(take)});
  return out;
}

std::string tensor_name(int64_t layer, const char* what) { return "layer " + std::to_string(layer) + " " + what; }

void shard_mamba2(const ModelConfig& c, const TpRankPlan& p, int64_t layer, const LayerWeights& f, LayerShard& s) {
  auto& st = s.storage;
  LayerWeights& w = s.w;
  const int64_t di = c.d_inner, gn = c.n_groups * c.d_state, N = c.d_state;
  const TpRange z = p.channels, x{di + p.channels.begin, p.channels.count};
  const TpRange B{2 * di + p.groups.begin * N, p.groups.count * N},
      C{2 * di + gn + p.groups.begin * N, p.groups.count * N};
  const TpRange dt{2 * di + 2 * gn + p.heads.begin, p.heads.count};
  // in_proj's output is [z | x | B | C | dt] (xBC = [x | B | C] feeds conv1d): the rank's rows of each, in order.
  w.in_proj = gather_rows(f.in_proj, {z, x, B, C, dt}, st, tensor_name(layer, "in_proj"));
  w.in_proj_bias = gather_rows(f.in_proj_bias, {z, x, B, C, dt}, st, tensor_name(layer, "in_proj.bias"));
  const TpRange cx = p.channels, cB{di + B.begin - 2 * di, B.count}, cC{di + C.begin - 2 * di, C.count};
  w.conv = gather_rows(f.conv, {cx, cB, cC}, st, tensor_name(layer, "conv1d"));
  w.conv_bias = gather_rows(f.conv_bias, {cx, cB, cC}, st, tensor_name(layer, "conv1d.bias"));
  w.A_log = gather_rows(f.A_log, {p.heads}, st, tensor_name(layer, "A_log"));
  w.D = gather_rows(f.D, {p.heads}, st, tensor_name(layer, "D"));
  w.dt_bias = gather_rows(f.dt_bias, {p.heads}, st, tensor_name(layer, "dt_bias"));
  w.gated_norm = gather_rows(f.gated_norm, {p.channels}, st, tensor_name(layer, "norm"));
  w.out_proj = slice_cols(f.out_proj, p.channels, st, tensor_name(layer, "out_proj"));
  w.out_proj_bias = p.rank == 0 ? copy_of(f.out_proj_bias, st, tensor_name(layer, "out_proj.bias")) : TensorView{};
}

void shard_mamba1(const ModelConfig& c, const TpRankPlan& p, int64_t layer, const LayerWeights& f, LayerShard& s) {
  auto& st = s.storage;
  LayerWeights& w = s.w;
  const TpRange x = p.channels, z{c.d_inner + p.channels.begin, p.channels.count};
  w.in_proj = gather_rows(f.in_proj, {x, z}, st, tensor_name(layer, "in_proj"));  // [x | z]
  w.in_proj_bias = gather_rows(f.in_proj_bias, {x, z}, st, tensor_name(layer, "in_proj.bias"));
  w.conv = gather_rows(f.conv, {x}, st, tensor_name(layer, "conv1d"));
  w.conv_bias = gather_rows(f.conv_bias, {x}, st, tensor_name(layer, "conv1d.bias"));
  w.x_proj = slice_cols(f.x_proj, x, st, tensor_name(layer, "x_proj"));  // row-parallel: dt, B, C are partial sums
  w.dt_proj = gather_rows(f.dt_proj, {x}, st, tensor_name(layer, "dt_proj"));
  w.dt_bias = gather_rows(f.dt_bias, {x}, st, tensor_name(layer, "dt_proj.bias"));
  w.A_log = gather_rows(f.A_log, {x}, st, tensor_name(layer, "A_log"));
  w.D = gather_rows(f.D, {x}, st, tensor_name(layer, "D"));
  w.out_proj = slice_cols(f.out_proj, x, st, tensor_name(layer, "out_proj"));
  w.out_proj_bias = p.rank == 0 ? copy_of(f.out_proj_bias, st, tensor_name(layer, "out_proj.bias")) : TensorView{};
  // Applied after x_proj's all-reduce, to the whole dt, B and C: replicated.
  w.mixer_norm = copy_of(f.mixer_norm, st, tensor_name(layer, "mixer_norm"));
  w.dt_norm = copy_of(f.dt_norm, st, tensor_name(layer, "dt_layernorm"));
  w.b_norm = copy_of(f.b_norm, st, tensor_name(layer, "b_layernorm"));
  w.c_norm = copy_of(f.c_norm, st, tensor_name(layer, "c_layernorm"));
}

void shard_attention(const ModelConfig& c, const TpRankPlan& p, int64_t layer, const LayerWeights& f, LayerShard& s) {
  auto& st = s.storage;
  LayerWeights& w = s.w;
  const int64_t hd = c.attn_head_dim;
  const TpRange q{p.q_heads.begin * hd, p.q_heads.count * hd}, kv{p.kv_heads.begin * hd, p.kv_heads.count * hd};
  w.q_proj = gather_rows(f.q_proj, {q}, st, tensor_name(layer, "q_proj"));
  w.k_proj = gather_rows(f.k_proj, {kv}, st, tensor_name(layer, "k_proj"));
  w.v_proj = gather_rows(f.v_proj, {kv}, st, tensor_name(layer, "v_proj"));
  w.q_bias = gather_rows(f.q_bias, {q}, st, tensor_name(layer, "q_proj.bias"));
  w.k_bias = gather_rows(f.k_bias, {kv}, st, tensor_name(layer, "k_proj.bias"));
  w.v_bias = gather_rows(f.v_bias, {kv}, st, tensor_name(layer, "v_proj.bias"));
  w.o_proj = slice_cols(f.o_proj, q, st, tensor_name(layer, "o_proj"));
  w.o_bias = p.rank == 0 ? copy_of(f.o_bias, st, tensor_name(layer, "o_proj.bias")) : TensorView{};
}

void shard_mlp(const ModelConfig& c, const TpRankPlan& p, int64_t layer, const LayerWeights& f, LayerShard& s) {
  auto& st = s.storage;
  LayerWeights& w = s.w;
  const TpRange m = p.mlp;
  const bool fused_gate_up = c.mlp_act == MlpAct::SiluGated && f.mlp_gate.empty();
  // Granite's input_linear is [gate | up]: the rank's rows of each, in order, keep that layout.
  if (fused_gate_up)
    w.mlp_up = gather_rows(f.mlp_up, {m, TpRange{c.mlp_size + m.begin, m.count}}, st, tensor_name(layer, "mlp up"));
  else
    w.mlp_up = gather_rows(f.mlp_up, {m}, st, tensor_name(layer, "mlp up"));
  w.mlp_gate = gather_rows(f.mlp_gate, {m}, st, tensor_name(layer, "mlp gate"));
  w.mlp_up_bias = gather_rows(f.mlp_up_bias, {m}, st, tensor_name(layer, "mlp up bias"));
  w.mlp_gate_bias = gather_rows(f.mlp_gate_bias, {m}, st, tensor_name(layer, "mlp gate bias"));
  w.mlp_down = slice_cols(f.mlp_down, m, st, tensor_name(layer, "mlp down"));
  w.mlp_down_bias = p.rank == 0 ? copy_of(f.mlp_down_bias, st, tensor_name(layer, "mlp down bias")) : TensorView{};
}

// Expert parallel: the rank's routed experts (whole), the router replicated (every rank routes every token over all
// experts), the shared expert column/row-parallel.
std::shared_ptr<const MoeWeights> shard_moe(const TpRankPlan& p, int64_t layer, const MoeWeights& f,
                                            std::vector<std::vector<char>>& st) {
  auto w = std::make_shared<MoeWeights>();
  auto whole = [&](const Weight& x, const char* what) {
    return x.empty() ? Weight{} : gather_rows(x, {TpRange{0, x.shape[0]}}, st, tensor_name(layer, what));
  };
  w->router = whole(f.router, "router");
  w->score_bias = copy_of(f.score_bias, st, tensor_name(layer, "e_score_correction_bias"));
  for (int64_t e = p.experts.begin; e < p.experts.end(); ++e) {
    const auto i = static_cast<size_t>(e);
    w->up.push_back(whole(f.up[i], "expert up"));
    if (!f.gate.empty()) w->gate.push_back(whole(f.gate[i], "expert gate"));
    w->down.push_back(whole(f.down[i], "expert down"));
  }
  w->shared_up = gather_rows(f.shared_up, {p.shared}, st, tensor_name(layer, "shared expert up"));
  w->shared_up_bias = gather_rows(f.shared_up_bias, {p.shared}, st, tensor_name(layer, "shared expert up bias"));
  w->shared_down = slice_cols(f.shared_down, p.shared, st, tensor_name(layer, "shared expert down"));
  w->shared_down_bias =
      p.rank == 0 ? copy_of(f.shared_down_bias, st, tensor_name(layer, "shared expert down bias")) : TensorView{};
  return w;
}

}  // namespace

// ---- The plan --------------------------------------------------------------------------------------------------

TpPlan plan_tensor_parallel(const ModelConfig& c, int64_t n_ranks) {
  if (n_ranks < 1) fail("tensor parallel: the number of ranks must be >= 1, found ", n_ranks);
  const bool mamba2 = c.arch == Arch::Mamba2 && has_kind(c, {LayerKind::Mamba2, LayerKind::ParallelHybrid});
  const bool mamba1 = has_kind(c, {LayerKind::Mamba1});
  const bool attention = c.has_attention();
  const bool moe = c.moe.n_experts > 0;
  TpPlan plan;
  plan.n_ranks = n_ranks;
  if (mamba2) {
    require_divides("n_heads", c.n_heads, n_ranks, "Mamba-2 heads are split across ranks");
    if (c.n_groups == 1 && n_ranks > 1) {
      plan.groups_replicated = true;
    } else if (c.n_groups % n_ranks != 0) {
      fail("tensor parallel over ", n_ranks, " ranks: n_groups = ", c.n_groups, ", expected a multiple of ", n_ranks,
           " or 1 (Mamba-2 groups are never split across ranks; one group is replicated on every rank)");
    }
    // The gated norm normalises runs of d_inner / norm_groups channels: each must lie within one rank's channels.
    const bool normed = !(c.family == Family::FalconH1 && !c.mamba_rms_norm);
    if (normed && c.norm_groups() == 1 && n_ranks > 1)
      plan.norm_all_reduce = true;
    else if (normed && c.norm_groups() % n_ranks != 0)
      fail("tensor parallel over ", n_ranks, " ranks: gated_norm_groups = ", c.norm_groups(), ", expected 1 or a ",
           "multiple of ", n_ranks, " (a gated norm group is whole on one rank, or the one group spans every rank)");
  }
  if (mamba1) require_divides("d_inner", c.d_inner, n_ranks, "Mamba-1 channels are split across ranks");
  if (attention && c.n_kv_heads % n_ranks != 0) {
    // Fewer KV heads than ranks: each KV head is held by N / n_kv_heads ranks, which split its query heads.
    if (n_ranks % c.n_kv_heads != 0 || c.n_attn_heads % n_ranks != 0)
      fail("tensor parallel over ", n_ranks, " ranks: n_kv_heads = ", c.n_kv_heads, " (n_attn_heads = ", c.n_attn_heads,
           "), expected a multiple of ", n_ranks, ", or a divisor of ", n_ranks, " with n_attn_heads a multiple of ",
           n_ranks,
           " (attention is split by KV heads, or each KV head "
           "replicated over ranks that split its query heads)");
    plan.kv_heads_replicated = true;
  }
  if (has_mlp(c)) require_divides("mlp_size", c.mlp_size, n_ranks, "MLP intermediate channels are split");
  if (moe) {
    // The latent projections would be replicated with fc2's bias on one rank; not done, so refused by name.
    if (c.moe.latent_size > 0 && n_ranks > 1)
      fail("tensor parallel over ", n_ranks, " ranks: moe.latent_size = ", c.moe.latent_size,
           " (Nemotron-H's moe_latent_size): latent MoE projections are not split across ranks yet");
    require_divides("moe.n_experts", c.moe.n_experts, n_ranks, "experts are split by expert");
    if (c.moe.shared_size > 0)
      require_divides("moe.shared_size", c.moe.shared_size, n_ranks, "the shared expert is split");
  }
  const int64_t per_rank_vocab =
      (c.vocab_size + n_ranks * kVocabPadPerRank - 1) / (n_ranks * kVocabPadPerRank) * kVocabPadPerRank;
  plan.padded_vocab = per_rank_vocab * n_ranks;
  for (int64_t r = 0; r < n_ranks; ++r) {
    TpRankPlan p;
    p.rank = r;
    if (mamba2) {
      p.heads = split(c.n_heads, n_ranks, r);
      p.groups = plan.groups_replicated ? TpRange{0, 1} : split(c.n_groups, n_ranks, r);
      p.channels = {p.heads.begin * c.head_dim, p.heads.count * c.head_dim};
    } else if (mamba1) {
      p.channels = split(c.d_inner, n_ranks, r);
    }
    if (attention && plan.kv_heads_replicated) {
      p.kv_heads = {r / (n_ranks / c.n_kv_heads), 1};
      p.q_heads = split(c.n_attn_heads, n_ranks, r);  // all of them query heads of that KV head
    } else if (attention) {
      p.kv_heads = split(c.n_kv_heads, n_ranks, r);
      const int64_t q_per_kv = c.n_attn_heads / c.n_kv_heads;
      p.q_heads = {p.kv_heads.begin * q_per_kv, p.kv_heads.count * q_per_kv};
    }
    if (has_mlp(c)) p.mlp = split(c.mlp_size, n_ranks, r);
    if (moe) {
      p.experts = split(c.moe.n_experts, n_ranks, r);
      p.shared = split(c.moe.shared_size, n_ranks, r);
    }
    p.vocab = {r * per_rank_vocab, per_rank_vocab};
    plan.ranks.push_back(p);
  }
  return plan;
}

ModelConfig TpPlan::rank_config(const ModelConfig& full) const {
  ModelConfig c = full;
  const int64_t n = n_ranks;
  if (c.arch == Arch::Mamba2 && c.n_heads > 0) {
    c.n_heads /= n;
    c.d_inner = c.n_heads * c.head_dim;
    c.gated_norm_groups = norm_all_reduce || groups_replicated ? 1 : full.norm_groups() / n;
    c.n_groups = groups_replicated ? 1 : full.n_groups / n;
  } else {
    c.d_inner /= n;
  }
  if (c.n_kv_heads > 0) {
    c.n_attn_heads /= n;
    c.n_kv_heads = kv_heads_replicated ? 1 : full.n_kv_heads / n;
  }
  c.mlp_size /= n;
  c.moe.shared_size /= n;
  return c;
}

// ---- Shards ----------------------------------------------------------------------------------------------------

LayerShard shard_layer(const ModelConfig& c, const TpPlan& plan, int64_t rank, int64_t layer,
                       const LayerWeights& full) {
  if (rank < 0 || rank >= plan.n_ranks) fail("tensor parallel: rank ", rank, " out of range [0, ", plan.n_ranks, ")");
  const TpRankPlan& p = plan.ranks[static_cast<size_t>(rank)];
  LayerShard s;
  s.w.kind = full.kind;
  s.w.norm = copy_of(full.norm, s.storage, tensor_name(layer, "norm"));
  s.w.mlp_norm = copy_of(full.mlp_norm, s.storage, tensor_name(layer, "mlp norm"));
  switch (full.kind) {
    case LayerKind::Mamba2:
      shard_mamba2(c, p, layer, full, s);
      break;
    case LayerKind::Mamba1:
      shard_mamba1(c, p, layer, full, s);
      break;
    case LayerKind::Attention:
      shard_attention(c, p, layer, full, s);
      break;
    case LayerKind::MLP:
      break;
    case LayerKind::ParallelHybrid:
      shard_mamba2(c, p, layer, full, s);
      shard_attention(c, p, layer, full, s);
      break;
    case LayerKind::MoE:
      break;
  }
  if (full.moe) s.w.moe = shard_moe(p, layer, *full.moe, s.storage);
  if (full.kind == LayerKind::MLP || c.mlp_after_mixer || full.kind == LayerKind::ParallelHybrid)
    shard_mlp(c, p, layer, full, s);
  return s;
}

VocabShard shard_vocab(const ModelConfig& c, const TpPlan& plan, int64_t rank, const Weight& full, const char* what) {
  if (rank < 0 || rank >= plan.n_ranks) fail("tensor parallel: rank ", rank, " out of range [0, ", plan.n_ranks, ")");
  if (full.ndim != 2 || full.shape[0] != c.vocab_size)
    fail("tensor parallel slicing: ", what, " ", full.shape_string(), ": expected [", c.vocab_size, ", d_model]");
  const TpRange v = plan.ranks[static_cast<size_t>(rank)].vocab;
  const TpRange real{std::min(v.begin, c.vocab_size), std::max<int64_t>(0, std::min(v.end(), c.vocab_size) - v.begin)};
  std::vector<std::vector<char>> st;
  const Weight rows = gather_rows(full, {real}, st, what);
  const size_t row_bytes = row_layout(full, what).row_bytes;
  VocabShard s;
  // Padding rows are zero bytes: a zero row in every format (block scales of zero), so zero embeddings and logits.
  s.storage.assign(static_cast<size_t>(v.count) * row_bytes, 0);
  if (real.count > 0) std::memcpy(s.storage.data(), rows.data.data, static_cast<size_t>(real.count) * row_bytes);
  s.w = full.dense() ? Weight(TensorView(s.storage.data(), full.data.dtype, {v.count, full.shape[1]}))
                     : Weight::packed(full.format, s.storage.data(), {v.count, full.shape[1]});
  return s;
}

}  // namespace mambacpp
