#!/usr/bin/env python3
"""A Nemotron-H MoE checkpoint wide enough for llama.cpp's quantizer to use its K types (rows of 256: the fixtures'
rows are shorter, so every tensor of theirs falls back to Q5_0 / Q8_0 / F16), with 8 experts (llama.cpp treats
8-expert models' attn_k / attn_v / attn_output apart) and expert layers at 1, 3, 5, 7 of 8 (Q4_K_M gives ffn_down
more bits by block index in expert models), random weights (seeded). For gguf_quantize_check.sh:
  python3 scripts/llamacpp_bench/make_moe_quant_model.py /tmp/moe_quant
  bash scripts/llamacpp_bench/gguf_quantize_check.sh build/mambacpp /tmp/moe_quant
Standard library only (writes safetensors by hand).
"""
import json
import os
import random
import struct
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = random.Random(50)
D, H, P, N, G, K, V = 256, 8, 64, 16, 1, 4, 512  # d_model, Mamba heads, head dim, state, groups, conv, vocab
E, I, S, AH, KV, AD = 8, 256, 256, 4, 2, 64      # experts, expert width, shared width, attention heads, kv heads, dim
kinds = ["mamba", "moe", "attention", "moe", "mamba", "moe", "attention", "moe"]
DI = H * P
config = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": D,
          "vocab_size": V, "layers_block_type": kinds, "num_hidden_layers": len(kinds), "mamba_num_heads": H,
          "mamba_head_dim": P, "ssm_state_size": N, "n_groups": G, "conv_kernel": K, "chunk_size": 16,
          "num_attention_heads": AH, "num_key_value_heads": KV, "head_dim": AD, "attention_bias": False,
          "mlp_bias": False, "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu", "use_bias": False,
          "use_conv_bias": True, "layer_norm_epsilon": 1e-5, "residual_in_fp32": False, "tie_word_embeddings": False,
          "n_routed_experts": E, "num_experts_per_tok": 2, "moe_intermediate_size": I,
          "moe_shared_expert_intermediate_size": S, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
          "norm_topk_prob": True, "routed_scaling_factor": 1.0, "intermediate_size": 512, "bos_token_id": 1,
          "eos_token_id": 2, "pad_token_id": 0, "max_position_embeddings": 4096}
tensors = {}


def t(name, shape, scale=0.05, base=0.0):
    n = 1
    for d in shape:
        n *= d
    tensors[name] = (shape, struct.pack("<%df" % n, *(base + scale * (2 * rng.random() - 1) for _ in range(n))))


t("backbone.embeddings.weight", [V, D])
t("backbone.norm_f.weight", [D], 0.1, 1.0)
t("lm_head.weight", [V, D])
for i, kind in enumerate(kinds):
    p = "backbone.layers.%d." % i
    t(p + "norm.weight", [D], 0.1, 1.0)
    m = p + "mixer."
    if kind == "mamba":
        t(m + "in_proj.weight", [2 * DI + 2 * G * N + H, D])
        t(m + "conv1d.weight", [DI + 2 * G * N, 1, K], 0.3)
        t(m + "conv1d.bias", [DI + 2 * G * N], 0.1)
        t(m + "dt_bias", [H], 0.5)
        t(m + "A_log", [H], 0.5, 0.5)
        t(m + "D", [H], 0.5, 1.0)
        t(m + "norm.weight", [DI], 0.1, 1.0)
        t(m + "out_proj.weight", [D, DI])
    elif kind == "attention":
        t(m + "q_proj.weight", [AH * AD, D])
        t(m + "k_proj.weight", [KV * AD, D])
        t(m + "v_proj.weight", [KV * AD, D])
        t(m + "o_proj.weight", [D, AH * AD])
    else:
        t(m + "gate.weight", [E, D], 0.2)
        t(m + "gate.e_score_correction_bias", [E], 0.1)
        for e in range(E):
            t(m + "experts.%d.up_proj.weight" % e, [I, D])
            t(m + "experts.%d.down_proj.weight" % e, [D, I])
        t(m + "shared_experts.up_proj.weight", [S, D])
        t(m + "shared_experts.down_proj.weight", [D, S])

header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    shape, blob = tensors[name]
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
