#!/usr/bin/env python3
"""Golden fixtures for the mixture-of-experts hybrids (Nemotron-H with MoE layers, Granite-4.0-H MoE, Jamba): tiny
random checkpoints saved with save_pretrained, reloaded and evaluated by transformers on the CPU in float64.

The helpers (full-pass logits, greedy by repeated full passes, parameter sensitivity, dt initialisation) are those of
scripts/make_hybrid_fixtures.py, imported from it. What is added here:
- an initialisation for the 3-D expert tensors ([E, out, in]) and the router buffers (Nemotron-H's
  e_score_correction_bias, a buffer rather than a parameter);
- a Nemotron-H with latent MoE (moe_latent_size: the routed experts between fc1_latent_proj and fc2_latent_proj);
- routing cases that a careless implementation gets wrong: group-limited routing (n_group 2, topk_group 1), an expert
  that no token may choose (its correction bias is -10), top-k equal to the number of experts, duplicated router rows
  (exact score ties: the expert of the lower index must win, as torch.topk does on the CPU), norm_topk_prob off;
- a copy of some checkpoints with the experts stored the other way (per-expert 2-D tensors <-> fused 3-D tensors),
  the same logits expected from both;
- per MoE layer routing statistics in manifest.json: tokens per expert over tokens.txt, score ties that straddle the
  top-k boundary, and whether torch chose the lower index at every such tie.

The routers compute in f32 even in a float64 model (transformers casts: Nemotron-H's router is F.linear in f32,
Granite's logits are .float()), so the reference routes exactly as an f32 engine does up to the f32 rounding of the
logits themselves.

Run on a machine with torch + transformers:  python3 scripts/make_moe_fixtures.py --out fixtures/moe
(--only NAME... remakes only those models and merges them into the existing manifest.json).
"""

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

import make_hybrid_fixtures as hy  # noqa: E402  (the hybrid fixtures' helpers)

