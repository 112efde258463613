#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/) and the regression inputs for the hostile
classes of issue 20 (fuzz/regressions/<target>/) from the committed fixtures, with the Python standard library only.
The torch_* corpora come from scripts/make_checkpoint_fixtures.py; state_file seeds need the built binary:

    python3 scripts/make_fuzz_corpus.py [--binary build/mambacpp]
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures")


def out_dir(kind, target):
    d = os.path.join(ROOT, "fuzz", kind, target)
    os.makedirs(d, exist_ok=True)
    return d


def put(kind, target, name, data):
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(out_dir(kind, target), name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def safetensors(tensors, pad_to=8, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] laid out in order."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad_to:
        h += b" " * ((-len(h)) % pad_to)
    return struct.pack("<Q", len(h)) + h + data


def npy(descr, shape, raw, version=1):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join("%d, " % s for s in shape).rstrip(" ") if len(shape) != 1 else "%d," % shape[0])
    total = 10 + len(d) + 1
    d = d + " " * ((64 - total % 64) % 64) + "\n"
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + raw
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(d)) + d.encode() + raw


def deep(n, open_="[", close="]"):
    return open_ * n + close * n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", help="the mambacpp binary, to write state_file seeds")
    args = ap.parse_args()

    # ---- config: every committed config.json, and the hostile classes ----
    for sub in ("models", "checkpoints", "hybrid"):
        for name in sorted(os.listdir(os.path.join(FIX, sub))):
            p = os.path.join(FIX, sub, name, "config.json")
            if os.path.isfile(p):
                put("corpus", "config", sub + "_" + name + ".json", read(p))
    put("corpus", "config", "shipped.json", read(os.path.join(ROOT, "models", "default", "config.json")))
    put("regressions", "config", "deep_nesting.json", '{"d_model": ' + deep(5000) + "}")
    put("regressions", "config", "deep_objects.json", '{"a":' * 5000 + "1" + "}" * 5000)
    put("regressions", "config", "number_overflow.json", '{"d_model": 1e705, "n_layer": 2, "vocab_size": 10}')
    put("regressions", "config", "nan_size.json", '{"model_type": "mamba", "hidden_size": NaN}')
    put("regressions", "config", "float_object.json", '{"d_model": {"__float__": ' + deep(3000) + "}}")
    put("regressions", "config", "eos_out_of_vocab.json",
        json.dumps({"d_model": 16, "n_layer": 1, "vocab_size": 32, "eos_token_id": 100000000}))  # accepted
    put("regressions", "config", "eos_not_int32.json",
        json.dumps({"d_model": 16, "n_layer": 1, "vocab_size": 32, "eos_token_id": 1 << 31}))  # refused
    # 2^30 layers sized per-layer tables of gigabytes before any weight was looked at; refused (at most 65536)
    bamba = json.loads(read(os.path.join(FIX, "hybrid", "bamba_f32", "config.json")))
    bamba.update(num_hidden_layers=1 << 30, attn_layer_indices=[])
    put("regressions", "config", "bamba_layer_count_2e30.json", json.dumps(bamba, indent=2))

    # ---- safetensors ----
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    put("corpus", "safetensors", "f32.safetensors", safetensors([("a", "F32", [2, 2], f32)]))
    put("corpus", "safetensors", "mixed.safetensors", safetensors(
        [("b", "BF16", [3], b"\x80\x3f" * 3), ("e", "F32", [0], b""), ("i", "I64", [1], struct.pack("<q", 7))],
        metadata={"format": "pt"}))
    put("corpus", "safetensors", "shard4.safetensors",
        read(os.path.join(FIX, "models", "mamba2_bf16_sharded", "model-00004-of-00004.safetensors")))
    put("regressions", "safetensors", "unaligned.safetensors",
        safetensors([("x", "F16", [1], b"\0\0"), ("y", "F32", [2], struct.pack("<2f", 1, 2)),
                     ("z", "F64", [1], struct.pack("<d", 3))], pad_to=0))
    put("regressions", "safetensors", "deep_metadata.safetensors",
        (lambda h: struct.pack("<Q", len(h)) + h)(('{"__metadata__": ' + deep(5000) + "}").encode()))
    put("regressions", "safetensors", "number_overflow.safetensors",
        (lambda h: struct.pack("<Q", len(h)) + h)(b'{"a": {"dtype": "F32", "shape": [1e705], "data_offsets": [0, 4]}}'))
    put("regressions", "safetensors", "huge_header.safetensors", struct.pack("<Q", 1 << 62) + b"{}")

    # ---- checkpoint_dir: byte 0 picks index (0), model.safetensors (1) or an extra shard (2) ----
    index = read(os.path.join(FIX, "models", "mamba2_bf16_sharded", "model.safetensors.index.json"))
    put("corpus", "checkpoint_dir", "index.bin", b"\0" + index)
    put("corpus", "checkpoint_dir", "single.bin", b"\1" + safetensors([("a", "F32", [2, 2], f32)]))
    put("corpus", "checkpoint_dir", "extra.bin", b"\2" + safetensors([("extra.weight", "F32", [2, 2], f32)]))
    put("corpus", "checkpoint_dir", "missing_shard.bin", b"\0" + json.dumps(
        {"weight_map": {"backbone.embeddings.weight": "model-00009-of-00004.safetensors"}}).encode())
    put("regressions", "checkpoint_dir", "deep_index.bin", b"\0" + ('{"weight_map": ' + deep(5000) + "}").encode())
    put("regressions", "checkpoint_dir", "escape_index.bin",
        b"\0" + json.dumps({"weight_map": {"a": "../../etc/passwd"}}).encode())

    # ---- npy ----
    for sub in ("models",):
        for name in sorted(os.listdir(os.path.join(FIX, sub))):
            p = os.path.join(FIX, sub, name, "inputs_embeds.npy")
            if os.path.isfile(p) and os.path.getsize(p) < 65536:
                put("corpus", "npy", name + "_embeds.npy", read(p))
    put("corpus", "npy", "f4_2x2.npy", npy("<f4", [2, 2], f32))
    put("corpus", "npy", "i8_3.npy", npy("<i8", [3], struct.pack("<3q", 1, -2, 3)))
    put("corpus", "npy", "f8_scalar.npy", npy("<f8", [], struct.pack("<d", 0.5)))
    put("corpus", "npy", "f2_v2.npy", npy("<f2", [2], b"\x00\x3c\x00\xc0", version=2))
    put("regressions", "npy", "huge_header_len.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{")
    put("regressions", "npy", "huge_shape.npy", npy("<f4", [1 << 40, 1 << 40], b""))
    put("regressions", "npy", "overflow_shape.npy", npy("<f4", [1 << 62, 1 << 62, 16], b""))
    put("regressions", "npy", "claims_gigabytes.npy", npy("<f8", [1 << 28], b"\0" * 8))

    # ---- token_lists: byte 0 even = --tokens-file text, odd = --chunks ----
    for i, t in enumerate(["1 2 3", "1,2,3", "1, 2,\n3\t4", "0", "2147483647", ""]):
        put("corpus", "token_lists", "tokens%d.txt" % i, b"\0" + t.encode())
    for i, t in enumerate(["3,1,17", "1", "9223372036854775807,4"]):
        put("corpus", "token_lists", "chunks%d.txt" % i, b"\1" + t.encode())
    for name, t in [("empty_entry", "1,,2"), ("trailing_comma", "1,2,"), ("negative", "-5"),
                    ("too_large", "2147483648"), ("leading_comma", ",1")]:
        put("regressions", "token_lists", name + ".txt", b"\0" + t.encode())
    put("regressions", "token_lists", "chunks_empty_entry.txt", b"\1" + b"1,,2")

    # ---- tokenizer_json: the committed tokenizers, small ones, and the hostile classes ----
    put("corpus", "tokenizer_json", "shipped.json", read(os.path.join(FIX, "tokenizer", "tokenizer.json")))
    for name in ("bert_like", "bytelevel_roberta", "llama3", "spm_llama2", "spm_metaspace", "suffix_bpe"):
        p = os.path.join(FIX, "tokenizers", name, "tokenizer.json")
        if os.path.isfile(p):
            put("corpus", "tokenizer_json", name + ".json", read(p))
    small = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<s>": 3}, "merges": ["a b"]},
             "added_tokens": [{"id": 3, "content": "<s>", "special": True}],
             "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
             "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
             "decoder": {"type": "ByteLevel"}}
    put("corpus", "tokenizer_json", "small.json", json.dumps(small))
    big_id = json.loads(json.dumps(small))
    big_id["model"]["vocab"]["ab"] = 130000000
    put("regressions", "tokenizer_json", "vocab_id_130M.json", json.dumps(big_id))
    for n in (120, 3000):  # within the depth limit (accepted), far beyond it (refused)
        norm = '{"type": "Sequence", "normalizers": [' * n + '{"type": "Lowercase"}' + "]}" * n
        text = json.dumps(small).replace('"normalizer": ' + json.dumps(small["normalizer"]), '"normalizer": ' + norm)
        put("regressions", "tokenizer_json", "normalizer_nesting_%d.json" % n, text)
    put("regressions", "tokenizer_json", "deep_nesting.json", '{"model": ' + deep(5000) + "}")
    put("regressions", "tokenizer_json", "number_overflow.json", '{"model": {"type": "BPE", "vocab": {"a": 1e705}}}')

    # ---- tokenizer_encode: byte 0 picks the tokenizer (bit 7: add special tokens), the rest is the text ----
    cases = json.load(open(os.path.join(FIX, "tokenizer", "cases.json")))
    n_tok = 1 + len([d for d in os.listdir(os.path.join(FIX, "tokenizers"))
                     if os.path.isdir(os.path.join(FIX, "tokenizers", d))])
    for i, c in enumerate(cases[:12]):
        put("corpus", "tokenizer_encode", "case%02d.bin" % i, bytes([i % n_tok]) + c["text"].encode())
    put("corpus", "tokenizer_encode", "special.bin", bytes([0x80]) + "<|endoftext|>hi  there\n\n".encode())
    put("regressions", "tokenizer_encode", "invalid_utf8.bin", b"\x01\xff\xfe\xc3")
    put("regressions", "tokenizer_encode", "long_word.bin", b"\x02" + b"a" * 60000)

    # ---- completion_request: byte 0 even = /v1/completions, odd = /v1/chat/completions ----
    bodies = [
        (0, {"prompt": "Hello", "max_tokens": 8, "temperature": 0.5}),
        (0, {"prompt": [1, 2, 3], "max_tokens": 4, "stop": ["\n"], "logprobs": 2}),
        (0, {"prompt": ["a", "b"], "n": 1, "seed": 3, "top_p": 0.9}),
        (1, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        (1, {"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]},
                          {"role": "user", "content": "y"}], "logprobs": True, "top_logprobs": 2}),
    ]
    for i, (kind, b) in enumerate(bodies):
        put("corpus", "completion_request", "body%d.json" % i, bytes([kind]) + json.dumps(b).encode())
    put("regressions", "completion_request", "deep.json", b"\0" + ('{"prompt": ' + deep(5000) + "}").encode())
    put("regressions", "completion_request", "deep_content.json",
        b"\1" + ('{"messages": [{"role": "user", "content": ' + deep(5000) + "}]}").encode())
    put("regressions", "completion_request", "number_overflow.json", b"\0" + b'{"prompt": "a", "max_tokens": 1e705}')
    # A number where a string belongs: nlohmann's value(key, "") threw its own type_error (a 500, not a 400).
    put("regressions", "completion_request", "content_part_type_number.json",
        b'1{"messages":[{"role":"user","content":[{"type":1,"text":"a"}]}],"response_format":{"type":2}}')
    put("regressions", "completion_request", "response_format_type_number.json",
        b'1{"messages":[{"role":"user","content":"a"}],"response_format":{"type":2}}')

    # ---- chat_template: tokenizer_config.json as `serve --chat-template auto` reads it ----
    configs = [
        {"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"},
        {"chat_template": [{"name": "default", "template": "<|im_start|>"}, {"name": "tool_use", "template": "x"}]},
        {"chat_template": "{{ bos_token }}[INST] {{ m }} [/INST]", "model_max_length": 1e30, "bos_token": "<s>"},
        {"added_tokens_decoder": {"0": {"content": "<|endoftext|>", "special": True}}},
    ]
    for i, c in enumerate(configs):
        put("corpus", "chat_template", "config%d.json" % i, json.dumps(c))
    put("regressions", "chat_template", "name_is_a_number.json",
        json.dumps({"chat_template": [{"name": 1, "template": "x"}, {"name": "default", "template": "<|im_start|>"}]}))
    put("regressions", "chat_template", "deep_nesting.json", '{"chat_template": ' + deep(100000) + "}")

    # ---- state_file: byte 0 picks the model (0: mamba2_f32_groups_bias, 1: nemotron_h_f32) ----
    if args.binary:
        tmp = tempfile.mkdtemp()
        try:
            for byte, model in ((0, "models/mamba2_f32_groups_bias"), (1, "hybrid/nemotron_h_f32")):
                for n, toks in (("short", "1 2 3"), ("longer", "5 6 7 8 9 10 11 12 13")):
                    tf = os.path.join(tmp, "t.txt")
                    open(tf, "w").write(toks)
                    sf = os.path.join(tmp, "s.state")
                    subprocess.run([args.binary, "generate", "--device", "cpu", "--model", os.path.join(FIX, model),
                                    "--tokens-file", tf, "-n", "2", "--temp", "0", "--save-state", sf, "--json"],
                                   check=True, stdout=subprocess.DEVNULL)
                    put("corpus", "state_file", "%s_%s.bin" % (model.split("/")[1], n), bytes([byte]) + read(sf))
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
