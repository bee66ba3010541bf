//! Quantizers of the types of `iquants.rs` that mica writes: IQ4_NL and IQ4_XS (ggml's
//! `quantize_iq4_nl` / `quantize_iq4_xs`, with or without an importance matrix), TQ1_0,
//! TQ2_0 and MXFP4 (`quantize_row_*_ref`, which ggml's `ggml_quantize_chunk` also uses for
//! files). The float operations are llama.cpp's, in its order, so the bytes are its bytes
//! (`tests/quant_fixtures.rs` against gguf-py for TQ1_0/TQ2_0/MXFP4,
//! `tests/weighted_fixtures.rs` against llama.cpp's libggml for all five).
//!
//! The other i-quants (IQ1_S ... IQ3_S) need llama.cpp's grid searches with neighbour
//! tables; mica reads them but does not write them.

use super::blocks::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockTQ1_0, BlockTQ2_0, QK, QK_K, e8m0_to_f32_half,
    f32_to_f16,
};
use super::iq_grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use super::kquants::nearest_int;

/// Largest |x| of a slice (NaN-blind, like ggml's `MAX`).
fn absmax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |m, &v| if m < v.abs() { v.abs() } else { m })
}

/// ggml's `lroundf(x * id) + 1`: the ternary digit of a value (0, 1, 2 for -1, 0, 1).
#[inline(always)]
fn ternary(v: f32, id: f32) -> u8 {
    ((v * id).round() as i32 + 1) as u8
}

/// `quantize_row_tq1_0_ref`: five digits per byte of `qs` (base 3, ceiling-scaled to a
/// fixed-point fraction), four per byte of `qh`.
pub fn quantize_tq1_0(x: &[f32], y: &mut [BlockTQ1_0]) {
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let d = absmax(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        let pack = |digits: &mut dyn Iterator<Item = u8>| -> u8 {
            let q = digits.fold(0u8, |q, t| q.wrapping_mul(3).wrapping_add(t));
            (q as u16 * 256).div_ceil(243) as u8
        };
        for m in 0..32 {
            b.qs[m] = pack(&mut (0..5).map(|n| ternary(x[m + 32 * n], id)));
        }
        for m in 0..16 {
            b.qs[32 + m] = pack(&mut (0..5).map(|n| ternary(x[160 + m + 16 * n], id)));
        }
        for j in 0..4 {
            // Four digits, then one more `* 3`: the first digit becomes the most significant.
            let mut it = (0..4).map(|m| ternary(x[240 + j + 4 * m], id)).chain([0]);
            b.qh[j] = pack(&mut it);
        }
    }
}

/// `quantize_row_tq2_0_ref`: two bits per digit.
pub fn quantize_tq2_0(x: &[f32], y: &mut [BlockTQ2_0]) {
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let d = absmax(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        for j in 0..2 {
            for m in 0..32 {
                let mut q = 0u8;
                for n in 0..4 {
                    q = q.wrapping_add((ternary(x[128 * j + m + 32 * n], id) & 3) << (2 * n));
                }
                b.qs[32 * j + m] = q;
            }
        }
    }
}

/// `best_index_mxfp4`: the first table value nearest to `x` at scale `e`.
fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * e - x).abs();
    for (i, &v) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (v as f32 * e - x).abs();
        if err < best_err {
            best = i;
            best_err = err;
        }
    }
    best as u8
}

