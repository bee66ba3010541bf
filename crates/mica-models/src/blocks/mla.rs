//! Multi-head latent attention (DeepSeek-V2's MLA), with the latent cached and the
//! key/value up-projections absorbed into the query and the output.
//!
//! Per token, `kv_a` projects the input to a latent of `kv_lora_rank` values (RMS-normed)
//! plus `qk_rope` dimensions of a key shared by every head (rotated by RoPE). That row,
//! `kv_lora_rank + qk_rope` values, is all the cache keeps ([`crate::config::MlaConfig`]).
//! transformers expands it per head through `kv_b` into keys (`qk_nope` values, then the
//! shared rope part) and values (`v_head_dim`); here the expansion is folded into the
//! query and the output instead, for prefill and decode alike:
//!
//! ```text
//! q_h            = [q_nope_h, rope(q_pe_h)]                   (q_b(norm(q_a(x))), or q(x))
//! k_h(j) · q_h   = (W_UK_h c_j) · q_nope_h + k_pe_j · q_pe_h
//!                = c_j · (W_UK_hᵀ q_nope_h) + k_pe_j · q_pe_h = latent_j · [q_lat_h, q_pe_h]
//! out_h          = Σ_j a_j W_UV_h c_j = W_UV_h (Σ_j a_j c_j)
//! ```
//!
//! so attention is multi-query attention of width `kv_lora_rank + qk_rope` over the latent
//! rows, values being their first `kv_lora_rank` entries. `k_b` holds each head's `W_UK_hᵀ`
//! (`[kv_lora_rank × qk_nope]`, llama.cpp's `attn_k_b`) and `v_b` each head's `W_UV_h`
//! (`[v_head_dim × kv_lora_rank]`, `attn_v_b`). The attention itself has the arithmetic of
//! llama.cpp's vector path for the cache type (f16 query, scores and accumulator over an f16
//! cache; f32 over an f32 one), for prefill as for decoding.
//!
//! References: DeepSeek-V2 (2024), §2.1; transformers `DeepseekV2Attention`; llama.cpp's
//! `deepseek2` graph (the absorbed form).

use super::attention::{OutPtr, POS_TILE, SoftmaxSteps, run_split};
use super::moe::project;
use crate::config::{MlaConfig, RopeConfig};
use crate::kv_cache::{CacheElem, CacheTypes, KvCache, KvType, SeqId, SeqKv};
use crate::weights::Linear;
use half::f16;
use mica_kernels::ThreadPool;
use mica_kernels::ops::{self, f16v, rms_norm, rope_angles, rope_apply};
use std::cell::RefCell;

/// The weights of one latent-attention layer beside its query (`DecoderLayer::wq`: `q_b`,
/// or the direct query projection) and output (`wo`) projections.
pub struct Mla {
    /// The query's low-rank projection `[q_lora_rank × n_embd]` and its RMSNorm weight
    /// (`q_a_proj`, `q_a_layernorm`); `None`: the query projection reads the input.
    pub q_a: Option<(Linear, Vec<f32>)>,
    /// `[kv_lora_rank + qk_rope × n_embd]` (`kv_a_proj_with_mqa`).
    pub kv_a: Linear,
    /// `[kv_lora_rank]` (`kv_a_layernorm`).
    pub kv_a_norm: Vec<f32>,
    /// Per head, `[kv_lora_rank × qk_nope]`: the head's query without RoPE to its latent
    /// query.
    pub k_b: Vec<Linear>,
    /// Per head, `[v_head_dim × kv_lora_rank]`: the head's latent output to its values.
    pub v_b: Vec<Linear>,
}

/// What one layer's latent attention reads besides its weights.
pub struct MlaInput<'a> {
    /// `[n, n_embd]` the attention norm's output.
    pub xn: &'a [f32],
    pub seq: &'a [SeqId],
    pub pos: &'a [usize],
    pub rope: &'a RopeConfig,
    pub eps: f32,
}

