#include "support/tensor_parallel_reference.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "mambacpp/error.h"
#include "model/mixers.h"
#include "model/moe_layer.h"
#include "model/workspace.h"

namespace mambacpp {

namespace {

TensorView host(std::vector<float>& v, int64_t rows, int64_t cols) {
  return TensorView(v.data(), DType::F32, {rows, cols});
}

// The all-reduce: the sum over ranks, in rank order.
std::vector<float> sum_of(const std::vector<std::vector<float>>& partials) {
  std::vector<float> sum(partials.at(0).size(), 0.0f);
  for (const std::vector<float>& p : partials)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
  return sum;
}

// One slot of fresh (zero) conv and SSM state for a rank's Mamba-2 layer.
struct FreshMambaState {
  DeviceBuffer conv, ssm;
  LayerCache cache;
  FreshMambaState(Backend& be, const ModelConfig& c) {
    conv = DeviceBuffer(be, static_cast<size_t>(c.conv_state_size()) * 4);
    ssm = DeviceBuffer(be, static_cast<size_t>(c.ssm_state_size()) * 4);
    be.fill_zero(conv.data(), conv.size());
    be.fill_zero(ssm.data(), ssm.size());
    cache.conv = TensorView(conv.data(), DType::F32, {1, c.conv_channels(), c.d_conv - 1});
    cache.ssm = TensorView(ssm.data(), DType::F32, {1, c.n_heads, c.head_dim, c.d_state});
  }
};

// out = attention(h) of a rank's heads over a fresh KV cache of one page holding the T rows (positions 0..T-1):
// the recipe of layers.cpp's attention_mixer, on the rank's head counts.
void rank_attention(Backend& be, const ModelConfig& c, const LayerWeights& w, const BatchLayout& batch,
                    const TensorView& h, TensorView out) {
  const int64_t T = batch.total_tokens;
  std::vector<float> q(static_cast<size_t>(T * c.q_dim())), k(static_cast<size_t>(T * c.kv_dim())),
      v(static_cast<size_t>(T * c.kv_dim())), o(static_cast<size_t>(T * c.q_dim()));
  AttentionArgs a;
  a.q = host(q, T, c.q_dim());
  a.k = host(k, T, c.kv_dim());
  a.v = host(v, T, c.kv_dim());
  a.out = host(o, T, c.q_dim());
  be.linear(h, w.q_proj, w.q_bias, a.q);
  be.linear(h, w.k_proj, w.k_bias, a.k);
  be.linear(h, w.v_proj, w.v_bias, a.v);
  if (c.key_multiplier != 1.0) be.scale(a.k, static_cast<float>(c.key_multiplier));
  if (c.rope_theta > 0) {
    be.rope(a.q, c.n_attn_heads, c.attn_head_dim, c.rope_dim, c.rope_theta, {0}, batch);
    be.rope(a.k, c.n_kv_heads, c.attn_head_dim, c.rope_dim, c.rope_theta, {0}, batch);
  }
  a.n_heads = c.n_attn_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.attn_head_dim;
  a.page_tokens = T;
  a.kv_dtype = DType::F32;
  a.scale = static_cast<float>(c.attn_scale > 0 ? c.attn_scale : 1.0 / std::sqrt(static_cast<double>(c.attn_head_dim)));
  DeviceBuffer page(be, static_cast<size_t>(2 * T * c.kv_dim()) * 4);
  a.cache.push_back(KvSequence{{page.data()}, 0});
  be.attention(a, batch);
  be.linear(a.out, w.o_proj, w.o_bias, out);
}

// out = mlp(h) of a rank's intermediate channels: layers.cpp's mlp on the rank's mlp_size.
void rank_mlp(Backend& be, const ModelConfig& c, const LayerWeights& w, int64_t T, const TensorView& h,
              TensorView out) {
  const int64_t n = c.mlp_size;
  std::vector<float> hid_v(static_cast<size_t>(T * 2 * n)), act_v(static_cast<size_t>(T * n));
  TensorView hid = host(hid_v, T, 2 * n);
  if (c.mlp_act == MlpAct::Relu2) {
    TensorView up = hid.cols(0, n);
    be.linear(h, w.mlp_up, w.mlp_up_bias, up);
    be.relu2(up);
    be.linear(up, w.mlp_down, w.mlp_down_bias, out);
    return;
  }
  if (w.mlp_gate.empty()) {
    be.linear(h, w.mlp_up, {}, hid);  // [gate | up]
  } else {
    be.linear(h, w.mlp_gate, {}, hid.cols(0, n));
    be.linear(h, w.mlp_up, {}, hid.cols(n, n));
  }
  TensorView act = host(act_v, T, n);
  be.silu_mul(hid.cols(0, n), hid.cols(n, n), act);
  be.linear(act, w.mlp_down, w.mlp_down_bias, out);
}

// out = a rank's share of a mixture of experts (moe_layer.cpp's recipe): every rank routes every token over all
// experts (the router is replicated), runs the chosen experts it holds (the others' weights set to zero), and adds
// its share of the shared expert (Nemotron-H's, or Granite's shared_mlp).
void rank_moe(Backend& be, const ModelConfig& rc, const TpRankPlan& p, const LayerWeights& lw, int64_t T,
              const TensorView& h, TensorView out) {
  const MoeConfig& mc = rc.moe;
  const MoeWeights& w = *lw.moe;
  const int64_t E = mc.n_experts, k = mc.top_k;
  std::vector<float> logits(static_cast<size_t>(T * E)), weights(static_cast<size_t>(T * k));
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  MoeRouteArgs r;
  r.logits = host(logits, T, E);
  be.linear(h, w.router, {}, r.logits);
  r.bias = w.score_bias;
  r.scoring = mc.routing == MoeRouting::SigmoidGrouped ? MoeScoring::SigmoidGrouped
              : mc.routing == MoeRouting::SoftmaxAll   ? MoeScoring::SoftmaxAll
                                                       : MoeScoring::SoftmaxChosen;
  r.top_k = k;
  r.n_group = mc.n_group;
  r.topk_group = mc.topk_group;
  r.renormalize = mc.norm_topk_prob;
  r.scale = static_cast<float>(mc.routed_scaling);
  r.ids = TensorView(ids.data(), DType::I32, {T, k});
  r.weights = host(weights, T, k);
  be.moe_route(r);
  be.synchronize();
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool mine = ids[i] >= p.experts.begin && ids[i] < p.experts.end();
    ids[i] = mine ? static_cast<int32_t>(ids[i] - p.experts.begin) : 0;
    if (!mine) weights[i] = 0.0f;
  }
  MoeExpertsArgs x;
  x.x = h;
  x.ids = r.ids;
  x.weights = r.weights;
  x.act = mc.act == MlpAct::Relu2 ? MoeExpertAct::Relu2 : MoeExpertAct::SiluGated;
  x.expert_size = mc.expert_size;
  x.up = w.up;
  x.gate = w.gate;
  x.down = w.down;
  x.out = out;
  be.moe_experts(x);
  std::vector<float> shared_v(static_cast<size_t>(T * rc.d_model));
  TensorView shared = host(shared_v, T, rc.d_model);
  if (!w.shared_up.empty()) {
    std::vector<float> hid_v(static_cast<size_t>(T * mc.shared_size));
    TensorView hid = host(hid_v, T, mc.shared_size);
    be.linear(h, w.shared_up, w.shared_up_bias, hid);
    be.relu2(hid);
    be.linear(hid, w.shared_down, w.shared_down_bias, shared);
    be.add_inplace(out, shared);
  } else if (rc.family == Family::GraniteHybrid) {
    rank_mlp(be, rc, lw, T, h, shared);
    be.add_inplace(out, shared);
  }
}

// out = a rank's partial of Falcon-H1's Mamba branch on x (already times ssm_in_multiplier): falcon_h1_layer.cpp's
// recipe on the rank's heads, with its slices of in_proj's output scaled by ssm_multipliers and a gated norm whose
// groups lie within the rank.
void rank_falcon_mamba(Backend& be, const ModelConfig& c, const LayerWeights& w, const BatchLayout& batch,
                       const TensorView& x, TensorView out) {
  const int64_t T = batch.total_tokens, di = c.d_inner, gn = c.n_groups * c.d_state;
  Workspace ws;
  ws.reserve(be, c, T, 1);
  FreshMambaState state(be, c);
  TensorView zxbcdt = Workspace::f32(ws.proj, be.device(), T, c.in_proj_size());
  be.linear(x, w.in_proj, w.in_proj_bias, zxbcdt);
  if (!c.ssm_multipliers.empty()) {
    const int64_t widths[5] = {di, di, gn, gn, c.n_heads};
    int64_t begin = 0;
    for (int i = 0; i < 5; ++i) {
      be.scale(zxbcdt.cols(begin, widths[i]), static_cast<float>(c.ssm_multipliers[static_cast<size_t>(i)]));
      begin += widths[i];
    }
  }
  TensorView y = Workspace::f32(ws.y, be.device(), T, di);
  mamba2_core(be, c, w, state.cache, batch, ws, zxbcdt, y);
  const TensorView z = zxbcdt.cols(0, di);
  TensorView gated = Workspace::f32(ws.y_normed, be.device(), T, di);
  const float eps = static_cast<float>(c.norm_eps);
  const int64_t group = di / c.norm_groups();
  if (!c.mamba_rms_norm) {
    be.silu_mul(z, y, gated);
  } else if (!c.mamba_norm_before_gate) {
    be.gated_rmsnorm(y, z, w.gated_norm, group, eps, gated);
  } else {
    for (int64_t g = 0; g < c.norm_groups(); ++g)
      be.rmsnorm(y.cols(g * group, group), w.gated_norm.rows(g * group, group), eps, gated.cols(g * group, group));
    be.silu_mul(z, gated, gated);
  }
  be.linear(gated, w.out_proj, w.out_proj_bias, out);
  be.synchronize();
}

// out = a rank's partial of Falcon-H1's MLP, down(up(x) * silu(gate(x) * mlp_gate_multiplier)), before
// mlp_down_multiplier (applied to the sum).
void rank_falcon_mlp(Backend& be, const ModelConfig& c, const LayerWeights& w, int64_t T, const TensorView& x,
                     TensorView out) {
  const int64_t n = c.mlp_size;
  std::vector<float> gate_v(static_cast<size_t>(T * n)), up_v(static_cast<size_t>(T * n)),
      act_v(static_cast<size_t>(T * n));
  TensorView gate = host(gate_v, T, n), up = host(up_v, T, n), act = host(act_v, T, n);
  be.linear(x, w.mlp_gate, w.mlp_gate_bias, gate);
  if (c.mlp_gate_multiplier != 1.0) be.scale(gate, static_cast<float>(c.mlp_gate_multiplier));
  be.linear(x, w.mlp_up, w.mlp_up_bias, up);
  be.silu_mul(gate, up, act);
  be.linear(act, w.mlp_down, w.mlp_down_bias, out);
}

}  // namespace

