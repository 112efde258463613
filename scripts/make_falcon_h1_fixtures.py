#!/usr/bin/env python3
"""Golden fixtures for Falcon-H1 (transformers' FalconH1ForCausalLM): tiny random checkpoints, saved with
save_pretrained, reloaded and evaluated by transformers on the CPU in float64.

The method and the helpers are scripts/make_hybrid_fixtures.py's (imported): every parameter drawn so that it visibly
changes the logits, weights stored in f32, logits of one full pass, and a greedy continuation made of repeated full
passes (use_cache=False: transformers' hybrid caches are never the reference).

Every variant has non-unit muP multipliers (embedding, lm_head, key, attention in/out, ssm in/out, the five
ssm_multipliers over [z | x | B | C | dt], mlp gate/down), mamba_d_ssm != 2 * hidden_size, n_groups 2 (so the
grouping of the gated norm shows) and GQA/MQA with RoPE (NeoX rotate-half over the whole head):
  falcon_h1_f32              mamba_rms_norm false (y * silu(z)), untied, theta 1e4
  falcon_h1_norm_tied_f32    mamba_rms_norm true, mamba_norm_before_gate true, tied, head_dim key != hidden/heads,
                             MQA, in_proj bias (mamba_proj_bias), theta 1e11 as the released models
  falcon_h1_gate_first_f32   mamba_rms_norm true, mamba_norm_before_gate false, untied, attention, MLP and out_proj
                             (projectors_bias) biases, mamba_d_ssm 3 * hidden_size

Note: transformers' naive SSD (torch_forward) casts x, B, C to float32 even in a float64 model, and its gated norm
casts the gate to float32: the reference carries f32 rounding there (well below the engine's own).

Run on a machine with torch + transformers:  python3 scripts/make_falcon_h1_fixtures.py --out fixtures/falcon_h1
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import make_hybrid_fixtures as H  # noqa: E402

MULTIPLIERS = dict(embedding_multiplier=2.5, lm_head_multiplier=0.7, key_multiplier=0.6,
                   attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.25,
                   ssm_out_multiplier=0.45, ssm_multipliers=[0.35, 0.6, 1.4, 0.8, 1.7], mlp_multipliers=[0.9, 0.55])
COMMON = dict(hidden_act="silu", pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096,
              mamba_d_conv=4, mamba_conv_bias=True, time_step_limit=(0.0, float("inf")), rms_norm_eps=1e-5)

SPECS = [
    dict(name="falcon_h1_f32",
         cfg=dict(COMMON, **MULTIPLIERS, vocab_size=101, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=48, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head="auto",
                  mamba_n_groups=2, mamba_d_state=12, mamba_chunk_size=8, mamba_proj_bias=False,
                  projectors_bias=False, mamba_rms_norm=False, mamba_norm_before_gate=True, attention_bias=False,
                  mlp_bias=False, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
         fallback=dict(rope_parameters=None, rope_theta=10000.0)),
    dict(name="falcon_h1_norm_tied_f32",
         cfg=dict(COMMON, **dict(MULTIPLIERS, ssm_multipliers=[1.6, 0.45, 0.7, 1.3, 0.55], key_multiplier=1.7),
                  vocab_size=89, hidden_size=40, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                  head_dim=12, intermediate_size=56, mamba_d_ssm=60, mamba_n_heads=6, mamba_d_head=10,
                  mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=16, mamba_proj_bias=True,
                  projectors_bias=False, mamba_rms_norm=True, mamba_norm_before_gate=True, attention_bias=False,
                  mlp_bias=False, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e11}),
         fallback=dict(rope_parameters=None, rope_theta=1e11, head_dim=None)),
    dict(name="falcon_h1_gate_first_f32",
         cfg=dict(COMMON, **dict(MULTIPLIERS, attention_in_multiplier=0.7, ssm_in_multiplier=0.8,
                                 mlp_multipliers=[1.4, 0.75]),
                  vocab_size=97, hidden_size=24, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=40, mamba_d_ssm=72, mamba_n_heads=6, mamba_d_head="auto", mamba_n_groups=2,
                  mamba_d_state=16, mamba_chunk_size=8, mamba_proj_bias=False, projectors_bias=True,
                  mamba_rms_norm=True, mamba_norm_before_gate=False, attention_bias=True, mlp_bias=True,
                  tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 5000.0}),
         fallback=dict(rope_parameters=None, rope_theta=5000.0)),
]


def build(spec):
    from transformers import FalconH1Config, FalconH1ForCausalLM
    cfg = {k: v for k, v in spec["cfg"].items() if v is not None}
    config = FalconH1Config(**cfg)
    config._attn_implementation = "eager"
    return FalconH1ForCausalLM(config), FalconH1ForCausalLM


def make_one(spec, root, index):
    name = spec["name"]
    out_dir = os.path.join(root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    torch.manual_seed(seed)
    model, cls = build(spec)
    H.init_weights(model, seed)
    model = model.to(torch.float32).eval()
    model.save_pretrained(out_dir)
    gc = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (H.L_TOKENS,), generator=gen).tolist()
    prompt = torch.randint(0, vocab, (H.PROMPT_LEN,), generator=gen).tolist()

    mem = model.double()
    ref = cls.from_pretrained(out_dir, dtype=torch.float64, attn_implementation="eager").eval()
    # The muP vector is a non-persistent buffer rebuilt from the config at load: check it came back.
    mup = ref.model.layers[0].mamba.mup_vector.flatten().tolist()
    logits = H.logits_of(ref, tokens)
    diff_reload = float((H.logits_of(mem, tokens) - logits).abs().max())
    assert diff_reload < 1e-9, f"{name}: reloaded model differs from the in-memory one by {diff_reload}"
    pre = H.logits_of(ref, tokens[:17])
    diff_prefix = float((pre - logits[:17]).abs().max())
    std = float(logits.std())
    assert std > 0.3 and torch.isfinite(logits).all(), f"{name}: logits std {std} too small or not finite"
    worst_change, worst_name = H.parameter_sensitivity(ref, tokens, logits)
    # Each multiplier must matter: the logits move when it moves by 10%.
    mult_effect = {}
    for key in ("key_multiplier", "attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
                "ssm_out_multiplier"):
        saved = getattr(ref.config, key)
        for layer in ref.model.layers:
            if key == "key_multiplier":
                layer.self_attn.key_multiplier = saved * 1.1
            elif key == "attention_in_multiplier":
                layer.attention_in_multiplier = saved * 1.1
            elif key == "attention_out_multiplier":
                layer.attn_out_multiplier = saved * 1.1
            elif key == "ssm_in_multiplier":
                layer.mamba.ssm_in_multiplier = saved * 1.1
            else:
                layer.ssm_out_multiplier = saved * 1.1
        mult_effect[key] = float((H.logits_of(ref, tokens) - logits).abs().max()) / float(logits.abs().max())
        for layer in ref.model.layers:
            if key == "key_multiplier":
                layer.self_attn.key_multiplier = saved
            elif key == "attention_in_multiplier":
                layer.attention_in_multiplier = saved
            elif key == "attention_out_multiplier":
                layer.attn_out_multiplier = saved
            elif key == "ssm_in_multiplier":
                layer.mamba.ssm_in_multiplier = saved
            else:
                layer.ssm_out_multiplier = saved
    assert float((H.logits_of(ref, tokens) - logits).abs().max()) == 0.0, f"{name}: multipliers not restored"

    with open(os.path.join(out_dir, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")
    np.save(os.path.join(out_dir, "logits.npy"), logits.to(torch.float32).numpy())
    greedy = H.greedy_full_pass(ref, prompt)
    with open(os.path.join(out_dir, "greedy.json"), "w") as f:
        json.dump(greedy, f, indent=1)
    tensors = {n: list(p.shape) for n, p in ref.state_dict().items()}
    index[name] = {
        "family": "falcon_h1", "dtype": "f32", "L": H.L_TOKENS, "files": sorted(os.listdir(out_dir)),
        "logits_std": std, "logits_absmax": float(logits.abs().max()), "reload_vs_memory_max_abs": diff_reload,
        "prefix_vs_full_max_abs": diff_prefix, "min_relative_logit_change_per_param_1pct": worst_change,
        "least_sensitive_param": worst_name, "relative_logit_change_per_multiplier_10pct": mult_effect,
        "mup_vector_layer0": mup, "greedy_min_margin": greedy["min_full_pass_margin"], "state_dict": tensors,
    }
    print(f"[falcon_h1] {name}: std={std:.3f} prefix_diff={diff_prefix:.2e} min_param_effect={worst_change:.2e} "
          f"({worst_name}) min_margin={greedy['min_full_pass_margin']:.3g} multipliers={mult_effect}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", nargs="?", default=None)
    ap.add_argument("--out", default="fixtures/falcon_h1")
    args = ap.parse_args()
    out = args.outdir or args.out
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(out, exist_ok=True)
    index, errors = {}, {}
    for spec in SPECS:
        try:
            make_one(spec, out, index)
        except Exception:  # one variant failing must not lose the others
            errors[spec["name"]] = traceback.format_exc()
            print(errors[spec["name"]], flush=True)
            try:  # a config spelling this transformers version does not take
                make_one(dict(spec, cfg={**spec["cfg"], **spec["fallback"]}), out, index)
            except Exception:
                errors[spec["name"] + "_fallback"] = traceback.format_exc()
                print(errors[spec["name"] + "_fallback"], flush=True)
    manifest = {
        "generator": "scripts/make_falcon_h1_fixtures.py", "transformers": transformers.__version__,
        "torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
        "reference": "CPU, float64 from f32-stored weights, eager attention, full passes (use_cache=False)",
        "models": index, "errors": errors,
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"[falcon_h1] wrote {len(index)} models, {len(errors)} errors", flush=True)


if __name__ == "__main__":
    main()
