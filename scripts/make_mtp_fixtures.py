#!/usr/bin/env python3
"""Golden fixtures for Nemotron-H's multi-token-prediction (MTP) block (src/model/mtp.h, --draft-mtp): a tiny random
Nemotron-H checkpoint (Mamba-2, MoE, attention and MLP layers) with an MTP block of the Nemotron 3 Super kind
(mtp_hybrid_override_pattern "*E": attention then MoE), and the block's logits computed in float64.

transformers' NemotronHForCausalLM does not run the MTP block (it ignores mtp.* tensors on load), so the script
assembles it: its layers are transformers' own NemotronH blocks, taken from a second NemotronHModel whose layer
pattern is the MTP pattern (that model's causal mask, RMSNorm and norm_f: the block's final_layernorm); only the glue
in front of them is written here, as vLLM's nemotron_h_mtp.py computes it:

    x_p = eh_proj([enorm(embed(t_{p+1})) ; hnorm(h_p)])     h_p: the model's last hidden state (after norm_f) at p
    g_p = final_layernorm(blocks(x_p))                       causal over p = 0..L-2
    logits_p = lm_head(g_p)                                  the model's own embedding table and LM head

Outputs under <outdir> (a few tens of KB):
  model/config.json, model/model.safetensors   the checkpoint: the model's tensors (model.*, lm_head) and the MTP
                                               block's (mtp.layers.0.{enorm,hnorm,eh_proj,norm,mixer.*},
                                               mtp.layers.1.{norm,mixer.*,final_layernorm}), float32
  tokens.npy      int32 [L]          the token ids
  hidden.npy      float32 [L, d]     the model's h_p (float64 computation, stored as float32)
  mtp_logits.npy  float32 [L-1, V]   logits_p for p = 0..L-2 (float64 computation)
  manifest.json   the versions, the config and a top-2 margin per row (how far each argmax is from a tie)

Run on a machine with torch + transformers (no network):  python3 scripts/make_mtp_fixtures.py fixtures/mtp
"""

import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

CFG = dict(vocab_size=67, hidden_size=32, hybrid_override_pattern="ME*-", num_attention_heads=4,
           num_key_value_heads=2, head_dim=8, attention_bias=False, intermediate_size=40, mlp_hidden_act="relu2",
           mlp_bias=False, ssm_state_size=8, mamba_num_heads=8, mamba_head_dim=8, n_groups=2, conv_kernel=4,
           expand=2, chunk_size=8, use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-5,
           residual_in_fp32=False, tie_word_embeddings=False, use_mamba_kernels=False,
           time_step_limit=(0.0, float("inf")), pad_token_id=0, bos_token_id=1, eos_token_id=2,
           max_position_embeddings=4096, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
           moe_shared_expert_intermediate_size=24, n_shared_experts=1, n_group=2, topk_group=1, norm_topk_prob=True,
           routed_scaling_factor=2.0)
MTP_PATTERN = "*E"
L = 23  # tokens; the MTP rows are p = 0..L-2
SEED = 53


def config_of(**overrides):
    from transformers import NemotronHConfig
    config = NemotronHConfig(**dict(CFG, **overrides))
    config._attn_implementation = "eager"
    return config


def eager(model):
    """transformers 5 runs MoE experts through torch._grouped_mm by default, which has no float64: the eager loop."""
    try:
        model.set_experts_implementation("eager")
    except Exception:  # noqa: BLE001  (versions without the setter)
        model.config._experts_implementation = "eager"
    return model


