#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/spm_tokenizer_fuzz.cpp (fuzz/corpus/spm_tokenizer/) and its regression inputs
(fuzz/regressions/spm_tokenizer/), with the Python standard library only:

    python3 scripts/make_spm_fuzz_seeds.py

Byte 0 is the mode (see the target): even = a committed vocabulary (bit 1 picks spm_llama2 or spm_metaspace) and the
text; odd = a vocabulary made from the bytes that follow, then the text.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def put(kind, name, data):
    d = os.path.join(ROOT, "fuzz", kind, "spm_tokenizer")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def made_vocab(flags, tokens, text):
    """tokens: [(text bytes <= 7, llama.cpp type 1..6, score int8)]."""
    out = bytes([flags | 1, len(tokens)])
    for t, typ, score in tokens:
        assert len(t) <= 7 and 1 <= typ <= 6
        out += bytes([len(t) | ((typ - 1) << 3), score & 0xFF]) + t
    return out + text


SP = "\u2581".encode()
texts = ["Hello world", " leading space", "tabs\tand\nnewlines", "caf\u00e9 \u00fcber na\u00efve",
         "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "emoji \U0001F600\U0001F44D", "<s>special</s> tokens",
         "\u2581already escaped", "   ", ""]
for i, t in enumerate(texts):
    put("corpus", "llama2_%02d.bin" % i, bytes([0]) + t.encode())
    put("corpus", "metaspace_%02d.bin" % i, bytes([2]) + t.encode())

normal = [(b"a", 1, 0), (b"b", 1, 0), (b"ab", 1, 8), (SP + b"a", 1, 4), (SP + b"ab", 1, 12), (b"ba", 1, -4)]
# Byte fallback added (bit 1), space prefix (bit 2): the round trip must hold.
put("corpus", "made_roundtrip.bin", made_vocab(0x06, normal, "ab ba abab b\u00e9".encode()))
# Control and user-defined tokens, BOS/EOS flags, an unknown token for missing bytes (bit 7), no byte tokens.
special = normal + [(b"<s>", 3, 0), (b"</s>", 3, 0), (b"<u>", 4, 0), (b"<unk>", 2, 0)]
put("corpus", "made_specials.bin", made_vocab(0x80 | 0x04 | 0x08 | 0x10, special, b"<s>ab<u>ba</s> zz"))
# Equal scores: the leftmost pair merges first.
put("corpus", "made_ties.bin", made_vocab(0x02, [(b"aa", 1, 1), (b"aaa", 1, 1)], b"aaaaaaa"))
# Refused inputs: a repeated token, a character with no token and no fallback, invalid UTF-8 text.
put("regressions", "repeated_token.bin", made_vocab(0x01, [(b"a", 1, 0), (b"a", 1, 0)], b"a"))
put("regressions", "no_fallback.bin", made_vocab(0x01, [(b"a", 1, 0)], b"b"))
put("regressions", "invalid_utf8.bin", bytes([0]) + b"\xff\xfe\xc3")
# Empty tokens (renamed [EMPTY_i] as llama.cpp does) and a long run of one character.
put("regressions", "empty_tokens.bin", made_vocab(0x07, [(b"", 1, 0), (b"", 3, 0), (b"x", 1, 0)], b"x" * 2000))
