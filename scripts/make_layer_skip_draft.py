#!/usr/bin/env python3
"""A draft model for speculative decoding made of a model's first N layers (its embeddings, final norm and LM head
kept): the same vocabulary, a fraction of the bytes per token. Standard library only: the safetensors file is
copied tensor by tensor, bytes unchanged.

    python3 scripts/make_layer_skip_draft.py models/default 2 /tmp/default-draft2
    mambacpp generate --model models/default --draft-model /tmp/default-draft2 -p "..."
"""
import json
import os
import re
import shutil
import struct
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: make_layer_skip_draft.py MODEL_DIR N_LAYERS OUT_DIR")
    src, n_keep, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cfg = json.load(open(os.path.join(src, "config.json")))
    layer_key = next(k for k in ("num_hidden_layers", "n_layer") if k in cfg)
    if not 1 <= n_keep <= cfg[layer_key]:
        sys.exit(f"N_LAYERS must be in [1, {cfg[layer_key]}], found {n_keep}")
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        data = f.read()
    kept, blobs, offset = {}, [], 0
    for name, info in header.items():
        if name == "__metadata__":
            kept[name] = info
            continue
        m = re.search(r"\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) >= n_keep:
            continue
        begin, end = info["data_offsets"]
        blobs.append(data[begin:end])
        kept[name] = dict(info, data_offsets=[offset, offset + end - begin])
        offset += end - begin
    os.makedirs(out, exist_ok=True)
    head = json.dumps(kept).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)
    cfg[layer_key] = n_keep
    if "layers_block_type" in cfg:
        cfg["layers_block_type"] = cfg["layers_block_type"][:n_keep]
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    for extra in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), out)
    print(f"{out}: {n_keep} of the model's layers")


if __name__ == "__main__":
    main()