@torch.no_grad()
def init(model, gen):
    """Values that make every tensor matter: norms near 1, projections of unit gain, Mamba parameters in range."""
    def normal(shape, std, mean=0.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * std + mean).float()

    for name, p in model.named_parameters():
        leaf = name.split(".")[-1]
        owner = name.split(".")[-2] if "." in name else ""
        if p.dim() == 3:  # fused experts [E, out, in]
            v = normal(p.shape, 1.0 / math.sqrt(p.shape[2]))
        elif "embed" in owner:
            v = normal(p.shape, 1.0)
        elif leaf == "A_log":
            v = torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=gen, dtype=torch.float64)).float()
        elif leaf == "D":
            v = (0.5 + torch.rand(p.shape, generator=gen, dtype=torch.float64)).float()
        elif leaf == "dt_bias":
            dt = torch.exp(torch.rand(p.shape, generator=gen, dtype=torch.float64) * math.log(10.0) + math.log(0.05))
            v = (dt + torch.log(-torch.expm1(-dt))).float()
        elif owner == "conv1d" and leaf == "weight":
            v = normal(p.shape, 0.5)
        elif leaf == "e_score_correction_bias":
            v = normal(p.shape, 0.1)
        elif leaf == "bias":
            v = normal(p.shape, 0.2)
        elif p.dim() == 1:  # RMSNorm weights
            v = normal(p.shape, 0.2, mean=1.0)
        elif p.dim() == 2:
            v = normal(p.shape, (2.0 if owner == "gate" else 1.0) / math.sqrt(p.shape[1]))
        else:
            raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
        p.copy_(v)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(normal(b.shape, 0.1))


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 scripts/make_mtp_fixtures.py OUTDIR")
    out = sys.argv[1]
    from transformers import NemotronHForCausalLM, NemotronHModel
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)

    model = eager(NemotronHForCausalLM(config_of()))
    init(model, gen)
    # The MTP block's layers: a NemotronHModel of the MTP pattern (its embeddings are not used).
    block = eager(NemotronHModel(config_of(hybrid_override_pattern=MTP_PATTERN)))
    init(block, gen)
    d = CFG["hidden_size"]
    glue = {
        "enorm": (torch.randn(d, generator=gen, dtype=torch.float64) * 0.2 + 1.0).float(),
        "hnorm": (torch.randn(d, generator=gen, dtype=torch.float64) * 0.2 + 1.0).float(),
        "eh_proj": (torch.randn(d, 2 * d, generator=gen, dtype=torch.float64) / math.sqrt(2 * d)).float(),
    }

    # The checkpoint: the model as save_pretrained writes it, the MTP tensors added, the config told about them.
    mdir = os.path.join(out, "model")
    os.makedirs(mdir, exist_ok=True)
    model.save_pretrained(mdir)
    st = os.path.join(mdir, "model.safetensors")
    tensors = load_file(st)
    n_mtp = len(MTP_PATTERN)
    tensors["mtp.layers.0.enorm.weight"] = glue["enorm"]
    tensors["mtp.layers.0.hnorm.weight"] = glue["hnorm"]
    tensors["mtp.layers.0.eh_proj.weight"] = glue["eh_proj"]
    for name, t in block.state_dict().items():
        if name.startswith("layers."):
            tensors["mtp." + name] = t.detach().float().contiguous()
    tensors[f"mtp.layers.{n_mtp - 1}.final_layernorm.weight"] = block.norm_f.weight.detach().float().contiguous()
    save_file(tensors, st, metadata={"format": "pt"})
    with open(os.path.join(mdir, "config.json")) as f:
        config = json.load(f)
    config["num_nextn_predict_layers"] = 1
    config.pop("mtp_layers_block_type", None)
    config["mtp_hybrid_override_pattern"] = MTP_PATTERN
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    # The reference, in float64: the model as transformers loads the checkpoint (which ignores mtp.*), the block from
    # the float32 values saved above.
    model = eager(NemotronHForCausalLM.from_pretrained(mdir, dtype=torch.float64, attn_implementation="eager")).eval()
    block = block.double().eval()
    tokens = torch.randint(3, CFG["vocab_size"], (L,), generator=gen)
    with torch.no_grad():
        h = model.model(input_ids=tokens[None]).last_hidden_state[0]  # after norm_f
        eps = CFG["layer_norm_epsilon"]
        e = model.model.embeddings(tokens[1:])
        x = torch.cat([rmsnorm(e, glue["enorm"].double(), eps), rmsnorm(h[:-1], glue["hnorm"].double(), eps)], dim=-1)
        x = x @ glue["eh_proj"].double().T
        g = block(inputs_embeds=x[None]).last_hidden_state[0]  # final_layernorm applied (the block's norm_f)
        logits = model.lm_head(g)
    np.save(os.path.join(out, "tokens.npy"), tokens.numpy().astype(np.int32))
    np.save(os.path.join(out, "hidden.npy"), h.numpy().astype(np.float32))
    np.save(os.path.join(out, "mtp_logits.npy"), logits.numpy().astype(np.float32))
    top2 = np.sort(logits.numpy(), axis=1)[:, -2:]
    manifest = {
        "torch": torch.__version__, "transformers": transformers.__version__, "seed": SEED, "tokens": L,
        "mtp_pattern": MTP_PATTERN, "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in CFG.items()},
        "top2_margin": (top2[:, 1] - top2[:, 0]).tolist(),
        "max_abs_logit": float(np.abs(logits.numpy()).max()),
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
    print(f"wrote {out}: {L} tokens, MTP logits [{L - 1}, {CFG['vocab_size']}]")


if __name__ == "__main__":
    main()
