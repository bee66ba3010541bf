#!/usr/bin/env python3
"""Regenerate fixtures/quant/: golden data for mica-kernels' block formats.

The reference is the `gguf` Python package (gguf-py, written by llama.cpp's authors), whose
`gguf.quants` module has numpy (de)quantizers for the ggml block formats. Nobody on mica
wrote it, so matching it bit for bit is an independent check of mica's layouts and float
order.

For every weight type this writes
  dequant_<TYPE>.bin   raw blocks (random bytes with finite f16 scales, gguf-py-quantized
                       random rows where gguf-py can quantize the type, hand-set edge blocks:
                       zero / negative / largest / subnormal scales, all-ones quant bits)
  dequant_<TYPE>.f32   gguf.quants.dequantize of those blocks, little-endian f32
and for every type gguf-py can quantize
  quant_<TYPE>.in.f32  input rows (random, constant, zero, huge, tiny, rounding ties)
  quant_<TYPE>.bin     gguf.quants.quantize of them
plus manifest.json describing every file. Deterministic (fixed seed). The i-quants, the
ternary types and MXFP4 (NEW_WEIGHT_TYPES) draw from a second generator after the others,
so the files of the older types stay byte-identical.

Usage: python3 scripts/gen_quant_fixtures.py   (needs numpy and gguf)
"""

import hashlib
import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
import gguf.quants as gq

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "quant")
rng = np.random.default_rng(20240607)

# Byte offsets of the f16 fields (scales, mins) inside one block, per ggml-common.h.
F16_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "IQ2_XXS": [0],
    "IQ2_XS": [0],
    "IQ2_S": [0],
    "IQ3_XXS": [0],
    "IQ3_S": [0],
    "IQ1_S": [0],
    "IQ1_M": [],  # the f16 scale is spread over nibbles: set_iq1m_scale
    "IQ4_NL": [0],
    "IQ4_XS": [0],
    "TQ1_0": [52],
    "TQ2_0": [64],
    "MXFP4": [],  # an E8M0 exponent byte: every value is valid
}
# Types gguf-py can quantize (we compare mica's reference quantizers against these).
QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "F16"]
WEIGHT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
NEW_WEIGHT_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
                    "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4"]
# New types gguf-py can quantize.
NEW_QUANTIZABLE = ["TQ1_0", "TQ2_0", "MXFP4"]


def set_iq1m_scale(blocks, vals):
    """IQ1_M keeps its f16 scale in the top nibbles of the four u16 at byte 48."""
    bits = np.asarray(vals, dtype=np.float16).view(np.uint16).astype(np.uint16)
    for i in range(4):
        off = 48 + 2 * i
        hi = blocks[:, off + 1]
        blocks[:, off + 1] = (hi & 0x0F) | (((bits >> (4 * i)) & 0xF) << 4).astype(np.uint8)


def random_f16(n):
    """Finite f16 values spread over many magnitudes, both signs, subnormals included."""
    mag = rng.uniform(-24, 6, size=n)
    v = (np.sign(rng.standard_normal(n)) * np.exp2(mag)).astype(np.float16)
    v[~np.isfinite(v)] = np.float16(1.0)
    return v


def set_f16(blocks, off, vals):
    blocks[:, off:off + 2] = np.asarray(vals, dtype=np.float16).reshape(-1, 1).view(np.uint8)


def edge_blocks(name, size):
    """Hand-set blocks: (description, bytes) pairs."""
    fields = F16_FIELDS[name]
    out = []

    def mk(fill, scale_vals):
        b = np.full((1, size), fill, dtype=np.uint8)
        for off, v in zip(fields, scale_vals):
            set_f16(b, off, [v])
        return b

    n = len(fields)
    out.append(mk(0xFF, [0.0] * n))                       # zero scales, all quant bits set
    out.append(mk(0xFF, [65504.0] * n))                   # largest finite scale, max quants
    out.append(mk(0xFF, [-65504.0] * n))                  # most negative scale
    out.append(mk(0x00, [-1.5] * n))                      # negative scale, zero quants
    out.append(mk(0x5A, [np.float16(2.0 ** -24)] * n))    # smallest subnormal scale
    out.append(mk(0xA5, [-0.0] + [3.0] * (n - 1)))        # negative zero / mixed
    r = rng.integers(0, 256, size=(1, size), dtype=np.uint8)
    for off, v in zip(fields, [0.125, -0.25][:n]):
        set_f16(r, off, [v])
    out.append(r)
    out = np.concatenate(out, axis=0)
    if name == "IQ1_M":
        set_iq1m_scale(out, [0.0, 65504.0, -65504.0, -1.5, 2.0 ** -24, -0.0, 0.125])
    return out