void SimulatedTensorParallel::falcon_h1_layer(int64_t layer, std::vector<float>& residual) const {
  const ModelConfig& c = model_.config();
  Backend& be = model_.backend();
  const LayerWeights& full = model_.weights().layers[static_cast<size_t>(layer)];
  const int64_t T = static_cast<int64_t>(residual.size()) / c.d_model, d = c.d_model;
  const float eps = static_cast<float>(c.norm_eps);
  BatchLayout batch;
  batch.seqs = {{0, T, 0}};
  batch.total_tokens = T;
  be.prepare_batch(batch);
  std::vector<float> ssm_in(residual.size()), attn_in(residual.size());
  be.rmsnorm(host(residual, T, d), full.norm, eps, host(ssm_in, T, d));
  attn_in = ssm_in;
  for (float& v : ssm_in) v *= static_cast<float>(c.ssm_in_multiplier);  // as Backend::scale
  for (float& v : attn_in) v *= static_cast<float>(c.attn_in_multiplier);
  // Each branch: the ranks' partials, the all-reduce, the branch's output multiplier, the residual add.
  auto add = [&](const std::vector<std::vector<float>>& partials, double multiplier) {
    const std::vector<float> sum = sum_of(partials);
    for (size_t i = 0; i < residual.size(); ++i) residual[i] += sum[i] * static_cast<float>(multiplier);
  };
  std::vector<std::vector<float>> partials(static_cast<size_t>(plan_.n_ranks), std::vector<float>(residual.size()));
  for (size_t r = 0; r < partials.size(); ++r)
    rank_falcon_mamba(be, rank_config_, shards_[r][static_cast<size_t>(layer)].w, batch, host(ssm_in, T, d),
                      host(partials[r], T, d));
  add(partials, c.ssm_out_multiplier);
  for (size_t r = 0; r < partials.size(); ++r)
    rank_attention(be, rank_config_, shards_[r][static_cast<size_t>(layer)].w, batch, host(attn_in, T, d),
                   host(partials[r], T, d));
  add(partials, c.attn_out_multiplier);
  std::vector<float> normed(residual.size());
  be.rmsnorm(host(residual, T, d), full.mlp_norm, eps, host(normed, T, d));
  for (size_t r = 0; r < partials.size(); ++r)
    rank_falcon_mlp(be, rank_config_, shards_[r][static_cast<size_t>(layer)].w, T, host(normed, T, d),
                    host(partials[r], T, d));
  add(partials, c.mlp_down_multiplier);
}

