#!/usr/bin/env python3
"""Golden fixtures for the C++ tests: tiny, deliberately awkward Mamba-1 / Mamba-2 checkpoints with logits and greedy
generations computed by Hugging Face transformers.

Each model is randomly initialised so that every parameter visibly changes the logits, rounded to its storage dtype,
saved with save_pretrained (safetensors), reloaded, and evaluated on the CPU in float64 (model.double()), so a
reference means "the stored weights, computed in high precision" - what the engine does in fp32. CPU because CUDA
convolutions/matmuls default to TF32 (~1e-3 error). Note that transformers itself casts some intermediates to fp32
(B, C and x in the SSM, the RMSNorm statistics), so the references are fp64 with fp32 in places (~1e-7 relative).

Mamba-2 with n_groups > 1: transformers' PyTorch path normalises the gated RMSNorm over all of d_inner, while the
reference inference code (mamba_ssm, and transformers' own fused CUDA path) normalises per group of
d_inner / n_groups. We patch MambaRMSNormGated to the group-wise form and assert that n_groups == 1 models give the
same logits with and without the patch.

Run on a machine with torch + transformers (see docs/fixtures.md):  python3 scripts/make_fixtures.py --out fixtures
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import transformers
from transformers import GenerationConfig, Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM
from transformers.models.mamba2 import modeling_mamba2

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
L_TOKENS = 45          # crosses chunk boundaries of chunk 8 / 16 models several times, and is no multiple of either
PROMPT_LEN = 8
NEW_TOKENS = 60

# --------------------------------------------------------------------------------------------------------------------
# Group-wise gated RMSNorm (mamba_ssm semantics). The norm module does not know n_groups, so each instance gets a
# `group_size` attribute (set_norm_groups); without it the whole last dimension is one group (transformers' form).

_ORIGINAL_GATED_FORWARD = modeling_mamba2.MambaRMSNormGated.forward


def _grouped_gated_forward(self, hidden_states, gate=None):
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)  # same precision choices as transformers' own forward
    if gate is not None:
        h = h * torch.nn.functional.silu(gate.to(torch.float32))
    group = getattr(self, "group_size", h.shape[-1])
    shape = h.shape
    h = h.reshape(*shape[:-1], shape[-1] // group, group)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = (h * torch.rsqrt(variance + self.variance_epsilon)).reshape(shape)
    return self.weight * h.to(input_dtype)


def use_grouped_norm(enabled):
    modeling_mamba2.MambaRMSNormGated.forward = _grouped_gated_forward if enabled else _ORIGINAL_GATED_FORWARD


def set_norm_groups(model):
    cfg = model.config
    if cfg.model_type != "mamba2":
        return
    d_inner = int(cfg.expand * cfg.hidden_size)
    for layer in model.backbone.layers:
        layer.mixer.norm.group_size = d_inner // cfg.n_groups


# --------------------------------------------------------------------------------------------------------------------
# Model specifications (awkward on purpose: odd vocab sizes, several groups, biases, tied/untied, all storage dtypes).

SPECS = [
    dict(name="mamba1_f32_untied_bias", arch="mamba1", dtype="f32", embeds=True,
         cfg=dict(hidden_size=40, num_hidden_layers=2, vocab_size=101, state_size=8, conv_kernel=4, expand=2,
                  time_step_rank="auto", use_bias=True, use_conv_bias=True, tie_word_embeddings=False)),
    dict(name="mamba1_bf16_tied", arch="mamba1", dtype="bf16", embeds=False,
         cfg=dict(hidden_size=24, num_hidden_layers=3, vocab_size=67, state_size=16, conv_kernel=3, expand=2,
                  time_step_rank="auto", use_bias=False, use_conv_bias=True, tie_word_embeddings=True)),
    dict(name="mamba2_f32_groups_bias", arch="mamba2", dtype="f32", embeds=True,
         cfg=dict(hidden_size=36, num_hidden_layers=2, vocab_size=89, expand=2, head_dim=12, num_heads=6, n_groups=3,
                  state_size=10, chunk_size=8, conv_kernel=4, use_bias=True, use_conv_bias=True,
                  tie_word_embeddings=False, time_step_limit=(0.0, float("inf")))),
    dict(name="mamba2_fp16_tied_limit", arch="mamba2", dtype="fp16", embeds=False,
         cfg=dict(hidden_size=32, num_hidden_layers=2, vocab_size=71, expand=2, head_dim=16, num_heads=4, n_groups=1,
                  state_size=16, chunk_size=16, conv_kernel=4, use_bias=False, use_conv_bias=True,
                  tie_word_embeddings=True, time_step_limit=(0.02, 0.4))),
    dict(name="mamba2_bf16_sharded", arch="mamba2", dtype="bf16", embeds=False, shards=True,
         cfg=dict(hidden_size=40, num_hidden_layers=3, vocab_size=120, expand=2, head_dim=8, num_heads=10, n_groups=2,
                  state_size=12, chunk_size=8, conv_kernel=4, use_bias=False, use_conv_bias=True,
                  tie_word_embeddings=False, time_step_limit=(0.0, float("inf")))),
]


def build_model(spec):
    common = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0, layer_norm_epsilon=1e-5, residual_in_fp32=True)
    if spec["arch"] == "mamba1":
        return MambaForCausalLM(MambaConfig(**common, **spec["cfg"]))
    return Mamba2ForCausalLM(Mamba2Config(**common, **spec["cfg"]))


def log_uniform(gen, n, lo, hi):
    return torch.exp(torch.rand(n, generator=gen, dtype=torch.float64) * (math.log(hi) - math.log(lo)) + math.log(lo))


def inverse_softplus(y):
    return y + torch.log(-torch.expm1(-y))


@torch.no_grad()
def init_weights(model, seed):
    """Every parameter drawn so that it visibly matters (transformers' default init gives nearly uniform logits)."""
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * std + mean).float()

    for name, p in model.named_parameters():
        short = name.split(".")[-2:]  # e.g. ['in_proj', 'weight'], ['mixer', 'A_log']
        leaf = short[-1]
        if name.endswith("embeddings.weight"):
            v = normal(p.shape, 1.0)
        elif leaf == "A_log":
            # A = -exp(A_log) with |A| in [1, 16]: decays from slow to fast.
            v = torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=gen, dtype=torch.float64)).float()
        elif leaf == "D":
            v = (0.5 + torch.rand(p.shape, generator=gen, dtype=torch.float64)).float()
        elif leaf == "dt_bias" or (short[0] == "dt_proj" and leaf == "bias"):
            v = inverse_softplus(log_uniform(gen, p.numel(), 0.01, 0.5)).float().reshape(p.shape)
        elif short[0] == "conv1d" and leaf == "weight":
            v = normal(p.shape, 0.5)
        elif leaf == "bias":
            v = normal(p.shape, 0.2)
        elif short[0] in ("norm", "norm_f") and leaf == "weight":
            v = normal(p.shape, 0.2, mean=1.0)
        elif leaf == "weight" and p.dim() == 2:
            fan_in = p.shape[1]
            scale = 0.5 if short[0] == "dt_proj" else 1.0  # dt_proj feeds a softplus around the dt bias
            v = normal(p.shape, scale / math.sqrt(fan_in))
        else:
            raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
        p.copy_(v)


