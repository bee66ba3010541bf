//! AVX2 dot products of the k-quants (Q2_K ... Q6_K) with Q8_K activations, with the float
//! structure of llama.cpp's `ggml_vec_dot_q*_K_q8_K` (ggml-cpu/arch/x86/quants.c, AVX2).
//!
//! Each super-block is walked in eight chunks of 32 elements. A chunk's quants are unpacked
//! to unsigned bytes, multiplied with the activations by `maddubs` (u8 x i8 pair sums, exact
//! in i16), then `madd` by the sub-block scales into eight i32 lanes: lane k of a chunk holds
//! `scale · Σ q·a` over its elements 4k..4k+3. Summed over the chunks, these lanes (`sumi`)
//! are what llama.cpp converts to f32 and accumulates with `acc = fma(d, sumi, acc)`, one
//! FMA per super-block into eight f32 lanes. The offsets and mins go where llama.cpp puts
//! them:
//!
//! | format | offset / min term |
//! |---|---|
//! | Q2_K | `acc = fma(dmin, lanes(mins · bsums), acc)` before the block's main FMA |
//! | Q3_K | folded into the i16 products (`q = low2 - 4·!hbit`) |
//! | Q4_K | a 4-lane accumulator `acc_m = fma(dmin, lanes, acc_m)`, reduced at the end |
//! | Q5_K | a scalar `summs = fma(dmin, Σ mins · bsums, summs)` |
//! | Q6_K | `sumi - 32 · lanes(scales · bsums)` before the FMA |
//!
//! with `dmin = -d_x · dmin_w` and the result `hsum_f32(acc)` (+ the min term). Integer sums
//! are exact however they are computed, so the AVX-512 kernels reproduce these results bit
//! for bit from wider registers.

use std::arch::x86_64::*;

use super::{hsum_f32, load32, load32i, piece, scales8};
use crate::quant::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, blocks, q3k_scales,
};
use crate::quant::kquants::scales_mins_k4;

/// i16 lanes: `s0` for the first 16 elements of a chunk, `s1` for the last 16.
#[inline]
#[target_feature(enable = "avx2")]
fn scales16(s0: i16, s1: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0))
}

/// Chunk c's Q6_K scales from the 16 signed scale bytes `v`: `v[2c]` in the eight low i16
/// lanes, `v[2c + 1]` in the eight high ones (one shuffle, one sign extension).
#[inline]
#[target_feature(enable = "avx2")]
fn pair16(v: __m128i, c: usize) -> __m256i {
    /// Shuffle controls: row c is byte 2c eight times, then byte 2c + 1 eight times.
    const PAIR: [[i8; 16]; 8] = {
        let mut t = [[0i8; 16]; 8];
        let mut c = 0;
        while c < 8 {
            let mut j = 0;
            while j < 16 {
                t[c][j] = (2 * c + j / 8) as i8;
                j += 1;
            }
            c += 1;
        }
        t
    };
    // SAFETY: 16 readable bytes.
    let ctl = unsafe { _mm_loadu_si128(PAIR[c].as_ptr().cast()) };
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(v, ctl))
}

/// `scale · Σ q·a` per i32 lane for one chunk of 32 unsigned quants.
#[inline]
#[target_feature(enable = "avx2")]
fn chunk(q: __m256i, a: &[i8; 32], scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32i(a)), scales)
}

/// Bits `s..s+mask_bits` of every byte (a variable shift of 16-bit lanes, then a mask).
#[inline]
#[target_feature(enable = "avx2")]
fn bits(v: __m256i, s: usize, mask: i8) -> __m256i {
    let shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(s as i32));
    _mm256_and_si256(shifted, _mm256_set1_epi8(mask))
}

/// The 16 Q8_K group sums as i16 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bsums16(b: &BlockQ8K) -> __m256i {
    // SAFETY: `bsums` is 16 i16 = 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(b.bsums.as_ptr().cast()) }
}

/// Sixteen per-group values (i16 lanes) from bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn groups16(s: [u8; 16], signed: bool) -> __m256i {
    // SAFETY: 16 readable bytes; unaligned load.
    let v = unsafe { _mm_loadu_si128(s.as_ptr().cast()) };
    if signed {
        _mm256_cvtepi8_epi16(v)
    } else {
        _mm256_cvtepu8_epi16(v)
    }
}