/// `quantize_row_mxfp4_ref`: the exponent from `floor(log2(amax)) - 2`, then the nearest
/// E2M1 value per element.
pub fn quantize_mxfp4(x: &[f32], y: &mut [BlockMXFP4]) {
    for (x, b) in x.chunks_exact(QK).zip(y) {
        let amax = absmax(x);
        let e = if amax > 0.0 {
            // C's float-to-uint8 conversion (through int for out-of-range exponents).
            (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        b.e = e;
        for j in 0..QK / 2 {
            b.qs[j] = best_index_mxfp4(x[j], d) | best_index_mxfp4(x[j + QK / 2], d) << 4;
        }
    }
}

/// ggml's `best_index_int8`: the index of the table value nearest to `x` (bisection; ties
/// to the upper one).
fn best_index_int8(values: &[i8; 16], x: f32) -> u8 {
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < values[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (values[mu - 1] as f32) < values[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// ggml's `GROUP_MAX_EPS`: groups whose largest |x| is below this quantize to zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `quantize_row_iq4_nl_impl` for one super-block of `x.len()` elements in groups of
/// 32 (one group: IQ4_NL; eight: IQ4_XS). Returns the f16 scale, the quants (element
/// order) and, for eight groups, the 6-bit group scales (offset by 32).
fn iq4_impl(x: &[f32], qw: Option<&[f32]>, ntry: i32, l: &mut [u8]) -> ([u8; 2], [u8; 8]) {
    let values = &KVALUES_IQ4NL;
    let n = x.len();
    let ngroups = n / 32;
    let mut sigma2 = 0.0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / n as f32;
    l.fill(0);
    let mut scales = [0.0f32; 8];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for ib in 0..ngroups {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l[32 * ib..32 * ib + 32];
        let weight: [f32; 32] = match qw {
            Some(qw) => std::array::from_fn(|j| qw[32 * ib + j] * (sigma2 + xb[j] * xb[j]).sqrt()),
            None => std::array::from_fn(|j| xb[j] * xb[j]),
        };
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let v0 = values[0] as f32;
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..32 {
            let li = best_index_int8(values, id * xb[j]);
            lb[j] = li;
            let q = values[li as usize] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry as f32 + v0) / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let q = values[best_index_int8(values, id * xb[j]) as usize] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let mut packed = [0u8; 8];
    let dh;
    if ngroups > 1 {
        let d = -max_scale / 32.0;
        dh = f32_to_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..ngroups {
            let li = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l[32 * ib + j] = best_index_int8(values, idl * x[32 * ib + j]);
            }
            packed[ib] = (li + 32) as u8;
        }
    } else {
        dh = f32_to_f16(scales[0]);
        if ntry > 0 {
            let id = if scales[0] != 0.0 {
                1.0 / scales[0]
            } else {
                0.0
            };
            for (lj, &v) in l.iter_mut().zip(x) {
                *lj = best_index_int8(values, id * v);
            }
        }
    }
    (dh, packed)
}

/// Quants `l` (element order, groups of 32) packed as nibbles: element j low, j + 16 high.
fn pack_nibbles(l: &[u8], qs: &mut [u8]) {
    for (lg, qg) in l.chunks_exact(32).zip(qs.chunks_exact_mut(16)) {
        for j in 0..16 {
            qg[j] = lg[j] | lg[16 + j] << 4;
        }
    }
}

/// ggml's `quantize_iq4_nl` (what `ggml_quantize_chunk` writes): seven scale tries per
/// block, weighted by the importance `imp` when given.
pub fn quantize_iq4nl(x: &[f32], imp: Option<&[f32]>, y: &mut [BlockIQ4NL]) {
    let mut l = [0u8; QK];
    for (ib, (xb, b)) in x.chunks_exact(QK).zip(y).enumerate() {
        let qw = imp.map(|w| &w[QK * ib..QK * ib + QK]);
        let (d, _) = iq4_impl(xb, qw, 7, &mut l);
        b.d = d;
        pack_nibbles(&l, &mut b.qs);
    }
}

/// ggml's `quantize_row_iq4_nl_ref`, the run-time conversion (`from_float`) llama.cpp's CPU
/// backend uses to store rows (a quantized KV cache): no scale search.
pub fn quantize_iq4nl_row(x: &[f32], y: &mut [BlockIQ4NL]) {
    let mut l = [0u8; QK];
    for (xb, b) in x.chunks_exact(QK).zip(y) {
        let (d, _) = iq4_impl(xb, None, -1, &mut l);
        b.d = d;
        pack_nibbles(&l, &mut b.qs);
    }
}

/// ggml's `quantize_iq4_xs`: IQ4_NL's search per group of 32, the eight group scales then
/// quantized to six bits against the largest.
pub fn quantize_iq4xs(x: &[f32], imp: Option<&[f32]>, y: &mut [BlockIQ4XS]) {
    let mut l = [0u8; QK_K];
    for (ib, (xb, b)) in x.chunks_exact(QK_K).zip(y).enumerate() {
        let qw = imp.map(|w| &w[QK_K * ib..QK_K * ib + QK_K]);
        let (d, ls) = iq4_impl(xb, qw, 7, &mut l);
        b.d = d;
        let mut h = 0u16;
        for (g, &s) in ls.iter().enumerate() {
            h |= ((s >> 4) as u16) << (2 * g);
        }
        b.scales_h = h.to_le_bytes();
        b.scales_l = std::array::from_fn(|k| ls[2 * k] & 0xF | (ls[2 * k + 1] & 0xF) << 4);
        pack_nibbles(&l, &mut b.qs);
    }
}
