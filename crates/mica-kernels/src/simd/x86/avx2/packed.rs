//! The AVX2 table's packed layout for the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
//! eight rows interleaved by groups of four quants, so that the SIMD lanes are rows.
//!
//! llama.cpp's `ggml_vec_dot_q*_q8_0` (AVX2) computes, per row and block, eight exact i32
//! lanes (lane k = the products of elements 4k..4k+3), converts them to f32 and accumulates
//! `acc = fma(d_w·d_x, lanes, acc)`; the row's result is `hsum_float_8(acc)` (+ `summs`).
//! Done row by row, every block costs an unpacking of its quants (nibbles, fifth bits), a
//! broadcast of its scale and a horizontal structure per row. Here the same numbers are
//! computed transposed: one vector holds quad k of eight rows (4 bytes per row), one
//! `vpmaddubsw` against quad k of the activations broadcast to every lane and one
//! `vpmaddwd` leave lane k of eight rows side by side, and eight accumulators `acc_k`
//! (lanes = rows) take `fma(d_w·d_x, lanes_k, acc_k)` with the eight rows' scales in one
//! vector. The end is `hsum_float_8`'s order across the accumulators,
//! `((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))`: every output is
//! bit-identical to the row-by-row kernel, in about half the instructions (llama.cpp's own
//! repack, `block_q4_0x8`, interleaves rows the same way for its gemv).
//!
//! Batches of [`DECODE_MIN_TOKENS`] or more tokens unpack each group once per token tile of
//! [`TOK_TILE`] (quad vectors, scales as f32) and run every token of the tile over it. With
//! the rows in the lanes, each activation quad is broadcast once per group, where the
//! row-by-row layout loads a token's block once for all rows but pays a scale broadcast and
//! a conversion chain per row; measured on a Zen 3 (criterion, one thread, 896×4864, in
//! cache) against the previous four-row layout: one token Q5_0 8.9 → 11.6 GiB/s, Q8_0 22.9
//! → 26.3 GiB/s; 512 tokens Q5_0 86 → 67 ms, Q8_0 103 → 75 ms.
//!
//! Q4_0 and Q5_0 quants are used unsigned (`u = q + 2^SHIFT`) with `2^SHIFT · (-Σy)` added
//! per lane (the activations' [`BlockAux`] lane sums): the same exact lanes as llama.cpp's
//! sign trick. Q8_0 keeps the sign trick (`|w|` against `sign(y, w)`).
//!
//! # Layout
//! Per group of eight rows (the last group repeats the last row) and block, exactly eight
//! blocks' bytes:
//! - the quants: 4-bit formats, four 32-byte vectors; vector m, bytes 4i..4i+4 = bytes
//!   4m..4m+4 of row i's `qs` (low nibbles: quad m, high nibbles: quad m + 4). Q8_0, eight
//!   32-byte vectors; vector k, bytes 4i..4i+4 = row i's quants 4k..4k+4;
//! - the eight rows' f16 `d`, then (Q4_1, Q5_1) their f16 `m`;
//! - (Q5_0, Q5_1) 32 bytes of fifth bits: byte 4i + e, bit k = the fifth bit of row i's
//!   element 4k + e, so one shift and one mask put quad k's bits at 0x10.

use std::arch::x86_64::*;

use super::mat::{Legacy, TOK_TILE};
use crate::quant::blocks::QK;
use crate::simd::mat::{ActRows, BlockAux, MatOut, PACKED_AHEAD, WeightRows, prefetch};

/// Rows per packed group.
pub(super) const GROUP: usize = 8;

/// Token batches from this size on take the decoded path (each group unpacked once per
/// token tile); fewer tokens do not repay the decoding.
const DECODE_MIN_TOKENS: usize = 8;

/// Whether `F` is Q8_0 (signed 8-bit quants).
const fn wide<F: Legacy>() -> bool {
    F::PQ == 32
}

