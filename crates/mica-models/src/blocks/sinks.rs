//! Attention sinks (gpt-oss): one learned logit per query head that joins every softmax's
//! denominator and attends to nothing, so a head may give most of its weight to no position.
//!
//! With the sink `s` of a head and its scores `x_j`, the attention output is
//! `Σ_j e^{x_j} v_j / (Σ_j e^{x_j} + e^s)`: the plain attention output times
//! `Z / (Z + e^s)`, `Z = Σ_j e^{x_j}`. [`apply`] rescales what [`super::attention`] computed
//! by that factor, recomputing each head's scores (same positions, window and scale) for `Z`,
//! so the attention paths stay as they are for every other family. (transformers
//! `eager_attention_forward` of `modeling_gpt_oss.py`, llama.cpp's `ggml_soft_max_ext` /
//! flash attention with sinks.)

use super::attention::{AttnShape, OutPtr, run_split};
use crate::error::{ModelError, Result};
use crate::kv_cache::{CacheTypes, KvCache, KvType, SeqId, SeqKv};
use half::f16;
use mica_kernels::ThreadPool;
use mica_kernels::ops::f16v;
use std::cell::RefCell;

thread_local! {
    /// Per thread: the query rounded to f16, and one head's scores.
    static SCRATCH: RefCell<(Vec<f16>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Scales each head of `out` (`[n, n_head · head_dim]`, the attention of `q` over layer
/// `layer` of the cache for tokens at `(seq, pos)`) by `Z / (Z + e^{sinks[h]})`. The scores
/// are recomputed as the attention's vector path computes them (an f16 cache: the query
/// rounded to f16). Only f16 and f32 caches are supported.
pub fn apply(
    pool: &ThreadPool,
    shape: AttnShape,
    cache: &KvCache,
    (layer, seq, pos): (usize, &[SeqId], &[usize]),
    q: &[f32],
    sinks: &[f32],
    out: &mut [f32],
) -> Result<()> {
    match cache.cache_types() {
        CacheTypes {
            k: KvType::F16,
            v: KvType::F16,
        } => {
            let view = |s| cache.typed_view::<f16>(layer, s).expect("the cache's type");
            run(pool, shape, seq, pos, q, sinks, out, view, |q, k, q16| {
                mica_kernels::ops::f32_to_f16(q, q16);
                f16v::dot(q16, k)
            });
        }
        CacheTypes {
            k: KvType::F32,
            v: KvType::F32,
        } => {
            let view = |s| cache.typed_view::<f32>(layer, s).expect("the cache's type");
            run(pool, shape, seq, pos, q, sinks, out, view, |q, k, _| {
                q.iter().zip(k).fold(0f32, |a, (&x, &y)| x.mul_add(y, a))
            });
        }
        t => {
            return Err(ModelError::Batch(format!(
                "attention sinks (gpt-oss) need an f16 or f32 KV cache, not {}/{}",
                t.k.name(),
                t.v.name()
            )));
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run<'a, T: Copy + 'a>(
    pool: &ThreadPool,
    shape: AttnShape,
    seq: &[SeqId],
    pos: &[usize],
    q: &[f32],
    sinks: &[f32],
    out: &mut [f32],
    view: impl Fn(SeqId) -> SeqKv<'a, T> + Sync,
    dot: impl Fn(&[f32], &[T], &mut Vec<f16>) -> f32 + Sync,
) {
    let (nh, hd) = (shape.n_head, shape.head_dim);
    let q_dim = nh * hd;
    let items = seq.len() * nh;
    if items == 0 {
        return;
    }
    let sm = shape.score_mod();
    let dst = OutPtr(out.as_mut_ptr());
    run_split(pool, items, &SCRATCH, |range, (q16, scores)| {
        q16.resize(hd, f16::ZERO);
        for item in range {
            let (t, h) = (item / nh, item % nh);
            let off = (h / (nh / shape.n_head_kv)) * hd;
            let kv = view(seq[t]);
            let qh = &q[t * q_dim + h * hd..][..hd];
            scores.clear();
            scores.extend(
                (sm.first_visible(pos[t])..=pos[t])
                    .map(|j| sm.apply(dot(qh, &kv.key_row(j)[off..][..hd], q16))),
            );
            let m = scores.iter().copied().fold(sinks[h], f32::max);
            let z: f32 = scores.iter().map(|&x| (x - m).exp()).sum();
            let f = z / (z + (sinks[h] - m).exp());
            // SAFETY: item (t, h) owns this slice of `out`; items are split disjointly.
            let o = unsafe { dst.slice(t * q_dim + h * hd, hd) };
            o.iter_mut().for_each(|v| *v *= f);
        }
    });
}
