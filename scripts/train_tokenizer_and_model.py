#!/usr/bin/env python3
"""The shipped default model: a GPT-NeoX-style byte-level BPE tokenizer and a small Mamba-2 trained on the Python
standard library, plus tokenizer fixtures and fixtures for the shipped model.

Writes (relative to --repo):
  fixtures/heldout.txt                 held-out stdlib text (documents joined by <|endoftext|>), ~60 KB
  fixtures/tokenizer/{tokenizer.json, cases.json}
  models/default/{config.json, model.safetensors, tokenizer.json, TRAINING.md}
  fixtures/default_model/{greedy.json, heldout_loss.json}

Needs a CUDA GPU, torch, transformers, tokenizers. Training is bounded by wall clock (--train-seconds).
"""

import argparse
import glob
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import Mamba2Config, Mamba2ForCausalLM

from make_fixtures import greedy_reference  # noqa: E402  (same reference procedure as the tiny fixtures)
from tiny_mamba2 import TinyMamba2LM  # noqa: E402

EOT = "<|endoftext|>"
PAD = "<|padding|>"
VOCAB = 4096
SPACE_RUNS = list(range(24, 1, -1))  # GPT-NeoX adds runs of 24 .. 2 spaces as non-special added tokens, longest first
HELDOUT_PERCENT = 3                   # sha1(relative path) % 100 < 3 -> held out (reported loss)
VALID_PERCENT = 2                     # next 2 buckets -> validation (checkpoint selection only)
HELDOUT_CAP = 60_000                  # characters of held-out text written to fixtures/heldout.txt
HELDOUT_PER_FILE = 8_000              # no file contributes more (a generated data file would otherwise dominate)
PROMPT = "def parse_args("


def log(msg):
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------------------------
# Data: the stdlib's .py files, split by a hash of their path.

def stdlib_documents():
    root = sysconfig.get_paths()["stdlib"]
    docs = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, root)
        if any(part in ("site-packages", "dist-packages", "__pycache__") for part in rel.split(os.sep)):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            docs.append((rel, text))
    return root, docs


def split_of(rel):
    bucket = int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16) % 100
    if bucket < HELDOUT_PERCENT:
        return "heldout"
    if bucket < HELDOUT_PERCENT + VALID_PERCENT:
        return "valid"
    return "train"


def cut_at_line(text, limit):
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return cut[: cut.rfind("\n") + 1] if "\n" in cut else ""


def heldout_text(docs):
    """Held-out files (path order), each cut to its first HELDOUT_PER_FILE characters at a line end, joined by
    <|endoftext|>; the last one cut at a line end to stay under HELDOUT_CAP."""
    out = ""
    for _, text in docs:
        piece = (EOT if out else "") + cut_at_line(text, HELDOUT_PER_FILE)
        if len(out) + len(piece) > HELDOUT_CAP:
            room = HELDOUT_CAP - len(out)
            cut = piece[:room]
            cut = cut[: cut.rfind("\n") + 1] if "\n" in cut else ""
            out += cut
            break
        out += piece
    return out


# --------------------------------------------------------------------------------------------------------------------
# Tokenizer

def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPACE_RUNS),
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(EOT, special=True, normalized=False),
                        AddedToken(PAD, special=True, normalized=False)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_tokens([AddedToken(" " * n, special=False, normalized=True) for n in SPACE_RUNS])
    # Pin the ByteLevel components to GPT-NeoX's exact settings (the Python constructors' defaults differ in fields
    # that do not change behaviour, e.g. the decoder's add_prefix_space) and re-read to be sure the file is valid.
    layout = json.loads(tok.to_str())
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    for key in ("pre_tokenizer", "post_processor", "decoder"):
        layout[key] = dict(byte_level)
    tok = Tokenizer.from_str(json.dumps(layout))
    assert tok.token_to_id(EOT) == 0 and tok.token_to_id(PAD) == 1
    return tok


