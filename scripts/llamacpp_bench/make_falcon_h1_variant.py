#!/usr/bin/env python3
"""Falcon-H1 checkpoints in forms llama.cpp's falcon-h1 runs that no transformers fixture has alone, derived from
fixtures/falcon_h1/falcon_h1_f32 (the other Falcon-H1 fixtures with these forms also have Mamba or attention biases
llama.cpp's falcon-h1 lacks, so the writer refuses them); gguf_arch_check.sh and make_llamacpp_fixtures.sh compare
them against llama.cpp:
  norm_after_gate_mlp_bias: plus a Mamba gated RMSNorm applied after the gate (mamba_rms_norm true,
    mamba_norm_before_gate false) and MLP biases (mlp_bias true), seeded (weights 1 + N(0, 0.1), biases N(0, 0.05));
  tied: tie_word_embeddings true, lm_head.weight dropped (embedding_multiplier 2.5 and lm_head_multiplier 0.7 kept:
    the writer must fold each into its own tensor).
Standard library only (writes safetensors by hand).
  python3 scripts/llamacpp_bench/make_falcon_h1_variant.py norm_after_gate_mlp_bias fixtures/gguf_llamacpp/falcon_h1_norm_after_gate_mlp_bias
  python3 scripts/llamacpp_bench/make_falcon_h1_variant.py tied fixtures/gguf_llamacpp/falcon_h1_tied
"""
import json
import os
import random
import shutil
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.join(here, "..", "..", "fixtures", "falcon_h1", "falcon_h1_f32")
form, out = sys.argv[1], sys.argv[2]
assert form in ("norm_after_gate_mlp_bias", "tied"), form
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
        tensors[name] = (h["shape"], list(struct.unpack("<%df" % ((e - b) // 4), data[b:e])))
    return tensors


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        shape, values = tensors[name]
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


config = json.load(open(os.path.join(src, "config.json")))
tensors = read_safetensors(os.path.join(src, "model.safetensors"))
if form == "tied":
    config["tie_word_embeddings"] = True
    del tensors["lm_head.weight"]
else:
    config["mamba_rms_norm"] = True
    config["mamba_norm_before_gate"] = False
    config["mlp_bias"] = True
rng = random.Random(50)
d, m, d_inner = config["hidden_size"], config["intermediate_size"], config["mamba_d_ssm"]
for i in range(config["num_hidden_layers"] if form == "norm_after_gate_mlp_bias" else 0):
    p = "model.layers.%d." % i
    tensors[p + "mamba.norm.weight"] = ([d_inner], [1 + rng.gauss(0, 0.1) for _ in range(d_inner)])
    for proj, n in (("gate_proj", m), ("up_proj", m), ("down_proj", d)):
        tensors[p + "feed_forward.%s.bias" % proj] = ([n], [rng.gauss(0, 0.05) for _ in range(n)])
write_safetensors(os.path.join(out, "model.safetensors"), tensors)
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
shutil.copy(os.path.join(src, "tokens.txt"), os.path.join(out, "tokens.txt"))
