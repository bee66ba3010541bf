//! The legacy 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the activation format
//! Q8_1: exact dequantization, llama.cpp's round-to-nearest reference quantizers
//! (`quantize_row_*_ref` in ggml-quants.c) and the scalar dot products of ggml's generic
//! CPU path (`ggml_vec_dot_*_q8_*_generic`), each float operation in the same order so that
//! results match bit for bit.

use super::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK, f16_to_f32, f32_to_f16,
};

// ---------------------------------------------------------------------------------------------
// Unpacking: integer quants of one block, in element order.

/// Q4_0 quants minus 8 (range -8..8).
#[inline(always)]
pub fn unpack_q4_0(b: &BlockQ4_0) -> [i8; QK] {
    let mut q = [0i8; QK];
    for j in 0..QK / 2 {
        q[j] = (b.qs[j] & 0xF) as i8 - 8;
        q[j + QK / 2] = (b.qs[j] >> 4) as i8 - 8;
    }
    q
}

/// Q4_1 quants (range 0..16).
#[inline(always)]
pub fn unpack_q4_1(b: &BlockQ4_1) -> [i8; QK] {
    let mut q = [0i8; QK];
    for j in 0..QK / 2 {
        q[j] = (b.qs[j] & 0xF) as i8;
        q[j + QK / 2] = (b.qs[j] >> 4) as i8;
    }
    q
}

/// Five-bit quants from nibbles + the 32 high bits (range 0..32).
#[inline(always)]
fn unpack_5bit(qs: &[u8; 16], qh: [u8; 4]) -> [i8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0i8; QK];
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        q[j] = ((qs[j] & 0xF) | (h0 << 4)) as i8;
        q[j + QK / 2] = ((qs[j] >> 4) | (h1 << 4)) as i8;
    }
    q
}

/// Q5_0 quants minus 16 (range -16..16).
#[inline(always)]
pub fn unpack_q5_0(b: &BlockQ5_0) -> [i8; QK] {
    unpack_5bit(&b.qs, b.qh).map(|q| q - 16)
}

/// Q5_1 quants (range 0..32).
#[inline(always)]
pub fn unpack_q5_1(b: &BlockQ5_1) -> [i8; QK] {
    unpack_5bit(&b.qs, b.qh)
}

// ---------------------------------------------------------------------------------------------
// Dequantization (`dequantize_row_*`): y = q * d, or q * d + m for the offset formats.

pub fn dequantize_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, q) in y.iter_mut().zip(unpack_q4_0(b)) {
            *y = q as f32 * d;
        }
    }
}

pub fn dequantize_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for (y, q) in y.iter_mut().zip(unpack_q4_1(b)) {
            *y = q as f32 * d + m;
        }
    }
}

pub fn dequantize_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, q) in y.iter_mut().zip(unpack_q5_0(b)) {
            *y = q as f32 * d;
        }
    }
}

pub fn dequantize_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for (y, q) in y.iter_mut().zip(unpack_q5_1(b)) {
            *y = q as f32 * d + m;
        }
    }
}

pub fn dequantize_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = q as f32 * d;
        }
    }
}

/// Q8_1 values are `d * q`; `s` is only a helper for dot products.
pub fn dequantize_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = q as f32 * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reference quantizers (`quantize_row_*_ref`).

/// The value of largest magnitude (the first one on ties), with its sign.
#[inline(always)]
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `1/d`, or 0 for a zero scale.
#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// Packs 32 quants of at most 4 bits into nibbles (element j low, j + 16 high).
#[inline(always)]
fn pack_nibbles(q: &[u8; QK]) -> [u8; QK / 2] {
    std::array::from_fn(|j| (q[j] & 0xF) | ((q[j + QK / 2] & 0xF) << 4))
}

/// Bit 4 of every quant, as the little-endian `qh` word.
#[inline(always)]
fn pack_high_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= (((v & 0x10) >> 4) as u32) << j;
    }
    qh.to_le_bytes()
}