/// `hsum_f32(acc) + ((m0 + m2) + (m1 + m3))`: the end of the Q4_K dot product.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn finish_q4k(acc: __m256, acc_m: __m128) -> f32 {
    let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    hsum_f32(acc) + _mm_cvtss_f32(m)
}

/// Q4_K/Q5_K min lanes: lane k = `m[2k]·(b[4k] + b[4k+1]) + m[2k+1]·(b[4k+2] + b[4k+3])`
/// (the mins apply to 32 elements, two Q8_K groups).
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn min_lanes_k4(mins: &[u8; 8], b: &BlockQ8K) -> __m128i {
    let bs = bsums16(b);
    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    // SAFETY: 8 readable bytes.
    let m = _mm_cvtepu8_epi16(unsafe { _mm_loadl_epi64(mins.as_ptr().cast()) });
    _mm_madd_epi16(m, pairs)
}

// ---------------------------------------------------------------------------------------------
// Per-block integer parts: the lanes of each 32-element chunk, in element order. Summing the
// eight chunks gives llama.cpp's `sumi`; the batch paths (`paths.rs`) need per-chunk totals.

/// Eight chunks of i32 lanes.
pub(super) type Chunks = [__m256i; 8];

/// The sum of the eight chunks (llama.cpp's `sumi`, exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn sum_chunks(c: &Chunks) -> __m256i {
    let a = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    let b = _mm256_add_epi32(_mm256_add_epi32(c[4], c[5]), _mm256_add_epi32(c[6], c[7]));
    _mm256_add_epi32(a, b)
}

/// Q2_K: `sc · q · a` with the 2-bit quants and the low-nibble scales.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn chunks_q2k(a: &BlockQ2K, b: &BlockQ8K) -> Chunks {
    let mut out = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let q = load32(piece(&a.qs, h));
        for j in 0..4 {
            let c = 4 * h + j;
            let s = scales16(
                (a.scales[2 * c] & 0xF) as i16,
                (a.scales[2 * c + 1] & 0xF) as i16,
            );
            out[c] = chunk(bits(q, 2 * j, 3), piece(&b.qs, c), s);
        }
    }
    out
}

/// Q3_K: `sc · q · a` with the signed quants `low2 - 4·!hbit`: two u8 x i8 products
/// subtracted in i16 (exact), as llama.cpp does.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn chunks_q3k(a: &BlockQ3K, b: &BlockQ8K) -> Chunks {
    let sc = q3k_scales(&a.scales);
    let hm = load32(&a.hmask);
    let mut out = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let q = load32(piece(&a.qs, h));
        for j in 0..4 {
            let c = 4 * h + j;
            let y = load32i(piece(&b.qs, c));
            let low = _mm256_maddubs_epi16(bits(q, 2 * j, 3), y);
            let clear = _mm256_andnot_si256(hm, _mm256_set1_epi8(1 << c));
            let four = _mm256_slli_epi16(bits(clear, c, 1), 2);
            let p = _mm256_sub_epi16(low, _mm256_maddubs_epi16(four, y));
            let s = scales16(sc[2 * c] as i16, sc[2 * c + 1] as i16);
            out[c] = _mm256_madd_epi16(p, s);
        }
    }
    out
}

/// Q4_K/Q5_K: `sc · q · a` (chunk c is sub-block c, one scale).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn chunks_k4(
    sc: &[u8; 8],
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    b: &BlockQ8K,
) -> Chunks {
    let low4 = _mm256_set1_epi8(0x0F);
    let hv = qh.map(|h| load32(h));
    let mut out = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        let q = load32(piece(qs, k));
        let mut lo = _mm256_and_si256(q, low4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        if let Some(hv) = hv {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(bits(hv, 2 * k, 1), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(bits(hv, 2 * k + 1, 1), 4));
        }
        let s0 = _mm256_set1_epi16(sc[2 * k] as i16);
        let s1 = _mm256_set1_epi16(sc[2 * k + 1] as i16);
        out[2 * k] = chunk(lo, piece(&b.qs, 2 * k), s0);
        out[2 * k + 1] = chunk(hi, piece(&b.qs, 2 * k + 1), s1);
    }
    out
}

