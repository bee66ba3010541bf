//! AVX2 dot products of the i-quants, the ternary formats and MXFP4, with the float structure
//! of llama.cpp's x86 kernels (`ggml_vec_dot_iq*_q8_K`, `_tq*_q8_K`, `_iq4_nl_q8_0`,
//! `_mxfp4_q8_0` in ggml-cpu/arch/x86/quants.c, AVX2), written down step by step in
//! `tests/iquant_exact.rs`.
//!
//! A 32-element chunk's weights become bytes: the grid rows of the iq2/iq3/iq1 types
//! gathered eight (or four) values at a time from `quant::iq_grids`, their signs applied to
//! the activations (`sign_epi8` with ±1 bytes), the 4-bit non-linear values looked up by
//! `pshufb`, the ternary digits shifted out. `maddubs` then `madd` by the group scales give
//! eight i32 lanes per chunk (lane k: elements 4k..4k+3, times their scale), summed over the
//! super-block and accumulated by one FMA per super-block into eight f32 lanes, then ggml's
//! horizontal sum. Integer sums are exact, so the lanes are llama.cpp's lanes.

use std::arch::x86_64::*;

use super::{hsum_f32, load16, load32, load32i};
use crate::quant::blocks::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL,
    BlockIQ4XS, BlockMXFP4, BlockQ8_0, BlockQ8K, BlockTQ1_0, BlockTQ2_0, QK, QK_K, blocks,
    e8m0_to_f32_half, f16_to_f32,
};
use crate::quant::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL, KVALUES_MXFP4,
};
use crate::quant::iquants::{iq1m_scale, iq4xs_scale, unpack_tq1_0};

/// For each sign byte, eight bytes of +1 (bit clear) or -1 (bit set), as one u64.
const SIGNS8: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let b: u64 = if i >> j & 1 != 0 { 0xFF } else { 0x01 };
            v |= b << (8 * j);
            j += 1;
        }
        t[i] = v;
        i += 1;
    }
    t
};

/// `SIGNS8` of ggml's `ksigns_iq2xs` (its `keven_signs_q2xs`): the 7-bit sign indices.
const KEVEN_SIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = SIGNS8[KSIGNS_IQ2XS[i] as usize];
        i += 1;
    }
    t
};

#[inline(always)]
fn u32le(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Four u64 (element order) as one register.
#[inline]
#[target_feature(enable = "avx2")]
fn q4x64(v: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(v[3] as i64, v[2] as i64, v[1] as i64, v[0] as i64)
}

/// Eight u32 (element order) as one register.
#[inline]
#[target_feature(enable = "avx2")]
fn q8x32(v: [u32; 8]) -> __m256i {
    _mm256_set_epi32(
        v[7] as i32,
        v[6] as i32,
        v[5] as i32,
        v[4] as i32,
        v[3] as i32,
        v[2] as i32,
        v[1] as i32,
        v[0] as i32,
    )
}

/// i16 lanes: `s0` for the first 16 elements of a chunk, `s1` for the last 16.
#[inline]
#[target_feature(enable = "avx2")]
fn scales16(s0: i32, s1: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(s1 as i16), _mm_set1_epi16(s0 as i16))
}

/// One chunk's lanes: unsigned grid bytes `g` times the activations with signs `s` applied,
/// times the i16 `scales`.
#[inline]
#[target_feature(enable = "avx2")]
fn grid_chunk(g: __m256i, s: __m256i, a: &[i8], scales: __m256i) -> __m256i {
    let a = load32i(a[..32].try_into().unwrap());
    _mm256_madd_epi16(_mm256_maddubs_epi16(g, _mm256_sign_epi8(a, s)), scales)
}

/// One chunk's lanes for signed weight bytes `q` (the sign trick of llama.cpp's
/// `mul_add_epi8`), times the i16 `scales`.
#[inline]
#[target_feature(enable = "avx2")]
fn signed_chunk(q: __m256i, a: &[i8], scales: __m256i) -> __m256i {
    grid_chunk(_mm256_sign_epi8(q, q), q, a, scales)
}

/// `acc = fma(d, f32(lanes), acc)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(in crate::simd::x86) fn fma_lanes(acc: __m256, d: f32, lanes: __m256i) -> __m256 {
    _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc)
}

/// The 16 Q8_K group sums, paired: lane k = `bsum[2k] + bsum[2k+1]`.
#[inline]
#[target_feature(enable = "avx2")]
fn bsum_pairs(b: &BlockQ8K) -> __m256i {
    // SAFETY: `bsums` is 32 readable bytes; unaligned load.
    let v = unsafe { _mm256_loadu_si256(b.bsums.as_ptr().cast()) };
    _mm256_madd_epi16(v, _mm256_set1_epi16(1))
}

