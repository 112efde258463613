#!/usr/bin/env python3
"""A draft model for speculative decoding made of a model's first N layers (its embeddings, final norm and LM head
kept): the same vocabulary, a fraction of the bytes per token. Standard library only: the safetensors file is
copied tensor by tensor, bytes unchanged.

    python3 scripts/make_layer_skip_draft.py models/default 2 /tmp/default-draft2
    mambacpp generate --model models/default --draft-model /tmp/default-draft2 -p "..."

With --tail-scale S it writes instead a target for benchmarks whose drafts are accepted at a rate set by S: the whole
model, with the contribution of every layer from N on to the residual stream multiplied by S (a Mamba-2 layer's
gated norm weight `mixer.norm.weight`, which feeds out_proj, and out_proj's bias where there is one). The first N
layers are the model's, so the N-layer draft of either agrees with it exactly at S = 0 and less as S grows, while
the target still reads every weight (the step cost of the real shape). Mamba-2 layers only; F32, BF16 or F16.

    python3 scripts/make_layer_skip_draft.py --tail-scale 0.25 /tmp/t27 8 /tmp/t27-s0.25
"""
import array
import json
import os
import re
import shutil
import struct
import sys

SCALED = re.compile(r"\.layers\.(\d+)\.mixer\.(norm\.weight|out_proj\.bias)$")


def scaled_bytes(raw, dtype, scale, name):
    """`raw` (little-endian) times `scale`, in the same dtype (BF16: rounded to nearest even)."""
    if dtype == "F32":
        a = array.array("f", raw)
        return array.array("f", [x * scale for x in a]).tobytes()
    if dtype == "F16":
        n = len(raw) // 2
        vals = struct.unpack(f"<{n}e", raw)
        return struct.pack(f"<{n}e", *[x * scale for x in vals])
    if dtype == "BF16":
        n = len(raw) // 2
        wide = bytearray(4 * n)  # bf16 is the top half of an f32
        wide[2::4], wide[3::4] = raw[0::2], raw[1::2]
        a = array.array("f", bytes(wide))
        bits = array.array("I", array.array("f", [x * scale for x in a]).tobytes())
        out = array.array("H", [((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF for b in bits])
        return out.tobytes()
    sys.exit(f"--tail-scale: tensor '{name}' is {dtype}; expected F32, BF16 or F16")


def main():
    args = sys.argv[1:]
    scale = None
    if args[:1] == ["--tail-scale"] and len(args) >= 2:
        scale = float(args[1])
        args = args[2:]
    if len(args) != 3:
        sys.exit("usage: make_layer_skip_draft.py [--tail-scale S] MODEL_DIR N_LAYERS OUT_DIR")
    src, n_keep, out = args[0], int(args[1]), args[2]
    cfg = json.load(open(os.path.join(src, "config.json")))
    layer_key = next(k for k in ("num_hidden_layers", "n_layer") if k in cfg)
    if not 1 <= n_keep <= cfg[layer_key]:
        sys.exit(f"N_LAYERS must be in [1, {cfg[layer_key]}], found {n_keep}")
    path = os.path.join(src, "model.safetensors")
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
    base = 8 + header_len
    kept, plan, offset, scaled = {}, [], 0, 0
    for name, info in header.items():
        if name == "__metadata__":
            kept[name] = info
            continue
        m = re.search(r"\.layers\.(\d+)\.", name)
        if scale is None and m and int(m.group(1)) >= n_keep:
            continue
        begin, end = info["data_offsets"]
        s = SCALED.search(name)
        do_scale = scale is not None and s is not None and int(s.group(1)) >= n_keep
        scaled += do_scale
        plan.append((begin, end, do_scale, info["dtype"], name))
        kept[name] = dict(info, data_offsets=[offset, offset + end - begin])
        offset += end - begin
    if scale is not None and scaled == 0:
        sys.exit(f"--tail-scale: no 'layers.N.mixer.norm.weight' from layer {n_keep} on in {path} (Mamba-2 only)")
    os.makedirs(out, exist_ok=True)
    head = json.dumps(kept).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "rb") as f, open(os.path.join(out, "model.safetensors"), "wb") as o:
        o.write(struct.pack("<Q", len(head)))
        o.write(head)
        for begin, end, do_scale, dtype, name in plan:
            f.seek(base + begin)
            raw = f.read(end - begin)
            o.write(scaled_bytes(raw, dtype, scale, name) if do_scale else raw)
    if scale is None:
        cfg[layer_key] = n_keep
        if "layers_block_type" in cfg:
            cfg["layers_block_type"] = cfg["layers_block_type"][:n_keep]
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    for extra in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), out)
    if scale is None:
        print(f"{out}: {n_keep} of the model's layers")
    else:
        print(f"{out}: the model, layers {n_keep}.. scaled by {scale} ({scaled} tensors)")


if __name__ == "__main__":
    main()
