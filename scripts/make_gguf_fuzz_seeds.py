"""Writes the GGUF fuzz seeds (fuzz/corpus/gguf/): small well-formed files of each architecture and tensor type, and a
few near-misses. Needs only the standard library. Run: python3 scripts/make_gguf_fuzz_seeds.py fuzz/corpus/gguf"""
import os
import struct
import sys

U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 6: (32, 22), 7: (32, 24), 12: (256, 144),
         13: (256, 176), 14: (256, 210), 3: (32, 20), 16: (256, 66)}  # q4_1 and iq2_xxs: refused by the reader


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, val):
    out = s(key) + struct.pack("<I", typ)
    if typ == U32:
        out += struct.pack("<I", val)
    elif typ == F32:
        out += struct.pack("<f", val)
    elif typ == BOOL:
        out += struct.pack("<B", val)
    elif typ == STRING:
        out += s(val)
    elif typ == ARRAY:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            out += s(it) if et == STRING else struct.pack("<i" if et == I32 else "<I", it)
    return out


def gguf(kvs, tensors, version=3):
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kv(*x) for x in kvs)
    off, infos, blobs = 0, b"", []
    for name, ne, typ in tensors:
        be, bb = BLOCK[typ]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // be * bb
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", typ, off)
        blobs.append((off, bytes((i * 37 + 11) % 251 for i in range(nbytes))))
        off = (off + nbytes + 31) // 32 * 32
    data = head + infos
    data += b"\0" * ((-len(data)) % 32)
    body = bytearray(off)
    for o, b in blobs:
        body[o:o + len(b)] = b
    return data + bytes(body)


def mamba2(typ):
    a = "mamba2"
    d, layers, inner, state, heads, groups, conv, vocab = 32, 1, 64, 8, 4, 2, 4, 16
    kvs = [("general.architecture", STRING, a), (a + ".embedding_length", U32, d), (a + ".block_count", U32, layers),
           (a + ".ssm.conv_kernel", U32, conv), (a + ".ssm.inner_size", U32, inner), (a + ".ssm.state_size", U32, state),
           (a + ".ssm.time_step_rank", U32, heads), (a + ".ssm.group_count", U32, groups),
           (a + ".attention.layer_norm_rms_epsilon", F32, 1e-5),
           ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b"])),
           ("tokenizer.ggml.token_type", ARRAY, (I32, [1, 1]))]
    C = inner + 2 * groups * state
    t = [("token_embd.weight", [d, vocab], typ), ("output_norm.weight", [d], 0), ("blk.0.attn_norm.weight", [d], 0),
         ("blk.0.ssm_in.weight", [d, 2 * inner + 2 * groups * state + heads], typ), ("blk.0.ssm_conv1d.weight", [conv, C], 0),
         ("blk.0.ssm_conv1d.bias", [C], 0), ("blk.0.ssm_dt.bias", [heads], 0), ("blk.0.ssm_a", [1, heads], 0),
         ("blk.0.ssm_d", [1, heads], 0), ("blk.0.ssm_norm.weight", [inner // groups, groups], 0),
         ("blk.0.ssm_out.weight", [inner, d], typ)]
    return kvs, t


def mamba1():
    a = "mamba"
    d, inner, state, conv, rank, vocab = 32, 64, 4, 4, 2, 16
    kvs = [("general.architecture", STRING, a), (a + ".embedding_length", U32, d), (a + ".block_count", U32, 1),
           (a + ".ssm.conv_kernel", U32, conv), (a + ".ssm.inner_size", U32, inner), (a + ".ssm.state_size", U32, state),
           (a + ".ssm.time_step_rank", U32, rank), (a + ".attention.layer_norm_rms_epsilon", F32, 1e-5)]
    t = [("token_embd.weight", [d, vocab], 0), ("output_norm.weight", [d], 0), ("output.weight", [d, vocab], 8),
         ("blk.0.attn_norm.weight", [d], 0), ("blk.0.ssm_in.weight", [d, 2 * inner], 2),
         ("blk.0.ssm_conv1d.weight", [conv, inner], 0), ("blk.0.ssm_conv1d.bias", [inner], 0),
         ("blk.0.ssm_x.weight", [inner, rank + 2 * state], 6), ("blk.0.ssm_dt.weight", [rank, inner], 0),
         ("blk.0.ssm_dt.bias", [inner], 0), ("blk.0.ssm_a", [state, inner], 0), ("blk.0.ssm_d", [inner], 0),
         ("blk.0.ssm_out.weight", [inner, d], 7)]
    return kvs, t


def main(out):
    os.makedirs(out, exist_ok=True)
    seeds = {}
    for typ, name in [(0, "f32"), (1, "f16"), (30, "bf16"), (8, "q8_0")]:
        seeds["mamba2_" + name] = gguf(*mamba2(typ))
    seeds["mamba1_mixed"] = gguf(*mamba1())
    kvs, t = mamba2(0)
    seeds["mamba2_v2"] = gguf(kvs, t, version=2)
    seeds["q4k_tensor"] = gguf([("general.architecture", STRING, "mamba2")],
                               [("x", [256, 2], 12), ("y", [256], 13), ("z", [256], 14), ("w", [64], 2)])
    seeds["empty"] = gguf([], [])
    full = seeds["mamba2_f32"]
    seeds["truncated"] = full[: len(full) // 2]
    seeds["unsupported_q4_1"] = gguf([("general.architecture", STRING, "mamba2")], [("x", [32], 3)])
    seeds["unsupported_iq2_xxs"] = gguf([("general.architecture", STRING, "mamba2")], [("x", [256], 16)])
    for name, data in seeds.items():
        with open(os.path.join(out, name + ".gguf"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
