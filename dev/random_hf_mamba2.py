#!/usr/bin/env python3
"""A transformers Mamba-2 checkpoint of random weights at a released model's shape (config.json + one
model.safetensors), made on the GPU in seconds: the target and draft models of the GPU speculative-decoding rows
(`generate --model DIR --draft-model DIR2`), where dev/write_random_checkpoint.cpp (one CPU thread) takes minutes
for 2.7B parameters. Shapes as src/model/shapes.cpp: vocab 50277 padded to 50280, d_state 128, head_dim 64, one
group, conv 4, expand 2, chunk 256, tied embeddings. GPU machine:

    python3 dev/random_hf_mamba2.py mamba2-2.7b /tmp/t27 [N_LAYERS]
"""
import sys

import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

SHAPES = {"mamba2-130m": (768, 24), "mamba2-370m": (1024, 48), "mamba2-1.3b": (2048, 48), "mamba2-2.7b": (2560, 64)}


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: random_hf_mamba2.py {{{'|'.join(SHAPES)}}} OUT_DIR [N_LAYERS]")
    d_model, n_layer = SHAPES[sys.argv[1]]
    if len(sys.argv) == 4:
        n_layer = int(sys.argv[3])
    cfg = Mamba2Config(vocab_size=50280, hidden_size=d_model, num_hidden_layers=n_layer, state_size=128, expand=2,
                       conv_kernel=4, head_dim=64, num_heads=2 * d_model // 64, n_groups=1, chunk_size=256,
                       tie_word_embeddings=True, use_conv_bias=True, use_bias=False, rms_norm=True,
                       residual_in_fp32=True, torch_dtype="bfloat16")
    torch.manual_seed(5)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Mamba2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(sys.argv[2], safe_serialization=True, max_shard_size="100GB")
    print(f"{sys.argv[2]}: {sys.argv[1]}, {n_layer} layers, bf16")


if __name__ == "__main__":
    main()
