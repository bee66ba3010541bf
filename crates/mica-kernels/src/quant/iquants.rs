//! The i-quants (IQ1_S ... IQ4_XS), the ternary formats (TQ1_0, TQ2_0) and MXFP4: exact
//! dequantization (ggml's `dequantize_row_*`, float operations in its order), the unpacking
//! of a block into integer weight values and integer scales that the dot products of every
//! tier share, and ggml's generic reference dot products (`ggml-cpu/quants.c`,
//! `ggml_vec_dot_*_generic`).
//!
//! Pairings as ggml's CPU type traits (`vec_dot_type`): IQ4_NL and MXFP4 with Q8_0, every
//! other type here with Q8_K.
//!
//! Every 256-element type unpacks ([`unpack`]) to `q[e]`, the signed integer value of
//! element `e` (grid value times sign, non-linear table value, ternary digit), and `sc[g]`,
//! the integer scale of elements `16g..16g+16`; its dot product with Q8_K activations is
//! `mult · Σ_blocks d_w · d_x · Σ_e sc[e/16] · q[e] · a[e]` (`mult` 1/8 for the iq2 types,
//! 1/4 for IQ3_XXS), plus the shift terms of IQ1_S/IQ1_M and the `-1` of the ternary
//! digits, which ggml computes from the activations' block sums.

use super::blocks::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL,
    BlockIQ4XS, BlockMXFP4, BlockQ8_0, BlockQ8K, BlockTQ1_0, BlockTQ2_0, QK, QK_K,
    e8m0_to_f32_half, f16_to_f32,
};
use super::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL, KVALUES_MXFP4,
};

/// ggml's `IQ1S_DELTA` (also `IQ1M_DELTA`): the shift of the IQ1 grids.
pub const IQ1_DELTA: f32 = 0.125;