/// A 256-element type whose chunk `c` (elements `32c..32c + 32`) contributes
/// `madd(maddubs(g, sign(a, s)), sc)` to the block's lanes: `g` the weights' magnitudes as
/// unsigned bytes, `s` their signs (applied to the activations `a`), `sc` the i16 scale of
/// each half; the dot product is `MULT · hsum(Σ_blocks fma(d_w·d_x, lanes, acc))`.
pub(in crate::simd::x86) trait GridChunks {
    type B: crate::quant::Block;
    const MULT: f32;
    fn d(b: &Self::B) -> [u8; 2];
    /// `(g, s, sc)` of chunk `c` of `b`.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn chunk(b: &Self::B, c: usize) -> (__m256i, __m256i, __m256i);
}

macro_rules! grid_type {
    ($(#[$doc:meta])* $name:ident, $B:ty, $mult:expr, |$a:ident, $c:ident| $body:block) => {
        $(#[$doc])*
        pub(in crate::simd::x86) struct $name;
        impl GridChunks for $name {
            type B = $B;
            const MULT: f32 = $mult;
            #[inline(always)]
            fn d(b: &$B) -> [u8; 2] {
                b.d
            }
            #[inline(always)]
            unsafe fn chunk($a: &$B, $c: usize) -> (__m256i, __m256i, __m256i) {
                // SAFETY: the caller guarantees AVX2.
                unsafe { $body }
            }
        }
    };
}

grid_type!(
    /// IQ2_XXS: four grid rows and four 7-bit sign indices per chunk, one 4-bit scale.
    IQ2XXS, BlockIQ2XXS, 0.125, |a, ib| {
        let (idx, aux) = (u32le(&a.qs, 8 * ib), u32le(&a.qs, 8 * ib + 4));
        let g = q4x64(std::array::from_fn(|l| IQ2XXS_GRID[(idx >> (8 * l) & 0xFF) as usize]));
        let s = q4x64(std::array::from_fn(|l| KEVEN_SIGNS[(aux >> (7 * l) & 127) as usize]));
        let ls = 2 * (aux >> 28) as i32 + 1;
        (g, s, scales16(ls, ls))
    }
);

grid_type!(
    /// IQ2_XS: four 16-bit codes (9-bit grid index, 7-bit sign index), a scale per 16.
    IQ2XS, BlockIQ2XS, 0.125, |a, ib| {
        let q2 = |l: usize| u16::from_le_bytes([a.qs[8 * ib + 2 * l], a.qs[8 * ib + 2 * l + 1]]);
        let g = q4x64(std::array::from_fn(|l| IQ2XS_GRID[(q2(l) & 511) as usize]));
        let s = q4x64(std::array::from_fn(|l| KEVEN_SIGNS[(q2(l) >> 9) as usize]));
        let sc = a.scales[ib];
        (g, s, scales16(2 * (sc & 0xF) as i32 + 1, 2 * (sc >> 4) as i32 + 1))
    }
);

grid_type!(
    /// IQ2_S: 10-bit grid indices, explicit sign bytes, a scale per 16.
    IQ2S, BlockIQ2S, 0.125, |a, ib| {
        let (qs, signs) = a.qs.split_at(QK_K / 8);
        let qh = a.qh[ib] as usize;
        let g = q4x64(std::array::from_fn(|l| {
            IQ2S_GRID[qs[4 * ib + l] as usize | (qh << (8 - 2 * l) & 0x300)]
        }));
        let s = q4x64(std::array::from_fn(|l| SIGNS8[signs[4 * ib + l] as usize]));
        let sc = a.scales[ib];
        (g, s, scales16(2 * (sc & 0xF) as i32 + 1, 2 * (sc >> 4) as i32 + 1))
    }
);

grid_type!(
    /// IQ3_XXS: eight 4-value grid rows, four 7-bit sign indices and the scale in one u32.
    IQ3XXS, BlockIQ3XXS, 0.25, |a, ib| {
        let (q3, gas) = a.qs.split_at(QK_K / 4);
        let aux = u32le(gas, 4 * ib);
        let g = q8x32(std::array::from_fn(|j| IQ3XXS_GRID[q3[8 * ib + j] as usize]));
        let s = q4x64(std::array::from_fn(|l| KEVEN_SIGNS[(aux >> (7 * l) & 127) as usize]));
        let ls = 2 * (aux >> 28) as i32 + 1;
        (g, s, scales16(ls, ls))
    }
);

grid_type!(
    /// IQ3_S: eight 9-bit grid indices, explicit sign bytes, one scale.
    IQ3S, BlockIQ3S, 1.0, |a, ib| {
        let qh = a.qh[ib] as usize;
        let g = q8x32(std::array::from_fn(|j| {
            let (l, hi) = (j / 2, j % 2);
            IQ3S_GRID[a.qs[8 * ib + j] as usize | (qh << (8 - 2 * l - hi) & 256)]
        }));
        let s = q4x64(std::array::from_fn(|l| SIGNS8[a.signs[4 * ib + l] as usize]));
        let ls = 2 * (a.scales[ib / 2] >> (4 * (ib % 2)) & 0xF) as i32 + 1;
        (g, s, scales16(ls, ls))
    }
);

grid_type!(
    /// IQ4_XS: the non-linear values by `pshufb` (magnitudes, and the values themselves as
    /// signs: the sign trick of llama.cpp's `mul_add_epi8`), the 6-bit scale minus 32.
    IQ4XS, BlockIQ4XS, 1.0, |a, ib| {
        let qs: &[u8; 16] = a.qs[16 * ib..16 * ib + 16].try_into().unwrap();
        let v = nl_values(qs, table16(&KVALUES_IQ4NL));
        let ls = iq4xs_scale(a, ib);
        (_mm256_sign_epi8(v, v), v, scales16(ls, ls))
    }
);

/// One chunk's lanes from its parts (see [`GridChunks`]).
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn parts_lanes(g: __m256i, s: __m256i, sc: __m256i, a: &[i8]) -> __m256i {
    grid_chunk(g, s, a, sc)
}

/// The dot product of a [`GridChunks`] type.
#[target_feature(enable = "avx2,fma")]
pub(super) fn vec_dot_grid<G: GridChunks>(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[G::B], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let mut sumi = _mm256_setzero_si256();
        for c in 0..QK_K / 32 {
            // SAFETY: this function runs with AVX2.
            let (g, s, sc) = unsafe { G::chunk(a, c) };
            sumi = _mm256_add_epi32(sumi, grid_chunk(g, s, &b.qs[32 * c..], sc));
        }
        acc = fma_lanes(acc, f16_to_f32(G::d(a)) * b.d(), sumi);
    }
    G::MULT * hsum_f32(acc)
}

/// 32 table values of 16 packed nibbles (low nibbles first, ggml's element order).
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn nl_values(qs: &[u8; 16], table: __m128i) -> __m256i {
    let q = load16(qs);
    let m4 = _mm_set1_epi8(0x0F);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    _mm256_set_m128i(hi, lo)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn table16(t: &[i8; 16]) -> __m128i {
    // SAFETY: 16 readable bytes; unaligned load.
    unsafe { _mm_loadu_si128(t.as_ptr().cast()) }
}

/// IQ1 grid rows `idx` (four, element order) as signed bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn iq1_grid(idx: [usize; 4]) -> __m256i {
    q4x64(idx.map(|i| IQ1S_GRID[i]))
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn vec_dot_iq1s(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockIQ1S], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    let mut accum1 = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let mut sumi = _mm256_setzero_si256();
        let mut sumi1 = 0i32;
        for ib in 0..8 {
            let qh = u16::from_le_bytes([a.qh[2 * ib], a.qh[2 * ib + 1]]) as usize;
            let g = iq1_grid(std::array::from_fn(|l| {
                a.qs[4 * ib + l] as usize | ((qh >> (3 * l) & 7) << 8)
            }));
            let ls = 2 * (qh >> 12 & 7) as i32 + 1;
            sumi = _mm256_add_epi32(sumi, signed_chunk(g, &b.qs[32 * ib..], scales16(ls, ls)));
            let sign = if qh & 0x8000 != 0 { -1 } else { 1 };
            sumi1 += (b.bsum(2 * ib) as i32 + b.bsum(2 * ib + 1) as i32) * sign * ls;
        }
        let d = b.d() * f16_to_f32(a.d);
        acc = fma_lanes(acc, d, sumi);
        accum1 = d.mul_add(sumi1 as f32, accum1);
    }
    hsum_f32(acc) + 0.125 * accum1
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn vec_dot_iq1m(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockIQ1M], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let ones = _mm256_set1_epi8(1);
    for (a, b) in w.iter().zip(x) {
        let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for ib in 0..8 {
            let sc = u16::from_le_bytes([a.scales[2 * (ib / 2)], a.scales[2 * (ib / 2) + 1]]);
            let sc = sc as i32 >> (6 * (ib % 2));
            let scales = scales16(2 * (sc & 7) + 1, 2 * (sc >> 3 & 7) + 1);
            let (h0, h1) = (a.qh[2 * ib] as usize, a.qh[2 * ib + 1] as usize);
            let q = &a.qs[4 * ib..];
            let g = iq1_grid([
                q[0] as usize | (h0 << 8 & 0x700),
                q[1] as usize | (h0 << 4 & 0x700),
                q[2] as usize | (h1 << 8 & 0x700),
                q[3] as usize | (h1 << 4 & 0x700),
            ]);
            let neg = [h0 & 0x08, h0 & 0x80, h1 & 0x08, h1 & 0x80];
            let delta = q4x64(neg.map(|m| if m != 0 { SIGNS8[255] } else { SIGNS8[0] }));
            let a8 = &b.qs[32 * ib..];
            sumi1 = _mm256_add_epi32(sumi1, signed_chunk(g, a8, scales));
            sumi2 = _mm256_add_epi32(sumi2, grid_chunk(ones, delta, a8, scales));
        }
        let d = b.d() * iq1m_scale(a);
        acc1 = fma_lanes(acc1, d, sumi1);
        acc2 = fma_lanes(acc2, d, sumi2);
    }
    hsum_f32(acc1) + 0.125 * hsum_f32(acc2)
}

