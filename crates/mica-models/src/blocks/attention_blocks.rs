//! Attention over a cache that stores keys and values as GGUF blocks (quantized cache types
//! such as q8_0 and q4_0, or float types that differ between keys and values), with the
//! arithmetic of llama.cpp's CPU flash attention for such caches
//! (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`, which llama.cpp runs for every
//! batch size when the cache is not f16/f16 or f32/f32). Per query row and head:
//!
//! ```text
//! q'   = q quantized to the key type's dot-product format (q8_0 for q8_0/q4_0/q5_0/iq4_nl
//!        keys, q8_1 for q4_1/q5_1, f16 for f16 keys)
//! s    = vec_dot(key blocks of position j, q')   (the weight-format dot-product kernel)
//!        then scale / soft-cap; positions outside the causal window are skipped
//! online softmax: on a new maximum M, acc *= e^(M_old - M); else vs = e^(s - M)
//! acc += dequantize(value blocks of j) · vs     (f32 accumulator, one FMA per element;
//!        an f16 value cache accumulates in f16 instead, as ggml's VKQ16)
//! S    = S·ms + vs;     out = acc / S
//! ```
//!
//! Where llama.cpp rotates a quantized cache's rows (see [`crate::kv_cache::Rotations`]),
//! the query is rotated like the keys before it is quantized, and the output is rotated
//! back like the values.
//!
//! The keys are read in place, block by block, through the dot-product kernels
//! ([`mica_kernels::simd::Kernels::vec_dot`]); one value row of one KV head at a time is
//! expanded into a head-sized buffer, once for all the query heads that read it (grouped-query
//! attention: each query head keeps its own softmax state and accumulator, so its arithmetic
//! is what it would be alone). Nothing dequantizes the cache as a whole.

use super::attention::{AttnShape, OutPtr, POS_TILE, SoftmaxSteps, run_split};
use crate::kv_cache::{KvCache, SeqId};
use half::f16;
use mica_kernels::ThreadPool;
use mica_kernels::ops::{f16v, hadamard, vec_f32};
use mica_kernels::{DType, quant};
use std::cell::RefCell;