#[inline(always)]
fn u16le(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

#[inline(always)]
fn u32le(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// `±1` for bit `j` of a sign byte (set: negative).
#[inline(always)]
fn sign(bits: u8, j: usize) -> i8 {
    if bits >> j & 1 != 0 { -1 } else { 1 }
}

/// Eight signed grid values: bytes of `g` times the signs of `bits`.
#[inline(always)]
fn signed8(g: u64, bits: u8) -> [i8; 8] {
    let b = g.to_le_bytes();
    std::array::from_fn(|j| b[j] as i8 * sign(bits, j))
}

/// Four signed grid values, signs from bits `off..off + 4` of `bits`.
#[inline(always)]
fn signed4(g: u32, bits: u8, off: usize) -> [i8; 4] {
    let b = g.to_le_bytes();
    std::array::from_fn(|j| b[j] as i8 * sign(bits, off + j))
}

/// A 256-element block as integers (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Unpacked {
    /// Signed integer weight value of every element (for IQ1: the grid value, -1..=1; for
    /// the ternary formats: the digit, 0..=2).
    pub q: [i8; QK_K],
    /// Integer scale of each group of 16 elements.
    pub sc: [i32; 16],
}

impl Unpacked {
    fn new() -> Unpacked {
        Unpacked {
            q: [0; QK_K],
            sc: [1; 16],
        }
    }

    fn put8(&mut self, e: usize, v: [i8; 8]) {
        self.q[e..e + 8].copy_from_slice(&v);
    }
}

pub fn unpack_iq2xxs(b: &BlockIQ2XXS) -> Unpacked {
    let mut u = Unpacked::new();
    for ib in 0..QK_K / 32 {
        let (idx, aux) = (u32le(&b.qs, 8 * ib), u32le(&b.qs, 8 * ib + 4));
        let ls = 2 * (aux >> 28) as i32 + 1;
        u.sc[2 * ib] = ls;
        u.sc[2 * ib + 1] = ls;
        for l in 0..4 {
            let g = IQ2XXS_GRID[(idx >> (8 * l) & 0xFF) as usize];
            let s = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
            u.put8(32 * ib + 8 * l, signed8(g, s));
        }
    }
    u
}

pub fn unpack_iq2xs(b: &BlockIQ2XS) -> Unpacked {
    let mut u = Unpacked::new();
    for ib in 0..QK_K / 32 {
        u.sc[2 * ib] = 2 * (b.scales[ib] & 0xF) as i32 + 1;
        u.sc[2 * ib + 1] = 2 * (b.scales[ib] >> 4) as i32 + 1;
        for l in 0..4 {
            let q2 = u16le(&b.qs, 4 * ib + l);
            let g = IQ2XS_GRID[(q2 & 511) as usize];
            let s = KSIGNS_IQ2XS[(q2 >> 9) as usize];
            u.put8(32 * ib + 8 * l, signed8(g, s));
        }
    }
    u
}

pub fn unpack_iq2s(b: &BlockIQ2S) -> Unpacked {
    let mut u = Unpacked::new();
    let (qs, signs) = b.qs.split_at(QK_K / 8);
    for ib in 0..QK_K / 32 {
        u.sc[2 * ib] = 2 * (b.scales[ib] & 0xF) as i32 + 1;
        u.sc[2 * ib + 1] = 2 * (b.scales[ib] >> 4) as i32 + 1;
        for l in 0..4 {
            let idx = qs[4 * ib + l] as usize | ((b.qh[ib] as usize) << (8 - 2 * l) & 0x300);
            u.put8(32 * ib + 8 * l, signed8(IQ2S_GRID[idx], signs[4 * ib + l]));
        }
    }
    u
}

pub fn unpack_iq3xxs(b: &BlockIQ3XXS) -> Unpacked {
    let mut u = Unpacked::new();
    let (q3, gas) = b.qs.split_at(QK_K / 4);
    for ib in 0..QK_K / 32 {
        let aux = u32le(gas, 4 * ib);
        let ls = 2 * (aux >> 28) as i32 + 1;
        u.sc[2 * ib] = ls;
        u.sc[2 * ib + 1] = ls;
        for l in 0..4 {
            let s = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
            let g1 = signed4(IQ3XXS_GRID[q3[8 * ib + 2 * l] as usize], s, 0);
            let g2 = signed4(IQ3XXS_GRID[q3[8 * ib + 2 * l + 1] as usize], s, 4);
            let e = 32 * ib + 8 * l;
            u.q[e..e + 4].copy_from_slice(&g1);
            u.q[e + 4..e + 8].copy_from_slice(&g2);
        }
    }
    u
}

pub fn unpack_iq3s(b: &BlockIQ3S) -> Unpacked {
    let mut u = Unpacked::new();
    for ib in 0..QK_K / 32 {
        let ls = 2 * (b.scales[ib / 2] >> (4 * (ib % 2)) & 0xF) as i32 + 1;
        u.sc[2 * ib] = ls;
        u.sc[2 * ib + 1] = ls;
        let qh = b.qh[ib] as usize;
        for l in 0..4 {
            let i1 = b.qs[8 * ib + 2 * l] as usize | (qh << (8 - 2 * l) & 256);
            let i2 = b.qs[8 * ib + 2 * l + 1] as usize | (qh << (7 - 2 * l) & 256);
            let s = b.signs[4 * ib + l];
            let e = 32 * ib + 8 * l;
            u.q[e..e + 4].copy_from_slice(&signed4(IQ3S_GRID[i1], s, 0));
            u.q[e + 4..e + 8].copy_from_slice(&signed4(IQ3S_GRID[i2], s, 4));
        }
    }
    u
}

/// The 6-bit scale of sub-block `ib` of an IQ4_XS block, minus 32.
#[inline(always)]
pub fn iq4xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let h = u16::from_le_bytes(b.scales_h);
    let ls =
        (b.scales_l[ib / 2] >> (4 * (ib % 2)) & 0xF) as i32 | ((h >> (2 * ib) & 3) << 4) as i32;
    ls - 32
}

