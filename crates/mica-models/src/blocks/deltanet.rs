//! The Gated DeltaNet layer (linear attention with the gated delta rule; Yang, Kautz and
//! Hatamizadeh, 2024), the token mixer of Qwen3.5's recurrent layers.
//!
//! Per token: the layer's input projection (`attn_qkv`, checkpoint `in_proj_qkv`) gives
//! q | k | v, which pass a depthwise causal convolution over the last `conv_kernel` tokens
//! and SiLU; q and k are L2-normalized per head and q scaled by `1/sqrt(head_k_dim)`. Each
//! value head `h` keeps a state matrix `S` (`head_k_dim × head_v_dim`) updated by the delta
//! rule with a decay `exp(g)`, `g = -exp(A_log) · softplus(alpha + dt_bias)`, and a
//! write strength `beta = sigmoid(b)`:
//!
//! ```text
//! S ← exp(g) · S;   S ← S + k ⊗ (beta · (v − Sᵀk));   o = Sᵀq
//! ```
//!
//! The output of each head is RMS-normalized, scaled by the norm weight and by `silu(z)`
//! (`z` from `attn_gate`, checkpoint `in_proj_z`), and projected back (`ssm_out`). The
//! convolution's last inputs and the state matrices are per sequence and live in the
//! [`KvCache`]; a batch may mix sequences: each token updates its own sequence's state, in
//! batch order (a sequence's tokens are in position order).
//!
//! The recurrence runs token by token, with the arithmetic of llama.cpp's CPU kernels as
//! built for AVX-512 (its `ssm_conv`, row-wise `silu`, `l2_norm`, `rms_norm` and fused
//! `gated_delta_net`: state matrices stored transposed, dot products in four 16-lane FMA
//! accumulators, the output scaled by `1/sqrt(head_k_dim)` after the read-out), which llama.cpp
//! runs for prompts and decoding alike; so a quantized model gives llama.cpp's logits bit for
//! bit. transformers' chunked prefill is the same sums reassociated; only the L2
//! normalization's epsilon differs in form, and follows the model's numerics.
//!
//! References: transformers `models/qwen3_5/modeling_qwen3_5.py` (`Qwen3_5GatedDeltaNet`);
//! llama.cpp `src/models/qwen35.cpp` (`build_layer_attn_linear`) and `delta-net-base.cpp`.

use crate::config::{DeltaNetConfig, Numerics};
use crate::kv_cache::{KvCache, SeqId};
use crate::model::grow;
use crate::weights::{ActCache, Linear};
use mica_kernels::ThreadPool;
use mica_kernels::ops::{self, silu, vec_f32};

/// The weights of one Gated DeltaNet layer besides its input projection (`attn_qkv`, the
/// layer's `wq`) and output projection (`ssm_out`, the layer's `wo`).
pub struct DeltaNet {
    /// `[value_dim × n_embd]` the output gate `z` (`attn_gate`).
    pub z: Linear,
    /// `[n_v_heads × n_embd]` the write strength before its sigmoid (`ssm_beta`).
    pub beta: Linear,
    /// `[n_v_heads × n_embd]` the decay input (`ssm_alpha`).
    pub alpha: Linear,
    /// `[conv_kernel][conv_dim]` depthwise convolution weights, oldest tap first: the
    /// transpose of the file's `[conv_dim][conv_kernel]` (`ssm_conv1d`), so each tap is a
    /// row over the channels.
    pub conv: Vec<f32>,
    /// `[n_v_heads]` added to `alpha` before the softplus (`ssm_dt.bias`).
    pub dt_bias: Vec<f32>,
    /// `[n_v_heads]` `-exp(A_log)` (`ssm_a`).
    pub a: Vec<f32>,
    /// `[head_v_dim]` weight of the gated RMSNorm of each head's output (`ssm_norm`).
    pub norm: Vec<f32>,
}

/// Reusable buffers of [`DeltaNet::forward`].
#[derive(Default)]
pub struct DeltaBufs {
    /// `[n, conv_dim]` q | k | v before and after the convolution
    qkv: Vec<f32>,
    /// `[n, value_dim]`
    z: Vec<f32>,
    /// `[n, n_v_heads]`
    beta: Vec<f32>,
    /// `[n, n_v_heads]`
    alpha: Vec<f32>,
    /// `[conv_dim]` one convolved row
    row: Vec<f32>,
    /// `[head_v_dim]` one head's delta
    tmp: Vec<f32>,
}

