//! AVX2 activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16), byte-identical to the scalar
//! table's: Q8_0/Q8_1 are llama.cpp's x86 `quantize_row_q8_0/1` (`127 / amax`, ties-to-even
//! rounding), the others its reference conversions.

use std::arch::x86_64::*;

use super::{hsum_i32, piece};
use crate::quant::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K, QK, QK_K, blocks_mut};

#[inline]
#[target_feature(enable = "avx2")]
fn loadf(x: &[f32; 8]) -> __m256 {
    // SAFETY: 8 readable floats; unaligned load.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// Largest |x| over 8 lanes, in the x86 quantizer's order: `maxps` of the four vectors
/// lane-wise, then 8 -> 4 -> 2 -> 1 lanes (the order only matters with NaNs).
#[inline]
#[target_feature(enable = "avx2")]
fn absmax_lanes(m: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
}

/// Largest |x| over 32 values (Q8_K; NaNs skipped, as in the scalar code).
#[inline]
#[target_feature(enable = "avx2")]
fn absmax32(x: &[f32; 32]) -> f32 {
    let mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_setzero_ps();
    for k in 0..4 {
        let v = loadf(x[8 * k..8 * k + 8].try_into().unwrap());
        // maxps returns its second operand when either is NaN.
        m = _mm256_max_ps(_mm256_and_ps(v, mask), m);
    }
    absmax_lanes(m)
}

/// Packs four vectors of eight i32 into 32 bytes in element order, saturating to i8.
#[inline]
#[target_feature(enable = "avx2")]
fn pack_i8(i: [__m256i; 4]) -> __m256i {
    let a = _mm256_packs_epi32(i[0], i[1]);
    let b = _mm256_packs_epi32(i[2], i[3]);
    let p = _mm256_packs_epi16(a, b);
    // packs work per 128-bit half; restore element order.
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline]
#[target_feature(enable = "avx2")]
fn store32(dst: &mut [i8; 32], v: __m256i) {
    // SAFETY: 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
}

/// One Q8_0/Q8_1 block as llama.cpp's x86 `quantize_row_q8_0/1`: `d = amax / 127`,
/// `q = cvtps(roundps_nearest(x * (127 / amax)))`, stored saturated; returns `(d, Σq)` with
/// the sum over the i32 quants (wrapping).
#[inline]
#[target_feature(enable = "avx2")]
fn q8_block(x: &[f32; 32], qs: &mut [i8; 32]) -> (f32, i32) {
    let sign = _mm256_set1_ps(-0.0);
    let mut v = [_mm256_setzero_ps(); 4];
    for (k, v) in v.iter_mut().enumerate() {
        *v = loadf(x[8 * k..8 * k + 8].try_into().unwrap());
    }
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for v in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
    }
    let amax = absmax_lanes(m);
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let mut q = [_mm256_setzero_si256(); 4];
    for (q, v) in q.iter_mut().zip(v) {
        let r = _mm256_round_ps(
            _mm256_mul_ps(v, id),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        *q = _mm256_cvtps_epi32(r);
    }
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    store32(qs, pack_i8(q));
    (d, hsum_i32(sum))
}

/// Run-time Q8_0 quantizer (byte-identical to `quant::legacy::quantize_q8_0_act`).
#[target_feature(enable = "avx2,f16c")]
pub(super) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    let y: &mut [BlockQ8_0] = blocks_mut(dst);
    for (x, b) in src.chunks_exact(QK).zip(y) {
        let (d, _) = q8_block(x.try_into().unwrap(), &mut b.qs);
        b.d = half::f16::from_f32(d).to_le_bytes();
    }
}

/// Run-time Q8_1 quantizer (byte-identical to `quant::legacy::quantize_q8_1_act`).
#[target_feature(enable = "avx2,f16c")]
pub(super) fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    let y: &mut [BlockQ8_1] = blocks_mut(dst);
    for (x, b) in src.chunks_exact(QK).zip(y) {
        let (d, sum) = q8_block(x.try_into().unwrap(), &mut b.qs);
        b.d = half::f16::from_f32(d).to_le_bytes();
        b.s = half::f16::from_f32(d * sum as f32).to_le_bytes();
    }
}

