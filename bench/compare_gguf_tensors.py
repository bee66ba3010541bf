#!/usr/bin/env python3
"""Compares two GGUF files tensor by tensor (by name): type, shape, and whether the bytes
are identical. Used to check that `mica convert --type T` writes what llama.cpp's
`llama_model_quantize` writes from the same source (same type choices, and the same bytes
where both use the reference quantizer).

Usage: python3 bench/compare_gguf_tensors.py A.gguf B.gguf
"""
import hashlib
import struct
import sys

# (block elements, block bytes) per ggml type id
GEOM = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
        8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
NAMES = {0: "F32", 1: "F16", 30: "BF16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
         10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read(path):
    b = open(path, "rb").read()
    pos = 0

    def u(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def s():
        nonlocal pos
        n = u("Q")
        v = b[pos:pos + n].decode()
        pos += n
        return v

    def skip(t):
        nonlocal pos
        if t == 8:
            s()
        elif t == 9:
            et, n = u("I"), u("Q")
            for _ in range(n):
                skip(et)
        else:
            pos += SCALAR[t]

    assert b[:4] == b"GGUF"
    pos = 8
    nt, nkv = u("Q"), u("Q")
    align = 32
    for _ in range(nkv):
        k, t = s(), u("I")
        if k == "general.alignment":
            align = u("I")
        else:
            skip(t)
    infos = []
    for _ in range(nt):
        name, nd = s(), u("I")
        shape = [u("Q") for _ in range(nd)]
        ty, off = u("I"), u("Q")
        infos.append((name, shape, ty, off))
    data = (pos + align - 1) // align * align
    out = {}
    for name, shape, ty, off in infos:
        n = 1
        for d in shape:
            n *= d
        be, bb = GEOM[ty]
        size = n // be * bb
        out[name] = (NAMES.get(ty, str(ty)), shape, hashlib.sha256(b[data + off:data + off + size]).hexdigest())
    return out


a, b = read(sys.argv[1]), read(sys.argv[2])
same_type = same_bytes = 0
for name in sorted(a):
    ta, tb = a[name], b.get(name)
    if tb is None:
        print(f"{name}: only in the first file")
        continue
    if ta[0] == tb[0]:
        same_type += 1
    else:
        print(f"{name}: type {ta[0]} vs {tb[0]}")
    if ta[2] == tb[2]:
        same_bytes += 1
    elif ta[0] == tb[0]:
        print(f"{name}: same type {ta[0]}, different bytes")
print(f"{len(a)} tensors: {same_type} same type, {same_bytes} identical bytes")
