#!/usr/bin/env python3
"""Fixtures for the pickled-checkpoint reader and FalconMamba: tiny random models written the way users have them
(mamba_ssm directories with pytorch_model.bin, sharded, deflated, bf16; FalconMamba through transformers), each with
float64 reference logits and greedy generations, plus a seed corpus of small torch.save files for the fuzz targets.

mamba_ssm directories: a transformers model (Mamba2ForCausalLM / MambaForCausalLM) is initialised as in
make_fixtures.py, rounded to its storage dtype, and its state dict renamed to mamba_ssm's names
(backbone.embeddings.weight -> backbone.embedding.weight; every other name is the same in both) and written with
torch.save, next to a mamba_ssm config.json whose vocab_size is smaller than the embedding (pad_vocab_size_multiple).
The reference is that transformers model in float64 on the CPU; the script checks that the files written describe it
by loading them back with torch.load(weights_only=True) into a fresh model (same logits within 1e-12).

Run on a machine with torch + transformers, from the repository root:
    python3 scripts/make_checkpoint_fixtures.py --out fixtures/checkpoints --corpus fuzz/corpus
"""

import argparse
import collections
import hashlib
import io
import json
import os
import shutil
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
for extra in ("scripts", os.path.join(os.getcwd(), "scripts")):
    if os.path.isdir(extra):
        sys.path.insert(0, extra)

import make_fixtures as mf  # noqa: E402  (sets HF_HUB_OFFLINE, imports torch/transformers)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (FalconMambaConfig, FalconMambaForCausalLM, Mamba2Config, Mamba2ForCausalLM,  # noqa: E402
                          MambaConfig, MambaForCausalLM)

L_TOKENS = mf.L_TOKENS

SPECS = [
    # mamba_ssm, Mamba-2, bf16, tied (lm_head.weight shares the embedding's storage), 2 groups, vocab 61 padded to 64.
    dict(name="mamba2_ssm_bf16_tied", kind="mamba_ssm", arch="mamba2", dtype="bf16", layout="single", vocab=61,
         pad=8, cfg=dict(hidden_size=32, num_hidden_layers=2, expand=2, head_dim=16, num_heads=4, n_groups=2,
                         state_size=8, chunk_size=8, conv_kernel=4, use_bias=False, use_conv_bias=True,
                         tie_word_embeddings=True, time_step_limit=(0.0, float("inf")))),
    # mamba_ssm, Mamba-1, f32, untied, three shards + pytorch_model.bin.index.json; the middle shard pickled with
    # protocol 4 (FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL); vocab 50 padded to 56.
    dict(name="mamba1_ssm_f32_sharded", kind="mamba_ssm", arch="mamba1", dtype="f32", layout="sharded", vocab=50,
         pad=8, cfg=dict(hidden_size=24, num_hidden_layers=3, state_size=8, conv_kernel=4, expand=2,
                         time_step_rank="auto", use_bias=False, use_conv_bias=True, tie_word_embeddings=False)),
    # mamba_ssm, Mamba-2, fp16, untied, in/out projection biases, every zip entry deflated; vocab 70 padded to 72.
    dict(name="mamba2_ssm_fp16_deflated", kind="mamba_ssm", arch="mamba2", dtype="fp16", layout="deflated", vocab=70,
         pad=8, cfg=dict(hidden_size=24, num_hidden_layers=2, expand=2, head_dim=16, num_heads=3, n_groups=1,
                         state_size=16, chunk_size=16, conv_kernel=4, use_bias=True, use_conv_bias=True,
                         tie_word_embeddings=False, time_step_limit=(0.0, float("inf")))),
    # FalconMamba through transformers' own writer (pytorch_model.bin), f32; intermediate_size given beside an
    # expand that disagrees with it (as tiiuae/falcon-mamba-7b's config.json has: expand 16, intermediate 2 x hidden),
    # and a large mixer_rms_eps so that reading the wrong eps shows.
    dict(name="falcon_mamba_f32_bin", kind="transformers", arch="falcon_mamba", dtype="f32", layout="save_pretrained_bin",
         cfg=dict(hidden_size=32, num_hidden_layers=2, vocab_size=72, state_size=8, conv_kernel=4, expand=16,
                  intermediate_size=64, time_step_rank="auto", use_bias=False, use_conv_bias=True,
                  tie_word_embeddings=False, mixer_rms_eps=0.01)),
    # FalconMamba, bf16 safetensors, tied, projection biases, default mixer_rms_eps (1e-6), conv kernel 3.
    dict(name="falcon_mamba_bf16_tied", kind="transformers", arch="falcon_mamba", dtype="bf16", layout="save_pretrained",
         cfg=dict(hidden_size=24, num_hidden_layers=3, vocab_size=67, state_size=16, conv_kernel=3, expand=2,
                  time_step_rank="auto", use_bias=True, use_conv_bias=True, tie_word_embeddings=True)),
]

