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
        if name.endswith("ssm_a") and typ == 0:  # A = -exp(A_log) must be negative for the model to load
            blobs.append((off, struct.pack("<f", -1.0) * n))
        else:
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


def common(a, d, layers, inner, state, conv, rank):
    return [("general.architecture", STRING, a), (a + ".embedding_length", U32, d), (a + ".block_count", U32, layers),
            (a + ".ssm.conv_kernel", U32, conv), (a + ".ssm.inner_size", U32, inner),
            (a + ".ssm.state_size", U32, state), (a + ".ssm.time_step_rank", U32, rank),
            (a + ".attention.layer_norm_rms_epsilon", F32, 1e-5)]


def mamba2_layer(b, d, inner, state, heads, groups, conv, typ):
    C = inner + 2 * groups * state
    return [(b + "ssm_in.weight", [d, 2 * inner + 2 * groups * state + heads], typ), (b + "ssm_conv1d.weight", [conv, C], 0),
            (b + "ssm_conv1d.bias", [C], 0), (b + "ssm_dt.bias", [heads], 0), (b + "ssm_a", [1, heads], 0),
            (b + "ssm_d", [1, heads], 0), (b + "ssm_norm.weight", [inner // groups, groups], 0),
            (b + "ssm_out.weight", [inner, d], typ)]


def attention(b, d, heads, kv_heads, head_dim, typ):
    return [(b + "attn_q.weight", [d, heads * head_dim], typ), (b + "attn_k.weight", [d, kv_heads * head_dim], typ),
            (b + "attn_v.weight", [d, kv_heads * head_dim], typ), (b + "attn_output.weight", [heads * head_dim, d], typ)]


def falcon_h1():
    """Falcon-H1 as llama.cpp's converter writes it: every layer Mamba-2 + attention + SwiGLU MLP, scalar
    head_count_kv and feed_forward_length, the MLP's pre-norm named blk.N.ffn_norm (no .weight), MLP biases."""
    a = "falcon-h1"
    d, inner, state, heads, groups, conv, vocab, nh, nkv, hd, ff = 8, 16, 2, 2, 1, 4, 4, 2, 1, 4, 8
    kvs = common(a, d, 1, inner, state, conv, heads) + [
        (a + ".ssm.group_count", U32, groups), (a + ".attention.head_count", U32, nh),
        (a + ".attention.head_count_kv", U32, nkv), (a + ".attention.key_length", U32, hd),
        (a + ".attention.value_length", U32, hd), (a + ".feed_forward_length", U32, ff),
        (a + ".rope.dimension_count", U32, hd), (a + ".rope.freq_base", F32, 10000.0)]
    t = [("token_embd.weight", [d, vocab], 1), ("output_norm.weight", [d], 0), ("output.weight", [d, vocab], 1),
         ("blk.0.attn_norm.weight", [d], 0)] + mamba2_layer("blk.0.", d, inner, state, heads, groups, conv, 1)
    t += attention("blk.0.", d, nh, nkv, hd, 1) + [
        ("blk.0.ffn_norm", [d], 0), ("blk.0.ffn_gate.weight", [d, ff], 1), ("blk.0.ffn_up.weight", [d, ff], 1),
        ("blk.0.ffn_down.weight", [ff, d], 1), ("blk.0.ffn_gate.bias", [ff], 0), ("blk.0.ffn_up.bias", [ff], 0),
        ("blk.0.ffn_down.bias", [d], 0)]
    return kvs, t


def nemotron_h_moe():
    """nemotron_h_moe: Mamba-2, attention and expert layers (feed_forward_length > 0), grouped sigmoid routing."""
    a = "nemotron_h_moe"
    d, inner, state, heads, groups, conv, vocab, E, I, S = 8, 16, 2, 2, 1, 4, 4, 4, 4, 4
    kvs = common(a, d, 3, inner, state, conv, heads) + [
        (a + ".ssm.group_count", U32, groups), (a + ".attention.head_count", U32, 2),
        (a + ".attention.head_count_kv", ARRAY, (I32, [0, 1, 0])), (a + ".attention.key_length", U32, 4),
        (a + ".attention.value_length", U32, 4), (a + ".feed_forward_length", ARRAY, (I32, [0, 0, I])),
        (a + ".expert_count", U32, E), (a + ".expert_used_count", U32, 2), (a + ".expert_feed_forward_length", U32, I),
        (a + ".expert_shared_feed_forward_length", U32, S), (a + ".expert_shared_count", U32, 1),
        (a + ".expert_weights_norm", BOOL, 1), (a + ".expert_weights_scale", F32, 2.5),
        (a + ".expert_group_count", U32, 2), (a + ".expert_group_used_count", U32, 1)]
    t = [("token_embd.weight", [d, vocab], 0), ("output_norm.weight", [d], 0)]
    t += [("blk.%d.attn_norm.weight" % i, [d], 0) for i in range(3)]
    t += mamba2_layer("blk.0.", d, inner, state, heads, groups, conv, 0) + attention("blk.1.", d, 2, 1, 4, 0)
    t += [("blk.2.ffn_gate_inp.weight", [d, E], 0), ("blk.2.exp_probs_b.bias", [E], 0),
          ("blk.2.ffn_up_exps.weight", [d, I, E], 1), ("blk.2.ffn_down_exps.weight", [I, d, E], 1),
          ("blk.2.ffn_up_shexp.weight", [d, S], 0), ("blk.2.ffn_down_shexp.weight", [S, d], 0)]
    return kvs, t


def granite_moe():
    """granitehybrid with experts: ffn_*_exps beside the shared MLP as ffn_*_shexp in every layer."""
    a = "granitehybrid"
    d, inner, state, heads, groups, conv, vocab, E, I, S = 8, 16, 2, 2, 1, 4, 4, 3, 4, 4
    kvs = common(a, d, 2, inner, state, conv, heads) + [
        (a + ".ssm.group_count", U32, groups), (a + ".attention.head_count", U32, 2),
        (a + ".attention.head_count_kv", ARRAY, (I32, [0, 1])), (a + ".attention.key_length", U32, 4),
        (a + ".attention.value_length", U32, 4), (a + ".feed_forward_length", U32, I),
        (a + ".expert_count", U32, E), (a + ".expert_used_count", U32, 2),
        (a + ".expert_shared_feed_forward_length", U32, S), (a + ".embedding_scale", F32, 2.0),
        (a + ".residual_scale", F32, 0.5), (a + ".logit_scale", F32, 1.5), (a + ".rope.scaling.finetuned", BOOL, 0)]
    t = [("token_embd.weight", [d, vocab], 0), ("output_norm.weight", [d], 0)]
    t += mamba2_layer("blk.0.", d, inner, state, heads, groups, conv, 1) + attention("blk.1.", d, 2, 1, 4, 1)
    for i in range(2):
        b = "blk.%d." % i
        t += [(b + "attn_norm.weight", [d], 0), (b + "ffn_norm.weight", [d], 0), (b + "ffn_gate_inp.weight", [d, E], 0),
              (b + "ffn_gate_exps.weight", [d, I, E], 1), (b + "ffn_up_exps.weight", [d, I, E], 1),
              (b + "ffn_down_exps.weight", [I, d, E], 1), (b + "ffn_gate_shexp.weight", [d, S], 1),
              (b + "ffn_up_shexp.weight", [d, S], 1), (b + "ffn_down_shexp.weight", [S, d], 1)]
    return kvs, t


def jamba():
    """jamba: a Mamba-1 layer with dt / B / C norms and a dense MLP, then NoPE attention with experts (ffn_gate_inp)."""
    a = "jamba"
    d, inner, state, conv, rank, vocab, E, ff = 8, 16, 2, 4, 1, 4, 2, 4
    kvs = common(a, d, 2, inner, state, conv, rank) + [
        (a + ".attention.head_count", U32, 2), (a + ".attention.head_count_kv", ARRAY, (I32, [0, 1])),
        (a + ".feed_forward_length", U32, ff), (a + ".expert_count", U32, E), (a + ".expert_used_count", U32, 2)]
    t = [("token_embd.weight", [d, vocab], 0), ("output_norm.weight", [d], 0), ("output.weight", [d, vocab], 0)]
    t += [("blk.%d.attn_norm.weight" % i, [d], 0) for i in range(2)] + [("blk.%d.ffn_norm.weight" % i, [d], 0) for i in range(2)]
    t += [("blk.0.ssm_in.weight", [d, 2 * inner], 0), ("blk.0.ssm_conv1d.weight", [conv, inner], 0),
          ("blk.0.ssm_conv1d.bias", [inner], 0), ("blk.0.ssm_x.weight", [inner, rank + 2 * state], 0),
          ("blk.0.ssm_dt_norm.weight", [rank], 0), ("blk.0.ssm_dt.weight", [rank, inner], 0),
          ("blk.0.ssm_dt.bias", [inner], 0), ("blk.0.ssm_b_norm.weight", [state], 0),
          ("blk.0.ssm_c_norm.weight", [state], 0), ("blk.0.ssm_a", [state, inner], 0), ("blk.0.ssm_d", [inner], 0),
          ("blk.0.ssm_out.weight", [inner, d], 0), ("blk.0.ffn_gate.weight", [d, ff], 0),
          ("blk.0.ffn_up.weight", [d, ff], 0), ("blk.0.ffn_down.weight", [ff, d], 0)]
    t += attention("blk.1.", d, 2, 1, 4, 0) + [
        ("blk.1.ffn_gate_inp.weight", [d, E], 0), ("blk.1.ffn_gate_exps.weight", [d, ff, E], 0),
        ("blk.1.ffn_up_exps.weight", [d, ff, E], 0), ("blk.1.ffn_down_exps.weight", [ff, d, E], 0)]
    return kvs, t


def main(out):
    os.makedirs(out, exist_ok=True)
    seeds = {}
    for typ, name in [(0, "f32"), (1, "f16"), (30, "bf16"), (8, "q8_0")]:
        seeds["mamba2_" + name] = gguf(*mamba2(typ))
    seeds["mamba1_mixed"] = gguf(*mamba1())
    seeds["falcon_h1_f16"] = gguf(*falcon_h1())
    seeds["nemotron_h_moe"] = gguf(*nemotron_h_moe())
    seeds["granite_moe"] = gguf(*granite_moe())
    seeds["jamba"] = gguf(*jamba())
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