/// C's float-to-integer conversion as compiled for x86 (`cvttss2si`): truncation, and the
/// "integer indefinite" `i32::MIN` for NaN and out-of-range values. ggml's quantizers write
/// `(int8_t)f` / `(uint8_t)f`, which is that value's low byte; only degenerate blocks (a
/// subnormal scale whose inverse overflows, or non-finite input) ever reach the special case.
#[inline(always)]
pub(crate) fn cvtt_i32(f: f32) -> i32 {
    if f.is_nan() || !(-2147483648.0..2147483648.0).contains(&f) {
        i32::MIN
    } else {
        f as i32
    }
}

/// `(int8_t)f` as compiled for x86.
#[inline(always)]
fn trunc_i8(f: f32) -> i8 {
    cvtt_i32(f) as i8
}

pub fn quantize_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let d = signed_absmax(x) / -8.0;
        let id = inverse(d);
        b.d = f32_to_f16(d);
        let q: [u8; QK] = std::array::from_fn(|j| trunc_i8(x[j] * id + 8.5).min(15) as u8);
        b.qs = pack_nibbles(&q);
    }
}

pub fn quantize_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        let q: [u8; QK] = std::array::from_fn(|j| trunc_i8((x[j] - min) * id + 0.5).min(15) as u8);
        b.qs = pack_nibbles(&q);
    }
}

pub fn quantize_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let d = signed_absmax(x) / -16.0;
        let id = inverse(d);
        b.d = f32_to_f16(d);
        let q: [u8; QK] = std::array::from_fn(|j| trunc_i8(x[j] * id + 16.5).min(31) as u8);
        b.qs = pack_nibbles(&q);
        b.qh = pack_high_bits(&q);
    }
}

pub fn quantize_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        // ggml converts straight to uint8_t here (no clamp at 31).
        let q: [u8; QK] = std::array::from_fn(|j| cvtt_i32((x[j] - min) * id + 0.5) as u8);
        b.qs = pack_nibbles(&q);
        b.qh = pack_high_bits(&q);
    }
}

/// Q8_0 block scale and quants: `d = amax / 127`, `q = roundf(x / d)` (half away from zero).
/// This is `quantize_row_q8_0_ref`, what gguf-py and llama-quantize write into files; the
/// activations llama.cpp quantizes at run time on x86 go through [`quantize_q8_0_act`].
#[inline(always)]
fn q8_block(x: &[f32]) -> (f32, [i8; QK]) {
    let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    (d, std::array::from_fn(|j| trunc_i8((x[j] * id).round())))
}

pub fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let (d, qs) = q8_block(x);
        b.d = f32_to_f16(d);
        b.qs = qs;
    }
}

/// As Q8_0, plus `s = f16(d * sum(q))` (the product taken in f32 from the exact f32 `d`).
pub fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let (d, qs) = q8_block(x);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        b.d = f32_to_f16(d);
        b.s = f32_to_f16(sum as f32 * d);
        b.qs = qs;
    }
}

// ---------------------------------------------------------------------------------------------
// Run-time activation quantizers (llama.cpp's x86 `quantize_row_q8_0` / `quantize_row_q8_1`).
//
// llama.cpp quantizes activations with its SIMD quantizer, not with the `_ref` one, and the two
// disagree on a few quants per thousand: the SIMD code multiplies by `id = 127 / amax` (not by
// `1 / d`, one more rounding apart) and rounds ties to even (the FPU default, `roundps`) where
// `roundf` rounds them away from zero. The models mica runs are sensitive enough to those few
// quants for greedy tokens to change, so mica's run-time quantizers follow the x86 code
// operation by operation, including what it does with NaN, infinities and subnormal blocks.
// The scalar versions here are the reference for mica's SIMD ones (byte-identical).

