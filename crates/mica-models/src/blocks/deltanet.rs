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
use mica_kernels::pool::split_range;

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
}

impl DeltaBufs {
    /// Bytes the buffers hold now (their capacity).
    pub(crate) fn buffer_bytes(&self) -> usize {
        let bufs = [&self.qkv, &self.z, &self.beta, &self.alpha];
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
        let weights = MixWeights {
            conv: &self.conv,
            dt_bias: &self.dt_bias,
            a: &self.a,
            norm: &self.norm,
        };
        let mut t0 = 0;
        while t0 < n {
            // The tokens up to and including the next one after which a checkpoint of its
            // sequence is taken: the state must be whole at that point.
            let mut t1 = t0 + 1;
            while t1 < n && !kv.wants_capture(seq[t1 - 1], pos[t1 - 1] + 1) {
                t1 += 1;
            }
            let states = StatePtrs::gather(kv, layer, &seq[t0..t1]);
            let seg = Segment {
                c,
                w: &weights,
                tokens: t0..t1,
                seq,
                qkv: SharedMut(b.qkv.as_mut_ptr()),
                z: &b.z,
                beta: &b.beta,
                alpha: &b.alpha,
                out: SharedMut(out.as_mut_ptr()),
                states: &states,
                eps,
                numerics,
            };
            // Each thread owns whole key heads (and the value heads that read them): their
            // channels of the convolution, their state matrices and their outputs, so the
            // threads never touch the same element and each element's arithmetic is the one
            // of a single thread.
            pool.run(|i, nt| {
                let heads = split_range(c.n_k_heads, i, nt, 1);
                if !heads.is_empty() {
                    // SAFETY: threads own disjoint key heads (see `Segment::run`).
                    unsafe { seg.run(heads) };
                }
            });
            if kv.wants_capture(seq[t1 - 1], pos[t1 - 1] + 1) {
                kv.capture_layer(layer, seq[t1 - 1], pos[t1 - 1] + 1);
            }
            t0 = t1;
        }
    }
}

/// The layer's own weights that the token mixing reads.
struct MixWeights<'a> {
    conv: &'a [f32],
    dt_bias: &'a [f32],
    a: &'a [f32],
    norm: &'a [f32],
}

/// A pointer that threads write through at disjoint places.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: only used for writes that the owners of the pointer keep disjoint between threads.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}

/// The convolution state and the state matrices of each sequence in a run of tokens.
struct StatePtrs(Vec<(SeqId, SharedMut, SharedMut)>);

impl StatePtrs {
    fn gather(kv: &mut KvCache, layer: usize, seqs: &[SeqId]) -> StatePtrs {
        let mut v: Vec<(SeqId, SharedMut, SharedMut)> = Vec::new();
        for &s in seqs {
            if !v.iter().any(|e| e.0 == s) {
                let (conv, ssm) = kv.state_mut(layer, s);
                v.push((s, SharedMut(conv.as_mut_ptr()), SharedMut(ssm.as_mut_ptr())));
            }
        }
        StatePtrs(v)
    }

    fn of(&self, s: SeqId) -> (*mut f32, *mut f32) {
        let e = self.0.iter().find(|e| e.0 == s).expect("gathered");
        (e.1.0, e.2.0)
    }
}

/// One run of tokens of a DeltaNet layer, after the projections: the convolution, the
/// L2 norms, the gated delta rule and the gated norm, token by token in batch order.
struct Segment<'a> {
    c: &'a DeltaNetConfig,
    w: &'a MixWeights<'a>,
    tokens: std::ops::Range<usize>,
    seq: &'a [SeqId],
    /// `[n, conv_dim]` q | k | v, convolved in place.
    qkv: SharedMut,
    z: &'a [f32],
    beta: &'a [f32],
    alpha: &'a [f32],
    /// `[n, value_dim]`
    out: SharedMut,
    states: &'a StatePtrs,
    eps: f32,
    numerics: Numerics,
}