/// Q8_K (`quantize_row_q8_K_ref`): signed max of largest magnitude (first on ties),
/// `nearest_int` through the same float-magic trick, bsums from the exact quants.
#[target_feature(enable = "avx2")]
pub(super) fn quantize_q8k(src: &[f32], dst: &mut [u8]) {
    let y: &mut [BlockQ8K] = blocks_mut(dst);
    for (x, b) in src.chunks_exact(QK_K).zip(y) {
        let amax = (0..8)
            .map(|k| absmax32(piece(x, k)))
            .fold(0.0f32, |a, m| if m > a { m } else { a });
        if amax == 0.0 || amax.is_nan() {
            crate::quant::kquants::quantize_q8k(x, std::slice::from_mut(b));
            continue;
        }
        let max = first_with_abs(x, amax);
        let iscale = -127.0 / max;
        if !iscale.is_finite() {
            // Subnormal blocks: ggml's quants wrap out of i8 range; let the scalar code do it.
            crate::quant::kquants::quantize_q8k(x, std::slice::from_mut(b));
            continue;
        }
        let vs = _mm256_set1_ps(iscale);
        let magic = _mm256_set1_ps(12582912.0);
        for c in 0..8 {
            let xc = piece(x, c);
            let mut q = [_mm256_setzero_si256(); 4];
            for (k, q) in q.iter_mut().enumerate() {
                let v = _mm256_add_ps(
                    _mm256_mul_ps(loadf(xc[8 * k..8 * k + 8].try_into().unwrap()), vs),
                    magic,
                );
                let i = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x007f_ffff));
                let i = _mm256_sub_epi32(i, _mm256_set1_epi32(0x0040_0000));
                *q = _mm256_min_epi32(i, _mm256_set1_epi32(127));
            }
            // Two groups of 16 per 32 values; sum the packed bytes.
            let packed = pack_i8(q);
            let mut qs = [0i8; 32];
            store32(&mut qs, packed);
            b.qs[32 * c..32 * c + 32].copy_from_slice(&qs);
            let wide = _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(packed)),
                _mm256_set1_epi16(1),
            );
            let wide2 = _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm256_extracti128_si256(packed, 1)),
                _mm256_set1_epi16(1),
            );
            b.bsums[2 * c] = (hsum_i32(wide) as i16).to_le_bytes();
            b.bsums[2 * c + 1] = (hsum_i32(wide2) as i16).to_le_bytes();
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

/// The first value whose magnitude equals `amax`.
#[inline]
#[target_feature(enable = "avx2")]
fn first_with_abs(x: &[f32], amax: f32) -> f32 {
    let mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let target = _mm256_set1_ps(amax);
    for (k, c) in x.chunks_exact(8).enumerate() {
        let v = _mm256_and_ps(loadf(c.try_into().unwrap()), mask);
        let hits = _mm256_movemask_ps(_mm256_cmp_ps(v, target, _CMP_EQ_OQ));
        if hits != 0 {
            return x[8 * k + hits.trailing_zeros() as usize];
        }
    }
    0.0
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    let mut d8 = dst.chunks_exact_mut(16);
    for (s, d) in src.chunks_exact(8).zip(&mut d8) {
        let h = _mm256_cvtps_ph(loadf(s.try_into().unwrap()), _MM_FROUND_TO_NEAREST_INT);
        // SAFETY: 16 writable bytes; unaligned store.
        unsafe { _mm_storeu_si128(d.as_mut_ptr().cast(), h) };
    }
    crate::quant::floats::quantize_f16(&src[src.len() / 8 * 8..], d8.into_remainder());
}

#[target_feature(enable = "avx2")]
pub(super) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    let mut d8 = dst.chunks_exact_mut(16);
    for (s, d) in src.chunks_exact(8).zip(&mut d8) {
        let u = _mm256_castps_si256(loadf(s.try_into().unwrap()));
        let hi = _mm256_srli_epi32(u, 16);
        let abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
        let quiet = _mm256_or_si256(hi, _mm256_set1_epi32(64));
        let bias = _mm256_add_epi32(
            _mm256_set1_epi32(0x7fff),
            _mm256_and_si256(hi, _mm256_set1_epi32(1)),
        );
        let rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
        let r = _mm256_blendv_epi8(rounded, quiet, nan);
        let p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0b11_01_10_00);
        // SAFETY: 16 writable bytes; unaligned store.
        unsafe { _mm_storeu_si128(d.as_mut_ptr().cast(), _mm256_castsi256_si128(p)) };
    }
    crate::quant::floats::quantize_bf16(&src[src.len() / 8 * 8..], d8.into_remainder());
}