/// `maxps`: the second operand unless the first is greater (so NaN in either gives `b`).
#[inline(always)]
fn maxps(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// `cvtps2dq` of an already rounded value: NaN and out-of-range give `i32::MIN`.
#[inline(always)]
fn cvtps_i32(r: f32) -> i32 {
    if r.is_nan() || !(-2147483648.0..2147483648.0).contains(&r) {
        i32::MIN
    } else {
        r as i32
    }
}

/// The x86 block quantizer: the largest |x| found by `maxps` in the SIMD reduction order
/// (four 8-lane vectors, then 8 -> 4 -> 2 -> 1 lanes), `d = amax / 127`,
/// `q = round_ties_even(x * (127 / amax))` as i32 (saturated to i8 when stored).
/// Returns `(d, q as i32)`.
#[inline(always)]
fn q8_block_act(x: &[f32]) -> (f32, [i32; QK]) {
    let lane = |l: usize| {
        let m = maxps(x[l].abs(), x[8 + l].abs());
        maxps(maxps(m, x[16 + l].abs()), x[24 + l].abs())
    };
    let m8: [f32; 8] = std::array::from_fn(lane);
    let m4: [f32; 4] = std::array::from_fn(|l| maxps(m8[4 + l], m8[l]));
    let amax = maxps(maxps(m4[0], m4[2]), maxps(m4[1], m4[3]));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (
        d,
        std::array::from_fn(|j| cvtps_i32((x[j] * id).round_ties_even())),
    )
}

/// i32 quants to bytes the way `packssdw` + `packsswb` do it (saturating).
#[inline(always)]
fn saturate_i8(q: &[i32; QK]) -> [i8; QK] {
    q.map(|v| v.clamp(-128, 127) as i8)
}

/// Run-time Q8_0 quantizer: llama.cpp's x86 `quantize_row_q8_0` (see the section comment).
/// For finite blocks of nonzero (normal) magnitude every quant lies in -127..=127.
pub fn quantize_q8_0_act(x: &[f32], y: &mut [BlockQ8_0]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let (d, q) = q8_block_act(x);
        b.d = f32_to_f16(d);
        b.qs = saturate_i8(&q);
    }
}

/// Run-time Q8_1 quantizer: llama.cpp's x86 `quantize_row_q8_1`; `s = f16(d * Σq)` with the
/// sum of the unsaturated i32 quants (wrapping, as the SIMD adds do).
pub fn quantize_q8_1_act(x: &[f32], y: &mut [BlockQ8_1]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let (d, q) = q8_block_act(x);
        let sum = q.iter().fold(0i32, |s, &v| s.wrapping_add(v));
        b.d = f32_to_f16(d);
        b.s = f32_to_f16(d * sum as f32);
        b.qs = saturate_i8(&q);
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar dot products (ggml's generic path): an exact i32 sum per block, then scaled and
// accumulated in f32, block after block.

/// Exact integer dot product of one block's 32 quants.
#[inline(always)]
pub fn idot32(a: &[i8; QK], b: &[i8; QK]) -> i32 {
    a.iter().zip(b).map(|(&a, &b)| a as i32 * b as i32).sum()
}

pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let sumi = idot32(&unpack_q4_0(a), &b.qs);
        sum += sumi as f32 * f16_to_f32(a.d) * f16_to_f32(b.d);
    }
    sum
}

pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let sumi = idot32(&unpack_q4_1(a), &b.qs);
        sum += f16_to_f32(a.d) * f16_to_f32(b.d) * sumi as f32 + f16_to_f32(a.m) * f16_to_f32(b.s);
    }
    sum
}

pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let sumi = idot32(&unpack_q5_0(a), &b.qs);
        sum += f16_to_f32(a.d) * f16_to_f32(b.d) * sumi as f32;
    }
    sum
}

pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let sumi = idot32(&unpack_q5_1(a), &b.qs);
        sum += f16_to_f32(a.d) * f16_to_f32(b.d) * sumi as f32 + f16_to_f32(a.m) * f16_to_f32(b.s);
    }
    sum
}

pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let sumi = idot32(&a.qs, &b.qs);
        sum += sumi as f32 * (f16_to_f32(a.d) * f16_to_f32(b.d));
    }
    sum
}