SPECS = [
    # Nemotron-H MoE: Mamba-2, MoE, attention and MLP layers; 8 experts in 2 groups, top-3 within the one chosen
    # group, sigmoid scores with correction bias, renormalised, scaled 2.5; relu2 experts and a shared expert with
    # biases (mlp_bias); expert 5 can never be chosen (bias -10).
    dict(name="nemotron_h_moe_f32", family="nemotron_h", split_copy=True,
         cfg=dict(vocab_size=131, hidden_size=48, hybrid_override_pattern="ME*EM-E", num_attention_heads=4,
                  num_key_value_heads=2, head_dim=20, attention_bias=False, intermediate_size=72,
                  mlp_hidden_act="relu2", mlp_bias=True, ssm_state_size=10, mamba_num_heads=8, mamba_head_dim=12,
                  n_groups=2, conv_kernel=4, expand=2, chunk_size=8, use_conv_bias=True, use_bias=False,
                  layer_norm_epsilon=1e-5, residual_in_fp32=False, tie_word_embeddings=False,
                  use_mamba_kernels=False, time_step_limit=(0.0, float("inf")), pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, max_position_embeddings=4096,
                  n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
                  moe_shared_expert_intermediate_size=40, n_shared_experts=1, n_group=2, topk_group=1,
                  norm_topk_prob=True, routed_scaling_factor=2.5, num_nextn_predict_layers=0),
         dead_expert=5),
    # Nemotron-H MoE with top-k = all 4 experts, one group, no renormalisation, scaling 1.
    dict(name="nemotron_h_moe_all_f32", family="nemotron_h",
         cfg=dict(vocab_size=89, hidden_size=32, hybrid_override_pattern="ME*E", num_attention_heads=4,
                  num_key_value_heads=4, head_dim=8, attention_bias=False, intermediate_size=40,
                  mlp_hidden_act="relu2", mlp_bias=False, ssm_state_size=8, mamba_num_heads=8, mamba_head_dim=8,
                  n_groups=2, conv_kernel=4, expand=2, chunk_size=16, use_conv_bias=True, use_bias=True,
                  layer_norm_epsilon=1e-5, residual_in_fp32=False, tie_word_embeddings=True,
                  use_mamba_kernels=False, time_step_limit=(0.0, float("inf")), pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, max_position_embeddings=4096,
                  n_routed_experts=4, num_experts_per_tok=4, moe_intermediate_size=16,
                  moe_shared_expert_intermediate_size=24, n_shared_experts=1, n_group=1, topk_group=1,
                  norm_topk_prob=False, routed_scaling_factor=1.0, num_nextn_predict_layers=0)),
    # Nemotron-H latent MoE (moe_latent_size, as in Nemotron 3 Super): the routed experts run in width 16 between
    # fc1_latent_proj [16, 48] and fc2_latent_proj [48, 16] (with biases: mlp_bias), the router and the shared expert
    # on the full 48; 6 experts in 2 groups of 3, top-2 within the one chosen group; expert 1 never chosen.
    dict(name="nemotron_h_moe_latent_f32", family="nemotron_h", split_copy=True,
         cfg=dict(vocab_size=113, hidden_size=48, hybrid_override_pattern="MEM*E-E", num_attention_heads=4,
                  num_key_value_heads=2, head_dim=12, attention_bias=False, intermediate_size=56,
                  mlp_hidden_act="relu2", mlp_bias=True, ssm_state_size=8, mamba_num_heads=8, mamba_head_dim=12,
                  n_groups=2, conv_kernel=4, expand=2, chunk_size=8, use_conv_bias=True, use_bias=False,
                  layer_norm_epsilon=1e-5, residual_in_fp32=False, tie_word_embeddings=False,
                  use_mamba_kernels=False, time_step_limit=(0.0, float("inf")), pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, max_position_embeddings=4096,
                  n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=20,
                  moe_shared_expert_intermediate_size=32, n_shared_experts=1, n_group=2, topk_group=1,
                  norm_topk_prob=True, routed_scaling_factor=2.0, moe_latent_size=16, num_nextn_predict_layers=0),
         dead_expert=1, latent=True),
    # Granite-4.0-H MoE: 6 SwiGLU experts top-2 (softmax over the two chosen logits) beside the shared_mlp, the
    # multipliers far from 1; in every MoE layer router row 4 is a copy of row 1 (exact ties).
    dict(name="granite_moe_f32", family="granitemoehybrid", tie_rows=(1, 4),
         cfg=dict(vocab_size=97, hidden_size=40, num_hidden_layers=5,
                  layer_types=["mamba", "attention", "mamba", "mamba", "attention"], num_attention_heads=4,
                  num_key_value_heads=1, attention_bias=True, attention_multiplier=0.3, embedding_multiplier=3.0,
                  residual_multiplier=0.4, logits_scaling=2.5, num_local_experts=6, num_experts_per_tok=2,
                  intermediate_size=20, shared_intermediate_size=56, position_embedding_type="nope",
                  mamba_n_heads=10, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=12, mamba_d_conv=4,
                  mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=True, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, hidden_act="silu", pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  max_position_embeddings=2048),
         fallback=dict(position_embedding_type=None)),
    # Granite MoE with top-k = all 3 experts (the softmax over all of them).
    dict(name="granite_moe_all_f32", family="granitemoehybrid",
         cfg=dict(vocab_size=71, hidden_size=32, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
                  num_attention_heads=4, num_key_value_heads=2, attention_bias=False, attention_multiplier=0.25,
                  embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=1.5, num_local_experts=3,
                  num_experts_per_tok=3, intermediate_size=16, shared_intermediate_size=24,
                  position_embedding_type="nope", mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1,
                  mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, mamba_conv_bias=True,
                  mamba_proj_bias=False, rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=2048),
         fallback=dict(position_embedding_type=None)),
    # Jamba: Mamba-1 mixers with dt/B/C RMSNorms, attention at layers 1 and 4 (period 3, offset 1), MoE at odd layers
    # (period 2, offset 1: 4 experts top-2, softmax over all, no renormalisation), dense MLP elsewhere; NoPE, GQA.
    dict(name="jamba_f32", family="jamba", split_copy=True,
         cfg=dict(vocab_size=101, hidden_size=32, num_hidden_layers=6, attn_layer_period=3, attn_layer_offset=1,
                  expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2,
                  intermediate_size=40, num_attention_heads=4, num_key_value_heads=2, mamba_d_state=8,
                  mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=5, mamba_conv_bias=True, mamba_proj_bias=False,
                  rms_norm_eps=1e-6, use_mamba_kernels=False, tie_word_embeddings=False, hidden_act="silu",
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096)),
]


