#!/usr/bin/env python3
"""Fixtures for mica's importance-weighted quantizers: llama.cpp's own output.

Calls ggml's `ggml_quantize_chunk(type, src, dst, start, nrows, n_per_row, imatrix)` from the
libggml-base shared library that llama-cpp-python ships (llama.cpp 0c1e57098), on 4 rows of
512 pseudo-random weights (normal, with a few outliers) and a skewed importance vector
(log-normal, some columns 100x), and writes
fixtures/quant/weighted/{x.f32, imp.f32, <TYPE>.bin} (and <TYPE>.noimp.bin, no importance,
for the types in NOIMP). IQ2_XS, whose quantizer needs the importance and has a grid search
with more paths, gets 32 more rows of its own (x_grid.f32, including an all-zero row, a
super-block of tiny values and an all-negative row) written to IQ2_XS.bin.

Usage: bench/.venv/bin/python scripts/gen_weighted_quant_fixtures.py
"""
import ctypes
import glob
import os

import numpy as np
import llama_cpp

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "fixtures", "quant", "weighted")
LIB = glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))[0]
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
         "IQ4_NL": 20, "IQ4_XS": 23, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39}
# Also written without an importance matrix (<TYPE>.noimp.bin): what llama-quantize writes
# for these types when it has none.
NOIMP = ["IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4"]
ROWS, COLS = 4, 512

ggml = ctypes.CDLL(LIB)
ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                     ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
ggml.ggml_row_size.restype = ctypes.c_size_t
ggml.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

rng = np.random.default_rng(20251122)
x = (rng.standard_normal((ROWS, COLS)) * 0.02).astype(np.float32)
x[rng.random((ROWS, COLS)) < 0.01] *= 8.0
imp = np.exp(rng.standard_normal(COLS) * 1.5).astype(np.float32)
imp[rng.random(COLS) < 0.05] *= 100.0
os.makedirs(OUT, exist_ok=True)
x.tofile(os.path.join(OUT, "x.f32"))
imp.tofile(os.path.join(OUT, "imp.f32"))
for name, t in TYPES.items():
    size = ggml.ggml_row_size(t, COLS) * ROWS
    dst = (ctypes.c_uint8 * size)()
    n = ggml.ggml_quantize_chunk(t, x.ctypes.data, dst, 0, ROWS, COLS, imp.ctypes.data)
    assert n == size, (name, n, size)
    open(os.path.join(OUT, name + ".bin"), "wb").write(bytes(dst))
    print(name, size, "bytes")
    if name in NOIMP:
        dst = (ctypes.c_uint8 * size)()
        n = ggml.ggml_quantize_chunk(t, x.ctypes.data, dst, 0, ROWS, COLS, None)
        assert n == size, (name, n, size)
        open(os.path.join(OUT, name + ".noimp.bin"), "wb").write(bytes(dst))

# IQ2_XS: llama.cpp has no unweighted IQ2_XS; more rows exercise its neighbour search.
xg = (rng.standard_normal((32, COLS)) * 0.02).astype(np.float32)
xg[rng.random((32, COLS)) < 0.01] *= 8.0
xg[0, :] = 0.0
xg[1, :256] = 1e-20
xg[2] = -np.abs(xg[2])
xg.tofile(os.path.join(OUT, "x_grid.f32"))
for name, t in {"IQ2_XS": 17}.items():
    size = ggml.ggml_row_size(t, COLS) * xg.shape[0]
    dst = (ctypes.c_uint8 * size)()
    n = ggml.ggml_quantize_chunk(t, xg.ctypes.data, dst, 0, xg.shape[0], COLS, imp.ctypes.data)
    assert n == size, (name, n, size)
    open(os.path.join(OUT, name + ".bin"), "wb").write(bytes(dst))
    print(name, size, "bytes")