/// Per-thread buffers of one head's attention, kept between calls.
#[derive(Default)]
struct Scratch {
    q16: Vec<f16>,
    acc16: Vec<f16>,
    /// A tile of latent rows.
    rows16: Vec<f16>,
    rows32: Vec<f32>,
    /// Per head: the online softmax's running maximum and sum.
    m: Vec<f32>,
    sum: Vec<f32>,
    steps: SoftmaxSteps,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Mla {
    pub fn n_head(&self) -> usize {
        self.k_b.len()
    }

    /// The matrices, for the model's walks over its weights.
    pub fn linears(&self) -> impl Iterator<Item = &Linear> {
        self.q_a
            .iter()
            .map(|(l, _)| l)
            .chain(std::iter::once(&self.kv_a))
            .chain(&self.k_b)
            .chain(&self.v_b)
    }

    /// [`Mla::linears`], mutably.
    pub fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.q_a
            .iter_mut()
            .map(|(l, _)| l)
            .chain(std::iter::once(&mut self.kv_a))
            .chain(&mut self.k_b)
            .chain(&mut self.v_b)
    }

    /// Writes the batch's latent rows into `kv` (layer `layer`) and `out` (`[n, n_head ·
    /// v_head_dim]`) = every head's attention output, before the output projection.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        c: &MlaConfig,
        wq: &Linear,
        pool: &ThreadPool,
        input: &MlaInput<'_>,
        kv: &mut KvCache,
        layer: usize,
        out: &mut [f32],
    ) {
        let n = input.seq.len();
        let h = self.n_head();
        let (r, nope, rd, vd) = (c.kv_lora_rank, c.qk_nope, c.qk_rope, c.v_head_dim);
        let (qk, lat, half) = (c.qk_head_dim(), c.latent_dim(), c.half());
        // Queries `[n, h, qk]`.
        let mut q = Vec::new();
        match &self.q_a {
            Some((qa, norm)) => {
                let mut a = Vec::new();
                project(pool, qa, input.xn, n, &mut a);
                let mut t = vec![0f32; norm.len()];
                for row in a.chunks_exact_mut(norm.len()) {
                    t.copy_from_slice(row);
                    rms_norm(&t, norm, input.eps, row);
                }
                project(pool, wq, &a, n, &mut q);
            }
            None => project(pool, wq, input.xn, n, &mut q),
        }
        // Latent rows `[n, 2 · half]`: the normed compressed values, then the rope key.
        let mut kva = Vec::new();
        project(pool, &self.kv_a, input.xn, n, &mut kva);
        let mut latent = vec![0f32; n * 2 * half];
        let mut cs = vec![0f32; rd];
        let rope = input.rope;
        for t in 0..n {
            let src = &kva[t * lat..(t + 1) * lat];
            let dst = &mut latent[t * 2 * half..][..lat];
            rms_norm(&src[..r], &self.kv_a_norm, input.eps, &mut dst[..r]);
            dst[r..].copy_from_slice(&src[r..]);
            let factors = rope.freq_factors.as_deref();
            rope_angles(
                input.pos[t] as f32,
                rd,
                rope.freq_base,
                rope.freq_scale,
                factors,
                &mut cs,
            );
            if c.rope_mscale != 1.0 {
                ops::scale(&mut cs, c.rope_mscale);
            }
            rope_apply(&mut dst[r..], rd, rope.style, &cs);
            for head in q[t * h * qk..(t + 1) * h * qk].chunks_exact_mut(qk) {
                rope_apply(&mut head[nope..], rd, rope.style, &cs);
            }
            let row = &latent[t * 2 * half..][..2 * half];
            kv.write(
                layer,
                input.seq[t],
                input.pos[t],
                &row[..half],
                &row[half..],
            );
        }
        // Absorbed queries `[n, h, lat]`: each head's latent query, then its rope part.
        let mut qa = vec![0f32; n * h * lat];
        let (mut x, mut y) = (Vec::with_capacity(n * r.max(nope)), Vec::new());
        for (hh, k_b) in self.k_b.iter().enumerate() {
            x.clear();
            for t in 0..n {
                x.extend_from_slice(&q[(t * h + hh) * qk..][..nope]);
            }
            project(pool, k_b, &x, n, &mut y);
            for t in 0..n {
                let dst = &mut qa[(t * h + hh) * lat..][..lat];
                dst[..r].copy_from_slice(&y[t * r..(t + 1) * r]);
                dst[r..].copy_from_slice(&q[(t * h + hh) * qk + nope..][..rd]);
            }
        }
        // Latent outputs `[n, h, r]`.
        let mut o = vec![0f32; n * h * r];
        let shape = Shape {
            n_head: h,
            lat,
            half,
            rank: r,
            scale: c.kq_scale,
        };
        match kv.cache_types() {
            CacheTypes {
                k: KvType::F32,
                v: KvType::F32,
            } => attend::<f32>(pool, &shape, kv, layer, input, &qa, &mut o),
            CacheTypes {
                k: KvType::F16,
                v: KvType::F16,
            } => attend::<f16>(pool, &shape, kv, layer, input, &qa, &mut o),
            t => unreachable!("an MLA cache of {t} (refused when the types were chosen)"),
        }
        // Each head's values from its latent output.
        for (hh, v_b) in self.v_b.iter().enumerate() {
            x.clear();
            for t in 0..n {
                x.extend_from_slice(&o[(t * h + hh) * r..][..r]);
            }
            project(pool, v_b, &x, n, &mut y);
            for t in 0..n {
                out[(t * h + hh) * vd..][..vd].copy_from_slice(&y[t * vd..(t + 1) * vd]);
            }
        }
    }
}

