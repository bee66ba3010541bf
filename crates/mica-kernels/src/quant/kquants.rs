//! The k-quant super-block formats Q2_K ... Q6_K and their activation partner Q8_K:
//! exact dequantization (ggml-quants.c `dequantize_row_*`), the Q8_K activation quantizer
//! (`quantize_row_q8_K_ref`) and the scalar dot products of ggml's generic CPU path
//! (`ggml_vec_dot_*_q8_K_generic`). The weight quantizers live in `kquants_quantize.rs`.
//!
//! Every format is handled by first unpacking a block into its integer quants in element
//! order plus per-sub-block integer scales (and mins); dequantization and dot products then
//! share that one description of the bit layout.

use super::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, f16_to_f32, q3k_scales,
    scale_min_k4,
};

// ---------------------------------------------------------------------------------------------
// Unpacking.

/// Q2_K quants (0..4) in element order.
#[inline(always)]
pub fn unpack_q2k(b: &BlockQ2K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for h in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                q[128 * h + 32 * j + l] = ((b.qs[32 * h + l] >> (2 * j)) & 3) as i8;
            }
        }
    }
    q
}

/// Q3_K quants (-4..4) in element order: two low bits from `qs` (as Q2_K), minus 4 when the
/// `hmask` bit is clear.
#[inline(always)]
pub fn unpack_q3k(b: &BlockQ3K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for h in 0..2 {
        for j in 0..4 {
            let m = 1u8 << (4 * h + j);
            for l in 0..32 {
                let low = ((b.qs[32 * h + l] >> (2 * j)) & 3) as i8;
                q[128 * h + 32 * j + l] = low - if b.hmask[l] & m != 0 { 0 } else { 4 };
            }
        }
    }
    q
}

/// Q4_K quants (0..16) in element order.
#[inline(always)]
pub fn unpack_q4k(b: &BlockQ4K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for k in 0..4 {
        for l in 0..32 {
            let v = b.qs[32 * k + l];
            q[64 * k + l] = (v & 0xF) as i8;
            q[64 * k + 32 + l] = (v >> 4) as i8;
        }
    }
    q
}

/// Q5_K quants (0..32) in element order.
#[inline(always)]
pub fn unpack_q5k(b: &BlockQ5K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for k in 0..4 {
        for l in 0..32 {
            let v = b.qs[32 * k + l];
            let h = b.qh[l];
            q[64 * k + l] = ((v & 0xF) | (((h >> (2 * k)) & 1) << 4)) as i8;
            q[64 * k + 32 + l] = ((v >> 4) | (((h >> (2 * k + 1)) & 1) << 4)) as i8;
        }
    }
    q
}

/// Q6_K quants minus 32 (-32..32) in element order.
#[inline(always)]
pub fn unpack_q6k(b: &BlockQ6K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for h in 0..2 {
        let (ql, qh) = (&b.ql[64 * h..64 * h + 64], &b.qh[32 * h..32 * h + 32]);
        let y = &mut q[128 * h..128 * h + 128];
        for l in 0..32 {
            y[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            y[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | ((qh[l] >> 6) << 4)) as i8 - 32;
        }
    }
    q
}

/// The eight (scale, min) pairs of a Q4_K/Q5_K block.
#[inline(always)]
pub fn scales_mins_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, s);
    }
    (sc, mn)
}

// ---------------------------------------------------------------------------------------------
// Dequantization. Per sub-block ggml forms `dl = d * sc` (and `ml = dmin * m`) in f32, then
// `y = dl * q - ml`; Q6_K computes `d * sc * q` left to right, which is the same thing.

/// `y = (d * sc) * q - (dmin * m)` for one sub-block.
#[inline(always)]
fn dequant_sub(y: &mut [f32], q: &[i8], d: f32, sc: u8, dmin: f32, m: u8) {
    let dl = d * sc as f32;
    let ml = dmin * m as f32;
    for (y, &q) in y.iter_mut().zip(q) {
        *y = dl * q as f32 - ml;
    }
}

pub fn dequantize_q2k(x: &[BlockQ2K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let q = unpack_q2k(b);
        for (k, (y, q)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            dequant_sub(y, q, d, b.scales[k] & 0xF, dmin, b.scales[k] >> 4);
        }
    }
}

pub fn dequantize_q3k(x: &[BlockQ3K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let q = unpack_q3k(b);
        let sc = q3k_scales(&b.scales);
        for (k, (y, q)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * sc[k] as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32;
            }
        }
    }
}

pub fn dequantize_q4k(x: &[BlockQ4K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let q = unpack_q4k(b);
        let (sc, mn) = scales_mins_k4(&b.scales);
        for (k, (y, q)) in y.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            dequant_sub(y, q, d, sc[k], dmin, mn[k]);
        }
    }
}

pub fn dequantize_q5k(x: &[BlockQ5K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let q = unpack_q5k(b);
        let (sc, mn) = scales_mins_k4(&b.scales);
        for (k, (y, q)) in y.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            dequant_sub(y, q, d, sc[k], dmin, mn[k]);
        }
    }
}

pub fn dequantize_q6k(x: &[BlockQ6K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let q = unpack_q6k(b);
        for (k, (y, q)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * b.scales[k] as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32;
            }
        }
    }
}

