#!/usr/bin/env python3
"""Prints llama.cpp's own dot products of the i-quants, TQ1_0, TQ2_0 and MXFP4, the table
`LLAMA_CPP` of crates/mica-kernels/tests/iquant_exact.rs.

Calls the CPU backend of llama-cpp-python's libggml-cpu (llama.cpp 0c1e57098, built for this
machine's AVX-512 VNNI ISA) through ctypes: `ggml_get_type_traits_cpu(t)->from_float` of the
vec-dot type quantizes the activations, `->vec_dot` computes the product. Inputs are
deterministic (xorshift32, the same generator as the test): random weight bytes with the
scale fields set to normal f16 values in [2^-8, 2^-4) (IQ1_M: its nibble-spread f16; MXFP4:
an exponent byte in 120..136), activations uniform in [-amp, amp) for amp in 1, 37, 0.01.
Per type and amplitude it prints the FNV-1a 64 of the quantized activations and the f32 bits
of vec_dot.

Usage: bench/.venv/bin/python scripts/gen_iquant_llama_dots.py   (llama-cpp-python)
"""
import ctypes
import glob
import os

import llama_cpp

LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
base = ctypes.CDLL(glob.glob(os.path.join(LIB, "libggml-base.so"))[0], mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(glob.glob(os.path.join(LIB, "libggml-cpu.so"))[0])

FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_int)


class Traits(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
cpu.ggml_cpu_init.restype = None
base.ggml_row_size.restype = ctypes.c_size_t
base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
base.ggml_type_size.restype = ctypes.c_size_t
base.ggml_type_size.argtypes = [ctypes.c_int]

# (name, ggml id, byte offset of the f16 scale or None)
TYPES = [("IQ2_XXS", 16, 0), ("IQ2_XS", 17, 0), ("IQ2_S", 22, 0), ("IQ3_XXS", 18, 0),
         ("IQ3_S", 21, 0), ("IQ1_S", 19, 0), ("IQ1_M", 29, None), ("IQ4_NL", 20, 0),
         ("IQ4_XS", 23, 0), ("TQ1_0", 34, 52), ("TQ2_0", 35, 64), ("MXFP4", 39, None)]
N = 1024
M32 = 0xFFFFFFFF


class XorShift:
    def __init__(self, s):
        self.s = s & M32

    def next(self):
        s = self.s
        s ^= (s << 13) & M32
        s ^= s >> 17
        s ^= (s << 5) & M32
        self.s = s
        return s

    def unif(self):
        return float(ctypes.c_float((self.next() >> 8) * (1.0 / 8388608.0) - 1.0).value)

    def scale16(self):
        return 0x1C00 + self.next() % 0x1000


def fnv(b):
    h = 0xCBF29CE484222325
    for v in b:
        h = ((h ^ v) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    cpu.ggml_cpu_init()
    for ti, (name, t, off) in enumerate(TYPES):
        for rep in range(3):
            rng = XorShift(0x9E3779B9 ^ (ti * 977 + rep * 131 + 1))
            wb = base.ggml_row_size(t, N)
            bs = base.ggml_type_size(t)
            w = bytearray(rng.next() & 0xFF for _ in range(wb))
            for b in range(wb // bs):
                o = b * bs
                if name == "MXFP4":
                    w[o] = 120 + rng.next() % 16
                elif name == "IQ1_M":
                    h = rng.scale16()
                    for i in range(4):
                        w[o + 49 + 2 * i] = (w[o + 49 + 2 * i] & 0x0F) | (((h >> (4 * i)) & 0xF) << 4)
                else:
                    h = rng.scale16()
                    w[o + off:o + off + 2] = h.to_bytes(2, "little")
            amp = float(ctypes.c_float([1.0, 37.0, 0.01][rep]).value)
            # f32 products, as the C generator computes them.
            x = (ctypes.c_float * N)(*[float(ctypes.c_float(rng.unif() * amp).value) for _ in range(N)])
            tr = cpu.ggml_get_type_traits_cpu(t).contents
            vt = tr.vec_dot_type
            xq = (ctypes.c_uint8 * base.ggml_row_size(vt, N))()
            FROM_FLOAT(cpu.ggml_get_type_traits_cpu(vt).contents.from_float)(x, xq, N)
            wbuf = (ctypes.c_uint8 * wb).from_buffer(w)
            s = ctypes.c_float(0.0)
            VEC_DOT(tr.vec_dot)(N, ctypes.byref(s), 0, ctypes.addressof(wbuf), 0, ctypes.addressof(xq), 0, 1)
            bits = int.from_bytes(bytes(s), "little")
            print(f"    (DType::{name}, {rep}, 0x{fnv(bytes(xq)):016x}, 0x{bits:08x}), // {s.value:g}")


if __name__ == "__main__":
    main()