/// The ternary formats: lanes of the digits times the activations, minus the paired group
/// sums; `acc = fma(lanes, d, acc)` (llama.cpp's mul + add, contracted by GCC).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn ternary_fma(acc: __m256, lanes: __m256i, b: &BlockQ8K, dw: [u8; 2]) -> __m256 {
    let lanes = _mm256_sub_epi32(lanes, bsum_pairs(b));
    let d = _mm256_set1_ps(b.d() * f16_to_f32(dw));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), d, acc)
}

/// Unsigned digits (0..=3) times activations, pair sums into i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn digit_chunk(t: __m256i, a: &[i8]) -> __m256i {
    let a = load32i(a[..32].try_into().unwrap());
    _mm256_madd_epi16(_mm256_maddubs_epi16(t, a), _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn vec_dot_tq2_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockTQ2_0], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    let m3 = _mm256_set1_epi8(3);
    for (a, b) in w.iter().zip(x) {
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q = load32(a.qs[32 * j..32 * j + 32].try_into().unwrap());
            for l in 0..4 {
                let t = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * l as i32)), m3);
                let p = digit_chunk(t, &b.qs[128 * j + 32 * l..]);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        acc = ternary_fma(acc, sumi, b, a.d);
    }
    hsum_f32(acc)
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn vec_dot_tq1_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockTQ1_0], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = _mm256_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let t = unpack_tq1_0(a);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            let tv = load32i(t[32 * c..32 * c + 32].try_into().unwrap());
            sumi = _mm256_add_epi32(sumi, digit_chunk(tv, &b.qs[32 * c..]));
        }
        acc = ternary_fma(acc, sumi, b, a.d);
    }
    hsum_f32(acc)
}

