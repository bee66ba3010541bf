// Norms, rotary embeddings, activations and residual adds, over f32 activation rows.

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (w may be null: no weight); one block per row.
struct NormP {
    const float *x;
    const float *w;
    float *y;
    int rows;
    int cols;
    float eps;
};

KERNEL rms_norm(const struct NormP p) {
    __shared__ float part[32];
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    const float *x = p.x + (size_t)blockIdx.x * p.cols;
    float *y = p.y + (size_t)blockIdx.x * p.cols;
    float s = 0.0f;
    for (int i = threadIdx.x; i < p.cols; i += blockDim.x) s += x[i] * x[i];
    s = warp_sum(s);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    s = warp_sum(lane < nw ? part[lane] : 0.0f);
    float scale = 1.0f / sqrtf(s / (float)p.cols + p.eps);
    for (int i = threadIdx.x; i < p.cols; i += blockDim.x)
        y[i] = p.w ? x[i] * scale * p.w[i] : x[i] * scale;
}
EXPORT(rms_norm, NormP)

// Rotates the first n_rot values of every head of every token by its position: pairs
// (2i, 2i+1), or (i, i + n_rot/2) with neox, by pos · freq_scale · base^(-2i/n_rot) / f_i
// (f_i: the per-pair frequency divisors when `factors` is set, else 1), cosine and sine
// multiplied by attn_factor. The angle and its sine and cosine are computed in double
// precision (the reference is exact rotation, whatever order a CPU path rounds its angles
// in). One block per (token, head).
struct RopeP {
    float *x;
    const int *pos;
    const float *factors;
    int n_tok;
    int n_head;
    int head_dim;
    int n_rot;
    int tok_stride;
    int neox;
    float theta_base;
    float freq_scale;
    float attn_factor;
    int _pad;
};

KERNEL rope(const struct RopeP p) {
    int t = blockIdx.x / p.n_head, h = blockIdx.x % p.n_head;
    float *x = p.x + (size_t)t * p.tok_stride + (size_t)h * p.head_dim;
    int half = p.n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double theta = (double)p.pos[t] * (double)p.freq_scale *
                       pow((double)p.theta_base, -2.0 * (double)i / (double)p.n_rot);
        if (p.factors) theta /= (double)p.factors[i];
        float c = (float)(cos(theta) * p.attn_factor), s = (float)(sin(theta) * p.attn_factor);
        int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}
EXPORT(rope, RopeP)

// y[i] = act(g[i]) * u[i]: kind 0 SiLU (SwiGLU), kind 1 tanh-approximated GELU (GeGLU).
struct GluP {
    const float *g;
    const float *u;
    float *y;
    int n;
    int kind;
};

KERNEL glu(const struct GluP p) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x) {
        float g = p.g[i], a;
        if (p.kind == 0) {
            a = g / (1.0f + expf(-g));
        } else {
            // 0.5·g·(1 + tanh(z)) written as g·sigmoid(2z): the same function without the
            // cancellation of 1 + tanh(z) for negative g.
            float z = 0.7978845608028654f * (g + 0.044715f * g * g * g);
            a = g / (1.0f + expf(-2.0f * z));
        }
        p.y[i] = a * p.u[i];
    }
}
EXPORT(glu, GluP)

// y[i] = y[i] + x[i] * s.
struct AxpyP {
    float *y;
    const float *x;
    int n;
    float s;
};

KERNEL axpy(const struct AxpyP p) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x)
        p.y[i] = p.y[i] + p.x[i] * p.s;
}
EXPORT(axpy, AxpyP)

// x[i] = x[i] * s.
struct ScaleP {
    float *x;
    int n;
    float s;
};

KERNEL scale(const struct ScaleP p) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x)
        p.x[i] = p.x[i] * p.s;
}
EXPORT(scale, ScaleP)

// y[i] = x[i] for n values (a cache block copied; the ranges do not overlap).
struct CopyP {
    const float *x;
    float *y;
    int n;
    int _pad;
};

KERNEL copy(const struct CopyP p) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x)
        p.y[i] = p.x[i];
}
EXPORT(copy, CopyP)

// y[r][i] += b[i] for `rows` rows of n values (a projection's bias).
struct BiasP {
    float *y;
    const float *b;
    int rows;
    int n;
};

KERNEL bias(const struct BiasP p) {
    long total = (long)p.rows * p.n;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x)
        p.y[i] = p.y[i] + p.b[i % p.n];
}
EXPORT(bias, BiasP)
