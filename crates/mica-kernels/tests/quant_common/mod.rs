//! Helpers shared by the `quant_*` integration tests: random and edge-case weight rows,
//! activations, and an f64 reference for a dot product built from dequantized values.
#![allow(dead_code)]

use mica_kernels::DType;
use mica_kernels::quant::{can_quantize, dequantize_row, f16_to_f32, f32_to_f16, quantize_row};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub type Rng = ChaCha8Rng;

pub fn rng(seed: u64) -> Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Standard normal sample (Box-Muller).
pub fn normal(r: &mut Rng) -> f32 {
    let u1: f64 = r.random_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = r.random();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// Byte offsets of the f16 scale/min fields in one block (ggml-common.h).
pub fn f16_fields(t: DType) -> &'static [usize] {
    match t {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q8_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S
        | DType::IQ4_NL
        | DType::IQ4_XS => &[0],
        DType::TQ1_0 => &[52],
        DType::TQ2_0 => &[64],
        _ => &[],
    }
}

/// A finite f16 value between 2^-14 and 2^2 in magnitude, random sign.
pub fn random_scale(r: &mut Rng) -> f32 {
    let e: f32 = r.random_range(-14.0..2.0);
    let s = if r.random::<bool>() { 1.0 } else { -1.0 };
    f16_to_f32(f32_to_f16(s * e.exp2()))
}

/// How a weight row is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    /// Random bytes with random finite scales: every bit pattern of the quants.
    RandomBytes,
    /// llama.cpp's reference quantizer applied to random normal weights (for the i-quants
    /// mica cannot write, random bytes with random scales as `RandomBytes`).
    Quantized,
    /// Zero scales.
    ZeroScales,
    /// All quant bits set, largest finite scales (65504 for f16 scales; max for floats).
    MaxMagnitude,
}

pub const WEIGHT_KINDS: [WeightKind; 4] = [
    WeightKind::RandomBytes,
    WeightKind::Quantized,
    WeightKind::ZeroScales,
    WeightKind::MaxMagnitude,
];

/// A row of `nblocks` blocks of weight type `t`.
pub fn weight_row(t: DType, nblocks: usize, kind: WeightKind, r: &mut Rng) -> Vec<u8> {
    let n = nblocks * t.block_size();
    let ts = t.type_size();
    if !t.is_quantized() {
        let vals: Vec<f32> = match kind {
            WeightKind::RandomBytes | WeightKind::Quantized => (0..n).map(|_| normal(r)).collect(),
            WeightKind::ZeroScales => vec![0.0; n],
            WeightKind::MaxMagnitude => {
                let m = if t == DType::F16 { 65504.0 } else { 1e30 };
                (0..n).map(|i| if i % 2 == 0 { m } else { -m }).collect()
            }
        };
        let mut out = vec![0u8; n * ts];
        quantize_row(t, &vals, &mut out);
        return out;
    }
    let kind = if kind == WeightKind::Quantized && !can_quantize(t) {
        WeightKind::RandomBytes
    } else {
        kind
    };
    match kind {
        WeightKind::Quantized => {
            let scale = (r.random_range(-6.0f32..4.0)).exp2();
            let vals: Vec<f32> = (0..n).map(|_| normal(r) * scale).collect();
            let mut out = vec![0u8; nblocks * ts];
            quantize_row(t, &vals, &mut out);
            out
        }
        WeightKind::RandomBytes => {
            let mut out: Vec<u8> = (0..nblocks * ts).map(|_| r.random()).collect();
            for b in out.chunks_exact_mut(ts) {
                for &off in f16_fields(t) {
                    b[off..off + 2].copy_from_slice(&f32_to_f16(random_scale(r)));
                }
                set_special_scale(t, b, random_scale(r));
            }
            out
        }
        WeightKind::ZeroScales | WeightKind::MaxMagnitude => {
            let (fill, scale) = if kind == WeightKind::ZeroScales {
                (r.random(), 0.0)
            } else {
                (0xFF, 65504.0)
            };
            let mut out = vec![fill; nblocks * ts];
            for b in out.chunks_exact_mut(ts) {
                for &off in f16_fields(t) {
                    b[off..off + 2].copy_from_slice(&f32_to_f16(scale));
                }
                set_special_scale(t, b, scale);
                if t == DType::MXFP4 && kind == WeightKind::ZeroScales {
                    b[0] = 0; // the smallest scale, 2^-128 (E8M0 has no zero)
                }
            }
            out
        }
    }
}

/// Scales that are not plain f16 fields: IQ1_M's f16 spread over the top nibbles of its
/// four u16 scale words; MXFP4's E8M0 exponent (kept in a range whose products stay finite).
pub fn set_special_scale(t: DType, b: &mut [u8], scale: f32) {
    match t {
        DType::IQ1_M => {
            let bits = u16::from_le_bytes(f32_to_f16(scale));
            for i in 0..4 {
                let hi = &mut b[48 + 2 * i + 1];
                *hi = (*hi & 0x0F) | (((bits >> (4 * i)) & 0xF) << 4) as u8;
            }
        }
        DType::MXFP4 => {
            // 2^(e-128) with e in 100..=150: as the f16 scales of the other types.
            b[0] = 100 + b[0] % 51;
        }
        _ => {}
    }
}

