//! AVX-512 (F, BW, VL) + VNNI dot products of the hottest formats; the others stay the AVX2
//! tier's. Results are bit-identical to the AVX2 tier's: integer sums are exact however they
//! are formed, and the float steps are the same (llama.cpp's, see `x86/avx2/dot.rs` and
//! `x86/avx2/kquants.rs`).
//!
//! - Legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): one 32-byte block per register, the
//!   u8 x i8 products by one `vpdpbusd` instead of `vpmaddubsw` + `vpmaddwd` (as llama.cpp
//!   built with AVX512-VNNI does). Q4_1/Q5_1 quants are unsigned: no sign trick needed.
//! - Q4_K and Q6_K: 64 elements (two chunks of 32) per 512-bit register; `vpmaddubsw` for
//!   the quant products (exact in i16), `vpdpwssd` to apply the sub-block scales and
//!   accumulate in i32. Both 256-bit halves use llama.cpp's chunk lane layout, so adding
//!   them gives its eight `sumi` lanes.

use std::arch::x86_64::*;

use super::{fold, halves16, twice};
use crate::quant::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, BlockQ8_1, BlockQ8K,
    QK, QK_K, blocks,
};
use crate::quant::kquants::scales_mins_k4;
use crate::simd::x86::avx2::{
    finish_q4k, hsum_f32, legacy_dot, load32, load32i, min_lanes_k4, nibbles, offset_lanes_q6k,
    q4_0_bytes, q5_0_bytes, q5_1_bytes, scales8,
};

/// u8 x i8 products summed four at a time into i32 lanes (exact, no i16 step).
#[inline]
#[target_feature(enable = "avx2,avx512vl,avx512vnni")]
fn dot_us8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
}

/// Signed i8 x i8 (sign trick); `y` must avoid -128.
#[inline]
#[target_feature(enable = "avx2,avx512vl,avx512vnni")]
fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

legacy_dot!(
    /// Q4_0 x Q8_0 with VNNI.
    vec_dot_q4_0, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", BlockQ4_0, BlockQ8_0,
    |a, b| dot_i8(q4_0_bytes(a), load32i(&b.qs)), offset: no
);

legacy_dot!(
    /// Q4_1 x Q8_1 with VNNI.
    vec_dot_q4_1, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", BlockQ4_1, BlockQ8_1,
    |a, b| dot_us8(nibbles(&a.qs), load32i(&b.qs)), offset: yes
);

legacy_dot!(
    /// Q5_0 x Q8_0 with VNNI.
    vec_dot_q5_0, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", BlockQ5_0, BlockQ8_0,
    |a, b| dot_i8(q5_0_bytes(a), load32i(&b.qs)), offset: no
);

legacy_dot!(
    /// Q5_1 x Q8_1 with VNNI.
    vec_dot_q5_1, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", BlockQ5_1, BlockQ8_1,
    |a, b| dot_us8(q5_1_bytes(a), load32i(&b.qs)), offset: yes
);

legacy_dot!(
    /// Q8_0 x Q8_0 with VNNI.
    vec_dot_q8_0, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", BlockQ8_0, BlockQ8_0,
    |a, b| dot_i8(load32i(&a.qs), load32i(&b.qs)), offset: no
);

// ---------------------------------------------------------------------------------------------
// k-quants, 64 elements per register.

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn load64(b: &[u8]) -> __m512i {
    let b: &[u8; 64] = b.try_into().unwrap();
    // SAFETY: 64 readable bytes; unaligned load.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn load64i(b: &[i8]) -> __m512i {
    let b: &[i8; 64] = b.try_into().unwrap();
    // SAFETY: 64 readable bytes; unaligned load.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn vec_dot_q4k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ4K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let low4 = _mm512_set1_epi8(0x0F);
    let split = halves16(0, 4);
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
            let mut sumi = _mm512_setzero_si512();
            for k in 0..4 {
                // Elements 64k..64k+32 are the low nibbles of qs[32k..], the next 32 the high.
                let q = twice(load32(a.qs[32 * k..32 * k + 32].try_into().unwrap()));
                let q = _mm512_and_si512(_mm512_srlv_epi16(q, split), low4);
                let p = _mm512_maddubs_epi16(q, load64i(&b.qs[64 * k..64 * k + 64]));
                let s = halves16(sc[2 * k] as i16, sc[2 * k + 1] as i16);
                sumi = _mm512_dpwssd_epi32(sumi, p, s);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold(sumi)), acc);
        }
    }
    finish_q4k(acc, acc_m)
}

/// i16 lanes holding `s[0..4]` for consecutive groups of 16 elements.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn scales4x16(s: &[i8]) -> __m512i {
    let four = i32::from_le_bytes([s[0] as u8, s[1] as u8, s[2] as u8, s[3] as u8]);
    let v = _mm256_broadcastsi128_si256(_mm_cvtsi32_si128(four));
    let idx = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(v, idx))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn vec_dot_q6k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ6K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let low4 = _mm512_set1_epi8(0x0F);
    let two = _mm512_set1_epi8(3);
    let (sh_a, sh_b) = (halves16(0, 2), halves16(4, 6));
    let mut acc = _mm256_setzero_ps();
    for (ws, xs) in w.chunks(8).zip(x.chunks(8)) {
        let dw = scales8(ws, |a| a.d);
        for (k, (a, b)) in ws.iter().zip(xs).enumerate() {
            let d = b.d() * dw[k];
            let mut sumi = _mm512_setzero_si512();
            for h in 0..2 {
                // ql[64h..64h+64] = [ql0 | ql1]; qh[32h..] feeds both halves at different shifts.
                let ql = load64(&a.ql[64 * h..64 * h + 64]);
                let qh = twice(load32(a.qh[32 * h..32 * h + 32].try_into().unwrap()));
                let hi_a = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_a), two), 4);
                let hi_b = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_b), two), 4);
                // Elements 128h + 0..64, then 128h + 64..128.
                let q0 = _mm512_or_si512(_mm512_and_si512(ql, low4), hi_a);
                let q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi_b);
                for (j, q) in [q0, q1].into_iter().enumerate() {
                    let e = 128 * h + 64 * j;
                    let p = _mm512_maddubs_epi16(q, load64i(&b.qs[e..e + 64]));
                    sumi = _mm512_dpwssd_epi32(sumi, p, scales4x16(&a.scales[e / 16..e / 16 + 4]));
                }
            }
            let sumi = _mm256_sub_epi32(fold(sumi), offset_lanes_q6k(&a.scales, b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    hsum_f32(acc)
}

// Keep the shared block-size constant referenced (legacy_dot! asserts on it).
const _: usize = QK;