def tokenizer_cases(source_chunk):
    cases = [
        "Hello, world! This is plain ASCII prose, with a comma and a full stop.",
        "The quick brown fox jumps over the lazy dog.",
        "", " ", "  ", "trailing spaces   ", "   leading spaces", "a\tb\t\tc", "\t\tindented with tabs",
        "line one\nline two\n\n\nline five\n", "\n", "\n\n", "windows\r\nline\r\nends\r\n", "\r\n",
        "def f(x):\n    if x:\n        return [i * 2 for i in range(x)]\n    return None\n",
        "class A:\n\tdef m(self):\n\t\tpass\n",
        "!!??...--=>", "a != b >= c <= d == e -> f ** g // h", "{[()]}<>;:@#$%^&*~`|\\/",
        "0 1 12 123 1234 12345 3.14159 2.718e-10 0x1F 1_000_000", "31415926535897932384626433832795028841971",
        "café naïve Ærøskøbing Zürich façade", "日本語の文章を書きます。", "中文，한국어 텍스트", "Привет, мир!",
        "emoji 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 🇺🇸", "❤️ ✨ 🤖",
        "e\u0301 vs \u00e9 (decomposed vs precomposed)", "A\u030a ohm \u2126 angstrom \u212b", "\u1100\u1161\u11a8",
        "text<|endoftext|>more text", "<|endoftext|>", "a <|endoftext|> b <|padding|> c", "<|endoftext",
        "mixed: English, Ελληνικά, עברית, العربية, हिन्दी, 日本",
        "it's don't we're they've I'm you'll he'd IT'S DON'T",
        "'s 't 're 've 'm 'll 'd",
        "    ", "        x = 1", "x" + " " * 25 + "y", "end with newline and spaces  \n  ",
    ]
    cases += ["a" + " " * n + "b" for n in range(2, 31)]
    cases += [" " * n for n in (3, 7, 24, 25, 30)]
    cases.append(source_chunk)
    return cases


def write_tokenizer_fixtures(tok, out_dir, source_chunk):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    rows = []
    for text in tokenizer_cases(source_chunk):
        enc = tok.encode(text, add_special_tokens=False)
        rows.append({
            "text": text,
            "ids": enc.ids,
            "tokens": enc.tokens,
            "decoded": tok.decode(enc.ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
        })
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False, indent=1)
    roundtrip = sum(r["decoded"] == r["text"] for r in rows)
    log(f"tokenizer cases: {len(rows)} written, {roundtrip} decode back to their text exactly")


# --------------------------------------------------------------------------------------------------------------------
# Model

def model_config(vocab):
    return Mamba2Config(
        vocab_size=vocab, hidden_size=256, num_hidden_layers=8, state_size=64, expand=2, head_dim=64, num_heads=8,
        n_groups=1, conv_kernel=4, chunk_size=64, use_bias=False, use_conv_bias=True, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=1, layer_norm_epsilon=1e-5, residual_in_fp32=True,
        time_step_min=0.001, time_step_max=0.1, time_step_floor=1e-4, time_step_limit=(0.0, float("inf")),
        rescale_prenorm_residual=False,
    )


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


@torch.no_grad()
def check_against_transformers(net, cfg, sample):
    """The training module must compute what transformers computes from the same weights (fp32, no TF32)."""
    set_tf32(False)
    hf = Mamba2ForCausalLM(cfg).cuda().eval()
    missing = hf.load_state_dict(net.state_dict(), strict=True)
    ours = net(sample).float()
    ref = hf(input_ids=sample, use_cache=False).logits.float()
    diff = float((ours - ref).abs().max())
    log(f"compact module vs transformers on {tuple(sample.shape)}: max|diff| = {diff:.3e} "
        f"(logits absmax {float(ref.abs().max()):.3f}) {missing}")
    assert diff < 1e-3, f"training module disagrees with transformers: {diff}"
    del hf
    set_tf32(True)