SimulatedTensorParallel::SimulatedTensorParallel(const Model& model, int64_t n_ranks)
    : model_(model), plan_(plan_tensor_parallel(model.config(), n_ranks)) {
  const ModelConfig& c = model.config();
  if (model.device() != Device::CPU) fail("simulated tensor parallelism: expected a model on the CPU");
  if (c.family == Family::FalconH1 && plan_.norm_all_reduce)
    fail("simulated tensor parallelism: Falcon-H1 with one gated norm group over the ranks is not simulated");
  rank_config_ = plan_.rank_config(c);
  const ModelWeights& w = model.weights();
  for (int64_t r = 0; r < n_ranks; ++r) {
    std::vector<LayerShard>& layers = shards_.emplace_back();
    for (int64_t l = 0; l < c.n_layer; ++l)
      layers.push_back(shard_layer(c, plan_, r, l, w.layers[static_cast<size_t>(l)]));
    embeddings_.push_back(shard_vocab(c, plan_, r, w.embeddings, "embeddings"));
    lm_heads_.push_back(shard_vocab(c, plan_, r, w.lm_head, "lm_head"));
  }
}

std::vector<float> SimulatedTensorParallel::rank_sublayer(int64_t rank, int64_t layer, LayerKind kind,
                                                          const std::vector<float>& normed) const {
  Backend& be = model_.backend();
  const ModelConfig& rc = rank_config_;
  const LayerWeights& w = shards_[static_cast<size_t>(rank)][static_cast<size_t>(layer)].w;
  const int64_t T = static_cast<int64_t>(normed.size()) / rc.d_model;
  BatchLayout batch;
  batch.seqs = {{0, T, 0}};
  batch.total_tokens = T;
  be.prepare_batch(batch);
  std::vector<float> in = normed, out(normed.size(), 0.0f);
  const TensorView h = host(in, T, rc.d_model);
  TensorView y = host(out, T, rc.d_model);
  if (kind == LayerKind::Mamba2) {
    Workspace ws;  // the rank's activations, sized by its config
    ws.reserve(be, rc, T, 1);
    FreshMambaState state(be, rc);
    mamba2_mixer(be, rc, w, state.cache, batch, ws, h, y);
  } else if (kind == LayerKind::Attention) {
    rank_attention(be, rc, w, batch, h, y);
  } else if (kind == LayerKind::MoE) {
    rank_moe(be, rc, plan_.ranks[static_cast<size_t>(rank)], w, T, h, y);
  } else {
    rank_mlp(be, rc, w, T, h, y);
  }
  be.synchronize();
  return out;
}