def round_to_storage(model, dtype):
    """Round every weight to the storage dtype (what the safetensors file will hold)."""
    return model.to(dtype)


@torch.no_grad()
def logits_of(model, ids=None, embeds=None):
    if embeds is not None:
        out = model(inputs_embeds=embeds[None], use_cache=False)
    else:
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float64)


def top2_margin(row):
    top = torch.topk(row.to(torch.float64), 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def greedy_reference(model, prompt, new_tokens=NEW_TOKENS):
    """`new_tokens` greedy tokens two ways: model.generate (the cached recurrent path) and a loop of full passes
    (use_cache=False). Records both, whether they agree, and each step's top-2 logit margin."""
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0,
                               output_scores=True, return_dict_in_generate=True)
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_cfg)
    gen_tokens = out.sequences[0, len(prompt):].tolist()
    gen_margins = [top2_margin(s[0]) for s in out.scores]

    seq = list(prompt)
    loop_tokens, loop_margins = [], []
    for _ in range(new_tokens):
        row = logits_of(model, seq)[-1]
        nxt = int(torch.argmax(row))
        loop_tokens.append(nxt)
        loop_margins.append(top2_margin(row))
        seq.append(nxt)
    first_diff = next((i for i, (a, b) in enumerate(zip(gen_tokens, loop_tokens)) if a != b), None)
    if first_diff is None and len(gen_tokens) != len(loop_tokens):
        first_diff = min(len(gen_tokens), len(loop_tokens))
    return {
        "prompt_ids": list(prompt),
        "max_new_tokens": new_tokens,
        "generate_ids": gen_tokens,
        "generate_margins": gen_margins,
        "full_pass_ids": loop_tokens,
        "full_pass_margins": loop_margins,
        "agree": first_diff is None,
        "first_disagreement": first_diff,
        "min_full_pass_margin": min(loop_margins),
        "note": "margins are top-1 minus top-2 logit at each step; generate used do_sample=False, eos_token_id=None, "
                "pad_token_id=0 (cached path); full_pass = argmax of a use_cache=False forward over prompt+generated.",
    }


@torch.no_grad()
def parameter_sensitivity(model, ids, base):
    """Smallest relative logit change over all parameter tensors when each is perturbed by 1% relative noise."""
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


def save_checkpoint(model, spec, out_dir):
    kwargs = {}
    if spec.get("shards"):
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        kwargs["max_shard_size"] = max(total // 3, 1024)  # several shards + model.safetensors.index.json
    model.save_pretrained(out_dir, **kwargs)
    # Only the checkpoint: generation_config.json is written by save_pretrained but not part of what we test.
    gc = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)