/// Byte offsets in a group block: the scales `d`, the mins `m`, the fifth bits.
const fn d_at<F: Legacy>() -> usize {
    if wide::<F>() { 256 } else { 128 }
}
const fn m_at<F: Legacy>() -> usize {
    d_at::<F>() + 16
}
const fn h_at<F: Legacy>() -> usize {
    d_at::<F>() + if F::MIN { 32 } else { 16 }
}

/// Byte offsets in a file block (`d` first, then `m`, `qh`, `qs` where the format has them).
const fn file_qh<F: Legacy>() -> usize {
    if F::MIN { 4 } else { 2 }
}
const fn file_qs<F: Legacy>() -> usize {
    file_qh::<F>() + if F::Q5 { 4 } else { 0 }
}

/// Packs `rows` rows of `n` elements (`data`, the file's layout) into groups of eight.
pub(super) fn pack<F: Legacy>(n: usize, rows: usize, data: &[u8]) -> Vec<u8> {
    let nb = n / QK;
    let rb = nb * F::BYTES;
    assert!(nb * QK == n && rows > 0 && data.len() >= rows * rb);
    let gb = GROUP * F::BYTES;
    let mut out = vec![0u8; rows.div_ceil(GROUP) * nb * gb];
    let (qs, vectors) = (file_qs::<F>(), if wide::<F>() { 8 } else { 4 });
    for (g, group) in out.chunks_exact_mut(nb * gb).enumerate() {
        for (b, o) in group.chunks_exact_mut(gb).enumerate() {
            for i in 0..GROUP {
                let r = (GROUP * g + i).min(rows - 1);
                let s = &data[r * rb + b * F::BYTES..][..F::BYTES];
                for v in 0..vectors {
                    o[32 * v + 4 * i..][..4].copy_from_slice(&s[qs + 4 * v..][..4]);
                }
                o[d_at::<F>() + 2 * i..][..2].copy_from_slice(&s[..2]);
                if F::MIN {
                    o[m_at::<F>() + 2 * i..][..2].copy_from_slice(&s[2..4]);
                }
                if F::Q5 {
                    let qh = file_qh::<F>();
                    let h = u32::from_le_bytes(s[qh..qh + 4].try_into().expect("4 bytes"));
                    for e in 0..4 {
                        let byte =
                            (0..8).fold(0u8, |a, k| a | (((h >> (4 * k + e)) & 1) as u8) << k);
                        o[h_at::<F>() + 4 * i + e] = byte;
                    }
                }
            }
        }
    }
    out
}

