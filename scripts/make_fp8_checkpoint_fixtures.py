#!/usr/bin/env python3
"""FP8 checkpoint fixtures: ModelOpt-format directories made with torch from two tiny transformers fixtures, with the
float64 logits transformers computes from the dequantized weights.

For each source (fixtures/hybrid/nemotron_h_f32: Mamba-2, attention and MLP layers; fixtures/models/
mamba1_f32_untied_bias: Mamba-1 with x_proj [19, 80] and dt_proj [80, 3]), every projection matrix (a 2-D `.weight`
other than the embeddings, lm_head, norms and conv kernels: the nn.Linear weights) is quantized per output channel
as ModelOpt's FP8_PER_CHANNEL_PER_TOKEN does: scale = amax(|row|) / 448 in float32, bytes = (row / scale) cast to
torch.float8_e4m3fn (round to nearest even; the quotient never exceeds 448). The directory holds model.safetensors
(F8_E4M3 `<m>.weight`, F32 `<m>.weight_scale` [out], every other tensor as in the source), config.json with
quantization_config {quant_method: modelopt, quant_algo: FP8_PER_CHANNEL_PER_TOKEN, ignore: [lm_head]},
hf_quant_config.json, tokens.txt (the source's) and logits.npy: float64 [L, vocab] from transformers on the CPU, on
the same model with each FP8 weight replaced by float64(e4m3) * float64(scale) (exact in float64), loaded through
from_pretrained from a float64 safetensors copy so that transformers' own name handling applies.

Checks before writing: the float64 weights transformers loaded are exactly the dequantized ones, and the logits moved
away from the source's 16-bit-free logits by a visible amount (the quantization happened).

Run on a machine with torch + transformers + safetensors (no network), from the repository root:
    python3 scripts/make_fp8_checkpoint_fixtures.py fixtures/fp8
Outputs are small (about 200 KB in all).
"""

import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import safetensors
import torch
import transformers
from safetensors.torch import load_file, save_file

SOURCES = [
    ("nemotron_h_fp8", "fixtures/hybrid/nemotron_h_f32"),
    ("mamba1_fp8", "fixtures/models/mamba1_f32_untied_bias"),
]
ALGO = "FP8_PER_CHANNEL_PER_TOKEN"
E4M3_MAX = 448.0


def is_projection(name, t):
    if t.dim() != 2 or not name.endswith(".weight"):
        return False
    if any(name.endswith(s) for s in ("embeddings.weight", "embed_tokens.weight", "embedding.weight",
                                      "lm_head.weight")):
        return False
    return "router" not in name and not name.endswith(".gate.weight") and "norm" not in name and "conv1d" not in name