impl DeltaBufs {
    /// Bytes the buffers hold now (their capacity).
    pub(crate) fn buffer_bytes(&self) -> usize {
        let bufs = [
            &self.qkv,
            &self.z,
            &self.beta,
            &self.alpha,
            &self.row,
            &self.tmp,
        ];
        4 * bufs.iter().map(|b| b.capacity()).sum::<usize>()
    }
}

impl DeltaNet {
    /// Runs the layer's token mixing over `n` rows of normed input `xn` (`[n, n_embd]`),
    /// row `t` belonging to sequence `seq[t]` at position `pos[t]`, through the layer's input
    /// projection `wqkv`; updates the sequences' states in `kv` (layer `layer`), saving the
    /// layer's part of a state into a checkpoint where [`KvCache::capture_state`] asked for
    /// one, and writes the gated, normed
    /// head outputs to `out` (`[n, value_dim]`, before the output projection). `eps` is the
    /// RMSNorm epsilon; `numerics` picks the L2 normalization's formula (llama.cpp's or
    /// transformers'; they differ for small vectors).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        c: &DeltaNetConfig,
        pool: &ThreadPool,
        acts: &mut ActCache,
        wqkv: &Linear,
        (xn, n): (&[f32], usize),
        (seq, pos): (&[SeqId], &[usize]),
        (kv, layer): (&mut KvCache, usize),
        (eps, numerics): (f32, Numerics),
        b: &mut DeltaBufs,
        out: &mut [f32],
    ) {
        let (cd, vd, nv) = (c.conv_dim(), c.value_dim(), c.n_v_heads);
        let qkv = grow(&mut b.qkv, n * cd);
        wqkv.apply(pool, acts, xn, n, qkv);
        let z = grow(&mut b.z, n * vd);
        self.z.apply(pool, acts, xn, n, z);
        let beta = grow(&mut b.beta, n * nv);
        self.beta.apply(pool, acts, xn, n, beta);
        let alpha = grow(&mut b.alpha, n * nv);
        self.alpha.apply(pool, acts, xn, n, alpha);
        let row = grow(&mut b.row, cd);
        let tmp = grow(&mut b.tmp, c.head_v_dim);
        for t in 0..n {
            let (conv_state, state) = kv.state_mut(layer, seq[t]);
            let x = &mut b.qkv[t * cd..(t + 1) * cd];
            self.convolve(c, conv_state, x, row);
            x.copy_from_slice(row);
            let o = &mut out[t * vd..(t + 1) * vd];
            let (beta, alpha) = (&b.beta[t * nv..], &b.alpha[t * nv..]);
            self.recur(c, x, (beta, alpha), state, (tmp, numerics), o);
            gated_norm(c, &self.norm, &b.z[t * vd..(t + 1) * vd], eps, tmp, o);
            kv.capture_layer(layer, seq[t], pos[t] + 1);
        }
    }

    /// The causal convolution of one token's q | k | v row `x` over the state's previous
    /// inputs, then SiLU, into `y`; the state shifts in `x`. (ggml's `ssm_conv`: a sum over
    /// the taps, oldest first, then its row-wise `silu`.)
    fn convolve(&self, c: &DeltaNetConfig, st: &mut [f32], x: &[f32], y: &mut [f32]) {
        let (cd, kk) = (c.conv_dim(), c.conv_kernel);
        y.fill(0.0);
        for j in 0..kk - 1 {
            vec_f32::fma_assign(
                y,
                &st[j * cd..(j + 1) * cd],
                &self.conv[j * cd..(j + 1) * cd],
            );
        }
        vec_f32::fma_assign(y, x, &self.conv[(kk - 1) * cd..]);
        silu_row(y);
        if kk > 1 {
            st.copy_within(cd.., 0);
            st[(kk - 2) * cd..].copy_from_slice(x);
        }
    }

    /// The gated delta rule for one token, as ggml's `gated_delta_net` computes it: `x` is
    /// its convolved q | k | v (q and k are L2-normalized here, in place), `beta` / `alpha`
    /// its `[n_v_heads]` inputs; updates the state matrices (each stored transposed,
    /// `M[j][i] = S[i][j]`, `head_v_dim` rows of `head_k_dim`) and writes each head's output
    /// to `o` (`[value_dim]`); `delta` holds one head's update (`[head_v_dim]`).
    fn recur(
        &self,
        c: &DeltaNetConfig,
        x: &mut [f32],
        (beta, alpha): (&[f32], &[f32]),
        state: &mut [f32],
        (delta, numerics): (&mut [f32], Numerics),
        o: &mut [f32],
    ) {
        let (dk, dv, kd) = (c.head_k_dim, c.head_v_dim, c.key_dim());
        let (qk, v) = x.split_at_mut(2 * kd);
        for head in qk.chunks_exact_mut(dk) {
            // The sum of squares in f64, then ggml's `l2_norm`, x / max(|x|, eps), or
            // transformers' `l2norm`, x / sqrt(|x|² + eps).
            let ss: f64 = head.iter().map(|&v| (v * v) as f64).sum();
            let scale = match numerics {
                Numerics::LlamaCpp => 1.0 / (ss as f32).sqrt().max(c.l2_eps),
                Numerics::F32 => 1.0 / (ss as f32 + c.l2_eps).sqrt(),
            };
            head.iter_mut().for_each(|v| *v *= scale);
        }
        let (q, k) = qk.split_at(kd);
        let scale = 1.0 / (dk as f32).sqrt();
        for h in 0..c.n_v_heads {
            let kh = c.k_head_of(h);
            let (q, k) = (&q[kh * dk..(kh + 1) * dk], &k[kh * dk..(kh + 1) * dk]);
            let v = &v[h * dv..(h + 1) * dv];
            let o = &mut o[h * dv..(h + 1) * dv];
            let m = &mut state[h * dk * dv..(h + 1) * dk * dv];
            let g = softplus(alpha[h] + self.dt_bias[h]) * self.a[h];
            let b = sigmoid(beta[h]);
            let decay = g.exp();
            m.iter_mut().for_each(|s| *s *= decay);
            // delta = beta · (v − Sᵀk); S ← S + k ⊗ delta; o = Sᵀq / sqrt(dk).
            for ((row, dj), vj) in m.chunks_exact(dk).zip(delta.iter_mut()).zip(v) {
                *dj = (vj - vec_f32::dot(row, k)) * b;
            }
            for (row, &dj) in m.chunks_exact_mut(dk).zip(delta.iter()) {
                vec_f32::mad(row, k, dj);
            }
            for (row, oj) in m.chunks_exact(dk).zip(o.iter_mut()) {
                *oj = vec_f32::dot(row, q) * scale;
            }
        }
    }
}

/// RMS-normalizes each head of `o` (`[value_dim]`) in place (ggml's `rms_norm`), times `w`,
/// times `silu(z)` (each head's row of `z` through ggml's row-wise `silu`); `tmp` holds a row.
fn gated_norm(c: &DeltaNetConfig, w: &[f32], z: &[f32], eps: f32, tmp: &mut [f32], o: &mut [f32]) {
    let dv = c.head_v_dim;
    for (head, zh) in o.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
        tmp.copy_from_slice(head);
        ops::rms_norm(tmp, w, eps, head);
        tmp.copy_from_slice(zh);
        silu_row(tmp);
        head.iter_mut().zip(tmp.iter()).for_each(|(v, s)| *v *= s);
    }
}

/// ggml's row-wise `silu` (`ggml_vec_silu_f32` as built for AVX-512): 16-lane groups, the
/// libm formula for the rest.
fn silu_row(x: &mut [f32]) {
    let body = x.len() / 16 * 16;
    let (head, tail) = x.split_at_mut(body);
    head.iter_mut().for_each(|v| *v = silu::silu_lane(*v));
    tail.iter_mut().for_each(|v| *v = silu::silu_libm(*v));
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)`, linear above 20 (ggml's and torch's `softplus`).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}
