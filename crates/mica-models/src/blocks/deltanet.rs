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
        unsafe { self.run_body::<false>(heads) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn run_avx512(&self, heads: std::ops::Range<usize>) {
        // SAFETY: the caller's.
        unsafe { self.run_body::<true>(heads) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(&self, heads: std::ops::Range<usize>) {
        // SAFETY: the caller's.
        unsafe { self.run_body::<false>(heads) }
    }

    /// `ROWS512`: the caller has AVX-512F and FMA, so 128-element state rows are held in
    /// registers ([`rows512::step`]) instead of looped over.
    #[inline(always)]
    unsafe fn run_body<const ROWS512: bool>(&self, heads: std::ops::Range<usize>) {
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
                // With AVX-512, a 128-element row stays in registers through the step.
                let in_regs = cfg!(target_arch = "x86_64") && ROWS512 && dk == 128;
                for ((row, &vj), oj) in m.chunks_exact_mut(dk).zip(v).zip(o.iter_mut()) {
                    #[cfg(target_arch = "x86_64")]
                    if in_regs {
                        // SAFETY: AVX-512F and FMA (`ROWS512`); 128-element slices.
                        *oj = unsafe { rows512::step(row, k, q, decay, vj, b, scale) };
                        continue;
                    }
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

/// One state row of 128 elements held in eight registers through the whole step.
#[cfg(target_arch = "x86_64")]
mod rows512 {
    use std::arch::x86_64::*;

    /// The key head size this path takes.
    const DK: usize = 128;

    /// [`vec_f32::dot_body`](mica_kernels::ops::vec_f32::dot_body) of a row in registers
    /// and 128 floats at `y`: the same four 16-lane accumulators and reduction tree.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn dot(r: &[__m512; 8], y: *const f32) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 4];
        for c in 0..2 {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: 128 readable floats at `y`.
                let yv = unsafe { _mm512_loadu_ps(y.add(64 * c + 16 * j)) };
                *a = _mm512_fmadd_ps(r[4 * c + j], yv, *a);
            }
        }
        let r16 = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r16), 1));
        let h8 = _mm256_add_ps(_mm512_castps512_ps256(r16), hi);
        let u4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
        // [u0 + u2, u1 + u3], then their sum.
        let p = _mm_add_ps(u4, _mm_movehl_ps(u4, u4));
        _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 1)))
    }

    /// One row of the gated delta rule, the arithmetic of the generic loop: decay, `delta =
    /// (v_j − row·k)·β`, `row += k·delta`, returns `row·q · scale`.
    ///
    /// # Safety
    /// AVX-512F and FMA; `row`, `k` and `q` hold 128 floats.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn step(
        row: &mut [f32],
        k: &[f32],
        q: &[f32],
        decay: f32,
        vj: f32,
        beta: f32,
        scale: f32,
    ) -> f32 {
        assert!(row.len() == DK && k.len() == DK && q.len() == DK);
        let d = _mm512_set1_ps(decay);
        // SAFETY (loads and stores): 128 floats each, checked above.
        let mut r: [__m512; 8] = std::array::from_fn(|i| unsafe {
            _mm512_mul_ps(_mm512_loadu_ps(row.as_ptr().add(16 * i)), d)
        });
        // SAFETY: as above.
        let dj = (vj - unsafe { dot(&r, k.as_ptr()) }) * beta;
        let dv = _mm512_set1_ps(dj);
        for (i, r) in r.iter_mut().enumerate() {
            // SAFETY: as above.
            *r = _mm512_fmadd_ps(unsafe { _mm512_loadu_ps(k.as_ptr().add(16 * i)) }, dv, *r);
        }
        // SAFETY: as above.
        let o = unsafe { dot(&r, q.as_ptr()) } * scale;
        for (i, r) in r.iter().enumerate() {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(16 * i), *r) };
        }
        o
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The generic row step (the arithmetic every tier shares).
    fn generic(row: &mut [f32], k: &[f32], q: &[f32], decay: f32, vj: f32, b: f32, s: f32) -> f32 {
        row.iter_mut().for_each(|x| *x *= decay);
        let dj = (vj - vec_f32::dot_body(row, k)) * b;
        vec_f32::mad_body(row, k, dj);
        vec_f32::dot_body(row, q) * s
    }

    /// The register-held row equals the generic loop bit for bit: random rows over many
    /// magnitudes, zeros, negative zeros and a decay of 1 and 0.
    #[test]
    fn rows512_step_equals_the_generic_row_bit_for_bit() {
        if !(std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma")) {
            // As the kernel tables' tests do: the tier does not exist here, nor its path.
            println!("SKIPPED: avx512 (this CPU lacks it; the path is not taken here)");
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let m = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * 2f32.powi((state % 24) as i32 - 12)
        };
        for case in 0..400 {
            let mut row: Vec<f32> = (0..128).map(|_| rnd()).collect();
            let k: Vec<f32> = (0..128).map(|_| rnd()).collect();
            let q: Vec<f32> = (0..128).map(|_| rnd()).collect();
            if case % 7 == 0 {
                row.iter_mut().step_by(3).for_each(|x| *x = -0.0);
            }
            let decay = match case % 5 {
                0 => 1.0,
                1 => 0.0,
                _ => rnd().abs().min(1.0),
            };
            let (vj, b, s) = (rnd(), rnd().abs(), 1.0 / 128f32.sqrt());
            let mut want_row = row.clone();
            let want = generic(&mut want_row, &k, &q, decay, vj, b, s);
            // SAFETY: the features were checked above; 128-element slices.
            let got = unsafe { rows512::step(&mut row, &k, &q, decay, vj, b, s) };
            assert_eq!(got.to_bits(), want.to_bits(), "case {case}: output");
            for (i, (g, w)) in row.iter().zip(&want_row).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "case {case}: state element {i}");
            }
        }
    }
}
