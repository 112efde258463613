#include "model/moe_layer.h"

#include "mambacpp/error.h"
#include "model/weights.h"
#include "model/workspace.h"

namespace mambacpp {
namespace {

// Expert e of a fused [E, out, in] weight, as the 2-D [out, in] weight the linear ops take.
Weight expert_of(const Weight& fused, int64_t e) {
  Weight w = fused.rows(e, 1);
  w.ndim = 2;
  w.shape = {fused.dim(1), fused.dim(2), 0, 0};
  if (w.dense()) w.data = w.data.reshaped({fused.dim(1), fused.dim(2)});
  return w;
}

void split(const Weight& fused, int64_t E, std::vector<Weight>& out) {
  if (fused.empty()) return;  // recording shapes
  for (int64_t e = 0; e < E; ++e) out.push_back(expert_of(fused, e));
}

}  // namespace

std::shared_ptr<const MoeWeights> bind_moe(const MoeBinder& b, const ModelConfig& c, const std::string& p) {
  auto w = std::make_shared<MoeWeights>();
  const MoeConfig& m = c.moe;
  const int64_t E = m.n_experts, I = m.expert_size, D = c.d_model;
  if (c.family == Family::NemotronH) {
    w->router = b.matrix(p + "gate.weight", {E, D});  // the router reads the full hidden state, latent or not
    w->score_bias = b.tensor(p + "gate.e_score_correction_bias", {E});
    // The routed experts' width: the latent one when moe_latent_size is set, else d_model.
    const int64_t L = m.latent_size > 0 ? m.latent_size : D;
    if (m.latent_size > 0) {
      w->latent_in = b.matrix(p + "fc1_latent_proj.weight", {L, D});
      w->latent_out = b.matrix(p + "fc2_latent_proj.weight", {D, L});
      if (c.mlp_bias) {
        w->latent_in_bias = b.tensor(p + "fc1_latent_proj.bias", {L});
        w->latent_out_bias = b.tensor(p + "fc2_latent_proj.bias", {D});
      }
    }
    if (b.has(p + "experts.0.up_proj.weight")) {  // per-expert tensors (the released checkpoints)
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "experts." + std::to_string(e) + ".";
        w->up.push_back(b.matrix(x + "up_proj.weight", {I, L}));
        w->down.push_back(b.matrix(x + "down_proj.weight", {L, I}));
      }
    } else {  // transformers 5's fused NemotronHExperts
      split(b.matrix(p + "experts.up_proj", {E, I, L}), E, w->up);
      split(b.matrix(p + "experts.down_proj", {E, L, I}), E, w->down);
    }
    const int64_t S = m.shared_size;
    if (S > 0) {
      w->shared_up = b.matrix(p + "shared_experts.up_proj.weight", {S, D});
      w->shared_down = b.matrix(p + "shared_experts.down_proj.weight", {D, S});
      if (c.mlp_bias) {
        w->shared_up_bias = b.tensor(p + "shared_experts.up_proj.bias", {S});
        w->shared_down_bias = b.tensor(p + "shared_experts.down_proj.bias", {D});
      }
    }
    return w;
  }
  if (c.family == Family::GraniteHybrid) {
    // The released checkpoints' names, or transformers 5's (router.weight, experts.gate_up_proj / down_proj).
    const bool v5 = b.has(p + "experts.gate_up_proj");
    w->router = b.matrix(p + (b.has(p + "router.weight") ? "router.weight" : "router.layer.weight"), {E, D});
    split(b.matrix(p + (v5 ? "experts.gate_up_proj" : "input_linear.weight"), {E, 2 * I, D}), E, w->up);  // gate, up
    split(b.matrix(p + (v5 ? "experts.down_proj" : "output_linear.weight"), {E, D, I}), E, w->down);
    return w;
  }
  if (c.family == Family::Jamba) {
    w->router = b.matrix(p + "router.weight", {E, D});
    if (b.has(p + "experts.0.up_proj.weight")) {  // per-expert tensors (the released checkpoints)
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "experts." + std::to_string(e) + ".";
        w->gate.push_back(b.matrix(x + "gate_proj.weight", {I, D}));
        w->up.push_back(b.matrix(x + "up_proj.weight", {I, D}));
        w->down.push_back(b.matrix(x + "down_proj.weight", {D, I}));
      }
    } else {  // transformers 5's fused experts: gate rows then up rows
      split(b.matrix(p + "experts.gate_up_proj", {E, 2 * I, D}), E, w->up);
      split(b.matrix(p + "experts.down_proj", {E, D, I}), E, w->down);
    }
    return w;
  }
  fail("bind_moe: ", family_name(c.family), " models have no mixture-of-experts layers here");
}

int64_t moe_expert_bytes(const MoeWeights& w) {
  int64_t sum = 0;
  for (const auto* v : {&w.up, &w.gate, &w.down})
    for (const Weight& e : *v) sum += static_cast<int64_t>(e.nbytes());
  return sum;
}