/// Per-thread buffers of one work item (a token's query heads of one KV head), kept
/// between calls.
#[derive(Default)]
struct Scratch {
    /// Per query head: the query in the key type's dot-product format (`q_bytes` each).
    q: Vec<u8>,
    /// One query rotated in f32.
    q_rot: Vec<f32>,
    /// Float keys: the queries (`[heads][hd]`) and one key as values.
    q16: Vec<f16>,
    k16: Vec<f16>,
    q32: Vec<f32>,
    k32: Vec<f32>,
    /// Per query head: running maximum and sum of the online softmax.
    m: Vec<f32>,
    sum: Vec<f32>,
    /// Per query head: the f32 accumulator (`[heads][hd]`), and a tile's value rows as f32
    /// (`[POS_TILE][hd]`).
    acc: Vec<f32>,
    v32: Vec<f32>,
    /// Per query head: the f16 accumulator, and a tile's value rows, for an f16 value cache.
    acc16: Vec<f16>,
    v16: Vec<f16>,
    /// A tile's scores per query head and the online softmax's weights.
    steps: SoftmaxSteps,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `out[t]` = attention of query row `q[t]` over its sequence, for a cache that stores
/// blocks (see the module doc). Same contract as [`super::attention::attention`].
#[allow(clippy::too_many_arguments)]
pub(super) fn attention_blocks(
    pool: &ThreadPool,
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    seq: &[SeqId],
    pos: &[usize],
    q: &[f32],
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let q_dim = shape.n_head * hd;
    let group = shape.n_head / shape.n_head_kv;
    // Work items: a token's query heads of one KV head, cut into `parts` runs so that there
    // are at least two items per thread (a single decoded token has only `n_head_kv` groups).
    let groups = seq.len() * shape.n_head_kv;
    if groups == 0 {
        return;
    }
    let parts = (2 * pool.n_threads()).div_ceil(groups).clamp(1, group);
    let per_part = group.div_ceil(parts);
    let items = groups * parts;
    let dst = OutPtr(out.as_mut_ptr());
    let sm = shape.score_mod();
    run_split(pool, items, &SCRATCH, |range, s| {
        for item in range {
            let (tg, part) = (item / parts, item % parts);
            let (t, g) = (tg / shape.n_head_kv, tg % shape.n_head_kv);
            let h0 = g * group + part * per_part;
            let h1 = (h0 + per_part).min((g + 1) * group);
            if h0 >= h1 {
                continue;
            }
            let kv = cache
                .block_view(layer, seq[t])
                .expect("a cache of blocks (checked by the caller)");
            let heads = HeadBlocks {
                kv,
                k_off: bytes(kv.k_type, g * hd),
                k_len: bytes(kv.k_type, hd),
                v_off: bytes(kv.v_type, g * hd),
                v_len: bytes(kv.v_type, hd),
            };
            let qs = &q[t * q_dim + h0 * hd..][..(h1 - h0) * hd];
            // SAFETY: item (t, heads h0..h1) owns this slice of `out`; items are disjoint.
            let o = unsafe { dst.slice(t * q_dim + h0 * hd, (h1 - h0) * hd) };
            heads.attend(qs, hd, &sm, sm.first_visible(pos[t]), pos[t] + 1, s, o);
        }
    });
}

/// Reads little-endian f16 values (the pools are byte buffers, not aligned for `f16`).
fn read_f16(b: &[u8], out: &mut [f16]) {
    for (d, c) in out.iter_mut().zip(b.chunks_exact(2)) {
        *d = f16::from_le_bytes([c[0], c[1]]);
    }
}

/// Reads little-endian f32 values.
fn read_f32(b: &[u8], out: &mut [f32]) {
    for (d, c) in out.iter_mut().zip(b.chunks_exact(4)) {
        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

fn bytes(t: DType, n: usize) -> usize {
    t.row_bytes(n)
        .expect("head sizes are whole blocks (checked when the cache type was chosen)")
}

/// One KV head of one sequence: the byte range of the head in each key and value row.
struct HeadBlocks<'a> {
    kv: crate::kv_cache::BlockKv<'a>,
    k_off: usize,
    k_len: usize,
    v_off: usize,
    v_len: usize,
}

impl HeadBlocks<'_> {
    /// Attention of the query heads `qs` (`[heads][hd]`, all reading this KV head) over
    /// cached positions `lo..n_kv` into `out` (`[heads][hd]`).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        qs: &[f32],
        hd: usize,
        sm: &mica_kernels::attention::ScoreMod,
        lo: usize,
        n_kv: usize,
        s: &mut Scratch,
        out: &mut [f32],
    ) {
        let heads = qs.len() / hd;
        let kern = mica_kernels::simd::kernels();
        let (kt, vt) = (self.kv.k_type, self.kv.v_type);
        let qt = kt.vec_dot_type();
        let qb = bytes(qt, hd);
        s.q.resize(heads * qb, 0);
        for (q, dst) in qs.chunks_exact(hd).zip(s.q.chunks_exact_mut(qb)) {
            if self.kv.rot_k > 0 {
                s.q_rot.clear();
                s.q_rot.extend_from_slice(q);
                hadamard::fwht(&mut s.q_rot, self.kv.rot_k);
                kern.quantize_act(qt, &s.q_rot, dst);
            } else {
                kern.quantize_act(qt, q, dst);
            }
        }
        match kt {
            DType::F16 => {
                s.q16.resize(heads * hd, f16::ZERO);
                s.k16.resize(hd, f16::ZERO);
                read_f16(&s.q, &mut s.q16);
            }
            DType::F32 => {
                s.q32.resize(heads * hd, 0.0);
                s.k32.resize(hd, 0.0);
                read_f32(&s.q, &mut s.q32);
            }
            _ => {}
        }
        let f16_values = vt == DType::F16;
        if f16_values {
            s.acc16.clear();
            s.acc16.resize(heads * hd, f16::ZERO);
            s.v16.resize(POS_TILE * hd, f16::ZERO);
        } else {
            s.acc.clear();
            s.acc.resize(heads * hd, 0.0);
            s.v32.resize(POS_TILE * hd, 0.0);
        }
        s.m.clear();
        s.m.resize(heads, f32::NEG_INFINITY);
        s.sum.clear();
        s.sum.resize(heads, 0.0);
        s.steps.resize(heads);
        for j0 in (lo..n_kv).step_by(POS_TILE) {
            let js = j0..(j0 + POS_TILE).min(n_kv);
            // The tile's values (once for every query head) and each head's scores.
            for (jj, j) in js.clone().enumerate() {
                let key = &self.kv.key_row(j)[self.k_off..][..self.k_len];
                match kt {
                    DType::F16 => read_f16(key, &mut s.k16),
                    DType::F32 => read_f32(key, &mut s.k32),
                    _ => {}
                }
                let value = &self.kv.value_row(j)[self.v_off..][..self.v_len];
                if f16_values {
                    read_f16(value, &mut s.v16[jj * hd..][..hd]);
                } else {
                    quant::dequantize_row(vt, value, &mut s.v32[jj * hd..][..hd]);
                }
                for h in 0..heads {
                    s.steps.scores[h * POS_TILE + jj] = sm.apply(match kt {
                        // ggml's attention calls its own f16/f32 vector dots for float keys.
                        DType::F16 => f16v::dot(&s.q16[h * hd..][..hd], &s.k16),
                        DType::F32 => vec_f32::dot(&s.q32[h * hd..][..hd], &s.k32),
                        _ => kern.vec_dot(kt, hd, key, &s.q[h * qb..][..qb]),
                    });
                }
            }
            for h in 0..heads {
                let mut sum = s.sum[h];
                let weights = s.steps.weights(h, js.len(), &mut s.m[h]);
                for (jj, (ms, vs)) in weights.enumerate() {
                    if f16_values {
                        let acc = &mut s.acc16[h * hd..][..hd];
                        if ms != 1.0 {
                            f16v::scale(acc, ms);
                        }
                        f16v::mad(acc, &s.v16[jj * hd..][..hd], vs);
                    } else {
                        let acc = &mut s.acc[h * hd..][..hd];
                        if ms != 1.0 {
                            for a in acc.iter_mut() {
                                *a *= ms;
                            }
                        }
                        vec_f32::mad(acc, &s.v32[jj * hd..][..hd], vs);
                    }
                    // ggml computes `S*ms + vs` with one fused multiply-add (GCC contracts it).
                    sum = sum.mul_add(ms, vs);
                }
                s.sum[h] = sum;
            }
        }
        for h in 0..heads {
            let sum = s.sum[h];
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            let o = &mut out[h * hd..][..hd];
            if f16_values {
                for (o, a) in o.iter_mut().zip(&s.acc16[h * hd..][..hd]) {
                    *o = a.to_f32() * inv;
                }
            } else {
                for (o, a) in o.iter_mut().zip(&s.acc[h * hd..][..hd]) {
                    *o = a * inv;
                }
            }
            if self.kv.rot_v > 0 {
                // The values were stored rotated: rotate the weighted sum back (`H·H = I`).
                hadamard::fwht(o, self.kv.rot_v);
            }
        }
    }
}