def build(spec):
    fam = spec["family"]
    if fam == "nemotron_h":
        from transformers import NemotronHConfig as C, NemotronHForCausalLM as M
    elif fam == "granitemoehybrid":
        from transformers import GraniteMoeHybridConfig as C, GraniteMoeHybridForCausalLM as M
    else:
        from transformers import JambaConfig as C, JambaForCausalLM as M
    config = C(**dict(spec["cfg"]))
    config._attn_implementation = "eager"
    model = M(config)
    eager_experts(model)
    if spec.get("latent"):  # a transformers that ignored moe_latent_size would make a non-latent fixture silently
        names = [n for n, _ in model.named_parameters()]
        assert any(n.endswith("fc1_latent_proj.weight") for n in names) and any(
            n.endswith("fc2_latent_proj.bias") for n in names), "moe_latent_size built no latent projections"
        assert getattr(config, "moe_latent_size", None) == spec["cfg"]["moe_latent_size"]
    return model, M


def eager_experts(model):
    """transformers 5 runs MoE experts through torch._grouped_mm by default, which has no float64: select the eager
    per-expert loop (the reference implementation) and check that every experts module sees it."""
    try:
        model.set_experts_implementation("eager")
    except Exception:  # noqa: BLE001  (versions without the setter, or that refuse it: set the config field)
        model.config._experts_implementation = "eager"
    for name, mod in model.named_modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_experts_implementation"):
            assert cfg._experts_implementation in (None, "eager"), \
                f"{name}: experts implementation {cfg._experts_implementation!r}, expected eager"
    return model


@torch.no_grad()
def init_weights(model, spec, seed):
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * std + mean).float()

    for name, p in model.named_parameters():
        parts = name.split(".")
        leaf, owner = parts[-1], parts[-2]
        if p.dim() == 3:  # fused experts [E, out, in]
            v = normal(p.shape, 1.0 / math.sqrt(p.shape[2]))
        elif p.dim() == 2 and ("embed" in owner):
            v = normal(p.shape, 1.0)
        elif leaf == "A_log":
            v = torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=gen, dtype=torch.float64)).float()
        elif leaf == "D":
            v = (0.5 + torch.rand(p.shape, generator=gen, dtype=torch.float64)).float()
        elif leaf == "dt_bias":
            v = hy.inverse_softplus(hy.log_uniform(gen, p.numel(), 0.05, 0.5)).float().reshape(p.shape)
        elif owner == "dt_proj" and leaf == "bias":  # Jamba's dt bias: softplus(dt) well above any clamp
            v = hy.inverse_softplus(hy.log_uniform(gen, p.numel(), 0.05, 0.5)).float().reshape(p.shape)
        elif owner == "conv1d" and leaf == "weight":
            v = normal(p.shape, 0.5)
        elif leaf == "e_score_correction_bias":  # a parameter in some transformers versions, a buffer in others
            v = normal(p.shape, 0.1)
            if "dead_expert" in spec:
                v[spec["dead_expert"]] = -10.0
        elif leaf == "bias":
            v = normal(p.shape, 0.2)
        elif leaf == "weight" and p.dim() == 1:  # every RMSNorm weight
            v = normal(p.shape, 0.2, mean=1.0)
        elif leaf == "weight" and p.dim() == 2:
            # Routers: logits of order 1-3 so that the choice depends on the token.
            std = 2.0 if owner in ("gate", "router", "layer") else 1.0
            v = normal(p.shape, std / math.sqrt(p.shape[1]))
        else:
            raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
        p.copy_(v)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            v = normal(b.shape, 0.1)
            if "dead_expert" in spec:
                v[spec["dead_expert"]] = -10.0
            b.copy_(v)
    if "tie_rows" in spec:
        a, c = spec["tie_rows"]
        for name, p in model.named_parameters():
            if name.endswith("router.layer.weight") or name.endswith("router.weight"):
                p[c].copy_(p[a])