/// IQ4_NL and MXFP4: blocks in pairs into two accumulators, an odd last block in scalar.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn nl_dot<B>(
    w: &[B],
    x: &[BlockQ8_0],
    table: &[i8; 16],
    qs: impl Fn(&B) -> &[u8; QK / 2],
    d: impl Fn(&B) -> f32,
) -> f32 {
    let tbl = table16(table);
    let ones = _mm256_set1_epi16(1);
    let lanes = |a: &B, b: &BlockQ8_0| signed_chunk(nl_values(qs(a), tbl), &b.qs, ones);
    let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut pairs = w.chunks_exact(2).zip(x.chunks_exact(2));
    for (a, b) in pairs.by_ref() {
        acc1 = fma_lanes(acc1, f16_to_f32(b[0].d) * d(&a[0]), lanes(&a[0], &b[0]));
        acc2 = fma_lanes(acc2, f16_to_f32(b[1].d) * d(&a[1]), lanes(&a[1], &b[1]));
    }
    let mut sum = hsum_f32(_mm256_add_ps(acc1, acc2));
    if w.len() % 2 == 1 {
        let (a, b) = (&w[w.len() - 1], &x[w.len() - 1]);
        let q = crate::quant::iquants::unpack_nl(qs(a), table);
        let s: i32 = q
            .iter()
            .zip(&b.qs)
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        sum = (f16_to_f32(b.d) * d(a)).mul_add(s as f32, sum);
    }
    sum
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn vec_dot_iq4nl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockIQ4NL], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    nl_dot(w, x, &KVALUES_IQ4NL, |a| &a.qs, |a| f16_to_f32(a.d))
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn vec_dot_mxfp4(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockMXFP4], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    nl_dot(w, x, &KVALUES_MXFP4, |a| &a.qs, |a| e8m0_to_f32_half(a.e))
}

/// IQ4_NL on llama.cpp's repacked path ([`crate::simd::DotPath::RepackGemv`]): one FMA per
/// block of the block's integer sum.
#[target_feature(enable = "avx2,fma")]
pub(super) fn repack_iq4nl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockIQ4NL], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    let tbl = table16(&KVALUES_IQ4NL);
    let ones = _mm256_set1_epi16(1);
    let mut acc = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let s = super::hsum_i32(signed_chunk(nl_values(&a.qs, tbl), &b.qs, ones));
        acc = (s as f32).mul_add(f16_to_f32(a.d) * f16_to_f32(b.d), acc);
    }
    acc
}
