//! AVX2 dot products of the legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the
//! float types (F32, F16, BF16); the legacy ones with llama.cpp's float structure
//! (`ggml_vec_dot_q4_0_q8_0` ... in ggml-cpu/arch/x86/quants.c), which `legacy_dot!`
//! writes once for this tier and the AVX-512 one.

use std::arch::x86_64::*;

use super::{bits_to_bytes, hsum_f32, load16, load32i, mul_sum_i8, mul_sum_us8, nibbles};
use crate::quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use crate::quant::blocks::{QK, blocks};

// ---------------------------------------------------------------------------------------------
// Legacy dot products, llama.cpp's structure (`ggml_vec_dot_q4_0_q8_0` ... in
// ggml-cpu/arch/x86/quants.c): per block, the 32 integer products summed into eight i32 lanes
// (lane j = elements 4j..4j+3), converted to f32 and accumulated with one FMA,
// `acc = fma(d_w * d_x, lanes, acc)`; Q4_1/Q5_1 add `summs = fma(m_w, s_x, summs)` in scalar
// f32 (GCC contracts `summs += m * s`); the result is `hsum_f32(acc)` (+ `summs`).

/// Generates a legacy dot product. `$lanes` gives the eight i32 lanes of one block pair
/// `($a, $b)`; `offset` says whether the format has the `m * s` term. Scales are converted
/// eight blocks at a time (products `d_w * d_x` rounded per block, as in llama.cpp); the
/// per-block FMAs into `acc` stay in block order.
macro_rules! legacy_dot {
    ($(#[$doc:meta])* $name:ident, $features:literal, $W:ty, $X:ty,
     |$a:ident, $b:ident| $lanes:expr, offset: $offset:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(super) fn $name(n: usize, w: &[u8], x: &[u8]) -> f32 {
            use $crate::simd::x86::avx2::{f16x8, gather_f16, lanes_f32};
            let (w, x): (&[$W], &[$X]) = (blocks(w), blocks(x));
            debug_assert!(w.len() == x.len() && w.len() * QK == n);
            let mut acc = _mm256_setzero_ps();
            #[allow(unused_mut)] // Only the formats with an offset term update it.
            let mut summs = 0.0f32;
            for (ws, xs) in w.chunks(8).zip(x.chunks(8)) {
                let dw = f16x8(gather_f16(ws, |b| b.d));
                let dx = f16x8(gather_f16(xs, |b| b.d));
                let d = lanes_f32(_mm256_mul_ps(dw, dx));
                for (k, ($a, $b)) in ws.iter().zip(xs).enumerate() {
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d[k]), _mm256_cvtepi32_ps($lanes), acc);
                }
                legacy_dot!(@offset $offset, summs, ws, xs);
            }
            legacy_dot!(@result $offset, acc, summs)
        }
    };
    (@offset yes, $summs:ident, $ws:ident, $xs:ident) => {
        let m = lanes_f32(f16x8(gather_f16($ws, |b| b.m)));
        let s = lanes_f32(f16x8(gather_f16($xs, |b| b.s)));
        for k in 0..$ws.len() {
            $summs = m[k].mul_add(s[k], $summs);
        }
    };
    (@offset no, $summs:ident, $ws:ident, $xs:ident) => {};
    (@result yes, $acc:ident, $summs:ident) => {
        $crate::simd::x86::avx2::hsum_f32($acc) + $summs
    };
    (@result no, $acc:ident, $summs:ident) => {{
        let _ = $summs;
        $crate::simd::x86::avx2::hsum_f32($acc)
    }};
}
pub(in crate::simd::x86) use legacy_dot;

/// Q4_0 quants minus 8 (i8 lanes in element order).
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn q4_0_bytes(b: &BlockQ4_0) -> __m256i {
    _mm256_sub_epi8(nibbles(&b.qs), _mm256_set1_epi8(8))
}

/// Q5_0 quants minus 16: nibble | 0xF0 where the fifth bit is clear reads as (q - 16) in i8.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn q5_0_bytes(b: &BlockQ5_0) -> __m256i {
    let hi = _mm256_andnot_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(-16));
    _mm256_or_si256(nibbles(&b.qs), hi)
}