def stable_top_k(choice, k):
    """Indices of the k largest entries of each row, ties to the lower index; and whether the k-th and (k+1)-th
    values tie (the boundary case)."""
    order = np.argsort(-choice, axis=1, kind="stable")
    top = order[:, :k]
    straddle = np.zeros(choice.shape[0], dtype=bool)
    if k < choice.shape[1]:
        kth = np.take_along_axis(choice, order[:, k - 1:k], 1)[:, 0]
        nxt = np.take_along_axis(choice, order[:, k:k + 1], 1)[:, 0]
        straddle = kth == nxt
    return top, straddle


class RoutingRecorder:
    """Forward hooks on each MoE layer's router: the expected choice (ties to the lower index, computed from the
    f32 router logits) against the one torch made."""

    def __init__(self, model, family):
        self.stats, self.handles = {}, []
        cfg = model.config
        for name, mod in model.named_modules():
            try:
                self.attach(family, cfg, name, mod)
            except Exception as e:  # noqa: BLE001  (statistics only: never lose the fixture over them)
                self.stats[name] = {"error": repr(e)[:300]}

    def attach(self, family, cfg, name, mod):
        if family == "nemotron_h" and type(mod).__name__ == "NemotronHMoE":
            self.handles.append(mod.gate.register_forward_hook(self.nemotron_hook(name, mod, cfg)))
        elif family == "granitemoehybrid" and (name.endswith("block_sparse_moe.router.layer") or (
                name.endswith("block_sparse_moe.router") and isinstance(getattr(mod, "weight", None), torch.Tensor))):
            self.handles.append(mod.register_forward_hook(
                self.softmax_hook(name, mod, cfg.num_experts_per_tok, softmax_first=False)))
        elif family == "jamba" and name.endswith("feed_forward.router"):
            self.handles.append(mod.register_forward_hook(
                self.softmax_hook(name, mod, cfg.num_experts_per_tok, softmax_first=True)))

    def record(self, name, expected, torch_choice, straddle, n_experts):
        counts = np.bincount(expected.reshape(-1), minlength=n_experts)
        self.stats[name] = {"tokens_per_expert": counts.tolist(), "ties_at_boundary": int(straddle.sum()),
                            "tokens": int(expected.shape[0])}
        if torch_choice is not None:
            same = [set(a.tolist()) == set(b.tolist()) for a, b in zip(expected, torch_choice)]
            self.stats[name]["torch_equals_lowest_index_rule"] = bool(all(same))

    def nemotron_hook(self, name, moe, cfg):

        def hook(mod, inp, _out):
            try:
                x = inp[0].detach().reshape(-1, inp[0].shape[-1])
                logits = torch.nn.functional.linear(x.to(torch.float32), mod.weight.detach().to(torch.float32))
                try:  # torch's own choice, where this transformers version exposes it this way
                    torch_idx = moe.route_tokens_to_experts(logits.clone())[0].numpy()
                except Exception:  # noqa: BLE001
                    torch_idx = None
                s = torch.sigmoid(logits).numpy()
                choice = s + mod.e_score_correction_bias.detach().to(torch.float32).numpy()
                T, E = choice.shape
                g = cfg.n_group
                per = E // g
                grp = np.sort(choice.reshape(T, g, per), axis=2)[:, :, -2:].sum(axis=2)
                gtop, _ = stable_top_k(grp, cfg.topk_group)
                mask = np.zeros((T, g), dtype=bool)
                np.put_along_axis(mask, gtop, True, 1)
                masked = np.where(np.repeat(mask, per, axis=1), choice, -np.inf)
                top, straddle = stable_top_k(masked, cfg.num_experts_per_tok)
                self.record(name, top, torch_idx, straddle, E)
            except Exception as e:  # noqa: BLE001  (statistics only: never lose the fixture over them)
                self.stats[name] = {"error": repr(e)[:300]}
        return hook

    def softmax_hook(self, name, module, k, softmax_first):
        """Granite ranks the f32 logits, Jamba the softmax over them: the choice recomputed from the router's input."""
        def hook(mod, inp, _out):
            try:
                x = inp[0].detach().reshape(-1, inp[0].shape[-1])
                logits = torch.nn.functional.linear(x, mod.weight.detach()).to(torch.float32)
                ranked = torch.softmax(logits, dim=-1) if softmax_first else logits
                torch_idx = torch.topk(ranked, k, dim=-1)[1].numpy()
                top, straddle = stable_top_k(ranked.numpy(), k)
                self.record(name, top, torch_idx, straddle, logits.shape[1])
            except Exception as e:  # noqa: BLE001
                self.stats[name] = {"error": repr(e)[:300]}
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def other_expert_layout(src_dir, dst_dir):
    """Copies a checkpoint with its experts stored the other way: fused 3-D `...experts.<proj>` tensors become
    per-expert `...experts.<e>.<proj>.weight` (a fused gate_up_proj becomes gate_proj and up_proj), and per-expert
    tensors are fused. Returns the new tensor names' layout ("per_expert" or "fused")."""
    shutil.copytree(src_dir, dst_dir)
    path = os.path.join(dst_dir, "model.safetensors")
    sd = load_file(path)
    out, groups = {}, {}
    fused = re.compile(r"^(.*\.experts)\.(up_proj|down_proj|gate_proj|gate_up_proj)$")
    single = re.compile(r"^(.*\.experts)\.(\d+)\.(up_proj|down_proj|gate_proj)\.weight$")
    layout = None
    for n, t in sd.items():
        m, s = fused.match(n), single.match(n)
        if m and t.dim() == 3:
            layout = "per_expert"
            for e in range(t.shape[0]):
                if m.group(2) == "gate_up_proj":
                    half = t.shape[1] // 2
                    out[f"{m.group(1)}.{e}.gate_proj.weight"] = t[e, :half].contiguous()
                    out[f"{m.group(1)}.{e}.up_proj.weight"] = t[e, half:].contiguous()
                else:
                    out[f"{m.group(1)}.{e}.{m.group(2)}.weight"] = t[e].contiguous()
        elif s:
            layout = "fused"
            groups.setdefault((s.group(1), s.group(3)), {})[int(s.group(2))] = t
        else:
            out[n] = t
    for (prefix, proj), per in groups.items():
        stacked = torch.stack([per[e] for e in range(len(per))])
        if proj == "gate_proj" and (prefix, "up_proj") in groups:
            up = groups[(prefix, "up_proj")]
            out[f"{prefix}.gate_up_proj"] = torch.cat([stacked, torch.stack([up[e] for e in range(len(up))])], 1)
        elif proj == "up_proj" and (prefix, "gate_proj") in groups:
            continue
        else:
            out[f"{prefix}.{proj}"] = stacked
    if layout is None:
        raise RuntimeError(f"{src_dir}: no expert tensors found to restore the other way")
    save_file(out, path, metadata={"format": "pt"})
    return layout