pub fn unpack_iq4xs(b: &BlockIQ4XS) -> Unpacked {
    let mut u = Unpacked::new();
    for ib in 0..QK_K / 32 {
        let ls = iq4xs_scale(b, ib);
        u.sc[2 * ib] = ls;
        u.sc[2 * ib + 1] = ls;
        for j in 0..16 {
            let q = b.qs[16 * ib + j];
            u.q[32 * ib + j] = KVALUES_IQ4NL[(q & 0xF) as usize];
            u.q[32 * ib + j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
        }
    }
    u
}

/// The 11-bit grid index of group of eight `l` (0..4) of group of 32 `ib` of an IQ1_S block.
#[inline(always)]
fn iq1s_index(b: &BlockIQ1S, ib: usize, l: usize) -> usize {
    let qh = u16le(&b.qh, ib) as usize;
    b.qs[4 * ib + l] as usize | ((qh >> (3 * l) & 7) << 8)
}

/// IQ1_S: grid values, scales, and the sign of the shift of each group of 32.
pub fn unpack_iq1s(b: &BlockIQ1S) -> (Unpacked, [i32; 8]) {
    let mut u = Unpacked::new();
    let mut delta = [0i32; 8];
    for (ib, dl) in delta.iter_mut().enumerate() {
        let qh = u16le(&b.qh, ib);
        let ls = 2 * (qh >> 12 & 7) as i32 + 1;
        u.sc[2 * ib] = ls;
        u.sc[2 * ib + 1] = ls;
        *dl = if qh & 0x8000 != 0 { -1 } else { 1 };
        for l in 0..4 {
            let g = IQ1S_GRID[iq1s_index(b, ib, l)].to_le_bytes();
            u.put8(32 * ib + 8 * l, g.map(|v| v as i8));
        }
    }
    (u, delta)
}

/// The f16 super-block scale of an IQ1_M block (spread over the top nibbles of `scales`).
#[inline(always)]
pub fn iq1m_scale(b: &BlockIQ1M) -> f32 {
    let sc = |i: usize| u16le(&b.scales, i);
    let bits = (sc(0) >> 12) | (sc(1) >> 8 & 0x00F0) | (sc(2) >> 4 & 0x0F00) | (sc(3) & 0xF000);
    f16_to_f32(bits.to_le_bytes())
}

/// IQ1_M: grid values, scales per 16, and the sign of the shift of each group of 8.
pub fn unpack_iq1m(b: &BlockIQ1M) -> (Unpacked, [i32; 32]) {
    let mut u = Unpacked::new();
    let mut delta = [0i32; 32];
    for ib in 0..QK_K / 32 {
        let sc = u16le(&b.scales, ib / 2) as i32;
        u.sc[2 * ib] = 2 * (sc >> (6 * (ib % 2)) & 7) + 1;
        u.sc[2 * ib + 1] = 2 * (sc >> (6 * (ib % 2) + 3) & 7) + 1;
        let (h0, h1) = (b.qh[2 * ib] as usize, b.qh[2 * ib + 1] as usize);
        let idx = [
            b.qs[4 * ib] as usize | (h0 << 8 & 0x700),
            b.qs[4 * ib + 1] as usize | (h0 << 4 & 0x700),
            b.qs[4 * ib + 2] as usize | (h1 << 8 & 0x700),
            b.qs[4 * ib + 3] as usize | (h1 << 4 & 0x700),
        ];
        let neg = [h0 & 0x08, h0 & 0x80, h1 & 0x08, h1 & 0x80];
        for l in 0..4 {
            let g = IQ1S_GRID[idx[l]].to_le_bytes();
            u.put8(32 * ib + 8 * l, g.map(|v| v as i8));
            delta[4 * ib + l] = if neg[l] != 0 { -1 } else { 1 };
        }
    }
    (u, delta)
}

/// Base-3 digit of a TQ1_0 byte after multiplying by `3^l`, as ggml reads it.
#[inline(always)]
fn trit(q: u8, pow: u8) -> i8 {
    let q = q.wrapping_mul(pow);
    ((q as u16 * 3) >> 8) as i8
}

/// TQ1_0: the ternary digits (0..=2) in element order.
pub fn unpack_tq1_0(b: &BlockTQ1_0) -> [i8; QK_K] {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let mut q = [0i8; QK_K];
    let mut e = 0;
    for (j, w) in [(0usize, 32usize), (32, 16)] {
        for &p in &POW3 {
            for m in 0..w {
                q[e] = trit(b.qs[j + m], p);
                e += 1;
            }
        }
    }
    for &p in &POW3[..4] {
        for &h in &b.qh {
            q[e] = trit(h, p);
            e += 1;
        }
    }
    q
}

/// TQ2_0: the ternary digits (0..=3; 3 never written by a quantizer) in element order.
pub fn unpack_tq2_0(b: &BlockTQ2_0) -> [i8; QK_K] {
    std::array::from_fn(|e| {
        let (h, l, m) = (e / 128, e % 128 / 32, e % 32);
        (b.qs[32 * h + m] >> (2 * l) & 3) as i8
    })
}

/// A 32-element non-linear block (IQ4_NL, MXFP4): table values in element order.
#[inline(always)]
pub fn unpack_nl(qs: &[u8; QK / 2], table: &[i8; 16]) -> [i8; QK] {
    std::array::from_fn(|e| {
        let b = qs[e % 16];
        table[(if e < 16 { b & 0xF } else { b >> 4 }) as usize]
    })
}

// ---------------------------------------------------------------------------------------------
// Dequantization (ggml's `dequantize_row_*`, same float operations).

/// `y = db · q` per element for one group (the grid types: `db` already includes the
/// scale; the sign flip is exact).
#[inline(always)]
fn put_scaled(y: &mut [f32], db: f32, q: &[i8]) {
    for (y, &q) in y.iter_mut().zip(q) {
        *y = db * q.unsigned_abs() as f32 * if q < 0 { -1.0 } else { 1.0 };
    }
}

pub fn dequantize_iq2xxs(x: &[BlockIQ2XXS], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let u = unpack_iq2xxs(b);
        for ib in 0..8 {
            let ls = (u32le(&b.qs, 8 * ib + 4) >> 28) as f32;
            let db = d * (0.5 + ls) * 0.25;
            put_scaled(
                &mut y[32 * ib..32 * ib + 32],
                db,
                &u.q[32 * ib..32 * ib + 32],
            );
        }
    }
}

