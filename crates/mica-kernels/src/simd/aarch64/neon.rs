//! NEON (aarch64) dot products of every quantized weight format, with the float structure
//! of llama.cpp's x86 kernels, so an ARM machine computes bit for bit what the AVX2 and
//! AVX-512 tables compute (and the golden tests hold there too).
//!
//! That structure (see the module doc of `simd` and `x86/avx2/kquants.rs`): per block, exact
//! integer products summed into eight i32 lanes, lane `k` holding elements `4k..4k+3` of
//! each 32-element chunk (scaled by the chunk's sub-block scales for the k-quants); the lanes
//! converted to f32 and accumulated with one FMA per block into eight f32 accumulators; the
//! offset/min terms accumulated where llama.cpp puts them; then ggml's `hsum_float_8`.
//!
//! The eight lanes of a chunk are exactly what `vmull_s8` + `vpaddlq_s16` + `vpaddq_s32`
//! produce from 16-byte halves (and what the `sdot` instruction would; that one is not used
//! because its intrinsic is not stable Rust yet). Integer sums are exact in any order, so
//! only the float operations need care: `vfmaq_n_f32` is the fused multiply-add of the x86
//! `vfmadd`, `vcvtq_f32_s32` rounds to nearest like `vcvtdq2ps`.
//!
//! The legacy 4-bit formats and Q8_0 unpack in registers; the 5-bit legacy formats and the
//! k-quants (and, in `neon/iquants.rs`, the i-quants, TQ1_0, TQ2_0 and MXFP4) unpack each
//! block with the scalar `unpack_*` of [`crate::quant`] first (correct
//! everywhere; a register unpack per format is the next step for ARM speed). NEON is part of
//! the aarch64 baseline, so this table needs no run-time detection.

use std::arch::aarch64::*;

use crate::DType;
use crate::quant::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, BlockQ8_1, BlockQ8K, QK, QK_K, blocks, f16_to_f32, q3k_scales, scale_min_k4,
};
use crate::quant::kquants::{unpack_q2k, unpack_q3k, unpack_q4k, unpack_q5k, unpack_q6k};
use crate::quant::legacy::{unpack_q5_0, unpack_q5_1};
use crate::simd::Kernels;

mod iquants;

/// Turns a target-feature kernel into a plain `fn` for the table.
macro_rules! entry {
    ($f:path) => {
        // SAFETY: NEON is part of the aarch64 baseline.
        |n, w, x| unsafe { $f(n, w, x) }
    };
}

