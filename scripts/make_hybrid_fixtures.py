#!/usr/bin/env python3
"""Golden fixtures for the hybrid families (Nemotron-H, Granite-4.0-H dense, Bamba): tiny random checkpoints with
awkward shapes, saved with save_pretrained, reloaded and evaluated by transformers on the CPU in float64.

As in scripts/make_fixtures.py: every parameter is drawn so that it visibly changes the logits; weights are stored in
f32 (the engine computes in f32, the reference in f64: the difference is fp32 rounding); the greedy continuation is
the argmax of repeated full passes (use_cache=False), never transformers' cached generate (its hybrid caches are the
thing under suspicion). Each model's transformers class is used as is: the Mamba-2 gated norm is per group in
Nemotron-H (Zamba2RMSNormGated with group_size) and over the whole d_inner in Granite-4.0-H and Bamba - that is what
those checkpoints were trained with, so no patch here.

dt clamps: transformers' PyTorch paths clamp dt differently from the kernels (Nemotron-H's at time_step_min); the dt
biases below keep softplus(dt) far above 1e-3 so no clamp binds and the reference does not depend on that choice.

Run on a machine with torch + transformers:  python3 scripts/make_hybrid_fixtures.py --out fixtures/hybrid
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import transformers

L_TOKENS = 45      # crosses the chunk boundaries of chunk 8 / 16 models, no multiple of either
PROMPT_LEN = 8
NEW_TOKENS = 40

SPECS = [
    # Nemotron-H: Mamba-2 (per-group gated norm, n_groups 2), NoPE attention with GQA and a head_dim unrelated to
    # hidden/heads, relu2 MLP with biases; pattern written as hybrid_override_pattern.
    dict(name="nemotron_h_f32", family="nemotron_h",
         cfg=dict(vocab_size=131, hidden_size=48, hybrid_override_pattern="M*M-M*", num_attention_heads=4,
                  num_key_value_heads=2, head_dim=20, attention_bias=False, intermediate_size=72,
                  mlp_hidden_act="relu2", mlp_bias=True, ssm_state_size=10, mamba_num_heads=8, mamba_head_dim=12,
                  n_groups=2, conv_kernel=4, expand=2, chunk_size=8, use_conv_bias=True, use_bias=False,
                  layer_norm_epsilon=1e-5, residual_in_fp32=False, tie_word_embeddings=False,
                  use_mamba_kernels=False, time_step_limit=(0.0, float("inf")), pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, max_position_embeddings=4096)),
    # Granite-4.0-H (dense: num_local_experts 0): Mamba-2 with n_groups 2 but a whole-d_inner gated norm, NoPE MQA
    # attention with biases and attention_multiplier, shared_mlp, embedding/residual multipliers, logits_scaling,
    # tied embeddings, proj biases in the Mamba layers.
    dict(name="granite_h_f32", family="granitemoehybrid",
         cfg=dict(vocab_size=97, hidden_size=40, num_hidden_layers=5,
                  layer_types=["mamba", "attention", "mamba", "mamba", "attention"], num_attention_heads=4,
                  num_key_value_heads=1, attention_bias=True, attention_multiplier=0.3, embedding_multiplier=3.0,
                  residual_multiplier=0.4, logits_scaling=2.5, num_local_experts=0, shared_intermediate_size=56,
                  intermediate_size=56, position_embedding_type="nope", mamba_n_heads=10, mamba_d_head=8,
                  mamba_n_groups=2, mamba_d_state=12, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
                  mamba_conv_bias=True, mamba_proj_bias=True, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  hidden_act="silu", pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=2048),
         fallback=dict(position_embedding_type=None)),
    # Bamba: RoPE on half of each head (partial_rotary_factor 0.5), theta 500, GQA, gated SiLU feed_forward,
    # n_groups 2 with the whole-d_inner gated norm.
    dict(name="bamba_f32", family="bamba",
         cfg=dict(vocab_size=113, hidden_size=32, num_hidden_layers=5, attn_layer_indices=[1, 4],
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, mamba_n_heads=8,
                  mamba_d_head=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                  mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=False, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, hidden_act="silu", pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  max_position_embeddings=4096,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}),
         fallback=dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
]


def build(spec):
    fam = spec["family"]
    cfg = dict(spec["cfg"])
    if fam == "nemotron_h":
        from transformers import NemotronHConfig as C, NemotronHForCausalLM as M
    elif fam == "granitemoehybrid":
        from transformers import GraniteMoeHybridConfig as C, GraniteMoeHybridForCausalLM as M
    else:
        from transformers import BambaConfig as C, BambaForCausalLM as M
    config = C(**cfg)
    config._attn_implementation = "eager"
    return M(config), M


def log_uniform(gen, n, lo, hi):
    return torch.exp(torch.rand(n, generator=gen, dtype=torch.float64) * (math.log(hi) - math.log(lo)) + math.log(lo))


def inverse_softplus(y):
    return y + torch.log(-torch.expm1(-y))


@torch.no_grad()
def init_weights(model, seed):
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * std + mean).float()

    for name, p in model.named_parameters():
        parts = name.split(".")
        leaf, owner = parts[-1], parts[-2]
        if p.dim() == 2 and ("embed" in owner):
            v = normal(p.shape, 1.0)
        elif leaf == "A_log":
            v = torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=gen, dtype=torch.float64)).float()
        elif leaf == "D":
            v = (0.5 + torch.rand(p.shape, generator=gen, dtype=torch.float64)).float()
        elif leaf == "dt_bias":
            v = inverse_softplus(log_uniform(gen, p.numel(), 0.05, 0.5)).float().reshape(p.shape)
        elif owner == "conv1d" and leaf == "weight":
            v = normal(p.shape, 0.5)
        elif leaf == "bias":
            v = normal(p.shape, 0.2)
        elif leaf == "weight" and p.dim() == 1:  # every RMSNorm weight
            v = normal(p.shape, 0.2, mean=1.0)
        elif leaf == "weight" and p.dim() == 2:
            v = normal(p.shape, 1.0 / math.sqrt(p.shape[1]))
        else:
            raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
        p.copy_(v)


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float64)


def top2_margin(row):
    top = torch.topk(row, 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def greedy_full_pass(model, prompt):
    seq, toks, margins = list(prompt), [], []
    for _ in range(NEW_TOKENS):
        row = logits_of(model, seq)[-1]
        nxt = int(torch.argmax(row))
        toks.append(nxt)
        margins.append(top2_margin(row))
        seq.append(nxt)
    return {"prompt_ids": list(prompt), "max_new_tokens": NEW_TOKENS, "full_pass_ids": toks,
            "full_pass_margins": margins, "min_full_pass_margin": min(margins),
            "note": "argmax of a use_cache=False float64 forward over prompt + generated, step by step"}


@torch.no_grad()
def parameter_sensitivity(model, ids, base):
    gen = torch.Generator().manual_seed(1234)
    worst = (float("inf"), None)
    scale = float(base.abs().max())
    for name, p in model.named_parameters():
        saved = p.detach().clone()
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
        p.add_(0.01 * noise * (saved.abs() + saved.abs().mean()))
        change = float((logits_of(model, ids) - base).abs().max()) / scale
        p.copy_(saved)
        if change < worst[0]:
            worst = (change, name)
    return worst


def make_one(spec, root, index):
    name = spec["name"]
    out_dir = os.path.join(root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    torch.manual_seed(seed)
    model, cls = build(spec)
    init_weights(model, seed)
    model = model.to(torch.float32).eval()
    model.save_pretrained(out_dir)
    gc = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (L_TOKENS,), generator=gen).tolist()
    prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()

    mem = model.double()
    ref = cls.from_pretrained(out_dir, dtype=torch.float64, attn_implementation="eager").eval()
    logits = logits_of(ref, tokens)
    diff_reload = float((logits_of(mem, tokens) - logits).abs().max())
    assert diff_reload < 1e-9, f"{name}: reloaded model differs from the in-memory one by {diff_reload}"
    # Prefix property of the reference itself: the logits of a prefix pass equal the first rows of the full pass.
    pre = logits_of(ref, tokens[:17])
    diff_prefix = float((pre - logits[:17]).abs().max())
    std = float(logits.std())
    assert std > 0.3 and torch.isfinite(logits).all(), f"{name}: logits std {std} too small or not finite"
    worst_change, worst_name = parameter_sensitivity(ref, tokens, logits)

    with open(os.path.join(out_dir, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")
    np.save(os.path.join(out_dir, "logits.npy"), logits.to(torch.float32).numpy())
    greedy = greedy_full_pass(ref, prompt)
    with open(os.path.join(out_dir, "greedy.json"), "w") as f:
        json.dump(greedy, f, indent=1)
    tensors = {n: list(p.shape) for n, p in ref.state_dict().items()}
    index[name] = {
        "family": spec["family"], "dtype": "f32", "L": L_TOKENS, "files": sorted(os.listdir(out_dir)),
        "logits_std": std, "logits_absmax": float(logits.abs().max()), "reload_vs_memory_max_abs": diff_reload,
        "prefix_vs_full_max_abs": diff_prefix, "min_relative_logit_change_per_param_1pct": worst_change,
        "least_sensitive_param": worst_name, "greedy_min_margin": greedy["min_full_pass_margin"],
        "state_dict": tensors,
    }
    print(f"[hybrid] {name}: std={std:.3f} prefix_diff={diff_prefix:.2e} min_param_effect={worst_change:.2e} "
          f"({worst_name}) min_margin={greedy['min_full_pass_margin']:.3g}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="fixtures/hybrid")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    index, errors = {}, {}
    for spec in SPECS:
        try:
            make_one(spec, args.out, index)
        except Exception:  # one family failing must not lose the others
            errors[spec["name"]] = traceback.format_exc()
            print(errors[spec["name"]], flush=True)
            if "fallback" in spec:  # a config spelling this transformers version does not take
                try:
                    make_one(dict(spec, cfg={**spec["cfg"], **spec["fallback"]}), args.out, index)
                except Exception:
                    errors[spec["name"] + "_fallback"] = traceback.format_exc()
                    print(errors[spec["name"] + "_fallback"], flush=True)
    manifest = {
        "generator": "scripts/make_hybrid_fixtures.py", "transformers": transformers.__version__,
        "torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
        "reference": "CPU, float64 from f32-stored weights, eager attention, full passes (use_cache=False)",
        "models": index, "errors": errors,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"[hybrid] wrote {len(index)} models, {len(errors)} errors", flush=True)


if __name__ == "__main__":
    main()
