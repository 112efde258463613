#!/usr/bin/env python3
"""Forged state files from a valid one (scripts/hostile_inputs.sh): truncations, bad counts, KV tables that disagree.

    scripts/hostile_state_files.py GOOD.state OUTDIR

The layout is StateCache::save_snapshot's (src/model/state_cache.cpp), version 4:
  magic[16] | u32 version | u32 dtype | u64 weights hash | u64 config length | config | i64 first layer
  | i64 layer count | per layer: u32 kind, u32 tensor count, per tensor: u32 ndim, i64 dims[ndim]
  | u64 token count | i32 tokens[count] | state data
Every file written is one a reader must refuse.
"""
import os
import struct
import sys


def parse(b):
    at = 16
    version, dtype = struct.unpack_from("<II", b, at)
    at += 8
    at += 8  # hash
    (clen,) = struct.unpack_from("<Q", b, at)
    fields = {"version": 16, "dtype": 20, "hash": 24, "config_len": 32}
    at += 8
    fields["config"] = at
    at += clen
    fields["first_layer"] = at
    fields["layer_count"] = at + 8
    first, count = struct.unpack_from("<qq", b, at)
    at += 16
    layers = []
    for _ in range(count):
        kind, n = struct.unpack_from("<II", b, at)
        entry = {"at": at, "kind": kind, "tensors": []}
        at += 8
        for _ in range(n):
            (ndim,) = struct.unpack_from("<I", b, at)
            entry["tensors"].append({"ndim_at": at, "dims_at": at + 4, "dims": struct.unpack_from("<%dq" % ndim, b, at + 4)})
            at += 4 + 8 * ndim
        layers.append(entry)
    fields["token_count"] = at
    (ntok,) = struct.unpack_from("<Q", b, at)
    at += 8
    fields["tokens"] = at
    at += 4 * ntok
    fields["data"] = at
    return version, dtype, fields, layers, ntok


def main():
    good, out = sys.argv[1], sys.argv[2]
    b = open(good, "rb").read()
    version, dtype, f, layers, ntok = parse(b)
    os.makedirs(out, exist_ok=True)

    def put(name, data):
        open(os.path.join(out, name + ".bin"), "wb").write(bytes(data))

    def patch(name, offset, fmt, value):
        m = bytearray(b)
        struct.pack_into(fmt, m, offset, value)
        put(name, m)

    for name, cut in [("cut_magic", 10), ("cut_header", 30), ("cut_config", f["config"] + 5),
                      ("cut_layer_table", f["layer_count"] + 12), ("cut_token_count", f["token_count"] + 3),
                      ("cut_tokens", f["tokens"] + 2), ("cut_data", f["data"] + 7), ("cut_last_byte", len(b) - 1)]:
        put(name, b[:cut])
    put("trailing_byte", b + b"\0")
    put("empty", b"")
    patch("version_2", f["version"], "<I", 2)
    patch("version_5", f["version"], "<I", 5)
    patch("version_huge", f["version"], "<I", 0xFFFFFFFF)
    patch("dtype_code_7", f["dtype"], "<I", 7)
    patch("dtype_bf16_on_f32_data", f["dtype"], "<I", 2 if dtype != 2 else 0)
    patch("config_len_huge", f["config_len"], "<Q", 1 << 62)
    patch("config_len_zero", f["config_len"], "<Q", 0)
    patch("config_len_one_less", f["config_len"], "<Q", f["first_layer"] - f["config"] - 1)
    m = bytearray(b)
    m[f["config"] + 20] ^= 1
    put("config_changed", m)
    patch("hash_changed", f["hash"] + 3, "<B", b[f["hash"] + 3] ^ 0x40)
    patch("first_layer_negative", f["first_layer"], "<q", -1)
    patch("first_layer_max", f["first_layer"], "<q", (1 << 63) - 1)
    patch("layer_count_huge", f["layer_count"], "<q", (1 << 62))
    patch("layer_count_negative", f["layer_count"], "<q", -1)
    patch("token_count_huge", f["token_count"], "<Q", (1 << 64) - 1)
    patch("token_count_plus_one", f["token_count"], "<Q", ntok + 1)
    if ntok > 0:
        patch("token_count_minus_one", f["token_count"], "<Q", ntok - 1)
        patch("token_negative", f["tokens"], "<i", -1)
        patch("token_past_vocab", f["tokens"], "<i", 1 << 30)
    kv = [l for l in layers if l["kind"] == 1]
    ssm = [l for l in layers if l["kind"] == 0]
    for l in layers[:1]:
        patch("kind_changed", l["at"], "<I", 1 - l["kind"] if l["kind"] < 2 else 0)
        patch("kind_huge", l["at"], "<I", 0xFFFFFFFF)
        patch("tensor_count_huge", l["at"] + 4, "<I", 0xFFFFFFFF)
    if ssm:
        t = ssm[0]["tensors"][0]
        patch("ssm_ndim_huge", t["ndim_at"], "<I", 0xFFFFFFFF)
        patch("ssm_dim_changed", t["dims_at"], "<q", t["dims"][0] + 1)
        patch("ssm_dim_negative", t["dims_at"], "<q", -t["dims"][0])
    if kv:
        k, v = kv[0]["tensors"]
        rows, cols = k["dims"]
        patch("kv_rows_huge", k["dims_at"], "<q", 1 << 62)
        patch("kv_rows_negative", k["dims_at"], "<q", -1)
        patch("kv_rows_plus_one", k["dims_at"], "<q", rows + 1)
        patch("kv_cols_changed", k["dims_at"] + 8, "<q", cols + 1)
        patch("kv_ndim_3", k["ndim_at"], "<I", 3)
        patch("kv_values_rows_differ", v["dims_at"], "<q", rows - 1)
        if len(kv) > 1:
            patch("kv_layers_rows_differ", kv[1]["tensors"][0]["dims_at"], "<q", rows - 1)
        # Every KV table claims one row fewer, and the data is one row shorter per table: a consistent file whose
        # KV rows are not the tokens it records.
        m = bytearray(b)
        for l in kv:
            for t in l["tensors"]:
                struct.pack_into("<q", m, t["dims_at"], rows - 1)
        elem = 2 if dtype == 2 else 4
        put("kv_rows_not_the_tokens", m[: len(m) - 2 * len(kv) * cols * elem])
        # 10,000 rows (past any fixture's context), data and tokens to match.
        big = 10000
        m = bytearray(b[: f["token_count"]])
        for l in kv:
            for t in l["tensors"]:
                struct.pack_into("<q", m, t["dims_at"] - 0, big)
        m += struct.pack("<Q", big) + struct.pack("<%di" % big, *([1] * big))
        state_bytes = len(b) - f["data"] - 2 * len(kv) * rows * cols * elem
        m += b"\0" * (state_bytes + 2 * len(kv) * big * cols * elem)
        put("kv_rows_past_context", m)


if __name__ == "__main__":
    main()