/// How activations are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    Normal,
    /// Normal with a few large outliers.
    Outliers,
    Zero,
    /// Subnormal f32 values.
    Denormal,
    /// Values around 1e6 (Q8 scales stay finite in f16).
    Huge,
}

pub const ACT_KINDS: [ActKind; 5] = [
    ActKind::Normal,
    ActKind::Outliers,
    ActKind::Zero,
    ActKind::Denormal,
    ActKind::Huge,
];

pub fn activations(n: usize, kind: ActKind, r: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| match kind {
            ActKind::Normal => normal(r),
            ActKind::Outliers => normal(r) * if i % 37 == 5 { 100.0 } else { 1.0 },
            ActKind::Zero => 0.0,
            ActKind::Denormal => normal(r) * 1e-40,
            ActKind::Huge => normal(r) * 1e6,
        })
        .collect()
}

/// Quantizes activations into the partner format of weight type `t`.
pub fn quantize_act(t: DType, x: &[f32]) -> Vec<u8> {
    let a = t.vec_dot_type();
    let mut out = vec![0u8; a.row_bytes(x.len()).unwrap()];
    quantize_row(a, x, &mut out);
    out
}

pub fn dequant(t: DType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    dequantize_row(t, bytes, &mut out);
    out
}

/// Per-element magnitude of the "offset" part of a weight (|m| for Q4_1/Q5_1, dmin*min for
/// Q2_K/Q4_K/Q5_K, 0 otherwise): terms that cancel inside a dequantized weight but are
/// computed separately (and rounded separately) by the dot products.
pub fn offset_magnitudes(t: DType, w: &[u8], n: usize) -> Vec<f64> {
    use mica_kernels::quant::blocks::scale_min_k4;
    let ts = t.type_size();
    let mut out = vec![0.0f64; n];
    for (b, o) in w.chunks_exact(ts).zip(out.chunks_exact_mut(t.block_size())) {
        let h = |off: usize| f16_to_f32([b[off], b[off + 1]]).abs() as f64;
        match t {
            DType::Q4_1 | DType::Q5_1 => o.fill(h(2)),
            DType::Q2_K => {
                for (i, o) in o.iter_mut().enumerate() {
                    *o = h(82) * (b[i / 16] >> 4) as f64;
                }
            }
            DType::Q4_K | DType::Q5_K => {
                let sc: [u8; 12] = b[4..16].try_into().unwrap();
                for (i, o) in o.iter_mut().enumerate() {
                    *o = h(2) * scale_min_k4(i / 32, &sc).1 as f64;
                }
            }
            // The IQ1 shift `±0.125 · d · ls`, computed from the activation sums.
            DType::IQ1_S => {
                for (i, o) in o.iter_mut().enumerate() {
                    let qh = u16::from_le_bytes([b[34 + 2 * (i / 32)], b[35 + 2 * (i / 32)]]);
                    *o = h(0) * (2 * (qh >> 12 & 7) + 1) as f64 * 0.125;
                }
            }
            DType::IQ1_M => {
                let blk: &[mica_kernels::quant::BlockIQ1M] =
                    mica_kernels::quant::cast_blocks(b).unwrap();
                let d = mica_kernels::quant::iquants::iq1m_scale(&blk[0]).abs() as f64;
                let (u, _) = mica_kernels::quant::iquants::unpack_iq1m(&blk[0]);
                for (i, o) in o.iter_mut().enumerate() {
                    *o = d * u.sc[i / 16] as f64 * 0.125;
                }
            }
            _ => {}
        }
    }
    out
}

/// The f64 reference of a quantized dot product and the magnitude that bounds its rounding
/// error: `(sum w_i x_i, sum (|w_i| + offset_i) |x_i|)` over dequantized values. For Q4_1 and
/// Q5_1 the reference uses the activation block's stored `s` (an f16 rounding of
/// `d * sum q`) for the offset term, exactly as llama.cpp does.
pub fn reference_f64(t: DType, n: usize, w: &[u8], xq: &[u8]) -> (f64, f64) {
    let a = t.vec_dot_type();
    let wd = dequant(t, w, n);
    let xd = dequant(a, xq, n);
    let off = offset_magnitudes(t, w, n);
    let mut sum = 0.0f64;
    let mut mag = 0.0f64;
    for i in 0..n {
        sum += wd[i] as f64 * xd[i] as f64;
        mag += (wd[i].abs() as f64 + off[i]) * xd[i].abs() as f64;
    }
    if matches!(t, DType::Q4_1 | DType::Q5_1) {
        let (wt, at) = (t.type_size(), a.type_size());
        for (b, (wb, xb)) in w.chunks_exact(wt).zip(xq.chunks_exact(at)).enumerate() {
            let m = f16_to_f32([wb[2], wb[3]]) as f64;
            let s = f16_to_f32([xb[2], xb[3]]) as f64;
            let exact: f64 = xd[32 * b..32 * b + 32].iter().map(|&v| v as f64).sum();
            sum += m * (s - exact);
            mag += (m * s).abs();
        }
    }
    (sum, mag)
}