impl Segment<'_> {
    /// Runs key heads `heads` (and their value heads) over the segment's tokens, compiled
    /// for the best SIMD tier of this CPU (the same results on every tier: each step is a
    /// lane-wise multiply, add or fused multiply-add in a fixed order).
    ///
    /// # Safety
    /// Concurrent calls must have disjoint `heads`; the buffers behind the pointers must
    /// be as [`DeltaNet::forward`] set them up and not otherwise in use.
    unsafe fn run(&self, heads: std::ops::Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                // SAFETY: the features were just detected; the rest is the caller's.
                return unsafe { self.run_avx512(heads) };
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                // SAFETY: as above.
                return unsafe { self.run_avx2(heads) };
            }
        }
        // SAFETY: the caller's.
        unsafe { self.run_body(heads) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn run_avx512(&self, heads: std::ops::Range<usize>) {
        // SAFETY: the caller's.
        unsafe { self.run_body(heads) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(&self, heads: std::ops::Range<usize>) {
        // SAFETY: the caller's.
        unsafe { self.run_body(heads) }
    }

    #[inline(always)]
    unsafe fn run_body(&self, heads: std::ops::Range<usize>) {
        let c = self.c;
        let (dk, dv, kd, cd, kk) = (
            c.head_k_dim,
            c.head_v_dim,
            c.key_dim(),
            c.conv_dim(),
            c.conv_kernel,
        );
        let (nv, vd) = (c.n_v_heads, c.value_dim());
        let vheads: Vec<usize> = (0..nv)
            .filter(|&h| heads.contains(&c.k_head_of(h)))
            .collect();
        let mut y = vec![0f32; dk.max(dv)];
        let mut tmp = vec![0f32; dv];
        let body = cd / 16 * 16;
        for t in self.tokens.clone() {
            let (conv_st, ssm) = self.states.of(self.seq[t]);
            // SAFETY (for every slice made below from the raw pointers): the ranges are this
            // thread's key heads' q and k channels, its value heads' v channels, state
            // matrices and outputs, which no other thread touches (the caller's contract),
            // all inside the buffers `forward` sized.
            let x = unsafe { self.qkv.0.add(t * cd) };
            let channels = heads
                .clone()
                .flat_map(|kh| [kh * dk, kd + kh * dk].map(|a| (a, dk)))
                .chain(vheads.iter().map(|&h| (2 * kd + h * dv, dv)));
            for (a, len) in channels {
                let xr = unsafe { std::slice::from_raw_parts_mut(x.add(a), len) };
                let y = &mut y[..len];
                y.fill(0.0);
                for j in 0..kk - 1 {
                    let st = unsafe { std::slice::from_raw_parts(conv_st.add(j * cd + a), len) };
                    vec_f32::fma_assign_body(y, st, &self.w.conv[j * cd + a..][..len]);
                }
                vec_f32::fma_assign_body(y, xr, &self.w.conv[(kk - 1) * cd + a..][..len]);
                silu_from(y, a, body);
                if kk > 1 {
                    for j in 0..kk - 2 {
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                conv_st.add((j + 1) * cd + a),
                                conv_st.add(j * cd + a),
                                len,
                            )
                        };
                    }
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            xr.as_ptr(),
                            conv_st.add((kk - 2) * cd + a),
                            len,
                        )
                    };
                }
                xr.copy_from_slice(y);
            }
            for kh in heads.clone() {
                for a in [kh * dk, kd + kh * dk] {
                    let head = unsafe { std::slice::from_raw_parts_mut(x.add(a), dk) };
                    l2_normalize(head, c.l2_eps, self.numerics);
                }
            }
            let scale = 1.0 / (dk as f32).sqrt();
            for &h in &vheads {
                let kh = c.k_head_of(h);
                let q = unsafe { std::slice::from_raw_parts(x.add(kh * dk), dk) };
                let k = unsafe { std::slice::from_raw_parts(x.add(kd + kh * dk), dk) };
                let v = unsafe { std::slice::from_raw_parts(x.add(2 * kd + h * dv), dv) };
                let o =
                    unsafe { std::slice::from_raw_parts_mut(self.out.0.add(t * vd + h * dv), dv) };
                let m = unsafe { std::slice::from_raw_parts_mut(ssm.add(h * dk * dv), dk * dv) };
                let g = softplus(self.alpha[t * nv + h] + self.w.dt_bias[h]) * self.w.a[h];
                let b = sigmoid(self.beta[t * nv + h]);
                let decay = g.exp();
                // Row j of the (transposed) state depends only on itself: decay it, then
                // delta_j = beta · (v_j − row·k), row += k · delta_j, o_j = row·q / sqrt(dk),
                // all while the row is in L1 (the same arithmetic as four passes over S).
                for ((row, &vj), oj) in m.chunks_exact_mut(dk).zip(v).zip(o.iter_mut()) {
                    row.iter_mut().for_each(|s| *s *= decay);
                    let dj = (vj - vec_f32::dot_body(row, k)) * b;
                    vec_f32::mad_body(row, k, dj);
                    *oj = vec_f32::dot_body(row, q) * scale;
                }
                // The gated RMSNorm of the head's output.
                tmp.copy_from_slice(o);
                ops::rms_norm(&tmp, self.w.norm, self.eps, o);
                tmp.copy_from_slice(&self.z[t * vd + h * dv..][..dv]);
                silu_from(&mut tmp, 0, dv / 16 * 16);
                o.iter_mut().zip(tmp.iter()).for_each(|(v, s)| *v *= s);
            }
        }
    }
}

/// The sum of squares in f64, then ggml's `l2_norm`, x / max(|x|, eps), or transformers'
/// `l2norm`, x / sqrt(|x|² + eps).
#[inline(always)]
fn l2_normalize(head: &mut [f32], eps: f32, numerics: Numerics) {
    let ss: f64 = head.iter().map(|&v| (v * v) as f64).sum();
    let scale = match numerics {
        Numerics::LlamaCpp => 1.0 / (ss as f32).sqrt().max(eps),
        Numerics::F32 => 1.0 / (ss as f32 + eps).sqrt(),
    };
    head.iter_mut().for_each(|v| *v *= scale);
}

/// ggml's row-wise `silu` (`ggml_vec_silu_f32` as built for AVX-512) on the piece of a row
/// that starts at index `start`: 16-lane groups for the row's first `body` elements (its
/// whole groups of 16), the libm formula for the rest.
#[inline(always)]
fn silu_from(y: &mut [f32], start: usize, body: usize) {
    let split = body.saturating_sub(start).min(y.len());
    let (head, tail) = y.split_at_mut(split);
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