/// The inverse of [`pack`] for one row: blocks `blocks` of row `r` in the file's layout.
pub(super) fn unpack<F: Legacy>(
    n: usize,
    data: &[u8],
    r: usize,
    blocks: std::ops::Range<usize>,
    out: &mut [u8],
) {
    let nb = n / QK;
    let gb = GROUP * F::BYTES;
    let (g, i) = (r / GROUP, r % GROUP);
    let (qs, vectors) = (file_qs::<F>(), if wide::<F>() { 8 } else { 4 });
    let group = &data[g * nb * gb..][..nb * gb];
    let src = group[blocks.start * gb..blocks.end * gb].chunks_exact(gb);
    for (o, s) in out.chunks_exact_mut(F::BYTES).zip(src) {
        for v in 0..vectors {
            o[qs + 4 * v..][..4].copy_from_slice(&s[32 * v + 4 * i..][..4]);
        }
        o[..2].copy_from_slice(&s[d_at::<F>() + 2 * i..][..2]);
        if F::MIN {
            o[2..4].copy_from_slice(&s[m_at::<F>() + 2 * i..][..2]);
        }
        if F::Q5 {
            let mut h = 0u32;
            for e in 0..4 {
                let byte = s[h_at::<F>() + 4 * i + e] as u32;
                for k in 0..8 {
                    h |= ((byte >> k) & 1) << (4 * k + e);
                }
            }
            let qh = file_qh::<F>();
            o[qh..qh + 4].copy_from_slice(&h.to_le_bytes());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Unpacking a group block.

/// Quad k's fifth bits (bit k of every byte of `h`) at 0x10. 16-bit shifts by at most 4:
/// what crosses into the neighbouring byte lands outside bit 4 and is masked away.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth(h: __m256i, k: usize) -> __m256i {
    {
        let s = match k {
            0 => _mm256_slli_epi16(h, 4),
            1 => _mm256_slli_epi16(h, 3),
            2 => _mm256_slli_epi16(h, 2),
            3 => _mm256_slli_epi16(h, 1),
            4 => h,
            5 => _mm256_srli_epi16(h, 1),
            6 => _mm256_srli_epi16(h, 2),
            _ => _mm256_srli_epi16(h, 3),
        };
        _mm256_and_si256(s, _mm256_set1_epi8(0x10))
    }
}

/// The eight quad vectors of one block of a 4- or 5-bit group (unsigned quants), passed to
/// `f(k, q_k)` in the order 0, 4, 1, 5, ... (two per load).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quads<F: Legacy>(p: *const u8, mut f: impl FnMut(usize, __m256i)) {
    // SAFETY: the caller passes a whole group block and enables AVX2.
    unsafe {
        let low4 = _mm256_set1_epi8(0x0F);
        let h = if F::Q5 {
            _mm256_loadu_si256(p.add(h_at::<F>()).cast())
        } else {
            _mm256_setzero_si256()
        };
        for m in 0..4 {
            let v = _mm256_loadu_si256(p.add(32 * m).cast());
            let mut lo = _mm256_and_si256(v, low4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            if F::Q5 {
                lo = _mm256_or_si256(lo, fifth(h, m));
                hi = _mm256_or_si256(hi, fifth(h, m + 4));
            }
            f(m, lo);
            f(m + 4, hi);
        }
    }
}

/// The activation quad k of a block (its quants at `xq`) in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quad_x(xq: *const u8, k: usize) -> __m256i {
    // SAFETY: the caller passes a whole activation block and enables AVX2.
    unsafe { _mm256_set1_epi32(xq.add(4 * k).cast::<i32>().read_unaligned()) }
}

/// A token's per-lane offsets `2^SHIFT · (-Σy)` of one block (zero without a `SHIFT`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn offsets<F: Legacy>(a: &BlockAux) -> [i32; 8] {
    let mut o = [0i32; 8];
    if let Some(sh) = F::SHIFT {
        // SAFETY: 32 readable and writable bytes; the callers enable AVX2.
        unsafe {
            let v = _mm256_loadu_si256(a.neg_lane_sums.as_ptr().cast());
            let v = _mm256_sll_epi32(v, _mm_cvtsi32_si128(sh));
            _mm256_storeu_si256(o.as_mut_ptr().cast(), v);
        }
    }
    o
}

/// The eight accumulators' results, in `hsum_float_8`'s order (lane = row), plus `summs`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn finish(acc: &[__m256; 8], summs: __m256) -> [f32; 8] {
    // SAFETY: 32 writable bytes.
    unsafe {
        let a = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let b = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        let mut r = [0f32; 8];
        _mm256_storeu_ps(r.as_mut_ptr(), _mm256_add_ps(_mm256_add_ps(a, b), summs));
        r
    }
}

/// One step: quad k's lanes of eight rows into `acc_k`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn step(acc: &mut __m256, q: __m256i, y: __m256i, off: i32, shift: bool, d: __m256) {
    {
        let mut l = _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), _mm256_set1_epi16(1));
        if shift {
            l = _mm256_add_epi32(l, _mm256_set1_epi32(off));
        }
        *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(l), *acc);
    }
}

// ---------------------------------------------------------------------------------------------
// Few tokens: every group block unpacked for each token.