def quantize_rows(w):
    """float32 [out, in] -> (float8_e4m3fn [out, in], float32 scales [out])."""
    w = w.to(torch.float32)
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / torch.tensor(E4M3_MAX, dtype=torch.float32), torch.ones_like(amax))
    q = (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def read_config(path):
    # Python's json reads the bare Infinity some configs hold; transformers 5's {"__float__": ...} stays an object.
    with open(path) as f:
        return json.load(f)


def logits_of(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float64)


def make_one(name, src, root):
    out_dir = os.path.join(root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    config = read_config(os.path.join(src, "config.json"))
    with open(os.path.join(src, "tokens.txt")) as f:
        tokens = [int(t) for t in f.read().split()]

    fp8, deq, quantized, ignore = {}, {}, [], []
    for n, t in sorted(tensors.items()):
        if is_projection(n, t):
            q, s = quantize_rows(t)
            fp8[n] = q.contiguous()
            fp8[n + "_scale"] = s.contiguous()
            deq[n] = q.to(torch.float64) * s.to(torch.float64)[:, None]
            quantized.append(n)
        else:
            fp8[n] = t.contiguous()
            deq[n] = t.to(torch.float64)
            if t.dim() == 2 and n.endswith(".weight"):
                ignore.append(n[: -len(".weight")])
    assert quantized, f"{name}: nothing to quantize in {src}"

    save_file(fp8, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    producer = {"name": "scripts/make_fp8_checkpoint_fixtures.py (ModelOpt layout)", "version": "1"}
    qconfig = dict(config)
    qconfig["quantization_config"] = {"quant_method": "modelopt", "quant_algo": ALGO, "ignore": ignore,
                                      "kv_cache_scheme": None, "producer": producer}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(qconfig, f, indent=2)
    with open(os.path.join(out_dir, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": producer, "quantization": {"quant_algo": ALGO, "kv_cache_quant_algo": None,
                                                          "exclude_modules": ignore}}, f, indent=2)
    shutil.copy(os.path.join(src, "tokens.txt"), os.path.join(out_dir, "tokens.txt"))

    # The written file reads back as the bytes and scales quantized above.
    back = load_file(os.path.join(out_dir, "model.safetensors"))
    for n in quantized:
        assert back[n].dtype == torch.float8_e4m3fn and torch.equal(back[n].view(torch.uint8), fp8[n].view(torch.uint8))
        assert back[n + "_scale"].dtype == torch.float32 and torch.equal(back[n + "_scale"], fp8[n + "_scale"])

    # The reference: transformers' model of the source config with the dequantized weights, in float64.
    with tempfile.TemporaryDirectory() as tmp:
        save_file({n: t.contiguous() for n, t in deq.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        shutil.copy(os.path.join(src, "config.json"), os.path.join(tmp, "config.json"))
        kwargs = dict(dtype=torch.float64)
        if config.get("model_type") != "mamba":
            kwargs["attn_implementation"] = "eager"
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp, output_loading_info=True, **kwargs)
        model, info = loaded if isinstance(loaded, tuple) else (loaded, {})
        model.eval()
        problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        assert not problems, f"{name}: transformers did not load every weight of the dequantized copy: {problems}"
        state = model.state_dict()
        matched = 0
        for n in quantized:
            # transformers may name a parameter differently from the file (a prefix); find it by suffix.
            hits = [k for k in state if k == n or k.endswith("." + n.split(".", 1)[1])]
            if len(hits) != 1:
                continue  # renamed beyond a prefix: covered by the loading-info check above
            got = state[hits[0]]
            if got.dtype == torch.float64:
                assert torch.equal(got, deq[n]), f"{name}: {n} did not load as the dequantized weight"
            else:  # a module transformers keeps in another dtype: one rounding of the exact product
                print(f"[fp8] note: {name}: {hits[0]} is held in {got.dtype}", flush=True)
                assert torch.allclose(got.to(torch.float64), deq[n], rtol=1e-6, atol=0), f"{name}: {n} differs"
            matched += 1
        logits = logits_of(model, tokens)
    source_logits = np.load(os.path.join(src, "logits.npy")).astype(np.float64)
    moved = float(np.abs(logits.numpy() - source_logits).max() / np.abs(source_logits).max())
    assert torch.isfinite(logits).all() and moved > 1e-4, f"{name}: logits moved {moved} from the source's"
    np.save(os.path.join(out_dir, "logits.npy"), logits.numpy())
    print(f"[fp8] {name}: {len(quantized)} FP8 matrices ({matched} checked in the loaded model), logits "
          f"{tuple(logits.shape)}, max |fp8 - source| / max |source| = {moved:.3f}", flush=True)
    return {"source": src, "quant_algo": ALGO, "quantized": quantized, "ignore": ignore, "L": len(tokens),
            "max_rel_change_from_source_logits": moved, "files": sorted(os.listdir(out_dir))}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 scripts/make_fp8_checkpoint_fixtures.py OUT_DIR (e.g. fixtures/fp8)")
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    torch.set_num_threads(4)
    manifest = {
        "generator": "scripts/make_fp8_checkpoint_fixtures.py",
        "transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__,
        "safetensors": safetensors.__version__, "python": sys.version.split()[0],
        "reference": "CPU, float64 logits of the source model with each FP8 weight dequantized exactly "
                     "(float64(e4m3) * float64(scale)), eager attention, one full pass (use_cache=False)",
        "models": {},
    }
    for name, src in SOURCES:
        manifest["models"][name] = make_one(name, src, root)
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