/// IQ2_XS, IQ2_S: `d · (0.5 + ls) · 0.25` per 16 elements.
fn dequantize_iq2_halves(d: f32, scales: &[u8; 8], u: &Unpacked, y: &mut [f32]) {
    for ib in 0..8 {
        for h in 0..2 {
            let ls = (scales[ib] >> (4 * h) & 0xF) as f32;
            let db = d * (0.5 + ls) * 0.25;
            let r = 32 * ib + 16 * h..32 * ib + 16 * h + 16;
            put_scaled(&mut y[r.clone()], db, &u.q[r]);
        }
    }
}

pub fn dequantize_iq2xs(x: &[BlockIQ2XS], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        dequantize_iq2_halves(f16_to_f32(b.d), &b.scales, &unpack_iq2xs(b), y);
    }
}

pub fn dequantize_iq2s(x: &[BlockIQ2S], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        dequantize_iq2_halves(f16_to_f32(b.d), &b.scales, &unpack_iq2s(b), y);
    }
}

pub fn dequantize_iq3xxs(x: &[BlockIQ3XXS], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let u = unpack_iq3xxs(b);
        for ib in 0..8 {
            let ls = (u32le(&b.qs, QK_K / 4 + 4 * ib) >> 28) as f32;
            let db = d * (0.5 + ls) * 0.5;
            put_scaled(
                &mut y[32 * ib..32 * ib + 32],
                db,
                &u.q[32 * ib..32 * ib + 32],
            );
        }
    }
}

pub fn dequantize_iq3s(x: &[BlockIQ3S], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let u = unpack_iq3s(b);
        for ib in 0..8 {
            let db = d * u.sc[2 * ib] as f32;
            put_scaled(
                &mut y[32 * ib..32 * ib + 32],
                db,
                &u.q[32 * ib..32 * ib + 32],
            );
        }
    }
}

pub fn dequantize_iq4xs(x: &[BlockIQ4XS], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let u = unpack_iq4xs(b);
        for ib in 0..8 {
            let dl = d * iq4xs_scale(b, ib) as f32;
            for e in 32 * ib..32 * ib + 32 {
                y[e] = dl * u.q[e] as f32;
            }
        }
    }
}