/// Q5_1 quants (0..32).
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::simd::x86) fn q5_1_bytes(b: &BlockQ5_1) -> __m256i {
    let hi = _mm256_and_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(0x10));
    _mm256_or_si256(nibbles(&b.qs), hi)
}

legacy_dot!(
    /// Q4_0 x Q8_0.
    vec_dot_q4_0, "avx2,fma,f16c", BlockQ4_0, BlockQ8_0,
    |a, b| mul_sum_i8(q4_0_bytes(a), load32i(&b.qs)), offset: no
);

legacy_dot!(
    /// Q4_1 x Q8_1.
    vec_dot_q4_1, "avx2,fma,f16c", BlockQ4_1, BlockQ8_1,
    |a, b| mul_sum_us8(nibbles(&a.qs), load32i(&b.qs)), offset: yes
);

legacy_dot!(
    /// Q5_0 x Q8_0.
    vec_dot_q5_0, "avx2,fma,f16c", BlockQ5_0, BlockQ8_0,
    |a, b| mul_sum_i8(q5_0_bytes(a), load32i(&b.qs)), offset: no
);

legacy_dot!(
    /// Q5_1 x Q8_1.
    vec_dot_q5_1, "avx2,fma,f16c", BlockQ5_1, BlockQ8_1,
    |a, b| mul_sum_us8(q5_1_bytes(a), load32i(&b.qs)), offset: yes
);

legacy_dot!(
    /// Q8_0 x Q8_0.
    vec_dot_q8_0, "avx2,fma,f16c", BlockQ8_0, BlockQ8_0,
    |a, b| mul_sum_i8(load32i(&a.qs), load32i(&b.qs)), offset: no
);

// ---------------------------------------------------------------------------------------------
// Float dot products: four FMA accumulators, scalar tail.

/// Generates a float dot product over elements of `$bytes` bytes, loading 8 at a time with
/// `$load` (a fn from a byte slice of 8 elements to f32 lanes) and `$one` for the tail.
macro_rules! float_dot {
    ($name:ident, $bytes:literal, $load:ident, $one:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn $name(n: usize, w: &[u8], x: &[u8]) -> f32 {
            debug_assert!(w.len() == n * $bytes && x.len() == n * $bytes);
            let mut acc = [_mm256_setzero_ps(); 4];
            let (w32, x32) = (w.chunks_exact(32 * $bytes), x.chunks_exact(32 * $bytes));
            let (wt, xt) = (w32.remainder(), x32.remainder());
            for (a, b) in w32.zip(x32) {
                for (k, acc) in acc.iter_mut().enumerate() {
                    let r = 8 * $bytes * k..8 * $bytes * (k + 1);
                    *acc = _mm256_fmadd_ps($load(&a[r.clone()]), $load(&b[r]), *acc);
                }
            }
            let (w8, x8) = (wt.chunks_exact(8 * $bytes), xt.chunks_exact(8 * $bytes));
            let (wt, xt) = (w8.remainder(), x8.remainder());
            for (a, b) in w8.zip(x8) {
                acc[0] = _mm256_fmadd_ps($load(a), $load(b), acc[0]);
            }
            let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let one = $one;
            let tail = wt
                .chunks_exact($bytes)
                .zip(xt.chunks_exact($bytes))
                .fold(0.0f32, |s, (a, b)| s + one(a) * one(b));
            hsum_f32(s) + tail
        }
    };
}

#[inline]
#[target_feature(enable = "avx2")]
fn load_f32x8(b: &[u8]) -> __m256 {
    let b: &[u8; 32] = b.try_into().unwrap();
    // SAFETY: 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_ps(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn load_f16x8(b: &[u8]) -> __m256 {
    let b: &[u8; 16] = b.try_into().unwrap();
    _mm256_cvtph_ps(load16(b))
}

#[inline]
#[target_feature(enable = "avx2")]
fn load_bf16x8(b: &[u8]) -> __m256 {
    let b: &[u8; 16] = b.try_into().unwrap();
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load16(b)), 16))
}

fn one_f32(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
fn one_f16(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}
fn one_bf16(b: &[u8]) -> f32 {
    crate::quant::floats::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

float_dot!(vec_dot_f32, 4, load_f32x8, one_f32);
float_dot!(vec_dot_f16, 2, load_f16x8, one_f16);
float_dot!(vec_dot_bf16, 2, load_bf16x8, one_bf16);
