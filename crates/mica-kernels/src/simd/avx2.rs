//! AVX2 + FMA + F16C kernels: the legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0),
//! the float types, and the activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16). The
//! k-quant dot products are in `avx2_kquants.rs`.
//!
//! The legacy dots and the Q8_0/Q8_1 quantizers do llama.cpp's x86 arithmetic operation by
//! operation (see the module doc of `simd` for why): eight f32 lanes of per-block integer
//! sums accumulated by FMA, ggml's horizontal sum; `127 / amax` and ties-to-even rounding.

use std::arch::x86_64::*;

use super::Kernels;
use crate::DType;
use crate::quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use crate::quant::blocks::{BlockQ8K, QK, QK_K, blocks, blocks_mut};

/// True when this CPU can run the kernels of this file.
pub(super) fn supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Turns a target-feature kernel into a plain `fn` for the table.
macro_rules! entry {
    (dot $f:path) => {
        // SAFETY: installed only after `supported()` confirmed the features.
        |n, w, x| unsafe { $f(n, w, x) }
    };
    (quant $f:path) => {
        // SAFETY: as above.
        |src, dst| unsafe { $f(src, dst) }
    };
}
pub(super) use entry;

pub(super) fn install(k: &mut Kernels) {
    k.set_dot(DType::Q4_0, entry!(dot vec_dot_q4_0));
    k.set_dot(DType::Q4_1, entry!(dot vec_dot_q4_1));
    k.set_dot(DType::Q5_0, entry!(dot vec_dot_q5_0));
    k.set_dot(DType::Q5_1, entry!(dot vec_dot_q5_1));
    k.set_dot(DType::Q8_0, entry!(dot vec_dot_q8_0));
    k.set_dot(DType::F32, entry!(dot vec_dot_f32));
    k.set_dot(DType::F16, entry!(dot vec_dot_f16));
    k.set_dot(DType::BF16, entry!(dot vec_dot_bf16));
    k.set_quant(DType::Q8_0, entry!(quant quantize_q8_0));
    k.set_quant(DType::Q8_1, entry!(quant quantize_q8_1));
    k.set_quant(DType::Q8_K, entry!(quant quantize_q8k));
    k.set_quant(DType::F16, entry!(quant quantize_f16));
    k.set_quant(DType::BF16, entry!(quant quantize_bf16));
}

// ---------------------------------------------------------------------------------------------
// Helpers (also used by avx2_kquants.rs and avx512.rs).

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32(b: &[u8; 32]) -> __m256i {
    // SAFETY: 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32i(b: &[i8; 32]) -> __m256i {
    // SAFETY: 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load16(b: &[u8; 16]) -> __m128i {
    // SAFETY: 16 readable bytes; unaligned load.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The `k`-th 32-byte piece of a slice, as an array reference (bounds-checked).
#[inline(always)]
pub(super) fn piece<T>(s: &[T], k: usize) -> &[T; 32] {
    s[32 * k..32 * k + 32].try_into().unwrap()
}

#[inline]
#[target_feature(enable = "avx2")]
fn loadf(x: &[f32; 8]) -> __m256 {
    // SAFETY: 8 readable floats; unaligned load.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

// Scales are converted eight blocks at a time ([`scales8`]), never one per block with a
// scalar `vcvtph2ps`: LLVM turns that zero-extending insert into a `vpinsrw` merging into a
// free register, which inside a dot product is the FMA accumulator, chaining every block's
// scale conversion to the previous block's FMA (2x slower).

/// Eight f16 values to f32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16x8(h: [u16; 8]) -> __m256 {
    // Built by inserts rather than a store and reload, which would stall store forwarding.
    let v = _mm_set_epi16(
        h[7] as i16,
        h[6] as i16,
        h[5] as i16,
        h[4] as i16,
        h[3] as i16,
        h[2] as i16,
        h[1] as i16,
        h[0] as i16,
    );
    _mm256_cvtph_ps(v)
}

/// Eight f16 fields of a group of blocks (zero for missing blocks).
#[inline(always)]
pub(super) fn gather_f16<B>(bs: &[B], f: impl Fn(&B) -> [u8; 2]) -> [u16; 8] {
    let mut out = [0u16; 8];
    for (o, b) in out.iter_mut().zip(bs) {
        *o = u16::from_le_bytes(f(b));
    }
    out
}

/// The f16 field `f` of up to eight blocks as f32 (zero past the end), converted together.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn scales8<B>(bs: &[B], f: impl Fn(&B) -> [u8; 2]) -> [f32; 8] {
    lanes_f32(f16x8(gather_f16(bs, f)))
}

/// Stores eight f32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn lanes_f32(v: __m256) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: 8 writable floats; unaligned store.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// 32 nibbles: byte j holds the low nibble of `qs[j]` for j < 16, the high nibble of
/// `qs[j - 16]` for j >= 16 (ggml's legacy element order).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn nibbles(qs: &[u8; 16]) -> __m256i {
    let x = load16(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Byte j = 0xFF when bit j of the little-endian `qh` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bits_to_bytes(qh: [u8; 4]) -> __m256i {
    let v = _mm256_set1_epi32(i32::from_le_bytes(qh));
    // Byte j takes source byte j / 8 ...
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let b = _mm256_shuffle_epi8(v, spread);
    // ... and every bit but j % 8 is forced on, so the byte is all-ones iff that bit is set.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(b, others), _mm256_set1_epi64x(-1))
}

/// Pairwise u8 * i8 products summed into eight i32 lanes (exact while every pair sum fits
/// i16: |u| * 127 * 2 <= 32767, true for u <= 128).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mul_sum_us8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Signed i8 * i8 products summed into eight i32 lanes; `y` must avoid -128.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
    mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Sum of eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Sum of eight f32 lanes in ggml's `hsum_float_8` order:
/// `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

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
            use $crate::simd::avx2::{f16x8, gather_f16, lanes_f32};
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
        $crate::simd::avx2::hsum_f32($acc) + $summs
    };
    (@result no, $acc:ident, $summs:ident) => {{
        let _ = $summs;
        $crate::simd::avx2::hsum_f32($acc)
    }};
}
pub(super) use legacy_dot;

/// Q4_0 quants minus 8 (i8 lanes in element order).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q4_0_bytes(b: &BlockQ4_0) -> __m256i {
    _mm256_sub_epi8(nibbles(&b.qs), _mm256_set1_epi8(8))
}

/// Q5_0 quants minus 16: nibble | 0xF0 where the fifth bit is clear reads as (q - 16) in i8.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q5_0_bytes(b: &BlockQ5_0) -> __m256i {
    let hi = _mm256_andnot_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(-16));
    _mm256_or_si256(nibbles(&b.qs), hi)
}

/// Q5_1 quants (0..32).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q5_1_bytes(b: &BlockQ5_1) -> __m256i {
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

// ---------------------------------------------------------------------------------------------
// Activation quantizers (byte-identical to the scalar reference).

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
pub(super) fn pack_i8(i: [__m256i; 4]) -> __m256i {
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
