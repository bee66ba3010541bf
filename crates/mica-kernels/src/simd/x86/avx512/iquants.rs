//! AVX-512 (F, BW) dot products of the i-quants with the most downloads: the grid types and
//! IQ4_XS two chunks per 512-bit register, IQ4_NL and MXFP4 two blocks per register. The
//! weights are decoded as in the AVX2 tier (`x86/avx2/iquants.rs`); the activations' signs
//! are applied by a masked negation (AVX-512 has no `vpsignb`), exact like the AVX2 sign
//! trick. Both 256-bit halves keep llama.cpp's chunk lane layout, so adding them gives its
//! eight lanes, and the float steps are the AVX2 tier's: the results are bit-identical.

use std::arch::x86_64::*;

use super::fold;
use crate::quant::blocks::{
    BlockIQ4NL, BlockMXFP4, BlockQ8_0, BlockQ8K, QK, QK_K, blocks, e8m0_to_f32_half, f16_to_f32,
};
use crate::quant::iq_grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::quant::iquants::unpack_nl;
use crate::simd::x86::avx2::{GridChunks, hsum_f32, load32i, nl_values, table16};

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn load64i(b: &[i8]) -> __m512i {
    let b: &[i8; 64] = b[..64].try_into().unwrap();
    // SAFETY: 64 readable bytes; unaligned load.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// `[lo | hi]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// `madd(maddubs(g, a · sign(s)), sc)`: the activations negated where `s` is negative.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn lanes(g: __m512i, s: __m512i, a: __m512i, sc: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(s);
    let a = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
    _mm512_madd_epi16(_mm512_maddubs_epi16(g, a), sc)
}

/// The dot product of a grid type or IQ4_XS: two chunks per register.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub(super) fn vec_dot_grid<G: GridChunks>(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[G::B], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let mut sumi = _mm512_setzero_si512();
        for c in (0..QK_K / 32).step_by(2) {
            // SAFETY: this function runs with AVX2.
            let ((g0, s0, c0), (g1, s1, c1)) = unsafe { (G::chunk(a, c), G::chunk(a, c + 1)) };
            let p = lanes(
                pair(g0, g1),
                pair(s0, s1),
                load64i(&b.qs[32 * c..]),
                pair(c0, c1),
            );
            sumi = _mm512_add_epi32(sumi, p);
        }
        let d = _mm256_set1_ps(f16_to_f32(G::d(a)) * b.d());
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold(sumi)), acc);
    }
    G::MULT * hsum_f32(acc)
}

/// IQ4_NL and MXFP4: two blocks per register, their two accumulators as llama.cpp's
/// `accum1`/`accum2` in the halves of one; an odd last block in scalar.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
fn nl_dot<B>(
    w: &[B],
    x: &[BlockQ8_0],
    table: &[i8; 16],
    qs: impl Fn(&B) -> &[u8; QK / 2],
    d: impl Fn(&B) -> f32,
) -> f32 {
    let tbl = table16(table);
    let ones = _mm512_set1_epi16(1);
    let mut acc = _mm512_setzero_ps();
    for (a, b) in w.chunks_exact(2).zip(x.chunks_exact(2)) {
        let v = pair(nl_values(qs(&a[0]), tbl), nl_values(qs(&a[1]), tbl));
        let y = pair(load32i(&b[0].qs), load32i(&b[1].qs));
        let p = lanes(_mm512_abs_epi8(v), v, y, ones);
        let d0 = _mm256_set1_ps(f16_to_f32(b[0].d) * d(&a[0]));
        let d1 = _mm256_set1_ps(f16_to_f32(b[1].d) * d(&a[1]));
        let dd = _mm512_castpd_ps(_mm512_insertf64x4(
            _mm512_castps_pd(_mm512_castps256_ps512(d0)),
            _mm256_castps_pd(d1),
            1,
        ));
        acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(p), acc);
    }
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    let mut sum = hsum_f32(_mm256_add_ps(lo, hi));
    if w.len() % 2 == 1 {
        let (a, b) = (&w[w.len() - 1], &x[w.len() - 1]);
        let q = unpack_nl(qs(a), table);
        let s: i32 = q
            .iter()
            .zip(&b.qs)
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        sum = (f16_to_f32(b.d) * d(a)).mul_add(s as f32, sum);
    }
    sum
}

#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub(super) fn vec_dot_iq4nl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockIQ4NL], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    nl_dot(w, x, &KVALUES_IQ4NL, |a| &a.qs, |a| f16_to_f32(a.d))
}

#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub(super) fn vec_dot_mxfp4(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockMXFP4], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    nl_dot(w, x, &KVALUES_MXFP4, |a| &a.qs, |a| e8m0_to_f32_half(a.e))
}
