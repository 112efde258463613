#!/usr/bin/env python3
"""Compares the tensors of two GGUF files (ours and llama.cpp's quantizer output of the same model): per tensor the
ggml type, the shape (trailing 1s dropped, as ggml pads them) and the bytes. Prints one line per tensor that differs and a JSON summary; exit 1 if any does.
Python standard library only:
    python3 gguf_compare_tensors.py OURS.gguf THEIRS.gguf
    python3 gguf_compare_tensors.py --hashes FILE.gguf   (each tensor's type and FNV-1a 64 of its bytes, as JSON)
"""
import json
import struct
import sys

TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_k", 11: "q3_k",
              12: "q4_k", 13: "q5_k", 14: "q6_k", 30: "bf16"}


def read_gguf(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF", path
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        while len(ne) > 1 and ne[-1] == 1:  # ggml pads with 1s; llama.cpp's quantizer drops them, its converter not
            ne.pop()
        infos.append((name, ne, take("I"), take("Q")))
    align = kv.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    tensors = {name: (ne, t, off) for name, ne, t, off in infos}
    # exact sizes from the type: bytes per block / elements per block
    blk = {0: (4, 1), 1: (2, 1), 30: (2, 1), 2: (18, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32), 12: (144, 256),
           13: (176, 256), 14: (210, 256)}
    out = {}
    for name, (ne, t, off) in tensors.items():
        n = 1
        for d in ne:
            n *= d
        b, e = blk[t]
        out[name] = (ne, t, data[base + off: base + off + n // e * b])
    return out


def fnv1a64(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    if sys.argv[1] == "--hashes":
        t = read_gguf(sys.argv[2])
        print(json.dumps({"generator": "scripts/llamacpp_bench/make_llamacpp_fixtures.sh",
                          "tensors": {n: {"type": TYPE_NAMES.get(ty, ty), "fnv1a64": fnv1a64(b)}
                                      for n, (ne, ty, b) in sorted(t.items())}}, indent=0))
        return
    ours, theirs = read_gguf(sys.argv[1]), read_gguf(sys.argv[2])
    differ, same_bytes, by_type = [], 0, {}
    for name in sorted(set(ours) | set(theirs)):
        if name not in ours or name not in theirs:
            differ.append(name)
            print(f"{name}: only in {'ours' if name in ours else 'theirs'}")
            continue
        (ne_a, t_a, b_a), (ne_b, t_b, b_b) = ours[name], theirs[name]
        if ne_a != ne_b or t_a != t_b:
            differ.append(name)
            print(f"{name}: ours {TYPE_NAMES.get(t_a, t_a)} {ne_a}, llama.cpp {TYPE_NAMES.get(t_b, t_b)} {ne_b}")
        elif b_a != b_b:
            differ.append(name)
            n = sum(1 for x, y in zip(b_a, b_b) if x != y)
            print(f"{name}: {TYPE_NAMES.get(t_a, t_a)} {ne_a}: {n} of {len(b_a)} bytes differ")
        else:
            same_bytes += 1
            by_type[TYPE_NAMES.get(t_a, t_a)] = by_type.get(TYPE_NAMES.get(t_a, t_a), 0) + 1
    print(json.dumps({"tensors": len(set(ours) | set(theirs)), "identical": same_bytes, "differing": len(differ),
                      "identical_by_type": by_type}))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