/// Q6_K: `sc · q · a` with the *unsigned* quants (0..64); the -32 offset is applied by the
/// caller through the bsums (lane-wise with [`offset_lanes_q6k`], or in total).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn chunks_q6k(a: &BlockQ6K, b: &BlockQ8K) -> Chunks {
    let low4 = _mm256_set1_epi8(0x0F);
    // SAFETY: 16 readable bytes.
    let sv = unsafe { _mm_loadu_si128(a.scales.as_ptr().cast()) };
    let mut out = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let ql0 = load32(piece(&a.ql, 2 * h));
        let ql1 = load32(piece(&a.ql, 2 * h + 1));
        let qh = load32(piece(&a.qh, h));
        // q in 0..64 for elements 128h + 32j + l, j = 0..4 (see BlockQ6K).
        let q = [
            _mm256_or_si256(
                _mm256_and_si256(ql0, low4),
                _mm256_slli_epi16(bits(qh, 0, 3), 4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, low4),
                _mm256_slli_epi16(bits(qh, 2, 3), 4),
            ),
            _mm256_or_si256(bits(ql0, 4, 0x0F), _mm256_slli_epi16(bits(qh, 4, 3), 4)),
            _mm256_or_si256(bits(ql1, 4, 0x0F), _mm256_slli_epi16(bits(qh, 6, 3), 4)),
        ];
        for (j, q) in q.into_iter().enumerate() {
            let c = 4 * h + j;
            out[c] = chunk(q, piece(&b.qs, c), pair16(sv, c));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Dot products.

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q2k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ2K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    for (ws, xs) in w.chunks(8).zip(x.chunks(8)) {
        let dw = scales8(ws, |a| a.d);
        let dmw = scales8(ws, |a| a.dmin);
        for (k, (a, b)) in ws.iter().zip(xs).enumerate() {
            let (d, dmin) = (b.d() * dw[k], -b.d() * dmw[k]);
            let mins = _mm256_madd_epi16(groups16(a.scales.map(|s| s >> 4), false), bsums16(b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins), acc);
            let sumi = sum_chunks(&chunks_q2k(a, b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    hsum_f32(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q3k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ3K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    for (ws, xs) in w.chunks(8).zip(x.chunks(8)) {
        let dw = scales8(ws, |a| a.d);
        for (k, (a, b)) in ws.iter().zip(xs).enumerate() {
            let d = b.d() * dw[k];
            let sumi = sum_chunks(&chunks_q3k(a, b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    hsum_f32(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q4k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ4K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (ws, xs) in w.chunks(8).zip(x.chunks(8)) {
        let dw = scales8(ws, |a| a.d);
        let dmw = scales8(ws, |a| a.dmin);
        for (k, (a, b)) in ws.iter().zip(xs).enumerate() {
            let (d, dmin) = (b.d() * dw[k], -b.d() * dmw[k]);
            let (sc, mn) = scales_mins_k4(&a.scales);
            let mins = _mm_cvtepi32_ps(min_lanes_k4(&mn, b));
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), mins, acc_m);
            let sumi = sum_chunks(&chunks_k4(&sc, &a.qs, None, b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    finish_q4k(acc, acc_m)
}

/// Sum of four i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn hsum_i32x4(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q5k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ5K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for (ws, xs) in w.chunks(8).zip(x.chunks(8)) {
        let dw = scales8(ws, |a| a.d);
        let dmw = scales8(ws, |a| a.dmin);
        for (k, (a, b)) in ws.iter().zip(xs).enumerate() {
            let (d, dmin) = (b.d() * dw[k], -b.d() * dmw[k]);
            let (sc, mn) = scales_mins_k4(&a.scales);
            summs = dmin.mul_add(hsum_i32x4(min_lanes_k4(&mn, b)) as f32, summs);
            let sumi = sum_chunks(&chunks_k4(&sc, &a.qs, Some(&a.qh), b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    hsum_f32(acc) + summs
}

/// Q6_K's offset lanes: lane k = `32 · (bsum[2k]·sc[2k] + bsum[2k+1]·sc[2k+1])`.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn offset_lanes_q6k(scales: &[i8; 16], b: &BlockQ8K) -> __m256i {
    let sc = groups16(scales.map(|s| s as u8), true);
    _mm256_slli_epi32(_mm256_madd_epi16(bsums16(b), sc), 5)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q6k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ6K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    for (ws, xs) in w.chunks(8).zip(x.chunks(8)) {
        let dw = scales8(ws, |a| a.d);
        for (k, (a, b)) in ws.iter().zip(xs).enumerate() {
            let d = b.d() * dw[k];
            let sumi = sum_chunks(&chunks_q6k(a, b));
            let sumi = _mm256_sub_epi32(sumi, offset_lanes_q6k(&a.scales, b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    hsum_f32(acc)
}