/// The attention's widths.
struct Shape {
    n_head: usize,
    /// A latent row (the width of keys and absorbed queries).
    lat: usize,
    /// Values of a row in each pool.
    half: usize,
    /// The values: the first `rank` entries of a row.
    rank: usize,
    scale: f32,
}

/// Causal attention of the absorbed queries `qa` (`[n, n_head, lat]`) over each token's
/// sequence's latent rows, into `out` (`[n, n_head, rank]`). A work item is a run of one
/// token's heads, which read each tile of latent rows once between them; a token's heads are
/// cut into runs so that there are at least two items per thread (decoding has one token).
fn attend<T: MlaElem>(
    pool: &ThreadPool,
    s: &Shape,
    kv: &KvCache,
    layer: usize,
    input: &MlaInput<'_>,
    qa: &[f32],
    out: &mut [f32],
) {
    let n_tok = input.seq.len();
    let parts = (2 * pool.n_threads()).div_ceil(n_tok).clamp(1, s.n_head);
    let per_part = s.n_head.div_ceil(parts);
    let dst = OutPtr(out.as_mut_ptr());
    run_split(pool, n_tok * parts, &SCRATCH, |range, sc| {
        for item in range {
            let (t, part) = (item / parts, item % parts);
            let h0 = part * per_part;
            let h1 = (h0 + per_part).min(s.n_head);
            if h0 >= h1 {
                continue;
            }
            let view = kv
                .typed_view::<T>(layer, input.seq[t])
                .expect("the cache's type");
            let first = t * s.n_head + h0;
            let qs = &qa[first * s.lat..][..(h1 - h0) * s.lat];
            // SAFETY: item (t, heads h0..h1) owns this slice of `out`; items are disjoint.
            let o = unsafe { dst.slice(first * s.rank, (h1 - h0) * s.rank) };
            T::heads(&view, qs, s, input.pos[t] + 1, sc, o);
        }
    });
}

/// A cache element type with the arithmetic of llama.cpp's vector attention path for it
/// (ggml's one-chunk flash attention, which llama.cpp runs over the latent for short
/// batches and decoding): per head, an online softmax a tile of positions at a time.
trait MlaElem: CacheElem {
    /// Attention of the absorbed queries `qs` (`[heads][lat]`) over positions `0..n_kv`
    /// into `o` (`[heads][rank]`); each head's arithmetic is what it would be alone.
    fn heads(
        view: &SeqKv<'_, Self>,
        qs: &[f32],
        s: &Shape,
        n_kv: usize,
        sc: &mut Scratch,
        o: &mut [f32],
    );
}

/// The rows of positions `js` (each `2 · half` values, key half then value half) into
/// `rows` (`[POS_TILE][2 · half]`).
fn gather<T: Copy + Default>(
    view: &SeqKv<'_, T>,
    js: std::ops::Range<usize>,
    half: usize,
    rows: &mut Vec<T>,
) {
    rows.resize(POS_TILE * 2 * half, T::default());
    for (jj, j) in js.enumerate() {
        let row = &mut rows[jj * 2 * half..][..2 * half];
        row[..half].copy_from_slice(view.key_row(j));
        row[half..].copy_from_slice(view.value_row(j));
    }
}