def quant_blocks(name, n_random):
    qt = getattr(T, name)
    bs, ts = GGML_QUANT_SIZES[qt]
    parts = []
    # Random bytes with finite random scales.
    r = rng.integers(0, 256, size=(n_random, ts), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        set_f16(r, off, random_f16(n_random))
    if name == "IQ1_M":
        set_iq1m_scale(r, random_f16(n_random))
    parts.append(r)
    # Real quantizations of random rows, where gguf-py can quantize the type.
    if name in QUANTIZABLE + NEW_QUANTIZABLE:
        x = (rng.standard_normal((n_random, bs)) * rng.uniform(0.01, 3, (n_random, 1)))
        parts.append(gq.quantize(x.astype(np.float32), qt).reshape(n_random, ts))
    parts.append(edge_blocks(name, ts))
    return np.concatenate(parts, axis=0)


def float_elems(name, n):
    if name == "F32":
        v = rng.standard_normal(n).astype(np.float32)
        v[:6] = [0.0, -0.0, np.inf, -np.inf, 1e-45, 3.4028235e38]
        return v.view(np.uint8)
    if name == "F16":
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xFC00  # NaN payloads -> inf (keep finite-ish)
        bits[:4] = [0x0000, 0x8000, 0x0001, 0x7BFF]
        return bits.view(np.uint8)
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)  # BF16: every pattern
    bits[:4] = [0x0000, 0x8000, 0x0001, 0x7F7F]
    return bits.view(np.uint8)


def quant_inputs(block):
    rows = [
        rng.standard_normal(block * 16),
        rng.standard_normal(block * 2) * 1e4,
        rng.standard_normal(block) * 1e-6,
        np.zeros(block),
        np.full(block, -0.75),
        # Rounding ties for the 8-bit path: amax 127 makes x * (1/d) land on k + 0.5.
        np.concatenate([[127.0], np.arange(block - 1) + 0.5 - block / 2]),
        rng.uniform(-1, 1, block) ** 3,
    ]
    return np.concatenate(rows).astype(np.float32)


def write(name, data):
    path = os.path.join(OUT, name)
    data = np.ascontiguousarray(data).tobytes()
    with open(path, "wb") as f:
        f.write(data)
    return {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def quant_entry(name):
    qt = getattr(T, name)
    block = GGML_QUANT_SIZES[qt][0]
    x = quant_inputs(max(block, 32))
    q = gq.quantize(x, qt)
    entry = {"type": name, "elements": int(x.size)}
    entry["input"] = write(f"quant_{name}.in.f32", x.astype("<f4"))
    entry["expected"] = write(f"quant_{name}.bin", q.view(np.uint8).reshape(-1))
    return entry


def main():
    os.makedirs(OUT, exist_ok=True)
    manifest = {"generator": "scripts/gen_quant_fixtures.py",
                "gguf_py_version": getattr(gguf, "__version__", "unknown"),
                "numpy_version": np.__version__, "dequant": [], "quantize": []}
    for name in WEIGHT_TYPES:
        qt = getattr(T, name)
        if name in ("F32", "F16", "BF16"):
            raw = float_elems(name, 512)
        else:
            n_random = 10 if name.endswith("_K") else 12
            raw = quant_blocks(name, n_random).reshape(-1)
        expected = gq.dequantize(raw, qt).astype(np.float32).reshape(-1)
        entry = {"type": name, "elements": int(expected.size)}
        entry["blocks"] = write(f"dequant_{name}.bin", raw)
        entry["expected"] = write(f"dequant_{name}.f32", expected.astype("<f4"))
        manifest["dequant"].append(entry)
    for name in QUANTIZABLE:
        manifest["quantize"].append(quant_entry(name))
    # The newer types, from their own generator (the files above stay as they were).
    global rng
    rng = np.random.default_rng(20261124)
    for name in NEW_WEIGHT_TYPES:
        qt = getattr(T, name)
        raw = quant_blocks(name, 16 if GGML_QUANT_SIZES[qt][0] == 256 else 24).reshape(-1)
        expected = gq.dequantize(raw, qt).astype(np.float32).reshape(-1)
        entry = {"type": name, "elements": int(expected.size)}
        entry["blocks"] = write(f"dequant_{name}.bin", raw)
        entry["expected"] = write(f"dequant_{name}.f32", expected.astype("<f4"))
        manifest["dequant"].append(entry)
    for name in NEW_QUANTIZABLE:
        manifest["quantize"].append(quant_entry(name))
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, p)) for p in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