CLASSES = {"mamba1": (MambaConfig, MambaForCausalLM), "mamba2": (Mamba2Config, Mamba2ForCausalLM),
           "falcon_mamba": (FalconMambaConfig, FalconMambaForCausalLM)}


def padded(v, m):
    return (v + m - 1) // m * m


def build(spec):
    common = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0, layer_norm_epsilon=1e-5, residual_in_fp32=True)
    cfg_cls, model_cls = CLASSES[spec["arch"]]
    cfg = dict(spec["cfg"])
    if spec["kind"] == "mamba_ssm":
        cfg["vocab_size"] = padded(spec["vocab"], spec["pad"])
    return model_cls(cfg_cls(**common, **cfg))


def mamba_ssm_config(spec, model):
    c = model.config
    if spec["arch"] == "mamba2":
        ssm = dict(layer="Mamba2", d_state=c.state_size, d_conv=c.conv_kernel, expand=c.expand, headdim=c.head_dim,
                   ngroups=c.n_groups, chunk_size=c.chunk_size, bias=c.use_bias, conv_bias=c.use_conv_bias)
    else:
        ssm = dict(layer="Mamba1", d_state=c.state_size, d_conv=c.conv_kernel, expand=c.expand, dt_rank="auto",
                   bias=c.use_bias, conv_bias=c.use_conv_bias)
    return {"d_model": c.hidden_size, "d_intermediate": 0, "n_layer": c.num_hidden_layers, "vocab_size": spec["vocab"],
            "ssm_cfg": ssm, "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True,
            "fused_add_norm": True, "pad_vocab_size_multiple": spec["pad"], "tie_embeddings": bool(c.tie_word_embeddings)}


def to_mamba_ssm_names(sd):
    out = collections.OrderedDict()
    for k, v in sd.items():
        out["backbone.embedding.weight" if k == "backbone.embeddings.weight" else k] = v
    return out


def from_mamba_ssm_names(sd):
    return {("backbone.embeddings.weight" if k == "backbone.embedding.weight" else k): v for k, v in sd.items()}


