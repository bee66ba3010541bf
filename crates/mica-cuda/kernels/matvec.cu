// Products of a quantized weight matrix with a few activation rows (decode and small
// batches), and row lookups (token embeddings). Needs dequant.cu.

// y[t * y_stride + r] = dot(row r of w, x[t * x_stride ..][..cols]) for t < n, r < rows.
struct MatvecP {
    const u8 *w;
    const float *x;
    float *y;
    int rows;
    int cols;
    int n;
    int row_bytes;
    int x_stride;
    int y_stride;
};

// Tokens per launch: each warp keeps one partial sum per token.
#define MV_MAXN 8

// One warp per weight row; each lane takes every 32nd sub-block of the row, dequantizes it
// once and multiplies it with every token's slice; the lanes' sums are added by shuffles.
#define MATVEC(NAME, SUBS, BYTES, DQ)                                                \
    KERNEL matvec_##NAME(const struct MatvecP p) {                                \
        int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;                  \
        int r = blockIdx.x * (blockDim.x / WARP) + warp;                           \
        if (r >= p.rows) return;                                                   \
        const u8 *row = p.w + (size_t)r * p.row_bytes;                             \
        float acc[MV_MAXN];                                                        \
        for (int t = 0; t < MV_MAXN; ++t) acc[t] = 0.0f;                           \
        int items = p.cols / 32;                                                   \
        for (int i = lane; i < items; i += WARP) {                                 \
            float v[32];                                                           \
            DQ(row + (size_t)(i / SUBS) * BYTES, i % SUBS, v);                     \
            for (int t = 0; t < MV_MAXN; ++t) {                                    \
                if (t >= p.n) break;                                               \
                const float *x = p.x + (size_t)t * p.x_stride + (size_t)i * 32;    \
                float s = 0.0f;                                                    \
                for (int k = 0; k < 32; ++k) s += v[k] * x[k];                     \
                acc[t] += s;                                                       \
            }                                                                      \
        }                                                                          \
        for (int t = 0; t < MV_MAXN; ++t) {                                        \
            if (t >= p.n) break;                                                   \
            float s = warp_sum(acc[t]);                                            \
            if (lane == 0) p.y[(size_t)t * p.y_stride + r] = s;                    \
        }                                                                          \
    }                                                                              \
    EXPORT(matvec_##NAME, MatvecP)

// y[t * cols ..][..cols] = row ids[t] of w, dequantized, for t < n (one block per row).
struct RowsP {
    const u8 *w;
    const int *ids;
    float *y;
    int n;
    int cols;
    int row_bytes;
};

#define GET_ROWS(NAME, SUBS, BYTES, DQ)                                              \
    KERNEL get_rows_##NAME(const struct RowsP p) {                                \
        int t = blockIdx.x;                                                        \
        const u8 *row = p.w + (size_t)p.ids[t] * p.row_bytes;                      \
        for (int i = threadIdx.x; i < p.cols / 32; i += blockDim.x) {              \
            float v[32];                                                           \
            DQ(row + (size_t)(i / SUBS) * BYTES, i % SUBS, v);                     \
            float *y = p.y + (size_t)t * p.cols + (size_t)i * 32;                  \
            for (int k = 0; k < 32; ++k) y[k] = v[k];                              \
        }                                                                          \
    }                                                                              \
    EXPORT(get_rows_##NAME, RowsP)

FOR_EACH_FORMAT(MATVEC)
FOR_EACH_FORMAT(GET_ROWS)