pub fn dequantize_iq1s(x: &[BlockIQ1S], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let (u, delta) = unpack_iq1s(b);
        for ib in 0..8 {
            let dl = d * u.sc[2 * ib] as f32;
            let delta = IQ1_DELTA * delta[ib] as f32;
            for e in 32 * ib..32 * ib + 32 {
                y[e] = dl * (u.q[e] as f32 + delta);
            }
        }
    }
}

pub fn dequantize_iq1m(x: &[BlockIQ1M], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = iq1m_scale(b);
        let (u, delta) = unpack_iq1m(b);
        for (e, y) in y.iter_mut().enumerate() {
            let dl = d * u.sc[e / 16] as f32;
            *y = dl * (u.q[e] as f32 + IQ1_DELTA * delta[e / 8] as f32);
        }
    }
}

/// The ternary formats: `(t - 1) · d`.
fn dequantize_ternary(q: &[i8; QK_K], d: f32, y: &mut [f32]) {
    for (y, &t) in y.iter_mut().zip(q) {
        *y = (t as i32 - 1) as f32 * d;
    }
}

pub fn dequantize_tq1_0(x: &[BlockTQ1_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        dequantize_ternary(&unpack_tq1_0(b), f16_to_f32(b.d), y);
    }
}

pub fn dequantize_tq2_0(x: &[BlockTQ2_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        dequantize_ternary(&unpack_tq2_0(b), f16_to_f32(b.d), y);
    }
}

pub fn dequantize_iq4nl(x: &[BlockIQ4NL], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, q) in y.iter_mut().zip(unpack_nl(&b.qs, &KVALUES_IQ4NL)) {
            *y = d * q as f32;
        }
    }
}

pub fn dequantize_mxfp4(x: &[BlockMXFP4], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = e8m0_to_f32_half(b.e);
        for (y, q) in y.iter_mut().zip(unpack_nl(&b.qs, &KVALUES_MXFP4)) {
            *y = q as f32 * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reference dot products (ggml's generic kernels: exact integer sums, its float steps).

/// `Σ_e sc[e/16] · q[e] · a[e]` over one block.
#[inline]
pub fn scaled_sum(u: &Unpacked, a: &[i8; QK_K]) -> i32 {
    u.q.iter()
        .zip(a)
        .enumerate()
        .map(|(e, (&q, &a))| u.sc[e / 16] * q as i32 * a as i32)
        .sum()
}

/// The iq2/iq3 types: `mult · Σ d_w·d_x · Σ sc·q·a`.
fn dot_grid<B>(
    x: &[B],
    y: &[BlockQ8K],
    d: impl Fn(&B) -> [u8; 2],
    unpack: impl Fn(&B) -> Unpacked,
    mult: f32,
) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let bsum = scaled_sum(&unpack(a), &b.qs);
        sumf += f16_to_f32(d(a)) * b.d() * bsum as f32;
    }
    mult * sumf
}

pub fn vec_dot_iq2xxs_q8k(x: &[BlockIQ2XXS], y: &[BlockQ8K]) -> f32 {
    dot_grid(x, y, |a| a.d, unpack_iq2xxs, 0.125)
}

pub fn vec_dot_iq2xs_q8k(x: &[BlockIQ2XS], y: &[BlockQ8K]) -> f32 {
    dot_grid(x, y, |a| a.d, unpack_iq2xs, 0.125)
}

pub fn vec_dot_iq2s_q8k(x: &[BlockIQ2S], y: &[BlockQ8K]) -> f32 {
    dot_grid(x, y, |a| a.d, unpack_iq2s, 0.125)
}

pub fn vec_dot_iq3xxs_q8k(x: &[BlockIQ3XXS], y: &[BlockQ8K]) -> f32 {
    dot_grid(x, y, |a| a.d, unpack_iq3xxs, 0.25)
}

pub fn vec_dot_iq3s_q8k(x: &[BlockIQ3S], y: &[BlockQ8K]) -> f32 {
    dot_grid(x, y, |a| a.d, unpack_iq3s, 1.0)
}

/// IQ4_XS: per 32 elements `sumf += (d_w·d_x·ls) · Σ q·a`.
pub fn vec_dot_iq4xs_q8k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let d4d8 = f16_to_f32(a.d) * b.d();
        let u = unpack_iq4xs(a);
        for ib in 0..8 {
            let r = 32 * ib..32 * ib + 32;
            let sumi: i32 = u.q[r.clone()]
                .iter()
                .zip(&b.qs[r])
                .map(|(&q, &a)| q as i32 * a as i32)
                .sum();
            sumf += d4d8 * iq4xs_scale(a, ib) as f32 * sumi as f32;
        }
    }
    sumf
}