int64_t moe_weight_bytes(const MoeWeights& w) {
  int64_t sum = moe_expert_bytes(w);
  for (const Weight* t : {&w.router, &w.shared_up, &w.shared_down, &w.latent_in, &w.latent_out})
    if (!t->empty()) sum += static_cast<int64_t>(t->nbytes());
  for (const TensorView* t : {&w.latent_in_bias, &w.latent_out_bias})
    if (!t->empty()) sum += static_cast<int64_t>(t->nbytes());
  return sum;
}

void moe_sublayer(const Model::Impl& m, const LayerWeights& lw, const TensorView& norm, const PieceContext& ctx,
                  TensorView residual) {
  const ModelConfig& c = m.config;
  const MoeConfig& mc = c.moe;
  Backend& be = *m.backend;
  const Device dev = be.device();
  Workspace& ws = m.workspace;
  const int64_t T = ctx.batch.total_tokens, D = c.d_model, E = mc.n_experts, k = mc.top_k;
  MAMBACPP_ASSERT(lw.moe != nullptr);
  const MoeWeights& w = *lw.moe;

  TensorView normed = Workspace::f32(ws.normed, dev, T, D);
  TensorView out = Workspace::f32(ws.mixer_out, dev, T, D);
  be.rmsnorm(residual, norm, static_cast<float>(c.norm_eps), normed);

  MoeRouteArgs r;
  r.logits = Workspace::f32(ws.moe_logits, dev, T, E);
  be.linear(normed, w.router, {}, r.logits);
  r.bias = w.score_bias;
  r.scoring = mc.routing == MoeRouting::SigmoidGrouped ? MoeScoring::SigmoidGrouped
              : mc.routing == MoeRouting::SoftmaxAll   ? MoeScoring::SoftmaxAll
                                                       : MoeScoring::SoftmaxChosen;
  r.top_k = k;
  r.n_group = mc.n_group;
  r.topk_group = mc.topk_group;
  r.renormalize = mc.norm_topk_prob;
  r.scale = static_cast<float>(mc.routed_scaling);
  r.ids = Workspace::of(ws.moe_ids, DType::I32, dev, T, k);
  r.weights = Workspace::f32(ws.moe_weights, dev, T, k);
  be.moe_route(r);

  // Latent MoE (transformers' NemotronHMoE): the routed experts see fc1_latent_proj(normed) and their weighted sum
  // goes through fc2_latent_proj; routing above and the shared expert below read the full-width normed rows.
  const bool latent = !w.latent_in.empty();
  TensorView routed_in = normed, routed_out = out;
  if (latent) {
    const int64_t L = mc.latent_size;
    routed_in = Workspace::f32(ws.moe_latent_in, dev, T, L);
    routed_out = Workspace::f32(ws.moe_latent_out, dev, T, L);
    be.linear(normed, w.latent_in, w.latent_in_bias, routed_in);
  }

  MoeExpertsArgs x;
  x.x = routed_in;
  x.ids = r.ids;
  x.weights = r.weights;
  x.act = mc.act == MlpAct::Relu2 ? MoeExpertAct::Relu2 : MoeExpertAct::SiluGated;
  x.expert_size = mc.expert_size;
  x.up = w.up;
  x.gate = w.gate;
  x.down = w.down;
  x.out = routed_out;
  be.moe_experts(x);
  if (latent) be.linear(routed_out, w.latent_out, w.latent_out_bias, out);

  // The shared expert, added to the routed experts' sum (as transformers does, before the residual multiplier).
  TensorView shared = Workspace::f32(ws.moe_shared, dev, T, D);
  if (!w.shared_up.empty()) {
    const int64_t S = mc.shared_size;
    TensorView hid = Workspace::f32(ws.moe_hidden, dev, T, S);
    be.linear(normed, w.shared_up, w.shared_up_bias, hid);
    be.relu2(hid);
    be.linear(hid, w.shared_down, w.shared_down_bias, shared);
    be.add_inplace(out, shared);
  } else if (c.family == Family::GraniteHybrid) {  // its shared_mlp: input_linear [gate | up], output_linear
    const int64_t n = c.mlp_size;
    TensorView hid = Workspace::f32(ws.moe_hidden, dev, T, 2 * n);
    TensorView act = Workspace::f32(ws.mlp_act, dev, T, n);
    be.linear(normed, lw.mlp_up, {}, hid);
    be.silu_mul(hid.cols(0, n), hid.cols(n, n), act);
    be.linear(act, lw.mlp_down, {}, shared);
    be.add_inplace(out, shared);
  }
  if (c.residual_multiplier != 1.0) be.scale(out, static_cast<float>(c.residual_multiplier));
  be.add_inplace(residual, out);
}

}  // namespace mambacpp
