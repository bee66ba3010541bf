// A CPU emulator of the CUDA execution model, just enough for mica's kernels: every thread
// of a block runs as a coroutine (its own stack) on the calling thread, switched at barriers;
// blocks run one after another. __syncthreads is a barrier over the block's live threads,
// warp shuffles exchange through a per-warp buffer between two barriers of the warp's live
// threads, __shared__ variables are statics (one block runs at a time). When every live
// thread waits at a barrier that cannot open, the emulator names the kernel and aborts.
// Included by kernels/prelude.cuh when MICA_EMU is defined.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

struct emu_dim3 {
    unsigned x, y, z;
};
extern struct emu_dim3 threadIdx, blockIdx;
extern struct emu_dim3 blockDim, gridDim;
extern unsigned char *emu_dyn_shared;

#define KERNEL void
#define DEV static inline
#define __shared__ static
#define DYN_SHARED(type, name) type *name = (type *)emu_dyn_shared
// The emulator is compiled with -ffp-contract=off: products and differences round alone.
#define MUL(a, b) ((a) * (b))
#define SUB(a, b) ((a) - (b))

void __syncthreads(void);
float shfl_xor(float v, int m);

static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline float __uint_as_float(u32 i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline float f16_to_f32(u16 h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float f;
    if (e == 0)
        f = ldexpf((float)m, -24);
    else if (e == 31)
        f = m ? NAN : INFINITY;
    else
        f = ldexpf((float)(m | 0x400), e - 25);
    return (h >> 15) ? -f : f;
}
static inline float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

typedef void (*emu_entry)(const void *);
void emu_register(const char *name, emu_entry f, size_t params_size);

#define EXPORT(name, P)                                                          \
    static void name##_emu_entry(const void *p) { name(*(const struct P *)p); } \
    __attribute__((constructor)) static void name##_emu_register(void) {        \
        emu_register(#name, name##_emu_entry, sizeof(struct P));                \
    }
