// Weight formats, read in place from the GGUF bytes. Each `dq32_*` dequantizes the 32
// values of sub-block `sub` of the block at `b`, value for value as ggml's dequantize_row_*
// does (same operations, same rounding). Every format's block is a whole number of
// 32-value sub-blocks: the list below gives sub-blocks and bytes per block.

DEV void dq32_f32(const u8 *b, int sub, float *v) {
    const float *f = (const float *)b;
    for (int i = 0; i < 32; ++i) v[i] = f[i];
}

DEV void dq32_f16(const u8 *b, int sub, float *v) {
    for (int i = 0; i < 32; ++i) v[i] = f16_to_f32(ld_u16(b + 2 * i));
}

DEV void dq32_bf16(const u8 *b, int sub, float *v) {
    for (int i = 0; i < 32; ++i) v[i] = bf16_to_f32(ld_u16(b + 2 * i));
}

// Q4_0: f16 scale, 16 bytes of nibbles (low nibbles are values 0..15, high 16..31).
DEV void dq32_q4_0(const u8 *b, int sub, float *v) {
    float d = f16_to_f32(ld_u16(b));
    const u8 *q = b + 2;
    for (int i = 0; i < 16; ++i) {
        v[i] = MUL((float)((q[i] & 0xF) - 8), d);
        v[i + 16] = MUL((float)((q[i] >> 4) - 8), d);
    }
}

// Q8_0: f16 scale, 32 signed bytes.
DEV void dq32_q8_0(const u8 *b, int sub, float *v) {
    float d = f16_to_f32(ld_u16(b));
    const i8 *q = (const i8 *)(b + 2);
    for (int i = 0; i < 32; ++i) v[i] = MUL((float)q[i], d);
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (ggml's get_scale_min_k4).
DEV void scale_min_k4(int j, const u8 *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K: 256 values; f16 d and dmin, 12 bytes of packed 6-bit scales and mins, 128 bytes of
// nibbles (bytes 32k..32k+31 hold sub-block 2k in their low and 2k+1 in their high nibbles).
DEV void dq32_q4_k(const u8 *b, int sub, float *v) {
    float d = f16_to_f32(ld_u16(b)), dmin = f16_to_f32(ld_u16(b + 2));
    int sc, m;
    scale_min_k4(sub, b + 4, &sc, &m);
    float d1 = MUL(d, (float)sc), m1 = MUL(dmin, (float)m);
    const u8 *q = b + 16 + 32 * (sub / 2);
    int shift = (sub % 2) * 4;
    for (int i = 0; i < 32; ++i) v[i] = SUB(MUL(d1, (float)((q[i] >> shift) & 0xF)), m1);
}

// Q6_K: 256 values; 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed scales (one
// per 16 values), f16 d. Sub-block j is quarter j % 4 of half j / 4.
DEV void dq32_q6_k(const u8 *b, int sub, float *v) {
    const u8 *ql = b, *qh = b + 128;
    const i8 *sc = (const i8 *)(b + 192);
    float d = f16_to_f32(ld_u16(b + 208));
    int n = sub / 4, qd = sub % 4;
    for (int l = 0; l < 32; ++l) {
        int lo = ql[64 * n + l + (qd & 1) * 32];
        lo = qd < 2 ? (lo & 0xF) : (lo >> 4);
        int hi = (qh[32 * n + l] >> (2 * qd)) & 3;
        int q = (lo | (hi << 4)) - 32;
        v[l] = MUL(MUL(d, (float)sc[8 * n + l / 16 + 2 * qd]), (float)q);
    }
}

// X(name, sub-blocks per block, bytes per block, dequantizer): every weight format.
#define FOR_EACH_FORMAT(X)             \
    X(f32, 1, 128, dq32_f32)           \
    X(f16, 1, 64, dq32_f16)            \
    X(bf16, 1, 64, dq32_bf16)          \
    X(q4_0, 1, 18, dq32_q4_0)          \
    X(q8_0, 1, 34, dq32_q8_0)          \
    X(q4_k, 8, 144, dq32_q4_k)         \
    X(q6_k, 8, 210, dq32_q6_k)