/// Puts every kernel of the NEON tier into `k` (a copy of the scalar table).
pub(in crate::simd) fn install(k: &mut Kernels) {
    k.set_dot(DType::Q4_0, entry!(vec_dot_q4_0));
    k.set_dot(DType::Q4_1, entry!(vec_dot_q4_1));
    k.set_dot(DType::Q5_0, entry!(vec_dot_q5_0));
    k.set_dot(DType::Q5_1, entry!(vec_dot_q5_1));
    k.set_dot(DType::Q8_0, entry!(vec_dot_q8_0));
    k.set_dot(DType::Q2_K, entry!(vec_dot_q2k));
    k.set_dot(DType::Q3_K, entry!(vec_dot_q3k));
    k.set_dot(DType::Q4_K, entry!(vec_dot_q4k));
    k.set_dot(DType::Q5_K, entry!(vec_dot_q5k));
    k.set_dot(DType::Q6_K, entry!(vec_dot_q6k));
    k.set_dot(DType::IQ2_XXS, entry!(iquants::vec_dot_iq2xxs));
    k.set_dot(DType::IQ2_XS, entry!(iquants::vec_dot_iq2xs));
    k.set_dot(DType::IQ2_S, entry!(iquants::vec_dot_iq2s));
    k.set_dot(DType::IQ3_XXS, entry!(iquants::vec_dot_iq3xxs));
    k.set_dot(DType::IQ3_S, entry!(iquants::vec_dot_iq3s));
    k.set_dot(DType::IQ1_S, entry!(iquants::vec_dot_iq1s));
    k.set_dot(DType::IQ1_M, entry!(iquants::vec_dot_iq1m));
    k.set_dot(DType::IQ4_NL, entry!(iquants::vec_dot_iq4nl));
    k.set_dot(DType::IQ4_XS, entry!(iquants::vec_dot_iq4xs));
    k.set_dot(DType::TQ1_0, entry!(iquants::vec_dot_tq1_0));
    k.set_dot(DType::TQ2_0, entry!(iquants::vec_dot_tq2_0));
    k.set_dot(DType::MXFP4, entry!(iquants::vec_dot_mxfp4));
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Eight i32 lanes (two registers: lanes 0..4, 4..8).
#[derive(Clone, Copy)]
struct Lanes(int32x4_t, int32x4_t);

impl Lanes {
    #[inline]
    #[target_feature(enable = "neon")]
    fn zero() -> Lanes {
        Lanes(vdupq_n_s32(0), vdupq_n_s32(0))
    }

    /// `self + s0 · l.0, s1 · l.1` (per-half scales: elements 0..16 and 16..32 of a chunk).
    #[inline]
    #[target_feature(enable = "neon")]
    fn add_scaled(self, l: Lanes, s0: i32, s1: i32) -> Lanes {
        Lanes(vmlaq_n_s32(self.0, l.0, s0), vmlaq_n_s32(self.1, l.1, s1))
    }

    #[inline]
    #[target_feature(enable = "neon")]
    fn sub(self, o: Lanes) -> Lanes {
        Lanes(vsubq_s32(self.0, o.0), vsubq_s32(self.1, o.1))
    }
}

/// Lane k of 16 byte products: elements 4k..4k+3 (k < 4), exact.
#[inline]
#[target_feature(enable = "neon")]
fn quad_sums(q: int8x16_t, a: int8x16_t) -> int32x4_t {
    let lo = vpaddlq_s16(vmull_s8(vget_low_s8(q), vget_low_s8(a)));
    let hi = vpaddlq_s16(vmull_high_s8(q, a));
    vpaddq_s32(lo, hi)
}

#[inline]
#[target_feature(enable = "neon")]
fn load_i8(s: &[i8]) -> int8x16_t {
    assert!(s.len() >= 16);
    // SAFETY: 16 readable bytes (checked above); unaligned load.
    unsafe { vld1q_s8(s.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn load_u8(s: &[u8]) -> uint8x16_t {
    assert!(s.len() >= 16);
    // SAFETY: 16 readable bytes (checked above); unaligned load.
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// The eight lanes of one 32-element chunk: quants `(q0, q1)` (elements 0..16, 16..32)
/// times activations `a`.
#[inline]
#[target_feature(enable = "neon")]
fn chunk(q0: int8x16_t, q1: int8x16_t, a: &[i8]) -> Lanes {
    Lanes(
        quad_sums(q0, load_i8(&a[..16])),
        quad_sums(q1, load_i8(&a[16..32])),
    )
}

/// The eight lanes of a chunk of unpacked quants.
#[inline]
#[target_feature(enable = "neon")]
fn chunk_of(q: &[i8], a: &[i8]) -> Lanes {
    chunk(load_i8(&q[..16]), load_i8(&q[16..32]), a)
}

/// Eight f32 accumulators (two registers).
#[derive(Clone, Copy)]
struct Acc(float32x4_t, float32x4_t);

impl Acc {
    #[inline]
    #[target_feature(enable = "neon")]
    fn zero() -> Acc {
        Acc(vdupq_n_f32(0.0), vdupq_n_f32(0.0))
    }

    /// `acc = fma(d, f32(lanes), acc)`, lane by lane.
    #[inline]
    #[target_feature(enable = "neon")]
    fn fma(self, d: f32, l: Lanes) -> Acc {
        Acc(
            vfmaq_n_f32(self.0, vcvtq_f32_s32(l.0), d),
            vfmaq_n_f32(self.1, vcvtq_f32_s32(l.1), d),
        )
    }

    /// ggml's `hsum_float_8`: `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
    #[inline]
    #[target_feature(enable = "neon")]
    fn hsum(self) -> f32 {
        let s = vaddq_f32(self.0, self.1);
        let t0 = vgetq_lane_f32::<0>(s) + vgetq_lane_f32::<2>(s);
        let t1 = vgetq_lane_f32::<1>(s) + vgetq_lane_f32::<3>(s);
        t0 + t1
    }
}

// ---------------------------------------------------------------------------------------------
// Legacy formats: `acc = fma(d_w · d_x, lanes, acc)` per block; Q4_1/Q5_1 also
// `summs = fma(m_w, s_x, summs)` in scalar f32.

/// Low and high nibbles of 16 bytes (elements 0..16 and 16..32), minus `offset`.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(qs: &[u8; 16], offset: i8) -> (int8x16_t, int8x16_t) {
    let v = load_u8(qs);
    let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
    let o = vdupq_n_s8(offset);
    (vsubq_s8(lo, o), vsubq_s8(hi, o))
}

#[target_feature(enable = "neon")]
fn vec_dot_q4_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ4_0], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    let mut acc = Acc::zero();
    for (a, b) in w.iter().zip(x) {
        let (q0, q1) = nibbles(&a.qs, 8);
        let d = f16_to_f32(a.d) * f16_to_f32(b.d);
        acc = acc.fma(d, chunk(q0, q1, &b.qs));
    }
    acc.hsum()
}

#[target_feature(enable = "neon")]
fn vec_dot_q4_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ4_1], &[BlockQ8_1]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    let mut acc = Acc::zero();
    let mut summs = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (q0, q1) = nibbles(&a.qs, 0);
        let d = f16_to_f32(a.d) * f16_to_f32(b.d);
        acc = acc.fma(d, chunk(q0, q1, &b.qs));
    }
    // llama.cpp accumulates the offsets after each group of blocks; in block order, so
    // a separate pass gives the same sequence of roundings.
    for (a, b) in w.iter().zip(x) {
        summs = f16_to_f32(a.m).mul_add(f16_to_f32(b.s), summs);
    }
    acc.hsum() + summs
}