def make_one(spec, root, index):
    name = spec["name"]
    out_dir = os.path.join(root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    torch.manual_seed(seed)
    model, cls = build(spec)
    init_weights(model, spec, seed)
    model = model.to(torch.float32).eval()
    model.save_pretrained(out_dir)
    gc = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (hy.L_TOKENS,), generator=gen).tolist()
    prompt = torch.randint(0, vocab, (hy.PROMPT_LEN,), generator=gen).tolist()

    mem = model.double()
    ref = eager_experts(cls.from_pretrained(out_dir, dtype=torch.float64, attn_implementation="eager").eval())
    rec = RoutingRecorder(ref, spec["family"])
    logits = hy.logits_of(ref, tokens)
    rec.remove()
    diff_reload = float((hy.logits_of(mem, tokens) - logits).abs().max())
    assert diff_reload < 1e-9, f"{name}: reloaded model differs from the in-memory one by {diff_reload}"
    pre = hy.logits_of(ref, tokens[:17])
    diff_prefix = float((pre - logits[:17]).abs().max())
    std = float(logits.std())
    assert std > 0.3 and torch.isfinite(logits).all(), f"{name}: logits std {std} too small or not finite"
    worst_change, worst_name = hy.parameter_sensitivity(ref, tokens, logits)

    with open(os.path.join(out_dir, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")
    np.save(os.path.join(out_dir, "logits.npy"), logits.to(torch.float32).numpy())
    greedy = hy.greedy_full_pass(ref, prompt)
    with open(os.path.join(out_dir, "greedy.json"), "w") as f:
        json.dump(greedy, f, indent=1)
    tensors = {n: list(p.shape) for n, p in ref.state_dict().items()}
    saved = sorted(load_file(os.path.join(out_dir, "model.safetensors")).keys())
    index[name] = {
        "family": spec["family"], "dtype": "f32", "L": hy.L_TOKENS, "files": sorted(os.listdir(out_dir)),
        "logits_std": std, "logits_absmax": float(logits.abs().max()), "reload_vs_memory_max_abs": diff_reload,
        "prefix_vs_full_max_abs": diff_prefix, "min_relative_logit_change_per_param_1pct": worst_change,
        "least_sensitive_param": worst_name, "greedy_min_margin": greedy["min_full_pass_margin"],
        "routing": rec.stats, "state_dict": tensors, "saved_tensor_names": saved,
    }
    print(f"[moe] {name}: std={std:.3f} prefix_diff={diff_prefix:.2e} min_param_effect={worst_change:.2e} "
          f"({worst_name}) min_margin={greedy['min_full_pass_margin']:.3g}", flush=True)
    for layer, st in rec.stats.items():
        print(f"[moe]   {layer}: {st}", flush=True)

    if spec.get("split_copy"):
        other = name.replace("_f32", "_other_layout_f32")
        other_dir = os.path.join(root, other)
        shutil.rmtree(other_dir, ignore_errors=True)
        layout = other_expert_layout(out_dir, other_dir)
        entry = {"family": spec["family"], "dtype": "f32", "same_reference_as": name, "expert_layout": layout,
                 "files": sorted(os.listdir(other_dir)),
                 "saved_tensor_names": sorted(load_file(os.path.join(other_dir, "model.safetensors")).keys())}
        try:  # whether transformers itself reads that layout (informational)
            again = eager_experts(cls.from_pretrained(other_dir, dtype=torch.float64, attn_implementation="eager").eval())
            entry["transformers_reload_max_abs"] = float((hy.logits_of(again, tokens) - logits).abs().max())
        except Exception as e:  # noqa: BLE001
            entry["transformers_reload_error"] = repr(e)[:500]
        index[other] = entry
        print(f"[moe] {other}: {layout} experts, transformers reload "
              f"{entry.get('transformers_reload_max_abs', entry.get('transformers_reload_error'))}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="fixtures/moe")
    ap.add_argument("--only", nargs="*", default=None,
                    help="make only these models (e.g. nemotron_h_moe_latent_f32) and merge them into the existing "
                         "manifest.json, leaving the other fixtures untouched")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    index, errors = {}, {}
    specs = SPECS
    if args.only is not None:
        unknown = set(args.only) - {s["name"] for s in SPECS}
        if unknown:
            ap.error(f"unknown models {sorted(unknown)}; known: {[s['name'] for s in SPECS]}")
        specs = [s for s in SPECS if s["name"] in args.only]
        old_manifest = os.path.join(args.out, "manifest.json")
        if os.path.exists(old_manifest):
            with open(old_manifest) as f:
                old = json.load(f)
            index, errors = old.get("models", {}), old.get("errors", {})
            for s in specs:  # the entries remade below (and their other-layout copies)
                for n in (s["name"], s["name"].replace("_f32", "_other_layout_f32"), s["name"] + "_fallback"):
                    index.pop(n, None)
                    errors.pop(n, None)
    for spec in specs:
        try:
            make_one(spec, args.out, index)
        except Exception:  # one family failing must not lose the others
            errors[spec["name"]] = traceback.format_exc()
            print(errors[spec["name"]], flush=True)
            if "fallback" in spec:
                try:
                    make_one(dict(spec, cfg={**spec["cfg"], **spec["fallback"]}), args.out, index)
                except Exception:
                    errors[spec["name"] + "_fallback"] = traceback.format_exc()
                    print(errors[spec["name"] + "_fallback"], flush=True)
    manifest = {
        "generator": "scripts/make_moe_fixtures.py", "transformers": transformers.__version__,
        "torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
        "reference": "CPU, float64 from f32-stored weights (routers in f32 as transformers casts them), eager "
                     "attention, full passes (use_cache=False)",
        "models": index, "errors": errors,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"[moe] wrote {len(index)} models, {len(errors)} errors", flush=True)


if __name__ == "__main__":
    main()
