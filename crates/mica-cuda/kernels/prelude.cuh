// Shared by every kernel source. Compiled two ways: by NVRTC for the GPU, and as C by the
// CPU emulator that tests the kernels' logic on machines without a GPU (MICA_EMU,
// crates/mica-cuda/tests/emu/emu.h). Kernel code therefore keeps to the C subset both
// accept: no templates, references or overloading; kernels take one parameter struct.
#ifdef MICA_EMU
#include "emu.h"
#else
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
#define KERNEL extern "C" __global__ void
#define DEV static __device__ __forceinline__
#define DYN_SHARED(type, name) extern __shared__ type name[]
#define EXPORT(name, params)
DEV float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
DEV float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }
DEV float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
// Rounded products and differences that the compiler may not fuse into one FMA: the
// dequantizers use them so each value is rounded exactly as ggml's C code rounds it.
#define MUL(a, b) __fmul_rn((a), (b))
#define SUB(a, b) __fsub_rn((a), (b))
#endif

#define WARP 32
#define NEG_INF __int_as_float((int)0xff800000u)

// A little-endian u16 at `p` (GGUF scales are f16 stored unaligned within blocks).
DEV u16 ld_u16(const u8 *p) { return (u16)(p[0] | (p[1] << 8)); }

DEV float warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
    return v;
}

DEV float warp_max(float v) {
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, shfl_xor(v, m));
    return v;
}