#[target_feature(enable = "neon")]
fn vec_dot_q5_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ5_0], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    let mut acc = Acc::zero();
    for (a, b) in w.iter().zip(x) {
        let d = f16_to_f32(a.d) * f16_to_f32(b.d);
        acc = acc.fma(d, chunk_of(&unpack_q5_0(a), &b.qs));
    }
    acc.hsum()
}

#[target_feature(enable = "neon")]
fn vec_dot_q5_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ5_1], &[BlockQ8_1]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    let mut acc = Acc::zero();
    let mut summs = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let d = f16_to_f32(a.d) * f16_to_f32(b.d);
        acc = acc.fma(d, chunk_of(&unpack_q5_1(a), &b.qs));
    }
    for (a, b) in w.iter().zip(x) {
        summs = f16_to_f32(a.m).mul_add(f16_to_f32(b.s), summs);
    }
    acc.hsum() + summs
}

#[target_feature(enable = "neon")]
fn vec_dot_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ8_0], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    let mut acc = Acc::zero();
    for (a, b) in w.iter().zip(x) {
        let d = f16_to_f32(a.d) * f16_to_f32(b.d);
        acc = acc.fma(d, chunk_of(&a.qs, &b.qs));
    }
    acc.hsum()
}

// ---------------------------------------------------------------------------------------------
// k-quants (see the table in `x86/avx2/kquants.rs` for where each format's min/offset goes).

/// `Σ_chunks scale · lanes` over the eight chunks of a super-block, with per-16-element
/// scales `sc16(g)` (g = 0..16).
#[inline]
#[target_feature(enable = "neon")]
fn sumi16(q: &[i8; QK_K], a: &[i8; QK_K], sc16: impl Fn(usize) -> i32) -> Lanes {
    let mut s = Lanes::zero();
    for c in 0..QK_K / 32 {
        let r = 32 * c..32 * c + 32;
        s = s.add_scaled(chunk_of(&q[r.clone()], &a[r]), sc16(2 * c), sc16(2 * c + 1));
    }
    s
}

/// Lanes `k = v(2k) + v(2k+1)` for k < 8 from 16 group values (Q2_K mins, Q6_K offsets).
#[inline]
#[target_feature(enable = "neon")]
fn pair_lanes(v: impl Fn(usize) -> i32) -> Lanes {
    let l: [i32; 8] = std::array::from_fn(|k| v(2 * k) + v(2 * k + 1));
    // SAFETY: 8 readable i32.
    unsafe { Lanes(vld1q_s32(l.as_ptr()), vld1q_s32(l.as_ptr().add(4))) }
}