/// `Σ_g bsum(g)` of the two groups of 16 of sub-block `ib`.
#[inline(always)]
fn bsum32(b: &BlockQ8K, ib: usize) -> i32 {
    b.bsum(2 * ib) as i32 + b.bsum(2 * ib + 1) as i32
}

pub fn vec_dot_iq1s_q8k(x: &[BlockIQ1S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let (u, delta) = unpack_iq1s(a);
        let sumi = scaled_sum(&u, &b.qs);
        let sumi1: i32 = (0..8)
            .map(|ib| u.sc[2 * ib] * delta[ib] * bsum32(b, ib))
            .sum();
        sumf += f16_to_f32(a.d) * b.d() * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
    }
    sumf
}

/// `Σ` of each group of eight activations.
#[inline(always)]
pub fn sums8(a: &[i8; QK_K]) -> [i32; 32] {
    std::array::from_fn(|k| a[8 * k..8 * k + 8].iter().map(|&v| v as i32).sum())
}

pub fn vec_dot_iq1m_q8k(x: &[BlockIQ1M], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let (u, delta) = unpack_iq1m(a);
        let sumi1 = scaled_sum(&u, &b.qs);
        let s8 = sums8(&b.qs);
        let sumi2: i32 = (0..32).map(|k| u.sc[k / 2] * delta[k] * s8[k]).sum();
        sumf += iq1m_scale(a) * b.d() * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
    }
    sumf
}

/// The ternary formats: `Σ (t - 1)·a` per block, times `d_w·d_x`.
fn dot_ternary<B>(x: &[B], y: &[BlockQ8K], f: impl Fn(&B) -> ([i8; QK_K], [u8; 2])) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let (q, d) = f(a);
        let sum: i32 = q
            .iter()
            .zip(&b.qs)
            .map(|(&t, &a)| (t as i32 - 1) * a as i32)
            .sum();
        sumf += sum as f32 * (f16_to_f32(d) * b.d());
    }
    sumf
}

pub fn vec_dot_tq1_0_q8k(x: &[BlockTQ1_0], y: &[BlockQ8K]) -> f32 {
    dot_ternary(x, y, |a| (unpack_tq1_0(a), a.d))
}

pub fn vec_dot_tq2_0_q8k(x: &[BlockTQ2_0], y: &[BlockQ8K]) -> f32 {
    dot_ternary(x, y, |a| (unpack_tq2_0(a), a.d))
}

/// `Σ q·a` over a 32-element block.
#[inline(always)]
fn idot32(q: &[i8; QK], a: &[i8; QK]) -> i32 {
    q.iter().zip(a).map(|(&q, &a)| q as i32 * a as i32).sum()
}

pub fn vec_dot_iq4nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let d = f16_to_f32(b.d) * f16_to_f32(a.d);
        sumf += d * idot32(&unpack_nl(&a.qs, &KVALUES_IQ4NL), &b.qs) as f32;
    }
    sumf
}

pub fn vec_dot_mxfp4_q8_0(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let d = f16_to_f32(b.d) * e8m0_to_f32_half(a.e);
        sumf += d * idot32(&unpack_nl(&a.qs, &KVALUES_MXFP4), &b.qs) as f32;
    }
    sumf
}

/// The per-output arithmetic of llama.cpp's repacked IQ4_NL (`ggml_gemv/gemm_iq4_nl_8x8_q8_0`,
/// the [`DotPath::RepackGemv`](crate::simd::DotPath::RepackGemv) of IQ4_NL): one FMA per
/// block, `acc = fma(Σ q·a, d_w·d_x, acc)`.
pub fn dot_iq4nl_repacked(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let s = idot32(&unpack_nl(&a.qs, &KVALUES_IQ4NL), &b.qs);
        acc = (s as f32).mul_add(f16_to_f32(a.d) * f16_to_f32(b.d), acc);
    }
    acc
}
