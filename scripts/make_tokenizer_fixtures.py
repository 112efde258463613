#!/usr/bin/env python3
"""Tokenizer fixtures of the other model families, made with the HF `tokenizers` library.

Trains small BPE vocabularies on local text (the Python standard library plus a few lines of many scripts written
below: nothing is downloaded), wraps them in the pipelines other model families ship (Llama-3-style byte-level with a
Split regex, SentencePiece-style with byte fallback, and several others that exercise every supported normalizer,
pre-tokenizer, post-processor and decoder), and writes for each

  <out>/<name>/tokenizer.json   as tokenizers saves it
  <out>/<name>/cases.json       {"encode": [{text, ids, ids_special, tokens, decoded, decoded_skip_special}],
                                 "decode": [{ids, decoded, decoded_skip_special}]}

plus <out>/manifest.json (library version, what each pipeline holds, HF's single-thread encode speed on the bench
texts and a hash of the ids, so that the C++ bench can check it produced the same tokens).

Run on the machine that has `tokenizers` (see docs/tokenizers.md):
  python3 scripts/make_tokenizer_fixtures.py --out fixtures/tokenizers --bench-text bench.txt
"""

import argparse
import glob
import hashlib
import json
import os
import random
import struct
import sys
import sysconfig
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # HF's single-thread figure
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402
from tokenizers import processors, trainers  # noqa: E402

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPM = "\u2581"


def log(msg):
    print(f"[tok {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------------------------
# Training text

MULTILINGUAL = [
    "Les élèves étudient la géométrie à l'école, où ça se passe très bien.",
    "Der Fußgänger überquert die Straße bei Grün; Schöne Grüße aus München.",
    "El niño comió piñata y jalapeños en la mañana del año nuevo.",
    "Привет, как дела? Сегодня хорошая погода в Москве.",
    "Καλημέρα σας, τι κάνετε σήμερα; Η θάλασσα είναι ήσυχη.",
    "日本語の文章を書きます。東京は大きな都市です。",
    "中文文本处理很有趣，我们今天学习分词。",
    "한국어 텍스트를 처리합니다. 서울은 큰 도시입니다.",
    "مرحبا بكم في عالم البرمجة", "שלום עולם, מה שלומך", "नमस्ते दुनिया, आप कैसे हैं",
    "emoji 😀 👍 ❤️ 🎉 and more text 2024-01-01 12:30:45",
]


def training_texts(limit_bytes):
    root = sysconfig.get_paths()["stdlib"]
    texts, total = [], 0
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, root)
        if any(part in ("site-packages", "dist-packages", "__pycache__", "test", "tests") for part in rel.split(os.sep)):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text.encode())
        if total >= limit_bytes:
            break
    texts += MULTILINGUAL * 20
    return texts


def lines_of(texts):
    out = []
    for t in texts:
        out += [line for line in t.split("\n") if line.strip()]
    return out


# --------------------------------------------------------------------------------------------------------------------
# Vocabularies. Each is trained once and shared by several pipelines (the pipeline is set on the JSON afterwards).

def trained_layout(tok):
    return json.loads(tok.to_str())


