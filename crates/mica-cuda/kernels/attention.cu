// The paged key/value cache on the device and attention over it. A layer's keys (and
// values) are a pool of rows, `[n_blocks << block_shift][n_head_kv][head_dim]` f32, in
// blocks of `1 << block_shift` positions: the host's KV cache layout. Token t's sequence
// has its block table at `blocks + tbl[t]`: position j of it is pool row
// `blocks[tbl[t] + (j >> block_shift)] << block_shift | (j & (block size - 1))`.

DEV size_t kv_row(const int *blocks, int tbl, int j, int shift) {
    return ((size_t)blocks[tbl + (j >> shift)] << shift) | (size_t)(j & ((1 << shift) - 1));
}

// Writes token t's key and value rows (`[n_head_kv * head_dim]` each) at position pos[t]
// of its sequence. One block per (token, KV head).
struct KvWriteP {
    const float *k;
    const float *v;
    float *kc;
    float *vc;
    const int *blocks;
    const int *tbl;
    const int *pos;
    int n_tok;
    int n_head_kv;
    int head_dim;
    int block_shift;
};

KERNEL kv_write(const struct KvWriteP p) {
    int t = blockIdx.x / p.n_head_kv, h = blockIdx.x % p.n_head_kv;
    size_t row = kv_row(p.blocks, p.tbl[t], p.pos[t], p.block_shift);
    size_t dst = (row * p.n_head_kv + h) * p.head_dim;
    size_t src = ((size_t)t * p.n_head_kv + h) * p.head_dim;
    for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
        p.kc[dst + d] = p.k[src + d];
        p.vc[dst + d] = p.v[src + d];
    }
}
EXPORT(kv_write, KvWriteP)

// out[t][h] = softmax over positions j of (q[t][h] . k[j] * scale, soft-capped when softcap
// > 0) applied to v[j], for the positions token t sees: 0..=pos[t] of its sequence, the
// last `window` of them when window > 0. Query head h reads KV head h / (n_head /
// n_head_kv). One block of ATT_THREADS per (token, head): each warp runs an online softmax
// over every ATT_WARPS-th position (lane l holding dimensions l, l + 32, ... below
// head_dim), then the warps' partial results are merged.
struct AttnP {
    const float *q;
    const float *kc;
    const float *vc;
    float *out;
    const int *blocks;
    const int *tbl;
    const int *pos;
    int n_tok;
    int n_head;
    int n_head_kv;
    int head_dim;
    int block_shift;
    int window;
    float scale;
    float softcap;
};

#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * WARP)
// Largest head_dim / 32, rounded up.
#define ATT_MAXD 8

KERNEL attention(const struct AttnP p) {
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS * ATT_MAXD * WARP];
    int t = blockIdx.x / p.n_head, h = blockIdx.x % p.n_head;
    int kvh = h / (p.n_head / p.n_head_kv);
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int nd = (p.head_dim + WARP - 1) / WARP;
    const float *q = p.q + ((size_t)t * p.n_head + h) * p.head_dim;
    int tbl = p.tbl[t];
    int hi = p.pos[t];
    int lo = (p.window > 0 && hi - p.window + 1 > 0) ? hi - p.window + 1 : 0;
    float qv[ATT_MAXD], acc[ATT_MAXD];
    for (int i = 0; i < ATT_MAXD; ++i) {
        int d = lane + WARP * i;
        qv[i] = i < nd && d < p.head_dim ? q[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = lo + warp; j <= hi; j += ATT_WARPS) {
        size_t at = (kv_row(p.blocks, tbl, j, p.block_shift) * p.n_head_kv + kvh) * p.head_dim;
        const float *kj = p.kc + at;
        const float *vj = p.vc + at;
        float s = 0.0f;
        for (int i = 0; i < nd; ++i)
            if (lane + WARP * i < p.head_dim) s += qv[i] * kj[lane + WARP * i];
        s = warp_sum(s) * p.scale;
        if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
        float mn = fmaxf(m, s);
        float c = expf(m - mn), e = expf(s - mn);
        l = l * c + e;
        for (int i = 0; i < nd; ++i)
            if (lane + WARP * i < p.head_dim) acc[i] = acc[i] * c + e * vj[lane + WARP * i];
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    for (int i = 0; i < nd; ++i) s_acc[(warp * ATT_MAXD + i) * WARP + lane] = acc[i];
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < ATT_WARPS; ++w) mx = fmaxf(mx, s_m[w]);
    float sum = 0.0f, f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; ++w) {
        // A warp that saw no position has m = -inf: its factor is 0.
        f[w] = s_m[w] == NEG_INF ? 0.0f : expf(s_m[w] - mx);
        sum += s_l[w] * f[w];
    }
    float *o = p.out + ((size_t)t * p.n_head + h) * p.head_dim;
    for (int d = threadIdx.x; d < p.head_dim; d += ATT_THREADS) {
        int i = d / WARP, ln = d % WARP;
        float a = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w) a += s_acc[(w * ATT_MAXD + i) * WARP + ln] * f[w];
        o[d] = a / sum;
    }
}
EXPORT(attention, AttnP)