pub fn dequantize_q8k(x: &[BlockQ8K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = d * q as f32;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q8_K activation quantizer.

/// ggml's `nearest_int`: round to nearest, ties to even, through the float-magic trick
/// (valid for |f| < 2^22, which every caller guarantees).
#[inline(always)]
pub fn nearest_int(f: f32) -> i32 {
    let v = f + 12582912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `quantize_row_q8_K_ref`: scale from the *signed* value of largest magnitude,
/// `iscale = -127 / max`, `q = min(127, nearest_int(iscale * x))`, `d = 1 / iscale`, and the
/// sums of each 16 quants. An all-zero block gets `d = 0` and zero quants and sums.
pub fn quantize_q8k(x: &[f32], y: &mut [BlockQ8K]) {
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.d = 0f32.to_le_bytes();
            b.qs = [0; QK_K];
            b.bsums = [[0; 2]; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (k, s) in b.bsums.iter_mut().enumerate() {
            let sum: i32 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i32).sum();
            *s = (sum as i16).to_le_bytes();
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar dot products with Q8_K activations.
//
// Q3_K..Q6_K follow ggml's generic code: the integer products scale * q8 * q of a block are
// summed into eight i32 lanes (lane = element index mod 8), each lane is scaled by
// `d = d_w * d_x` into its own f32 accumulator across blocks, and the lanes are added at the
// end. The min terms (`dmin * sum(bsums * m)`) go straight into the running sum. Keeping the
// lanes makes this reference bit-identical to llama.cpp's generic build.

/// Eight-lane integer sum of `scale[k] * q[i] * a[i]` over a block split in sub-blocks of
/// `sub` elements.
#[inline(always)]
fn lanes8(q: &[i8; QK_K], a: &[i8; QK_K], scales: &[i32], sub: usize) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (k, (q, a)) in q.chunks_exact(sub).zip(a.chunks_exact(sub)).enumerate() {
        for (i, (&q, &a)) in q.iter().zip(a).enumerate() {
            lanes[i % 8] += scales[k] * (q as i32 * a as i32);
        }
    }
    lanes
}

/// Sum over the 16 groups of `bsums[g] * mins[g / per]`, `per` groups sharing one min.
#[inline(always)]
fn min_term(y: &BlockQ8K, mins: &[u8], per: usize) -> i32 {
    (0..QK_K / 16)
        .map(|g| y.bsum(g) as i32 * mins[g / per] as i32)
        .sum()
}

pub fn vec_dot_q2k_q8k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let mins: [u8; 16] = a.scales.map(|s| s >> 4);
        let summs = min_term(b, &mins, 1);
        let dall = b.d() * f16_to_f32(a.d);
        let dmin = b.d() * f16_to_f32(a.dmin);
        let q = unpack_q2k(a);
        let mut isum = 0i32;
        for (k, (q, a8)) in q.chunks_exact(16).zip(b.qs.chunks_exact(16)).enumerate() {
            let s: i32 = q.iter().zip(a8).map(|(&q, &a)| q as i32 * a as i32).sum();
            isum += (a.scales[k] & 0xF) as i32 * s;
        }
        sum += dall * isum as f32 - dmin * summs as f32;
    }
    sum
}

/// Shared tail of the lane-based k-quant dots: accumulate `d * lane` per lane.
#[inline(always)]
fn add_lanes(acc: &mut [f32; 8], d: f32, lanes: [i32; 8]) {
    for (a, l) in acc.iter_mut().zip(lanes) {
        *a += d * l as f32;
    }
}

pub fn vec_dot_q3k_q8k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (a, b) in x.iter().zip(y) {
        let scales = q3k_scales(&a.scales).map(|s| s as i32);
        let lanes = lanes8(&unpack_q3k(a), &b.qs, &scales, 16);
        add_lanes(&mut acc, f16_to_f32(a.d) * b.d(), lanes);
    }
    acc.iter().fold(0.0f32, |s, &a| s + a)
}

pub fn vec_dot_q4k_q8k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let (sc, mn) = scales_mins_k4(&a.scales);
        let sumi = min_term(b, &mn, 2);
        let lanes = lanes8(&unpack_q4k(a), &b.qs, &sc.map(|s| s as i32), 32);
        add_lanes(&mut acc, f16_to_f32(a.d) * b.d(), lanes);
        sum -= f16_to_f32(a.dmin) * b.d() * sumi as f32;
    }
    acc.iter().fold(sum, |s, &a| s + a)
}

pub fn vec_dot_q5k_q8k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut sum = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let (sc, mn) = scales_mins_k4(&a.scales);
        let sumi = min_term(b, &mn, 2);
        let lanes = lanes8(&unpack_q5k(a), &b.qs, &sc.map(|s| s as i32), 32);
        add_lanes(&mut acc, f16_to_f32(a.d) * b.d(), lanes);
        sum -= f16_to_f32(a.dmin) * b.d() * sumi as f32;
    }
    acc.iter().fold(sum, |s, &a| s + a)
}

pub fn vec_dot_q6k_q8k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (a, b) in x.iter().zip(y) {
        let lanes = lanes8(&unpack_q6k(a), &b.qs, &a.scales.map(|s| s as i32), 16);
        add_lanes(&mut acc, f16_to_f32(a.d) * b.d(), lanes);
    }
    acc.iter().fold(0.0f32, |s, &a| s + a)
}