std::vector<std::vector<float>> SimulatedTensorParallel::mamba2_whole_norm_partials(
    int64_t layer, const std::vector<float>& normed) const {
  Backend& be = model_.backend();
  const ModelConfig& rc = rank_config_;
  const int64_t T = static_cast<int64_t>(normed.size()) / rc.d_model, di = rc.d_inner;
  const auto n = static_cast<size_t>(plan_.n_ranks);
  BatchLayout batch;
  batch.seqs = {{0, T, 0}};
  batch.total_tokens = T;
  be.prepare_batch(batch);
  std::vector<float> in = normed;
  const TensorView h = host(in, T, rc.d_model);
  // Each rank: g = y * silu(z) of its channels, and the per-row sums of squares.
  std::vector<std::vector<float>> gated(n), squares(n);
  for (size_t r = 0; r < n; ++r) {
    const LayerWeights& w = shards_[r][static_cast<size_t>(layer)].w;
    Workspace ws;
    ws.reserve(be, rc, T, 1);
    FreshMambaState state(be, rc);
    const TensorView zxbcdt = Workspace::f32(ws.proj, be.device(), T, rc.in_proj_size());
    be.linear(h, w.in_proj, w.in_proj_bias, zxbcdt);
    const TensorView y = Workspace::f32(ws.y, be.device(), T, di);
    mamba2_core(be, rc, w, state.cache, batch, ws, zxbcdt, y);
    be.synchronize();
    gated[r].resize(static_cast<size_t>(T * di));
    squares[r].assign(static_cast<size_t>(T), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < di; ++i) {
        const float z = zxbcdt.ptr<float>()[t * rc.in_proj_size() + i];
        const float g = y.ptr<float>()[t * di + i] * (z / (1.0f + std::exp(-z)));
        gated[r][static_cast<size_t>(t * di + i)] = g;
        ss += static_cast<double>(g) * g;
      }
      squares[r][static_cast<size_t>(t)] = static_cast<float>(ss);
    }
  }
  const std::vector<float> ss = sum_of(squares);  // the all-reduce of T floats
  const double d_inner = static_cast<double>(model_.config().d_inner);
  std::vector<std::vector<float>> partials;
  for (size_t r = 0; r < n; ++r) {
    const LayerWeights& w = shards_[r][static_cast<size_t>(layer)].w;
    std::vector<float> norm_w(static_cast<size_t>(di));
    be.to_f32(w.gated_norm, TensorView(norm_w.data(), DType::F32, {di}));
    std::vector<float>& g = gated[r];
    for (int64_t t = 0; t < T; ++t) {
      const auto inv_rms = static_cast<float>(1.0 / std::sqrt(ss[static_cast<size_t>(t)] / d_inner + rc.norm_eps));
      for (int64_t i = 0; i < di; ++i) g[static_cast<size_t>(t * di + i)] *= inv_rms * norm_w[static_cast<size_t>(i)];
    }
    std::vector<float>& out = partials.emplace_back(normed.size());
    be.linear(host(g, T, di), w.out_proj, w.out_proj_bias, host(out, T, rc.d_model));
  }
  return partials;
}