@torch.no_grad()
def mean_loss(net, ids, seq, max_windows=64):
    n = min((ids.numel() - 1) // seq, max_windows)
    x = ids[: n * seq + 1]
    inputs = x[:-1].view(n, seq)
    targets = x[1:].view(n, seq)
    total = 0.0
    for i in range(0, n, 16):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(inputs[i:i + 16])
        total += float(F.cross_entropy(logits.float().flatten(0, 1), targets[i:i + 16].flatten(), reduction="sum"))
    return total / (n * seq)


def train(net, train_ids, valid_ids, args):
    decay = [p for n, p in net.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in net.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    seq, bsz = args.seq_len, args.batch
    offsets = torch.arange(seq + 1, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    start = time.time()
    last_eval = start
    best = (float("inf"), None, 0)
    curve = []  # (step, validation loss)
    step, losses, tokens_seen = 0, [], 0
    warmup = 200
    while True:
        elapsed = time.time() - start
        if elapsed >= args.train_seconds:
            break
        frac = elapsed / args.train_seconds
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train_ids.numel() - seq - 1, (bsz,), device="cuda", generator=gen)
        batch = train_ids[starts[:, None] + offsets]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += bsz * seq
        if step % 50 == 0:
            losses.append(float(loss.detach()))
        if step % 250 == 0:
            log(f"step {step} t={elapsed:.0f}s loss={float(loss):.4f} lr={lr:.2e} "
                f"tok/s={tokens_seen / max(elapsed, 1e-9):.0f}")
        if time.time() - last_eval > 30 or time.time() - start >= args.train_seconds:
            last_eval = time.time()
            net.eval()
            v = mean_loss(net, valid_ids, seq)
            net.train()
            log(f"step {step} validation loss {v:.4f}")
            curve.append((step, v))
            if v < best[0]:
                best = (v, {k: t.detach().clone() for k, t in net.state_dict().items()}, step)
    wall = time.time() - start
    net.eval()
    v = mean_loss(net, valid_ids, seq)
    if not curve or curve[-1][0] != step:
        curve.append((step, v))
    if v < best[0]:
        best = (v, {k: t.detach().clone() for k, t in net.state_dict().items()}, step)
    net.load_state_dict(best[1])
    final_train = sum(losses[-10:]) / max(len(losses[-10:]), 1)
    return {"steps": step, "tokens_seen": tokens_seen, "train_wall_s": wall, "final_train_loss": final_train,
            "best_valid_loss": best[0], "best_step": best[2], "batch": bsz, "seq_len": seq, "peak_lr": args.lr,
            "validation_curve": curve}


@torch.no_grad()
def heldout_loss(model_dir, ids):
    """NLL (nats/token) of the shipped model over the held-out tokens: one full-context pass, and 256-token windows.
    fp32 compute on the GPU with TF32 off, weights as stored (bf16) upcast."""
    set_tf32(False)
    hf = Mamba2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    x = torch.tensor(ids, device="cuda")
    logits = hf(input_ids=x[None], use_cache=False).logits[0].float()
    full = float(F.cross_entropy(logits[:-1], x[1:]))
    w = 256
    n = x.numel() // w
    win = x[: n * w].view(n, w)
    wl = hf(input_ids=win, use_cache=False).logits.float()
    windows = float(F.cross_entropy(wl[:, :-1].flatten(0, 1), win[:, 1:].flatten()))
    del hf
    return {
        "tokens": len(ids),
        "full_context": {"nll_nats_per_token": full, "perplexity": math.exp(full), "predicted_tokens": len(ids) - 1},
        "windows_256": {"nll_nats_per_token": windows, "perplexity": math.exp(windows), "windows": n,
                        "predicted_tokens": n * (w - 1)},
        "compute": "transformers Mamba2ForCausalLM, fp32 on CUDA with TF32 off, bf16 weights upcast, use_cache=False",
    }


@torch.no_grad()
def sample_generations(model_dir, tok):
    set_tf32(False)
    hf = Mamba2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    hf.generation_config.eos_token_id = None
    ids = torch.tensor([tok.encode(PROMPT, add_special_tokens=False).ids], device="cuda")
    mask = torch.ones_like(ids)
    out = {}
    g = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=80, pad_token_id=1)
    out["greedy"] = tok.decode(g[0].tolist(), skip_special_tokens=False)
    out["sampled"] = []
    for seed in range(3):
        torch.manual_seed(seed)
        s = hf.generate(ids, attention_mask=mask, do_sample=True, temperature=0.8, top_k=50, max_new_tokens=80,
                        pad_token_id=1)
        out["sampled"].append(tok.decode(s[0].tolist(), skip_special_tokens=False))
    del hf
    return out


def write_training_md(path, info):
    t, h, g = info["train"], info["heldout"], info["generations"]
    lines = [
        "# The default model",
        "",
        "A small Mamba-2 language model trained on Python source, shipped so that the engine has a real model to run",
        "and the tests have a real tokenizer. Made by `scripts/train_tokenizer_and_model.py` (see docs/fixtures.md).",
        "",
        "## Data",
        f"- The `.py` files of the Python {info['python']} standard library on the training machine ({info['stdlib']},",
        "  without site-packages): "
        f"{info['files']['train']} files for training, {info['files']['valid']} for validation (checkpoint "
        f"selection), {info['files']['heldout']} held out.",
        f"- Split by path: bucket = int(sha1(relative path)[:8], 16) % 100; bucket < {HELDOUT_PERCENT} is held out,",
        f"  the next {VALID_PERCENT} buckets are validation, the rest training.",
        f"- Documents are separated by `{EOT}` (id 0). Training tokens: {info['tokens']['train']:,}; validation: "
        f"{info['tokens']['valid']:,}.",
        f"- `fixtures/heldout.txt`: held-out files in path order, each cut to its first {HELDOUT_PER_FILE:,} "
        f"characters at a line end (so that no one file, such as the generated `_sysconfigdata` module, dominates),",
        f"  joined by `{EOT}`, capped at {HELDOUT_CAP:,} characters: {h['characters']:,} characters, "
        f"{h['tokens']:,} tokens.",
        "",
        "## Tokenizer",
        f"- Byte-level BPE trained with the `tokenizers` library ({info['tokenizers']}), laid out like GPT-NeoX's:",
        "  NFC normalizer, ByteLevel pre-tokenizer (add_prefix_space false, use_regex true), ByteLevel decoder and",
        f"  post-processor, `{EOT}` (id 0) and `{PAD}` (id 1) special, runs of 24..2 spaces as non-special added",
        f"  tokens. {info['vocab']} tokens in all.",
        "",
        "## Model",
        f"- Mamba-2: {json.dumps(info['model'])}.",
        f"- {info['params']:,} parameters; stored in bf16 (`model.safetensors`), tied embeddings.",
        "",
        "## Training",
        f"- AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), peak lr {t['peak_lr']}, 200 warm-up steps, cosine",
        f"  over wall-clock time to 10%, gradient clipping 1.0, bf16 autocast, batch {t['batch']} x {t['seq_len']} "
        "tokens (random windows).",
        f"- {t['steps']} steps, {t['tokens_seen']:,} tokens seen, {t['train_wall_s']:.0f} s of training on "
        f"{info['device']}.",
        f"- Final training loss (mean of the last logged steps): {t['final_train_loss']:.4f} nats/token.",
        f"- Best validation loss {t['best_valid_loss']:.4f} at step {t['best_step']} (that checkpoint is shipped).",
        "- Validation loss during training (step: nats/token): "
        + ", ".join(f"{step}: {v:.3f}" for step, v in t["validation_curve"]) + ".",
        "- The data is small (a few million tokens), so the model overfits after a few epochs: training loss keeps",
        "  falling while validation loss rises. Checkpoint selection on the validation files (never on the held-out",
        "  files) picks the model before that.",
        "",
        "## Held-out loss (the shipped bf16 weights, computed in fp32)",
        f"- `fixtures/heldout.txt` as one sequence, one forward pass with full context: "
        f"{h['full_context']['nll_nats_per_token']:.4f} nats/token, perplexity "
        f"{h['full_context']['perplexity']:.3f}.",
        f"- The same tokens in {h['windows_256']['windows']} independent windows of 256 tokens: "
        f"{h['windows_256']['nll_nats_per_token']:.4f} nats/token, perplexity {h['windows_256']['perplexity']:.3f}.",
        "",
        f"## Generations for the prompt `{PROMPT}`",
        "Greedy (80 new tokens):",
        "```python",
        g["greedy"],
        "```",
    ]
    for i, s in enumerate(g["sampled"]):
        lines += [f"Sampled, temperature 0.8, top-k 50, seed {i}:", "```python", s, "```"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def train_and_save(args, tok, split, model_dir, record_path):
    def encode_docs(texts):
        ids = []
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(0)
        return torch.tensor(ids, dtype=torch.long, device="cuda")

    train_ids = encode_docs([t for _, t in split["train"]])
    valid_ids = encode_docs([t for _, t in split["valid"]])
    log(f"tokens: train {train_ids.numel():,} valid {valid_ids.numel():,}")

    vocab = (tok.get_vocab_size() + 7) // 8 * 8
    cfg = model_config(vocab)
    torch.manual_seed(0)
    net = TinyMamba2LM(cfg)
    net.init_weights(cfg, seed=0)  # on the CPU: the init uses a CPU generator
    net = net.cuda()
    params = sum(p.numel() for p in net.parameters())
    log(f"model: {params:,} parameters")
    check_against_transformers(net, cfg, train_ids[:2 * 200].view(2, 200))
    net.train()
    set_tf32(True)
    stats = train(net, train_ids, valid_ids, args)
    log(f"training done: {stats}")

    # Save through transformers so config.json and tensor names are exactly what its loader writes.
    hf = Mamba2ForCausalLM(cfg)
    hf.load_state_dict({k: v.float().cpu() for k, v in net.state_dict().items()}, strict=True)
    shutil.rmtree(model_dir, ignore_errors=True)
    hf.to(torch.bfloat16).save_pretrained(model_dir)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(model_dir, extra)):
            os.remove(os.path.join(model_dir, extra))
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    log(f"saved {model_dir}: {sorted(os.listdir(model_dir))}")
    record = {
        "train": stats, "params": params, "device": torch.cuda.get_device_name(0),
        "tokens": {"train": train_ids.numel(), "valid": valid_ids.numel()},
        "transformers": transformers.__version__, "torch": torch.__version__,
    }
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1)
    return record


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=".")
    ap.add_argument("--train-seconds", type=float, default=210.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-only", action="store_true",
                    help="keep the shipped model and its training record; redo data, held-out loss, fixtures, docs")
    args = ap.parse_args()
    t0 = time.time()
    fx = os.path.join(args.repo, "fixtures")
    model_dir = os.path.join(args.repo, "models", "default")
    os.makedirs(os.path.join(fx, "default_model"), exist_ok=True)
    record_path = os.path.join(fx, "default_model", "training.json")

    stdlib, docs = stdlib_documents()
    split = {"train": [], "valid": [], "heldout": []}
    for rel, text in docs:
        split[split_of(rel)].append((rel, text))
    log(f"stdlib {stdlib}: {len(docs)} files; " +
        ", ".join(f"{k} {len(v)} files / {sum(len(t) for _, t in v):,} chars" for k, v in split.items()))
    held = heldout_text(split["heldout"])
    with open(os.path.join(fx, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(held)

    # The tokenizer learns from a bounded sample (files in hash order, ~12 M characters) to keep its time small.
    by_hash = sorted(split["train"], key=lambda d: hashlib.sha1(d[0].encode()).hexdigest())
    sample, size = [], 0
    for _, text in by_hash:
        if size > 12_000_000:
            break
        sample.append(text)
        size += len(text)
    tok = train_tokenizer(sample)
    log(f"tokenizer trained: {tok.get_vocab_size()} tokens ({time.time() - t0:.0f}s)")
    if args.eval_only:
        shipped = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        assert shipped.to_str() == tok.to_str(), "the shipped tokenizer is not what this script trains"
    src = split["heldout"][0][1]
    write_tokenizer_fixtures(tok, os.path.join(fx, "tokenizer"), cut_at_line(src, 2048))

    if args.eval_only:
        with open(record_path) as f:
            record = json.load(f)
    else:
        record = train_and_save(args, tok, split, model_dir, record_path)

    held_ids = tok.encode(held, add_special_tokens=False).ids
    log(f"held-out text: {len(held):,} chars, {len(held_ids):,} tokens "
        f"({len(held.encode()) / len(held_ids):.2f} bytes/token)")
    held_res = heldout_loss(model_dir, held_ids)
    held_res["characters"] = len(held)
    held_res["bytes"] = len(held.encode())
    log(f"held-out: {json.dumps(held_res)}")
    with open(os.path.join(fx, "default_model", "heldout_loss.json"), "w") as f:
        json.dump(held_res, f, indent=1)

    gens = sample_generations(model_dir, tok)
    for k, v in gens.items():
        log(f"{k}: {json.dumps(v)}")

    # Greedy reference for the engine's generate tests: CPU, float64, same procedure as the tiny fixtures.
    ref = Mamba2ForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False).ids
    greedy = greedy_reference(ref, prompt_ids, new_tokens=50)
    greedy["prompt_text"] = PROMPT
    greedy["generate_text"] = tok.decode(greedy["generate_ids"], skip_special_tokens=False)
    greedy["full_pass_text"] = tok.decode(greedy["full_pass_ids"], skip_special_tokens=False)
    with open(os.path.join(fx, "default_model", "greedy.json"), "w", encoding="utf-8") as f:
        json.dump(greedy, f, ensure_ascii=False, indent=1)
    log(f"default-model greedy: agree={greedy['agree']} first_diff={greedy['first_disagreement']} "
        f"min_margin={greedy['min_full_pass_margin']:.4f} text={json.dumps(greedy['full_pass_text'])}")

    cfg = ref.config
    info = {
        "python": sys.version.split()[0], "stdlib": stdlib, "tokenizers": __import__("tokenizers").__version__,
        "files": {k: len(v) for k, v in split.items()}, "tokens": record["tokens"], "vocab": tok.get_vocab_size(),
        "params": record["params"], "train": record["train"], "heldout": held_res, "generations": gens,
        "device": record["device"],
        "model": {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "state_size",
                                               "expand", "head_dim", "num_heads", "n_groups", "conv_kernel",
                                               "chunk_size")},
    }
    write_training_md(os.path.join(model_dir, "TRAINING.md"), info)
    log(f"all done in {time.time() - t0:.0f}s; transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
