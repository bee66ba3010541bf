//! AVX2 dot products of the k-quants (Q2_K ... Q6_K) with Q8_K activations.
//!
//! Each super-block is walked in eight chunks of 32 elements. A chunk's quants are unpacked
//! to unsigned bytes, multiplied with the activations by `maddubs` (u8 x i8 pair sums, exact
//! in i16 for quants below 64), then `madd` by the sub-block scales into i32 lanes. Signed
//! offsets (Q3_K's -4, Q6_K's -32) and the mins of Q2_K/Q4_K/Q5_K are applied through the
//! Q8_K group sums `bsums`, so the block's integer total is exact. The float math per block
//! is the scalar reference's formula; the reference spreads it over eight lanes, so results
//! differ from it only in float rounding order (Q2_K matches it exactly).

use std::arch::x86_64::*;

use super::Kernels;
use super::avx2::{entry, f16s, hsum_i32, load32, load32i, piece};
use crate::DType;
use crate::quant::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, blocks, q3k_scales,
};
use crate::quant::kquants::scales_mins_k4;

pub(super) fn install(k: &mut Kernels) {
    k.set_dot(DType::Q2_K, entry!(dot vec_dot_q2k));
    k.set_dot(DType::Q3_K, entry!(dot vec_dot_q3k));
    k.set_dot(DType::Q4_K, entry!(dot vec_dot_q4k));
    k.set_dot(DType::Q5_K, entry!(dot vec_dot_q5k));
    k.set_dot(DType::Q6_K, entry!(dot vec_dot_q6k));
}

/// i16 lanes: `s0` for the first 16 elements of a chunk, `s1` for the last 16.
#[inline]
#[target_feature(enable = "avx2")]
fn scales16(s0: i16, s1: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0))
}

/// `scale * sum(q * a)` per i32 lane for one chunk of 32 unsigned quants.
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

/// Sum over the 16 Q8_K groups of `bsums[g] * s[g]`.
#[inline(always)]
fn bsum_dot(b: &BlockQ8K, s: impl Fn(usize) -> i32) -> i32 {
    (0..QK_K / 16).map(|g| b.bsum(g) as i32 * s(g)).sum()
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q2k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ2K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut sum = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let summs = bsum_dot(b, |g| (a.scales[g] >> 4) as i32);
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let q = load32(piece(&a.qs, h));
            for j in 0..4 {
                let c = 4 * h + j;
                let s = scales16(
                    (a.scales[2 * c] & 0xF) as i16,
                    (a.scales[2 * c + 1] & 0xF) as i16,
                );
                acc = _mm256_add_epi32(acc, chunk(bits(q, 2 * j, 3), piece(&b.qs, c), s));
            }
        }
        let dall = b.d() * f16s(a.d);
        let dmin = b.d() * f16s(a.dmin);
        sum += dall * hsum_i32(acc) as f32 - dmin * summs as f32;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q3k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ3K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut sum = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let sc = q3k_scales(&a.scales);
        let hm = load32(&a.hmask);
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let q = load32(piece(&a.qs, h));
            for j in 0..4 {
                let c = 4 * h + j;
                // q + 4 in 0..8: two low bits, plus 4 when the hmask bit is set.
                let high = _mm256_slli_epi16(bits(hm, c, 1), 2);
                let qc = _mm256_or_si256(bits(q, 2 * j, 3), high);
                let s = scales16(sc[2 * c] as i16, sc[2 * c + 1] as i16);
                acc = _mm256_add_epi32(acc, chunk(qc, piece(&b.qs, c), s));
            }
        }
        let isum = hsum_i32(acc) - 4 * bsum_dot(b, |g| sc[g] as i32);
        sum += f16s(a.d) * b.d() * isum as f32;
    }
    sum
}

/// Q4_K and Q5_K share everything but the fifth bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_k4(scales: &[u8; 12], qs: &[u8; 128], qh: Option<&[u8; 32]>, b: &BlockQ8K) -> (i32, i32) {
    let (sc, mn) = scales_mins_k4(scales);
    let summ = bsum_dot(b, |g| mn[g / 2] as i32);
    let low4 = _mm256_set1_epi8(0x0F);
    let hv = qh.map(|h| load32(h));
    let mut acc = _mm256_setzero_si256();
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
        acc = _mm256_add_epi32(acc, chunk(lo, piece(&b.qs, 2 * k), s0));
        acc = _mm256_add_epi32(acc, chunk(hi, piece(&b.qs, 2 * k + 1), s1));
    }
    (hsum_i32(acc), summ)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q4k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ4K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut sum = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (isum, summ) = dot_k4(&a.scales, &a.qs, None, b);
        sum += f16s(a.d) * b.d() * isum as f32;
        sum -= f16s(a.dmin) * b.d() * summ as f32;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q5k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ5K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut sum = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (isum, summ) = dot_k4(&a.scales, &a.qs, Some(&a.qh), b);
        sum += f16s(a.d) * b.d() * isum as f32;
        sum -= f16s(a.dmin) * b.d() * summ as f32;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q6k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ6K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let low4 = _mm256_set1_epi8(0x0F);
    let mut sum = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let sc = &a.scales;
        let mut acc = _mm256_setzero_si256();
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
                let s = scales16(sc[2 * c] as i16, sc[2 * c + 1] as i16);
                acc = _mm256_add_epi32(acc, chunk(q, piece(&b.qs, c), s));
            }
        }
        let isum = hsum_i32(acc) - 32 * bsum_dot(b, |g| sc[g] as i32);
        sum += f16s(a.d) * b.d() * isum as f32;
    }
    sum
}