std::vector<std::vector<float>> SimulatedTensorParallel::mamba1_partials(int64_t layer,
                                                                         const std::vector<float>& normed) const {
  Backend& be = model_.backend();
  const ModelConfig& rc = rank_config_;
  const int64_t T = static_cast<int64_t>(normed.size()) / rc.d_model, di = rc.d_inner, n = rc.d_state, r = rc.dt_rank;
  const auto ranks = static_cast<size_t>(plan_.n_ranks);
  BatchLayout batch;
  batch.seqs = {{0, T, 0}};
  batch.total_tokens = T;
  be.prepare_batch(batch);
  std::vector<float> in = normed;
  const TensorView h = host(in, T, rc.d_model);
  // Each rank: in_proj's x and z of its channels, conv1d + SiLU, and x_proj's partial [dt_low | B | C].
  struct Rank {
    Workspace ws;
    DeviceBuffer conv, ssm;
    std::vector<float> dbc;
  };
  std::vector<Rank> rk(ranks);
  for (size_t i = 0; i < ranks; ++i) {
    const LayerWeights& w = shards_[i][static_cast<size_t>(layer)].w;
    Rank& k = rk[i];
    k.ws.reserve(be, rc, T, 1);
    k.conv = DeviceBuffer(be, static_cast<size_t>(rc.conv_state_size()) * 4);
    k.ssm = DeviceBuffer(be, static_cast<size_t>(rc.ssm_state_size()) * 4);
    be.fill_zero(k.conv.data(), k.conv.size());
    be.fill_zero(k.ssm.data(), k.ssm.size());
    const TensorView xz = Workspace::f32(k.ws.proj, be.device(), T, 2 * di);
    be.linear(h, w.in_proj, w.in_proj_bias, xz);
    const TensorView xc = Workspace::f32(k.ws.conv, be.device(), T, di);
    be.conv1d_silu(xz.cols(0, di), w.conv, w.conv_bias, TensorView(k.conv.data(), DType::F32, {1, di, rc.d_conv - 1}),
                   batch, xc);
    k.dbc.resize(static_cast<size_t>(T * (r + 2 * n)));
    be.linear(xc, w.x_proj, {}, host(k.dbc, T, r + 2 * n));
  }
  std::vector<std::vector<float>> parts;
  for (Rank& k : rk) parts.push_back(k.dbc);
  const std::vector<float> dbc_sum = sum_of(parts);  // the all-reduce of x_proj's [T, dt_rank + 2 d_state]
  std::vector<std::vector<float>> partials;
  for (size_t i = 0; i < ranks; ++i) {
    const LayerWeights& w = shards_[i][static_cast<size_t>(layer)].w;
    Rank& k = rk[i];
    std::vector<float> dbc_v = dbc_sum;
    TensorView dbc = host(dbc_v, T, r + 2 * n);
    if (rc.mixer_rms_eps > 0) {  // FalconMamba's and Jamba's norms of dt, B and C: on the whole, reduced values
      const float eps = static_cast<float>(rc.mixer_rms_eps);
      const TensorView* own[] = {&w.dt_norm, &w.b_norm, &w.c_norm};
      int j = 0;
      for (const auto& [begin, width] : {std::pair<int64_t, int64_t>{0, r}, {r, n}, {r + n, n}}) {
        TensorView part = dbc.cols(begin, width);
        const TensorView& mine = *own[j++];
        be.rmsnorm(part, mine.empty() ? w.mixer_norm.rows(0, width) : mine, eps, part);
      }
    }
    const TensorView dt = Workspace::f32(k.ws.dt, be.device(), T, di);
    be.linear(dbc.cols(0, r), w.dt_proj, {}, dt);
    const TensorView xz = Workspace::f32(k.ws.proj, be.device(), T, 2 * di);
    const TensorView y = Workspace::f32(k.ws.y, be.device(), T, di);
    Mamba1ScanArgs a;
    a.x = Workspace::f32(k.ws.conv, be.device(), T, di);
    a.dt = dt;
    a.A_log = w.A_log;
    a.B = dbc.cols(r, n);
    a.C = dbc.cols(r + n, n);
    a.D = w.D;
    a.dt_bias = w.dt_bias;
    a.z = xz.cols(di, di);
    a.state = TensorView(k.ssm.data(), DType::F32, {1, di, n});
    a.y = y;
    be.mamba1_scan(a, batch);
    std::vector<float>& out = partials.emplace_back(normed.size());
    be.linear(y, w.out_proj, w.out_proj_bias, host(out, T, rc.d_model));
  }
  be.synchronize();
  return partials;
}