#[target_feature(enable = "neon")]
fn vec_dot_q2k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ2K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = Acc::zero();
    for (a, b) in w.iter().zip(x) {
        let (d, dmin) = (b.d() * f16_to_f32(a.d), -b.d() * f16_to_f32(a.dmin));
        let mins = pair_lanes(|g| (a.scales[g] >> 4) as i32 * b.bsum(g) as i32);
        acc = acc.fma(dmin, mins);
        let sumi = sumi16(&unpack_q2k(a), &b.qs, |g| (a.scales[g] & 0xF) as i32);
        acc = acc.fma(d, sumi);
    }
    acc.hsum()
}

#[target_feature(enable = "neon")]
fn vec_dot_q3k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ3K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = Acc::zero();
    for (a, b) in w.iter().zip(x) {
        let d = b.d() * f16_to_f32(a.d);
        let sc = q3k_scales(&a.scales);
        acc = acc.fma(d, sumi16(&unpack_q3k(a), &b.qs, |g| sc[g] as i32));
    }
    acc.hsum()
}

/// The eight (scale, min) pairs of a Q4_K/Q5_K block.
#[inline]
#[target_feature(enable = "neon")]
fn k4_scales(s: &[u8; 12]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0; 8];
    let mut mn = [0; 8];
    for j in 0..8 {
        let (a, m) = scale_min_k4(j, s);
        (sc[j], mn[j]) = (a as i32, m as i32);
    }
    (sc, mn)
}

/// Q4_K/Q5_K min lanes: lane k = `m[2k]·(b[4k] + b[4k+1]) + m[2k+1]·(b[4k+2] + b[4k+3])`.
#[inline]
#[target_feature(enable = "neon")]
fn min_lanes_k4(mn: &[i32; 8], b: &BlockQ8K) -> [i32; 4] {
    let pair = |g: usize| b.bsum(2 * g) as i32 + b.bsum(2 * g + 1) as i32;
    std::array::from_fn(|k| mn[2 * k] * pair(2 * k) + mn[2 * k + 1] * pair(2 * k + 1))
}

#[target_feature(enable = "neon")]
fn vec_dot_q4k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ4K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = Acc::zero();
    let mut acc_m = vdupq_n_f32(0.0);
    for (a, b) in w.iter().zip(x) {
        let (d, dmin) = (b.d() * f16_to_f32(a.d), -b.d() * f16_to_f32(a.dmin));
        let (sc, mn) = k4_scales(&a.scales);
        let mins = min_lanes_k4(&mn, b);
        // SAFETY: 4 readable i32.
        let mins = vcvtq_f32_s32(unsafe { vld1q_s32(mins.as_ptr()) });
        acc_m = vfmaq_n_f32(acc_m, mins, dmin);
        acc = acc.fma(d, sumi16(&unpack_q4k(a), &b.qs, |g| sc[g / 2]));
    }
    let m = (vgetq_lane_f32::<0>(acc_m) + vgetq_lane_f32::<2>(acc_m))
        + (vgetq_lane_f32::<1>(acc_m) + vgetq_lane_f32::<3>(acc_m));
    acc.hsum() + m
}

#[target_feature(enable = "neon")]
fn vec_dot_q5k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ5K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = Acc::zero();
    let mut summs = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (d, dmin) = (b.d() * f16_to_f32(a.d), -b.d() * f16_to_f32(a.dmin));
        let (sc, mn) = k4_scales(&a.scales);
        let mins: i32 = min_lanes_k4(&mn, b).iter().sum();
        summs = dmin.mul_add(mins as f32, summs);
        acc = acc.fma(d, sumi16(&unpack_q5k(a), &b.qs, |g| sc[g / 2]));
    }
    acc.hsum() + summs
}

#[target_feature(enable = "neon")]
fn vec_dot_q6k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockQ6K], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = Acc::zero();
    for (a, b) in w.iter().zip(x) {
        let d = b.d() * f16_to_f32(a.d);
        let sc = |g: usize| a.scales[g] as i32;
        // As llama.cpp: products with the unsigned quants (0..64) by element lane, minus
        // the offset 32 · sc · bsum by *chunk* lane (lane k = groups 2k, 2k+1). The lanes
        // differ from those of the signed products, so their float sums do too.
        let q = unpack_q6k(a).map(|q| q + 32);
        let offset = pair_lanes(|g| 32 * sc(g) * b.bsum(g) as i32);
        acc = acc.fma(d, sumi16(&q, &b.qs, sc).sub(offset));
    }
    acc.hsum()
}