def reload(spec, out_dir):
    cls = MambaForCausalLM if spec["arch"] == "mamba1" else Mamba2ForCausalLM
    model = cls.from_pretrained(out_dir, dtype=torch.float64)
    model.eval()
    set_norm_groups(model)
    return model


def make_one(spec, root, index):
    name = spec["name"]
    out_dir = os.path.join(root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    torch.manual_seed(seed)

    model = build_model(spec)
    init_weights(model, seed)
    model = round_to_storage(model, DTYPES[spec["dtype"]])
    model.eval()
    save_checkpoint(model, spec, out_dir)

    cfg = model.config
    vocab = cfg.vocab_size
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (L_TOKENS,), generator=gen).tolist()
    prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()

    # In-memory model (rounded weights) in float64, and the same model reloaded from the files: they must agree, so the
    # fixture is known to describe the files (tying, sharding, names).
    mem = model.double()
    set_norm_groups(mem)
    ref = reload(spec, out_dir)
    logits = logits_of(ref, tokens)
    diff_reload = float((logits_of(mem, tokens) - logits).abs().max())
    assert diff_reload < 1e-9, f"{name}: reloaded model differs from the in-memory one by {diff_reload}"
    del mem

    n_groups = getattr(cfg, "n_groups", None)
    patch_check = None
    if spec["arch"] == "mamba2" and n_groups == 1:
        use_grouped_norm(False)
        plain = logits_of(ref, tokens)
        use_grouped_norm(True)
        patch_check = float((plain - logits).abs().max())
        assert patch_check <= 1e-12, f"{name}: group-wise norm patch changed an n_groups == 1 model by {patch_check}"
    elif spec["arch"] == "mamba2":
        use_grouped_norm(False)
        plain = logits_of(ref, tokens)
        use_grouped_norm(True)
        patch_check = float((plain - logits).abs().max())
        # The two norms differ for n_groups > 1: a zero difference would mean the patch is not in effect.
        assert patch_check > 1e-6, f"{name}: group-wise norm patch had no effect ({patch_check})"

    std = float(logits.std())
    assert std > 0.3 and torch.isfinite(logits).all(), f"{name}: logits std {std} too small or not finite"
    worst_change, worst_name = parameter_sensitivity(ref, tokens, logits)
    assert worst_change > 1e-5, f"{name}: parameter {worst_name} barely matters ({worst_change})"

    files = sorted(os.listdir(out_dir))
    with open(os.path.join(out_dir, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")
    np.save(os.path.join(out_dir, "logits.npy"), logits.to(torch.float32).numpy())
    extra = {}
    if spec["embeds"]:
        embeds = torch.randn(L_TOKENS, cfg.hidden_size, generator=gen, dtype=torch.float32)
        le = logits_of(ref, embeds=embeds.to(torch.float64))
        np.save(os.path.join(out_dir, "inputs_embeds.npy"), embeds.numpy())
        np.save(os.path.join(out_dir, "logits_embeds.npy"), le.to(torch.float32).numpy())
        extra["logits_embeds_std"] = float(le.std())
    greedy = greedy_reference(ref, prompt)
    with open(os.path.join(out_dir, "greedy.json"), "w") as f:
        json.dump(greedy, f, indent=1)

    entry = {
        "arch": spec["arch"],
        "dtype": spec["dtype"],
        "tied": bool(cfg.tie_word_embeddings),
        "n_groups": n_groups,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "vocab_size": vocab,
        "L": L_TOKENS,
        "checkpoint_files": files,
        "files": sorted(os.listdir(out_dir)),
        "logits_std": std,
        "logits_absmax": float(logits.abs().max()),
        "reload_vs_memory_max_abs": diff_reload,
        "grouped_norm_vs_transformers_norm_max_abs": patch_check,
        "min_relative_logit_change_per_param_1pct": worst_change,
        "least_sensitive_param": worst_name,
        "greedy_agree": greedy["agree"],
        "greedy_first_disagreement": greedy["first_disagreement"],
        "greedy_min_margin": greedy["min_full_pass_margin"],
        **extra,
    }
    index[name] = entry
    print(f"[fixtures] {name:26s} std={std:7.3f} absmax={entry['logits_absmax']:7.2f} "
          f"norm_patch_diff={patch_check} min_param_effect={worst_change:.2e} ({worst_name}) "
          f"greedy_agree={greedy['agree']} first_diff={greedy['first_disagreement']} "
          f"min_margin={greedy['min_full_pass_margin']:.3g} files={entry['files']}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="fixtures", help="fixture root; models go to <out>/models/<name>")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    use_grouped_norm(True)
    root = os.path.join(args.out, "models")
    os.makedirs(root, exist_ok=True)
    index = {}
    for spec in SPECS:
        make_one(spec, root, index)
    manifest = {
        "generator": "scripts/make_fixtures.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "reference": "CPU, model.double() after rounding weights to the storage dtype; transformers keeps some "
                     "intermediates in fp32. Mamba-2 gated RMSNorm patched to group-wise (mamba_ssm semantics).",
        "models": index,
    }
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"[fixtures] wrote {len(index)} models under {root}", flush=True)


if __name__ == "__main__":
    main()
