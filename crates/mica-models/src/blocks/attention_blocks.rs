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
//! ([`mica_kernels::simd::Kernels::vec_dot`]); one value row of one head at a time is expanded
//! into a head-sized f32 buffer. Nothing dequantizes the cache as a whole.

use super::attention::{AttnShape, OutPtr};
use crate::kv_cache::{KvCache, SeqId};
use half::f16;
use mica_kernels::ThreadPool;
use mica_kernels::ops::{f16v, hadamard, vec_f32};
use mica_kernels::pool::split_range;
use mica_kernels::{DType, quant};
use std::cell::RefCell;

/// Per-thread buffers of one head's attention, kept between calls.
#[derive(Default)]
struct Scratch {
    /// The query in the key type's dot-product format, and rotated in f32.
    q: Vec<u8>,
    q_rot: Vec<f32>,
    /// Float keys: the query and one key as values.
    q16: Vec<f16>,
    k16: Vec<f16>,
    q32: Vec<f32>,
    k32: Vec<f32>,
    /// f32 accumulator and one dequantized value row.
    acc: Vec<f32>,
    v32: Vec<f32>,
    /// f16 accumulator and one value row, for an f16 value cache.
    acc16: Vec<f16>,
    v16: Vec<f16>,
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
    let items = seq.len() * shape.n_head;
    if items == 0 {
        return;
    }
    let dst = OutPtr(out.as_mut_ptr());
    let sm = shape.score_mod();
    let run = |i: usize, nt: usize| {
        SCRATCH.with_borrow_mut(|s| {
            for item in split_range(items, i, nt, 1) {
                let (t, h) = (item / shape.n_head, item % shape.n_head);
                let g = h / (shape.n_head / shape.n_head_kv);
                let kv = cache
                    .block_view(layer, seq[t])
                    .expect("a cache of blocks (checked by the caller)");
                let qh = &q[t * q_dim + h * hd..][..hd];
                // SAFETY: item (t, h) owns this slice of `out`; items are split disjointly.
                let o = unsafe { dst.slice(t * q_dim + h * hd, hd) };
                let head = HeadBlocks {
                    kv,
                    k_off: bytes(kv.k_type, g * hd),
                    k_len: bytes(kv.k_type, hd),
                    v_off: bytes(kv.v_type, g * hd),
                    v_len: bytes(kv.v_type, hd),
                };
                head.attend(qh, &sm, sm.first_visible(pos[t]), pos[t] + 1, s, o);
            }
        })
    };
    if items == 1 {
        run(0, 1);
    } else {
        pool.run(run);
    }
}

/// Reads little-endian f16 values (the pools are byte buffers, not aligned for `f16`).
fn read_f16(b: &[u8], out: &mut Vec<f16>) {
    out.clear();
    out.extend(b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])));
}

/// Reads little-endian f32 values.
fn read_f32(b: &[u8], out: &mut Vec<f32>) {
    out.clear();
    out.extend(
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
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
    /// Attention of query `q` over cached positions `lo..n_kv` into `out`.
    fn attend(
        &self,
        q: &[f32],
        sm: &mica_kernels::attention::ScoreMod,
        lo: usize,
        n_kv: usize,
        s: &mut Scratch,
        out: &mut [f32],
    ) {
        let hd = q.len();
        let kern = mica_kernels::simd::kernels();
        let (kt, vt) = (self.kv.k_type, self.kv.v_type);
        let qt = kt.vec_dot_type();
        s.q.resize(bytes(qt, hd), 0);
        if self.kv.rot_k > 0 {
            s.q_rot.clear();
            s.q_rot.extend_from_slice(q);
            hadamard::fwht(&mut s.q_rot, self.kv.rot_k);
            kern.quantize_act(qt, &s.q_rot, &mut s.q);
        } else {
            kern.quantize_act(qt, q, &mut s.q);
        }
        match kt {
            DType::F16 => read_f16(&s.q, &mut s.q16),
            DType::F32 => read_f32(&s.q, &mut s.q32),
            _ => {}
        }
        let f16_values = vt == DType::F16;
        if f16_values {
            s.acc16.clear();
            s.acc16.resize(hd, f16::ZERO);
        } else {
            s.acc.clear();
            s.acc.resize(hd, 0.0);
            s.v32.resize(hd, 0.0);
        }
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
        for j in lo..n_kv {
            let key = &self.kv.key_row(j)[self.k_off..][..self.k_len];
            let score = sm.apply(match kt {
                // ggml's attention calls its own f16/f32 vector dots for float keys.
                DType::F16 => {
                    read_f16(key, &mut s.k16);
                    f16v::dot(&s.q16, &s.k16)
                }
                DType::F32 => {
                    read_f32(key, &mut s.k32);
                    vec_f32::dot(&s.q32, &s.k32)
                }
                _ => kern.vec_dot(kt, hd, key, &s.q),
            });
            let (mut ms, mut vs) = (1f32, 1f32);
            if score > m {
                ms = (m - score).exp();
                m = score;
            } else {
                vs = (score - m).exp();
            }
            let value = &self.kv.value_row(j)[self.v_off..][..self.v_len];
            if f16_values {
                if ms != 1.0 {
                    f16v::scale(&mut s.acc16, ms);
                }
                read_f16(value, &mut s.v16);
                f16v::mad(&mut s.acc16, &s.v16, vs);
            } else {
                if ms != 1.0 {
                    for a in s.acc.iter_mut() {
                        *a *= ms;
                    }
                }
                quant::dequantize_row(vt, value, &mut s.v32);
                vec_f32::mad(&mut s.acc, &s.v32, vs);
            }
            // ggml computes `S*ms + vs` with one fused multiply-add (GCC contracts it).
            sum = sum.mul_add(ms, vs);
        }
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        if f16_values {
            for (o, a) in out.iter_mut().zip(&s.acc16) {
                *o = a.to_f32() * inv;
            }
        } else {
            for (o, a) in out.iter_mut().zip(&s.acc) {
                *o = a * inv;
            }
        }
        if self.kv.rot_v > 0 {
            // The values were stored rotated: rotate the weighted sum back (`H·H = I`).
            hadamard::fwht(out, self.kv.rot_v);
        }
    }
}
