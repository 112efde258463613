#!/usr/bin/env python3
"""A Nemotron-H MoE checkpoint in the form llama.cpp's nemotron_h_moe runs, derived from
fixtures/moe/nemotron_h_moe_all_f32 (the transformers MoE fixtures have Mamba in_proj / out_proj biases or a dense
MLP layer with shared-expert biases, which llama.cpp's nemotron_h_moe has no slot for): the Mamba biases dropped
(use_bias false), and the routing keys the fixture leaves at their defaults set, so that llama.cpp's grouped
sigmoid routing is compared too: n_group 2 with topk_group 1 (a token chooses within the best of two groups of two
experts), num_experts_per_tok 2, norm_topk_prob true, routed_scaling_factor 2.5. gguf_arch_check.sh and
make_llamacpp_fixtures.sh compare it against llama.cpp (against ours on the checkpoint: it has no transformers logits).
Standard library only (writes safetensors by hand).
  python3 scripts/llamacpp_bench/make_nemotron_h_moe_variant.py fixtures/gguf_llamacpp/nemotron_h_moe_grouped
"""
import json
import os
import shutil
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.join(here, "..", "..", "fixtures", "moe", "nemotron_h_moe_all_f32")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        assert h["dtype"] == "F32", (name, h["dtype"])
        b, e = h["data_offsets"]
        tensors[name] = (h["shape"], data[b:e])
    return tensors


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        shape, blob = tensors[name]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


config = json.load(open(os.path.join(src, "config.json")))
tensors = read_safetensors(os.path.join(src, "model.safetensors"))
dropped = [n for n in tensors if n.endswith(("mixer.in_proj.bias", "mixer.out_proj.bias"))]
assert dropped, "the source fixture has no Mamba projection biases any more"
for n in dropped:
    del tensors[n]
assert config["n_routed_experts"] == 4
config.update(use_bias=False, n_group=2, topk_group=1, num_experts_per_tok=2, norm_topk_prob=True,
              routed_scaling_factor=2.5)
write_safetensors(os.path.join(out, "model.safetensors"), tensors)
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
shutil.copy(os.path.join(src, "tokens.txt"), os.path.join(out, "tokens.txt"))