def train_byte_level(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return trained_layout(tok)


def train_sentencepiece_like(texts, vocab_size):
    """A ▁-word BPE with a small alphabet (so CJK, emoji and rare letters need byte fallback), laid out like
    Llama-2's vocabulary: <unk> <s> </s>, then <0x00>..<0xFF>, then the learnt tokens."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPM), normalizers.Replace(" ", SPM)])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, limit_alphabet=90,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(lines_of(texts), trainer=trainer)
    layout = trained_layout(tok)
    old = sorted(layout["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {}
    for token, _ in old[:3]:
        vocab[token] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for token, _ in old[3:]:
        if token not in vocab:
            vocab[token] = len(vocab)
    layout["model"]["vocab"] = vocab
    for t in layout["added_tokens"]:
        t["id"] = vocab[t["content"]]
    return layout


def train_word_bpe(texts, vocab_size, prefix=None, suffix=None):
    kwargs = {}
    if prefix:
        kwargs["continuing_subword_prefix"] = prefix
    if suffix:
        kwargs["end_of_word_suffix"] = suffix
    tok = Tokenizer(models.BPE(unk_token="[UNK]", **kwargs))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, limit_alphabet=70,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], **kwargs)
    tok.train_from_iterator(texts, trainer=trainer)
    return trained_layout(tok)


# --------------------------------------------------------------------------------------------------------------------
# Pipelines (what each tokenizer.json is made of). Components are built with the library's own classes and
# serialised by it, so the JSON is exactly what HF writes.

def comp(obj):
    """A component's JSON, as the library serialises it."""
    t = Tokenizer(models.BPE())
    if isinstance(obj, normalizers.Normalizer):
        t.normalizer = obj
        return json.loads(t.to_str())["normalizer"]
    if isinstance(obj, pre_tokenizers.PreTokenizer):
        t.pre_tokenizer = obj
        return json.loads(t.to_str())["pre_tokenizer"]
    if isinstance(obj, decoders.Decoder):
        t.decoder = obj
        return json.loads(t.to_str())["decoder"]
    t.post_processor = obj
    return json.loads(t.to_str())["post_processor"]


def template(single, specials, layout):
    ids = {tok["content"]: tok["id"] for tok in layout["added_tokens"]}
    return processors.TemplateProcessing(single=single, pair=single + " " + single.replace("$A", "$B:1"),
                                         special_tokens=[(s, ids[s]) for s in specials])


def build(*args, **kwargs):
    try:
        return build_one(*args, **kwargs)
    except Exception as e:  # one broken pipeline must not cost the others
        log(f"pipeline failed: {type(e).__name__}: {e}")
        return None


def build_one(layout, normalizer=None, pre_tokenizer=None, post_processor=None, decoder=None, model_fields=None,
          added=(), extra_vocab=()):
    layout = json.loads(json.dumps(layout))
    layout["normalizer"] = comp(normalizer) if normalizer is not None else None
    layout["pre_tokenizer"] = comp(pre_tokenizer) if pre_tokenizer is not None else None
    layout["decoder"] = comp(decoder) if decoder is not None else None
    layout["model"].update(model_fields or {})
    vocab = layout["model"]["vocab"]
    for token in extra_vocab:  # whole words that no merge reaches (what ignore_merges is for)
        if token not in vocab:
            vocab[token] = max(vocab.values()) + 1
    tok = Tokenizer.from_str(json.dumps(layout))
    specials = [a for a in added if a.special]
    others = [a for a in added if not a.special]
    if specials:
        tok.add_special_tokens(specials)
    if others:
        tok.add_tokens(others)
    if post_processor is not None:
        tok.post_processor = post_processor(json.loads(tok.to_str())) if callable(post_processor) else post_processor
    return Tokenizer.from_str(tok.to_str())  # re-read: the saved file is what the tests load


def pipelines(bl, sp, wprefix, wsuffix):
    P = pre_tokenizers
    N = normalizers
    D = decoders
    out = {}
    out["llama3"] = build(
        bl, pre_tokenizer=P.Sequence([P.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                                      P.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
        decoder=D.ByteLevel(), model_fields={"ignore_merges": True},
        extra_vocab=["\u0120tokenization", "\u0120Mamba", "inference", "\u0120\u0120\u0120\u0120return"],
        added=[AddedToken("<|reserved_special_token_0|>", special=True, normalized=False),
               AddedToken("<|eot_id|>", special=True, normalized=False)],
        post_processor=lambda lay: processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            template("<|begin_of_text|> $A", ["<|begin_of_text|>"], lay)]))
    out["llama3_merges"] = build(  # the same without ignore_merges: the extra whole words are never produced
        bl, pre_tokenizer=P.Sequence([P.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                                      P.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
        decoder=D.ByteLevel(), model_fields={"ignore_merges": False},
        extra_vocab=["\u0120tokenization", "\u0120Mamba", "inference", "\u0120\u0120\u0120\u0120return"])
    out["bytelevel_roberta"] = build(
        bl, normalizer=N.NFKC(), pre_tokenizer=P.ByteLevel(add_prefix_space=True, use_regex=True),
        decoder=D.ByteLevel(),
        added=[AddedToken("<s>", special=True, normalized=False), AddedToken("</s>", special=True, normalized=False),
               AddedToken("<mask>", special=True, normalized=False, lstrip=True),
               AddedToken("[word]", special=False, normalized=True, single_word=True),
               AddedToken("<r>", special=False, normalized=False, rstrip=True)],
        post_processor=lambda lay: processors.RobertaProcessing(
            ("</s>", [t["id"] for t in lay["added_tokens"] if t["content"] == "</s>"][0]),
            ("<s>", [t["id"] for t in lay["added_tokens"] if t["content"] == "<s>"][0])))
    out["bytelevel_split_behaviours"] = build(
        bl, normalizer=N.Sequence([N.NFD(), N.Lowercase()]),
        pre_tokenizer=P.Sequence([P.Split(Regex(r"\s+"), behavior="merged_with_next"),
                                  P.Split(Regex(r"[.,;:!?]"), behavior="merged_with_previous"),
                                  P.Split("-", behavior="contiguous"),
                                  P.Split(Regex(r"\S+"), behavior="removed", invert=True),
                                  P.Digits(individual_digits=True),
                                  P.ByteLevel(add_prefix_space=False, use_regex=False)]),
        decoder=D.ByteLevel())
    out["spm_llama2"] = build(
        sp, normalizer=N.Sequence([N.Prepend(SPM), N.Replace(" ", SPM)]),
        model_fields={"byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>"},
        decoder=D.Sequence([D.Replace(SPM, " "), D.ByteFallback(), D.Fuse(), D.Strip(" ", 1, 0)]),
        post_processor=lambda lay: template("<s> $A", ["<s>"], lay))
    out["spm_metaspace"] = build(
        sp, pre_tokenizer=P.Metaspace(replacement=SPM, prepend_scheme="first", split=False),
        model_fields={"byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>"},
        decoder=D.Sequence([D.ByteFallback(), D.Metaspace(replacement=SPM, prepend_scheme="first", split=False),
                            D.Fuse()]),
        added=[AddedToken("[INST]", special=True, normalized=False, rstrip=True),
               AddedToken("[/INST]", special=True, normalized=False, lstrip=True),
               AddedToken("<think>", special=False, normalized=True)],
        post_processor=lambda lay: template("<s> $A </s>", ["<s>", "</s>"], lay))
    out["spm_metaspace_split"] = build(
        sp, normalizer=N.Sequence([N.Strip(left=True, right=False), N.NFKC()]),
        pre_tokenizer=P.Metaspace(replacement=SPM, prepend_scheme="always", split=True),
        model_fields={"byte_fallback": False, "fuse_unk": False, "unk_token": "<unk>"},
        decoder=D.Metaspace(replacement=SPM, prepend_scheme="always", split=True))
    out["spm_never"] = build(
        sp, normalizer=N.Sequence([N.Replace(Regex(r"[\t ]+"), " "), N.Replace(" ", SPM)]),
        pre_tokenizer=P.Metaspace(replacement=SPM, prepend_scheme="never", split=True),
        model_fields={"byte_fallback": True, "fuse_unk": False, "unk_token": "<unk>"},
        decoder=D.Sequence([D.Metaspace(replacement=SPM, prepend_scheme="never", split=True), D.ByteFallback(),
                            D.Strip(" ", 0, 1)]))
    out["bert_like"] = build(
        wprefix, normalizer=N.Sequence([N.NFD(), N.Replace(Regex(r"\p{Mn}"), ""), N.Lowercase(), N.Strip()]),
        pre_tokenizer=P.Sequence([P.WhitespaceSplit(), P.Punctuation(behavior="isolated"),
                                  P.Digits(individual_digits=True)]),
        added=[AddedToken("[MASK]", special=True, normalized=False, lstrip=True),
               AddedToken("[Word]", special=False, normalized=True)],
        post_processor=lambda lay: processors.BertProcessing(
            ("[SEP]", [t["id"] for t in lay["added_tokens"] if t["content"] == "[SEP]"][0]),
            ("[CLS]", [t["id"] for t in lay["added_tokens"] if t["content"] == "[CLS]"][0])))
    out["suffix_bpe"] = build(
        wsuffix, normalizer=N.Sequence([N.NFKD(), N.Lowercase()]),
        pre_tokenizer=P.Sequence([P.Whitespace(), P.Punctuation(behavior="contiguous"), P.Digits(False)]),
        model_fields={"fuse_unk": True},
            # Strip with stop > 0 after Fuse would panic in tokenizers 0.23 on empty text (Fuse of no tokens gives ""), and
        # Strip that cuts a one-character token to nothing panics too: pipelines here avoid both.
        decoder=D.Sequence([D.Replace("</w>", " "), D.Fuse(), D.Strip(" ", 1, 0)]),
        post_processor=lambda lay: processors.Sequence([template("[CLS] $A [SEP]", ["[CLS]", "[SEP]"], lay)]))
    return out


# --------------------------------------------------------------------------------------------------------------------
# Cases

def hard_strings():
    return [
        "", " ", "  ", "   leading", "trailing   ", "  both  ", "a", "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "line one\nline two\n\n\nline five\n", "\n", "\r\n", "windows\r\nline\r\nends\r\n", "\t\ttabs\tand\t spaces",
        "def f(x):\n    if x:\n        return [i * 2 for i in range(x)]\n    return None\n",
        "0 1 12 123 1234 12345 123456 3.14159 2.718e-10 0x1F 1_000_000 ٣٤٥ ½ ²",
        "31415926535897932384626433832795028841971",
        "it's don't we're they've I'm you'll he'd IT'S DON'T WE'RE THEY'VE I'M YOU'LL HE'D",
        "'s 't 're 've 'm 'll 'd 'S 'T", "\u017fo \u212a 'ſ",
        "café naïve Ærøskøbing Zürich façade", "İSTANBUL ΣΊΣΥΦΟΣ ǅ ß ẞ ﬁ ﬀ", "ＡＢＣ１２３ ｶﾀｶﾅ ㈱ ① ™ ㎏",
        "日本語の文章を書きます。", "中文，한국어 텍스트", "Привет, мир!", "emoji 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 ❤️",
        "e\u0301 vs \u00e9, A\u030a, \u1100\u1161\u11a8, n\u0303\u0323", "a\u00a0b\u00a0\u00a0c", "x\u3000y\u3000",
        "para\u2028sep\u2029end", "nel\u0085line", "zero\u200bwidth\u200djoin\ufeff",
        "ctrl \x00 \x01\x02 \x07 \x1b[0m \x7f end", "tab\x0bvt\x0cff",
        "a-b--c---d, e.f;g:h!i?j", "(parens) [brackets] {braces} <angles> $100 +5 =6 ^x `y` |z| ~w @at #hash %p &a *s",
        "mixed: English, Ελληνικά, עברית, العربية, हिन्दी, 日本",
        "rare: ꙮ 𓀀 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∮ ∯ ⅷ", "    indented\n\tcode  \n", "x" + " " * 25 + "y", "a" + "\n" * 5 + "b",
        "?!?!... ---", "   ", "\u2581already\u2581marked \u2581", "hello world hello worlds", "tokenization Mamba inference", "[WORD] [Word] [word]",
        "    return x", "return    return", "é" * 40, "ab" * 60,
    ]


def special_strings(names):
    out = []
    for s in names:
        out += [s, f"a{s}b", f" {s} ", f"x {s}  y", f"{s}{s}", f"{s} hello", f"hello {s}", s[:-1],
                f"日本{s}語", f"\n{s}\n"]
    if len(names) > 1:
        out.append(" ".join(names) + " text " + "".join(names))
    return out


def case_texts(tok, chunk):
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    return hard_strings() + special_strings(added) + [chunk]


def stream_chunks(tok, ids):
    """What HF's DecodeStream emits token by token (None while it holds back an incomplete character)."""
    try:
        stream = decoders.DecodeStream(skip_special_tokens=False)
        return [stream.step(tok, i) for i in ids]
    except Exception as e:
        log(f"DecodeStream failed: {e}")
        return None


def encode_rows(tok, texts):
    rows = []
    for text in texts:
        enc = tok.encode(text, add_special_tokens=False)
        rows.append({
            "text": text,
            "stream": stream_chunks(tok, enc.ids) if hasattr(decoders, "DecodeStream") else None,
            "ids": enc.ids,
            "ids_special": tok.encode(text, add_special_tokens=True).ids,
            "tokens": enc.tokens,
            "decoded": tok.decode(enc.ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
        })
    return rows


def decode_rows(tok, rng):
    """Id sequences no encoder would produce: lone byte-fallback bytes, halves of characters, specials, ids past
    the vocabulary."""
    size = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    byte_ids = [vocab[f"<0x{b:02X}>"] for b in range(256) if f"<0x{b:02X}>" in vocab]
    special_ids = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    seqs = [[], [size + 5], [0]]
    for n in range(40):
        length = rng.randint(1, 12)
        seq = []
        for _ in range(length):
            r = rng.random()
            if byte_ids and r < 0.35:
                seq.append(rng.choice(byte_ids[0x80:] if rng.random() < 0.7 else byte_ids))
            elif special_ids and r < 0.45:
                seq.append(rng.choice(special_ids))
            else:
                seq.append(rng.randrange(size))
        seqs.append(seq)
    if byte_ids:
        b = {x: vocab[f"<0x{x:02X}>"] for x in range(256)}
        seqs += [[b[0xE6], b[0x97], b[0xA5]], [b[0xE6], b[0x97]], [b[0x41], b[0xE6], b[0x41]], [b[0xF0], b[0x9F]],
                 [b[0xC3]], [b[0xFF], b[0xFE]], [b[0x20], b[0x20]]]
    return [{"ids": s, "decoded": tok.decode(s, skip_special_tokens=False),
             "decoded_skip_special": tok.decode(s, skip_special_tokens=True)} for s in seqs]


# --------------------------------------------------------------------------------------------------------------------
# Speed (single thread) and an identity hash of the ids, for the C++ bench

def ids_hash(ids):
    return hashlib.sha256(struct.pack(f"<{len(ids)}i", *ids)).hexdigest()


def bench(tok, text, rounds=3):
    best, ids = None, None
    for _ in range(rounds):
        t0 = time.perf_counter()
        enc = tok.encode(text, add_special_tokens=False)
        dt = time.perf_counter() - t0
        ids = enc.ids
        best = dt if best is None else min(best, dt)
    return {"bytes": len(text.encode()), "tokens": len(ids), "seconds": best, "tokens_per_s": len(ids) / best,
            "ids_sha256": ids_hash(ids)}


def calibration():
    """Seconds for fixed pure-Python and hashing work: run the same here and on another machine to compare CPUs."""
    t0 = time.perf_counter()
    sum(i * i for i in range(5_000_000))
    t1 = time.perf_counter()
    hashlib.sha256(b"x" * (200 << 20)).hexdigest()
    t2 = time.perf_counter()
    return {"python_loop_s": t1 - t0, "sha256_200MiB_s": t2 - t1}


def repeated_to(text, size):
    out = text
    while len(out.encode()) < size:
        out += text
    data = out.encode()[:size]
    return data.decode("utf-8", errors="ignore")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--heldout", default="fixtures/heldout.txt", help="repeated to 1 MiB: the repo's bench text")
    ap.add_argument("--neox", default="fixtures/tokenizer/tokenizer.json")
    ap.add_argument("--bench-text", default=None, help="also write a 1 MiB non-repeating stdlib text here")
    args = ap.parse_args()
    log(f"tokenizers {tokenizers.__version__}, python {sys.version.split()[0]}")
    rng = random.Random(11)

    texts = training_texts(3_000_000)
    log(f"training text: {len(texts)} documents")
    bl = train_byte_level(texts, 1500)
    sp = train_sentencepiece_like(texts, 1500)
    wprefix = train_word_bpe(texts, 900, prefix="##")
    wsuffix = train_word_bpe(texts, 900, suffix="</w>")
    log("vocabularies trained")

    chunk = texts[7][:1500]
    manifest = {"tokenizers_version": tokenizers.__version__, "pipelines": {}, "bench": {}}
    toks = {}
    for name, tok in pipelines(bl, sp, wprefix, wsuffix).items():
        if tok is None:
            log(f"{name}: FAILED, not written")
            continue
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        toks[name] = tok
        try:
            rows = encode_rows(tok, case_texts(tok, chunk))
            drows = decode_rows(tok, rng)
        except BaseException as e:  # a Rust panic arrives as a BaseException
            log(f"{name}: FAILED making cases: {type(e).__name__}: {e}")
            continue
        with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
            json.dump({"encode": rows, "decode": drows}, f, ensure_ascii=False, indent=0)
        layout = json.loads(tok.to_str())
        manifest["pipelines"][name] = {
            k: (json.dumps(layout[k], ensure_ascii=False)[:300] if layout[k] is not None else None)
            for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder")}
        manifest["pipelines"][name]["vocab_size"] = tok.get_vocab_size(with_added_tokens=True)
        log(f"{name}: {len(rows)} encode cases, {len(drows)} decode cases, vocab {tok.get_vocab_size()}")

    bench_texts = {}
    if os.path.exists(args.heldout):
        with open(args.heldout, encoding="utf-8") as f:
            bench_texts["heldout_x_1MiB"] = repeated_to(f.read(), 1 << 20)
    stdlib = "".join(training_texts(1_200_000))
    bench_texts["stdlib_1MiB"] = stdlib.encode()[: 1 << 20].decode("utf-8", errors="ignore")
    if args.bench_text:
        with open(args.bench_text, "w", encoding="utf-8") as f:
            f.write(bench_texts["stdlib_1MiB"])
    if os.path.exists(args.neox):
        toks["neox"] = Tokenizer.from_file(args.neox)
    for tname, text in bench_texts.items():
        for name in ("llama3", "spm_llama2", "spm_metaspace", "neox"):
            if name in toks:
                r = bench(toks[name], text)
                manifest["bench"][f"{name}/{tname}"] = r
                log(f"bench {name} on {tname}: {r['tokens']} tokens in {r['seconds']:.3f} s = "
                    f"{r['tokens_per_s'] / 1e6:.2f} M tokens/s")
    manifest["calibration"] = calibration()
    log(f"calibration: {manifest['calibration']}")
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