def deflate_zip(src, dst):
    """Rewrites a torch.save zip with every entry deflated (same names, same order, same bytes)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename), compress_type=zipfile.ZIP_DEFLATED)


def write_mamba_ssm(spec, model, out_dir):
    sd = to_mamba_ssm_names(model.state_dict())
    if spec["arch"] == "mamba2" and model.config.tie_word_embeddings:
        assert sd["lm_head.weight"].data_ptr() == sd["backbone.embedding.weight"].data_ptr(), "tied copy not shared"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(mamba_ssm_config(spec, model), f, indent=2)
    layout = spec["layout"]
    if layout in ("single", "deflated"):
        path = os.path.join(out_dir, "pytorch_model.bin")
        torch.save(sd, path)
        if layout == "deflated":
            tmp = path + ".stored"
            os.rename(path, tmp)
            deflate_zip(tmp, path)
            with zipfile.ZipFile(tmp) as a, zipfile.ZipFile(path) as b:
                assert [i.filename for i in a.infolist()] == [i.filename for i in b.infolist()]
                for i in a.infolist():
                    assert a.read(i.filename) == b.read(i.filename)
                assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in b.infolist())
            os.remove(tmp)
        return
    # Sharded: the embedding + norm_f + lm_head, then the layers split in two.
    n = model.config.num_hidden_layers
    groups = [collections.OrderedDict() for _ in range(3)]
    for k, v in sd.items():
        if k.startswith("backbone.layers."):
            i = int(k.split(".")[2])
            groups[1 if i < (n + 1) // 2 else 2][k] = v
        else:
            groups[0][k] = v
    weight_map, total = {}, 0
    for s, g in enumerate(groups):
        fname = f"pytorch_model-{s + 1:05d}-of-{len(groups):05d}.bin"
        torch.save(g, os.path.join(out_dir, fname), pickle_protocol=4 if s == 1 else 2)
        for k, v in g.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    with open(os.path.join(out_dir, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)


def torch_load_own_file(path, notes):
    """torch.load of a file this script wrote: weights_only first; where that refuses (torch 2.11's restricted
    unpickler has no FRAME opcode, so protocol 4 fails) or cannot inflate, the full unpickler (trusted: our own
    file), then a stored copy of the same entries."""
    name = os.path.basename(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        notes[name] = "weights_only=True failed: " + " ".join(str(e).split())[-160:]
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        notes[name] += " | weights_only=False failed: " + " ".join(str(e).split())[-160:]
    buf = io.BytesIO()
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    buf.seek(0)
    notes[name] += " | read from a stored copy"
    return torch.load(buf, map_location="cpu", weights_only=False)


def load_mamba_ssm_back(spec, out_dir, notes):
    """The files as torch itself reads them, into a fresh float64 model."""
    sd = {}
    for fname in sorted(os.listdir(out_dir)):
        if fname.endswith(".bin"):
            sd.update(torch_load_own_file(os.path.join(out_dir, fname), notes))
    model = build(spec)
    missing, unexpected = model.load_state_dict(from_mamba_ssm_names(sd), strict=False)
    assert not unexpected, unexpected
    assert not [m for m in missing if m != "lm_head.weight"], missing
    if spec["arch"] in ("mamba1", "mamba2") and model.config.tie_word_embeddings:
        model.tie_weights()
    model = model.double().eval()
    mf.set_norm_groups(model)
    return model


def write_transformers(spec, model, out_dir):
    if spec["layout"] == "save_pretrained_bin":
        try:
            model.save_pretrained(out_dir, safe_serialization=False)
        except Exception as e:
            print(f"[ckpt] save_pretrained(safe_serialization=False) failed: {e}", flush=True)
        if not os.path.exists(os.path.join(out_dir, "pytorch_model.bin")):
            # This transformers version no longer writes pickles: the same file by hand.
            for f in os.listdir(out_dir):
                if f.endswith(".safetensors") or f.endswith(".index.json"):
                    os.remove(os.path.join(out_dir, f))
            model.config.save_pretrained(out_dir)
            torch.save(model.state_dict(), os.path.join(out_dir, "pytorch_model.bin"))
    else:
        model.save_pretrained(out_dir)
    gc = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)


def make_one(spec, root, index):
    name = spec["name"]
    out_dir = os.path.join(root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    torch.manual_seed(seed)
    model = build(spec)
    mf.init_weights(model, seed)
    model = model.to(mf.DTYPES[spec["dtype"]]).eval()
    if spec["kind"] == "mamba_ssm":
        write_mamba_ssm(spec, model, out_dir)
    else:
        write_transformers(spec, model, out_dir)

    vocab = model.config.vocab_size
    real_vocab = spec.get("vocab", vocab)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, real_vocab, (L_TOKENS,), generator=gen).tolist()
    prompt = torch.randint(0, real_vocab, (mf.PROMPT_LEN,), generator=gen).tolist()

    mem = model.double()
    mf.set_norm_groups(mem)
    load_notes = {}
    if spec["kind"] == "mamba_ssm":
        ref = load_mamba_ssm_back(spec, out_dir, load_notes)
    else:
        try:
            ref = CLASSES[spec["arch"]][1].from_pretrained(out_dir, dtype=torch.float64).eval()
        except Exception as e:
            load_notes["from_pretrained"] = " ".join(str(e).split())[-200:]
            ref = build(spec)
            for fname in sorted(os.listdir(out_dir)):
                if fname.endswith(".bin"):
                    ref.load_state_dict(torch_load_own_file(os.path.join(out_dir, fname), load_notes), strict=False)
                elif fname.endswith(".safetensors"):
                    import safetensors.torch
                    ref.load_state_dict(safetensors.torch.load_file(os.path.join(out_dir, fname)), strict=False)
            if ref.config.tie_word_embeddings:
                ref.tie_weights()
            ref = ref.double().eval()
    logits = mf.logits_of(ref, tokens)
    diff_reload = float((mf.logits_of(mem, tokens) - logits).abs().max())
    assert diff_reload < 1e-9, f"{name}: files differ from the in-memory model by {diff_reload}"
    del mem
    std = float(logits.std())
    assert std > 0.3 and torch.isfinite(logits).all(), f"{name}: logits std {std}"
    worst_change, worst_name = mf.parameter_sensitivity(ref, tokens, logits)
    assert worst_change > 1e-5, f"{name}: parameter {worst_name} barely matters ({worst_change})"

    with open(os.path.join(out_dir, "tokens.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")
    np.save(os.path.join(out_dir, "logits.npy"), logits.to(torch.float32).numpy())
    greedy = mf.greedy_reference(ref, prompt)
    with open(os.path.join(out_dir, "greedy.json"), "w") as f:
        json.dump(greedy, f, indent=1)
    files = sorted(os.listdir(out_dir))
    entry = dict(kind=spec["kind"], arch=spec["arch"], dtype=spec["dtype"], layout=spec["layout"],
                 embedding_rows=vocab, tokenizer_vocab=real_vocab, tied=bool(model.config.tie_word_embeddings),
                 d_inner=int(model.backbone.layers[0].mixer.intermediate_size
                             if hasattr(model.backbone.layers[0].mixer, "intermediate_size") else -1),
                 files=files, logits_std=std, logits_absmax=float(logits.abs().max()),
                 reload_vs_memory_max_abs=diff_reload, min_relative_logit_change_per_param_1pct=worst_change,
                 least_sensitive_param=worst_name, greedy_agree=greedy["agree"],
                 greedy_min_margin=greedy["min_full_pass_margin"], torch_load_notes=load_notes)
    index[name] = entry
    print(f"[ckpt] {name:26s} std={std:.3f} absmax={entry['logits_absmax']:.2f} min_param={worst_change:.2e} "
          f"greedy_agree={greedy['agree']} margin={greedy['min_full_pass_margin']:.3g} files={files}", flush=True)


def make_corpus(corpus_root):
    """Small torch.save files covering what the reader accepts and refuses; data.pkl of each for the pickle target."""
    zdir = os.path.join(corpus_root, "torch_checkpoint")
    pdir = os.path.join(corpus_root, "torch_pickle")
    for d in (zdir, pdir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    g = torch.Generator().manual_seed(7)
    base = torch.randn(10, generator=g)
    lin = torch.nn.Linear(3, 2)
    seeds = {
        "f32": ({"w": torch.randn(2, 3, generator=g)}, {}),
        "mixed_dtypes": (collections.OrderedDict(a=torch.randn(4, generator=g).half(),
                                                 b=torch.randn(2, 2, generator=g).bfloat16(),
                                                 c=torch.tensor(1.5), d=torch.zeros(0, 4)), {}),
        "views": ({"a": base[2:6], "b": base[:3], "c": base.view(2, 5)[1]}, {}),
        "tied": ({"emb": base.view(5, 2), "head": base.view(5, 2)}, {}),
        "linear_state_dict": (lin.state_dict(), {}),
        "parameter": ({"p": torch.nn.Parameter(torch.randn(3, generator=g))}, {}),
        "proto4": ({"x": torch.randn(3, 2, generator=g), "y": torch.randn(2, generator=g).bfloat16()},
                   {"pickle_protocol": 4}),
        "noncontiguous": ({"t": torch.randn(3, 4, generator=g).t()}, {}),
        "int64": ({"i": torch.arange(4)}, {}),
        "four_dims": ({"t": torch.randn(1, 2, 1, 3, generator=g)}, {}),
        "legacy": ({"w": torch.randn(2, generator=g)}, {"_use_new_zipfile_serialization": False}),
    }
    for name, (obj, kw) in seeds.items():
        buf = io.BytesIO()
        torch.save(obj, buf, **kw)
        data = buf.getvalue()
        with open(os.path.join(zdir, name + ".pt"), "wb") as f:
            f.write(data)
        if data[:2] == b"PK":
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                pkl = [n for n in z.namelist() if n.endswith("/data.pkl")]
                with open(os.path.join(pdir, name + ".pkl"), "wb") as f:
                    f.write(z.read(pkl[0]))
    src = os.path.join(zdir, "mixed_dtypes.pt")
    deflate_zip(src, os.path.join(zdir, "mixed_dtypes_deflated.pt"))
    try:
        back = torch.load(os.path.join(zdir, "mixed_dtypes_deflated.pt"), weights_only=True)
        deflated_loads = all(torch.equal(back[k], seeds["mixed_dtypes"][0][k]) for k in back)
    except Exception as e:  # recorded, not fatal: the reader's own tests cover deflated entries
        deflated_loads = f"no: {type(e).__name__}: {e}"
    print(f"[corpus] {len(os.listdir(zdir))} checkpoint seeds, {len(os.listdir(pdir))} pickle seeds; "
          f"torch.load reads the deflated seed: {deflated_loads}", flush=True)
    return {"torch_load_reads_deflated": deflated_loads}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="fixtures/checkpoints")
    ap.add_argument("--corpus", default="fuzz/corpus")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    mf.use_grouped_norm(True)
    os.makedirs(args.out, exist_ok=True)
    index = {}
    for spec in SPECS:
        make_one(spec, args.out, index)
    corpus = make_corpus(args.corpus)
    manifest = {
        "generator": "scripts/make_checkpoint_fixtures.py",
        "transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__,
        "python": sys.version.split()[0],
        "reference": "CPU, float64 after rounding weights to the storage dtype (transformers keeps some "
                     "intermediates in fp32); Mamba-2 gated RMSNorm group-wise (mamba_ssm semantics).",
        "corpus": corpus,
        "models": index,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"[ckpt] wrote {len(index)} models under {args.out}", flush=True)


if __name__ == "__main__":
    main()