/// Per head: the running maximum and sum of its online softmax, reset.
fn reset_softmax(sc: &mut Scratch, heads: usize) {
    sc.m.clear();
    sc.m.resize(heads, f32::NEG_INFINITY);
    sc.sum.clear();
    sc.sum.resize(heads, 0.0);
    sc.steps.resize(heads);
}

impl MlaElem for f16 {
    /// f16 queries, f16·f16 scores, the weighted sums accumulated in f16 (ggml's `VKQ16`).
    fn heads(
        view: &SeqKv<'_, f16>,
        qs: &[f32],
        s: &Shape,
        n_kv: usize,
        sc: &mut Scratch,
        o: &mut [f32],
    ) {
        let heads = qs.len() / s.lat;
        sc.q16.resize(heads * s.lat, f16::ZERO);
        ops::f32_to_f16(qs, &mut sc.q16);
        sc.acc16.clear();
        sc.acc16.resize(heads * s.rank, f16::ZERO);
        reset_softmax(sc, heads);
        let w = 2 * s.half;
        for j0 in (0..n_kv).step_by(POS_TILE) {
            let js = j0..(j0 + POS_TILE).min(n_kv);
            let n = js.len();
            gather(view, js, s.half, &mut sc.rows16);
            for h in 0..heads {
                let q = &sc.q16[h * s.lat..][..s.lat];
                for (jj, x) in sc.steps.scores[h * POS_TILE..][..n].iter_mut().enumerate() {
                    *x = f16v::dot(q, &sc.rows16[jj * w..][..s.lat]) * s.scale;
                }
            }
            for h in 0..heads {
                let acc = &mut sc.acc16[h * s.rank..][..s.rank];
                let mut sum = sc.sum[h];
                for (jj, (ms, vs)) in sc.steps.weights(h, n, &mut sc.m[h]).enumerate() {
                    if ms != 1.0 {
                        f16v::scale(acc, ms);
                    }
                    f16v::mad(acc, &sc.rows16[jj * w..][..s.rank], vs);
                    // ggml computes `S*ms + vs` with one fused multiply-add.
                    sum = sum.mul_add(ms, vs);
                }
                sc.sum[h] = sum;
            }
        }
        for h in 0..heads {
            let sum = sc.sum[h];
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            let acc = &sc.acc16[h * s.rank..][..s.rank];
            for (o, a) in o[h * s.rank..][..s.rank].iter_mut().zip(acc) {
                *o = a.to_f32() * inv;
            }
        }
    }
}

impl MlaElem for f32 {
    /// f32 throughout (float32 checkpoints).
    fn heads(
        view: &SeqKv<'_, f32>,
        qs: &[f32],
        s: &Shape,
        n_kv: usize,
        sc: &mut Scratch,
        o: &mut [f32],
    ) {
        let heads = qs.len() / s.lat;
        o.fill(0.0);
        reset_softmax(sc, heads);
        let w = 2 * s.half;
        for j0 in (0..n_kv).step_by(POS_TILE) {
            let js = j0..(j0 + POS_TILE).min(n_kv);
            let n = js.len();
            gather(view, js, s.half, &mut sc.rows32);
            for h in 0..heads {
                let q = &qs[h * s.lat..][..s.lat];
                for (jj, x) in sc.steps.scores[h * POS_TILE..][..n].iter_mut().enumerate() {
                    let k = &sc.rows32[jj * w..][..s.lat];
                    *x = q.iter().zip(k).fold(0f32, |a, (&x, &y)| x.mul_add(y, a)) * s.scale;
                }
            }
            for h in 0..heads {
                let acc = &mut o[h * s.rank..][..s.rank];
                let mut sum = sc.sum[h];
                for (jj, (ms, vs)) in sc.steps.weights(h, n, &mut sc.m[h]).enumerate() {
                    if ms != 1.0 {
                        acc.iter_mut().for_each(|x| *x *= ms);
                    }
                    for (x, &v) in acc.iter_mut().zip(&sc.rows32[jj * w..][..s.rank]) {
                        *x = v.mul_add(vs, *x);
                    }
                    sum = sum.mul_add(ms, vs);
                }
                sc.sum[h] = sum;
            }
        }
        for h in 0..heads {
            let sum = sc.sum[h];
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            o[h * s.rank..][..s.rank].iter_mut().for_each(|x| *x *= inv);
        }
    }
}