std::vector<std::vector<float>> SimulatedTensorParallel::sublayer_partials(int64_t layer, bool mlp_sublayer,
                                                                           const std::vector<float>& normed) const {
  const ModelConfig& c = model_.config();
  if (layer < 0 || layer >= c.n_layer) fail("simulated tensor parallelism: layer ", layer, " out of range");
  if (mlp_sublayer && !c.mlp_after_mixer) fail("simulated tensor parallelism: the model has no MLP sublayers");
  if (normed.empty() || normed.size() % static_cast<size_t>(c.d_model) != 0)
    fail("simulated tensor parallelism: expected [T, ", c.d_model, "] rows, found ", normed.size(), " values");
  if (c.layer_kind(layer) == LayerKind::ParallelHybrid)
    fail("simulated tensor parallelism: layer ", layer, " is Falcon-H1's parallel layer; only logits() runs it");
  const bool experts = model_.weights().layers[static_cast<size_t>(layer)].moe != nullptr;
  // The MLP sublayer of a layer with experts (Granite-4.0-H MoE) is a mixture of experts.
  const LayerKind kind = mlp_sublayer ? (experts ? LayerKind::MoE : LayerKind::MLP) : c.layer_kind(layer);
  if (kind == LayerKind::Mamba2 && plan_.norm_all_reduce) return mamba2_whole_norm_partials(layer, normed);
  if (kind == LayerKind::Mamba1) return mamba1_partials(layer, normed);
  std::vector<std::vector<float>> partials;
  for (int64_t r = 0; r < plan_.n_ranks; ++r) partials.push_back(rank_sublayer(r, layer, kind, normed));
  return partials;
}