/// Eight rows (group at `g`) × one token (activation row at `x`, block data `aux`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot<F: Legacy>(
    g: *const u8,
    x: *const u8,
    aux: &[BlockAux],
    nb: usize,
    pf: bool,
) -> [f32; 8] {
    let gb = GROUP * F::BYTES;
    let xq = if F::MIN { 4 } else { 2 };
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut summs = _mm256_setzero_ps();
    for (b, a) in aux.iter().enumerate().take(nb) {
        // SAFETY: block b of the group and of the token exist (the driver checks).
        unsafe {
            let p = g.add(b * gb);
            if pf {
                prefetch(p.wrapping_add(PACKED_AHEAD), gb);
            }
            let y = x.add(b * F::XBYTES + xq);
            let d = _mm256_mul_ps(
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(d_at::<F>()).cast())),
                _mm256_set1_ps(a.d),
            );
            if wide::<F>() {
                for (k, acc) in acc.iter_mut().enumerate() {
                    let w = _mm256_loadu_si256(p.add(32 * k).cast());
                    let ys = _mm256_sign_epi8(quad_x(y, k), w);
                    step(acc, _mm256_sign_epi8(w, w), ys, 0, false, d);
                }
            } else {
                let off = offsets::<F>(a);
                quads::<F>(p, |k, q| {
                    step(&mut acc[k], q, quad_x(y, k), off[k], F::SHIFT.is_some(), d)
                });
            }
            if F::MIN {
                let m = _mm256_cvtph_ps(_mm_loadu_si128(p.add(m_at::<F>()).cast()));
                summs = _mm256_fmadd_ps(m, _mm256_set1_ps(a.s), summs);
            }
        }
    }
    finish(&acc, summs)
}

/// The packed matrix kernel: groups of eight rows × each token (the decoded path from
/// [`DECODE_MIN_TOKENS`] tokens).
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mat<F: Legacy>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    let nb = w.n / QK;
    let gb = GROUP * F::BYTES;
    assert!(w.packed && w.group == GROUP && nb * QK == w.n && w.rows > 0);
    assert!(w.stride == nb * gb, "packed group stride");
    assert!(
        w.data.len() >= w.rows.div_ceil(GROUP) * w.stride,
        "packed rows"
    );
    assert!(x.data.len() == x.n * nb * F::XBYTES, "activation rows");
    assert!(x.aux.len() == x.n * nb, "activation block data");
    if x.n >= DECODE_MIN_TOKENS {
        // SAFETY: as asserted.
        return unsafe { decoded::<F>(w, x, out) };
    }
    for r0 in (0..w.rows).step_by(GROUP) {
        let nr = (w.rows - r0).min(GROUP);
        // SAFETY: group r0 / 8 exists (asserted above).
        let g = unsafe { w.data.as_ptr().add(r0 / GROUP * w.stride) };
        for t in 0..x.n {
            // SAFETY: token t's blocks exist (asserted above).
            let res = unsafe {
                group_dot::<F>(
                    g,
                    x.data.as_ptr().add(t * nb * F::XBYTES),
                    &x.aux[t * nb..(t + 1) * nb],
                    nb,
                    t == 0,
                )
            };
            for (i, &v) in res[..nr].iter().enumerate() {
                out.set(t, r0 + i, v);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Many tokens: each group decoded once per token tile, lanes still rows.

/// One block of a group, decoded: the eight unsigned quad vectors (Q8_0: the magnitudes),
/// the rows' `d` and `m` as f32.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Decoded {
    q: [__m256i; 8],
    d: __m256,
    m: __m256,
}

/// Decodes blocks `0..nb` of the group at `g` into `buf`, and for Q8_0 the signed quad
/// vectors into `signs`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode<F: Legacy>(
    g: *const u8,
    nb: usize,
    buf: &mut Vec<Decoded>,
    signs: &mut Vec<[__m256i; 8]>,
) {
    buf.clear();
    signs.clear();
    for b in 0..nb {
        // SAFETY: block b of the group exists (the driver checks).
        unsafe {
            let p = g.add(b * GROUP * F::BYTES);
            let mut e = Decoded {
                q: [_mm256_setzero_si256(); 8],
                d: _mm256_cvtph_ps(_mm_loadu_si128(p.add(d_at::<F>()).cast())),
                m: _mm256_setzero_ps(),
            };
            if F::MIN {
                e.m = _mm256_cvtph_ps(_mm_loadu_si128(p.add(m_at::<F>()).cast()));
            }
            if wide::<F>() {
                let s: [__m256i; 8] =
                    std::array::from_fn(|k| _mm256_loadu_si256(p.add(32 * k).cast()));
                e.q = s.map(|v| _mm256_sign_epi8(v, v));
                signs.push(s);
            } else {
                quads::<F>(p, |k, q| e.q[k] = q);
            }
            buf.push(e);
        }
    }
}

/// A decoded group × one token (activation row at `x`, block data `aux`, lane offsets
/// `offs`, one per block; read only where the format has a `SHIFT`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decoded_dot<F: Legacy>(
    wd: &[Decoded],
    sg: &[[__m256i; 8]],
    x: *const u8,
    aux: &[BlockAux],
    offs: &[[i32; 8]],
) -> [f32; 8] {
    assert!(F::SHIFT.is_none() || offs.len() >= wd.len(), "lane offsets");
    let xq = if F::MIN { 4 } else { 2 };
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut summs = _mm256_setzero_ps();
    for (b, (e, a)) in wd.iter().zip(aux).enumerate() {
        // SAFETY: block b of the token exists (the driver checks).
        unsafe {
            let y = x.add(b * F::XBYTES + xq);
            let d = _mm256_mul_ps(e.d, _mm256_set1_ps(a.d));
            for (k, acc) in acc.iter_mut().enumerate() {
                let mut yk = quad_x(y, k);
                if wide::<F>() {
                    yk = _mm256_sign_epi8(yk, sg.get_unchecked(b)[k]);
                }
                let off = if F::SHIFT.is_some() {
                    offs.get_unchecked(b)[k]
                } else {
                    0
                };
                step(acc, e.q[k], yk, off, F::SHIFT.is_some(), d);
            }
            if F::MIN {
                summs = _mm256_fmadd_ps(e.m, _mm256_set1_ps(a.s), summs);
            }
        }
    }
    finish(&acc, summs)
}

/// The decoded path: token tiles of [`TOK_TILE`], each group decoded once per tile.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decoded<F: Legacy>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    let nb = w.n / QK;
    let base = w.data.as_ptr();
    let mut buf: Vec<Decoded> = Vec::with_capacity(nb);
    let mut signs: Vec<[__m256i; 8]> = Vec::new();
    // The tile's lane offsets, `[t1 - t0][nb]`, shifted once here rather than per group.
    let mut offs: Vec<[i32; 8]> = Vec::new();
    for t0 in (0..x.n).step_by(TOK_TILE) {
        let t1 = (t0 + TOK_TILE).min(x.n);
        offs.clear();
        if F::SHIFT.is_some() {
            offs.extend(x.aux[t0 * nb..t1 * nb].iter().map(|a| offsets::<F>(a)));
        }
        for r0 in (0..w.rows).step_by(GROUP) {
            let nr = (w.rows - r0).min(GROUP);
            // SAFETY: group r0 / 8 exists (asserted by the caller).
            unsafe { decode::<F>(base.add(r0 / GROUP * w.stride), nb, &mut buf, &mut signs) };
            for t in t0..t1 {
                // SAFETY: token t's blocks exist (asserted by the caller).
                let res = unsafe {
                    decoded_dot::<F>(
                        &buf,
                        &signs,
                        x.data.as_ptr().add(t * nb * F::XBYTES),
                        &x.aux[t * nb..(t + 1) * nb],
                        // Empty for the formats without offsets (never read).
                        offs.get((t - t0) * nb..(t - t0 + 1) * nb).unwrap_or(&[]),
                    )
                };
                for (i, &v) in res[..nr].iter().enumerate() {
                    out.set(t, r0 + i, v);
                }
            }
        }
    }
}