std::vector<float> SimulatedTensorParallel::logits(std::span<const int32_t> ids) const {
  const ModelConfig& c = model_.config();
  const ModelWeights& full = model_.weights();
  Backend& be = model_.backend();
  const int64_t T = static_cast<int64_t>(ids.size()), d = c.d_model;
  if (T < 1) fail("simulated tensor parallelism: expected at least one token");
  for (int32_t id : ids)
    if (id < 0 || id >= c.vocab_size) fail("simulated tensor parallelism: token ", id, " out of range");

  // Vocab-parallel embedding: each rank embeds the tokens of its rows, zeros for the others; the all-reduce sums.
  std::vector<std::vector<float>> partials;
  for (int64_t r = 0; r < plan_.n_ranks; ++r) {
    const TpRange v = plan_.ranks[static_cast<size_t>(r)].vocab;
    std::vector<int32_t> local(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) local[t] = ids[t] >= v.begin && ids[t] < v.end() ? ids[t] - v.begin : 0;
    std::vector<float>& rows = partials.emplace_back(static_cast<size_t>(T * d));
    be.embed(embeddings_[static_cast<size_t>(r)].w, TensorView(local.data(), DType::I32, {T}), host(rows, T, d));
    for (size_t t = 0; t < ids.size(); ++t)
      if (ids[t] < v.begin || ids[t] >= v.end()) std::fill_n(rows.begin() + static_cast<int64_t>(t) * d, d, 0.0f);
  }
  std::vector<float> residual = sum_of(partials);
  for (float& x : residual) x *= static_cast<float>(c.embedding_multiplier);  // as Backend::scale

  std::vector<float> normed(residual.size());
  auto sublayer = [&](int64_t l, const TensorView& norm, bool mlp_sublayer) {
    be.rmsnorm(host(residual, T, d), norm, static_cast<float>(c.norm_eps), host(normed, T, d));
    std::vector<float> sum = sum_of(sublayer_partials(l, mlp_sublayer, normed));
    for (size_t i = 0; i < residual.size(); ++i) residual[i] += sum[i] * static_cast<float>(c.residual_multiplier);
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& w = full.layers[static_cast<size_t>(l)];
    if (c.layer_kind(l) == LayerKind::ParallelHybrid) {
      falcon_h1_layer(l, residual);
      continue;
    }
    sublayer(l, w.norm, false);
    if (c.mlp_after_mixer) sublayer(l, w.mlp_norm, true);
  }

  // Vocab-parallel lm_head: each rank's logits of its rows; the gather concatenates them and drops the padding.
  be.rmsnorm(host(residual, T, d), full.norm_f, static_cast<float>(c.norm_eps), host(normed, T, d));
  std::vector<float> out(static_cast<size_t>(T * c.vocab_size));
  for (int64_t r = 0; r < plan_.n_ranks; ++r) {
    const TpRange v = plan_.ranks[static_cast<size_t>(r)].vocab;
    std::vector<float> part(static_cast<size_t>(T * v.count));
    be.linear(host(normed, T, d), lm_heads_[static_cast<size_t>(r)].w, {}, host(part, T, v.count));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = v.begin; j < std::min(v.end(), c.vocab_size); ++j)
        out[static_cast<size_t>(t * c.vocab_size + j)] =
            part[static_cast<size_t>(t * v.count + j - v.begin)] * static_cast<float>(1.0 / c.logits_scaling);
  }
  return out;
}

}  // namespace mambacpp
