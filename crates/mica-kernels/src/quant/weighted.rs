//! Quantizers weighted by an importance matrix: per input column, the mean squared
//! activation that column meets (llama.cpp's `imatrix`). Rounding error in a column that
//! sees large activations costs more output error, so the scale (and min) searches
//! minimize `Σ_i w_i (x_i − x̂_i)²` with `w_i = imp_i · sqrt(σ² + x_i²)` (σ² the mean square of
//! the weights in the block), the weighting llama.cpp's `quantize_*_impl` functions use with
//! `quant_weights`. The method follows llama.cpp's; the code is mica's:
//!
//! - symmetric formats (Q4_0, Q5_0, Q6_K sub-blocks): the 18-candidate least-squares scale
//!   search of `make_qx_quants`, with the importance weights (Q6_K: the importance alone,
//!   as llama.cpp's `quantize_row_q6_K_impl`; the legacy formats take σ² over the row);
//! - scale + min formats (Q4_1, Q5_1, Q4_K, Q5_K sub-blocks): the candidate-scale weighted
//!   least-squares fit of `make_qkx2_quants`, searched more finely (37 candidates from
//!   `nmax − 0.9`);
//! - Q4_K/Q5_K's eight sub-block scales and mins are themselves quantized to six bits by a
//!   weighted search ([`quantize_scales`]: each sub-block weighs by its total importance),
//!   instead of plain rounding against the largest.
//!
//! - Q2_K: sixteen 16-element sub-blocks fitted as the scale + min formats (two-bit quants,
//!   σ² the block's mean square), their scales and mins quantized to four bits by the same
//!   weighted search;
//! - Q3_K: sixteen symmetric 16-element fits, then the sixteen signed sub-block scales
//!   themselves fitted to six bits by the symmetric search, each weighted by its
//!   sub-block's total weight.
//!
//! - IQ4_NL, IQ4_XS: llama.cpp's own `quantize_iq4_*` with the importance
//!   (`iquants_quantize.rs`); IQ2_XS: its `quantize_iq2_xs`, which has no unweighted form
//!   (`iq2_quantize.rs`; [`requires_importance`]).
//!
//! Q8_0 and the float types have no weighted variant (nor in llama.cpp) and use the
//! reference quantizers.

use super::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, QK, QK_K,
    blocks_mut, f32_to_f16,
};
use super::kquants::nearest_int;
use super::kquants_quantize::{
    Qkx2, make_qkx2_quants, make_qx_quants, pack_q3k_scales, quantize_q6k_with, store_k4,
    store_q2k, store_q3k,
};
use super::{iq2_quantize, iquants_quantize};
use crate::DType;

/// Quantizes one row of `t` with importance `imp` (`[src.len()]`); types without a weighted
/// variant use [`super::quantize_row`]. Panics when the lengths do not match.
pub fn quantize_row_weighted(t: DType, src: &[f32], imp: &[f32], dst: &mut [u8]) {
    assert_eq!(imp.len(), src.len(), "one importance per column");
    assert_eq!(t.row_bytes(src.len()), Some(dst.len()), "{t}: row size");
    match t {
        DType::Q4_0 => q4_0(src, imp, blocks_mut(dst)),
        DType::Q5_0 => q5_0(src, imp, blocks_mut(dst)),
        DType::Q4_1 => q4_1(src, imp, blocks_mut(dst)),
        DType::Q5_1 => q5_1(src, imp, blocks_mut(dst)),
        DType::Q2_K => q2k(src, imp, blocks_mut(dst)),
        DType::Q3_K => q3k(src, imp, blocks_mut(dst)),
        DType::Q4_K => q4k(src, imp, blocks_mut(dst)),
        DType::Q5_K => q5k(src, imp, blocks_mut(dst)),
        DType::Q6_K => quantize_q6k_with(src, Some(imp), blocks_mut(dst)),
        DType::IQ4_NL => iquants_quantize::quantize_iq4nl(src, Some(imp), blocks_mut(dst)),
        DType::IQ4_XS => iquants_quantize::quantize_iq4xs(src, Some(imp), blocks_mut(dst)),
        DType::IQ2_XS => iq2_quantize::quantize_iq2xs(src, imp, blocks_mut(dst)),
        _ => super::quantize_row(t, src, dst),
    }
}

/// Whether [`quantize_row_weighted`] uses the importance for `t`.
pub fn has_weighted(t: DType) -> bool {
    matches!(
        t,
        DType::Q4_0
            | DType::Q5_0
            | DType::Q4_1
            | DType::Q5_1
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::IQ4_NL
            | DType::IQ4_XS
            | DType::IQ2_XS
    )
}

/// Whether `t` can only be written with an importance matrix (llama.cpp's quantizer for it
/// asserts one): [`super::quantize_row`] cannot write it, [`quantize_row_weighted`] can.
pub fn requires_importance(t: DType) -> bool {
    t == DType::IQ2_XS
}

/// `w_i = imp_i · sqrt(σ² + x_i²)`, σ² = `sigma2`.
fn element_weights<const N: usize>(x: &[f32], imp: &[f32], sigma2: f32) -> [f32; N] {
    std::array::from_fn(|i| imp[i] * (sigma2 + x[i] * x[i]).sqrt())
}

fn mean_square(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |s, &v| s + v * v) / x.len() as f32
}

/// Scale + min search of the legacy and k-quant asymmetric formats.
fn fine_search(nmax: i32) -> Qkx2 {
    Qkx2 {
        nmax,
        rmin: -0.9,
        rdelta: 0.05,
        nstep: 36,
        use_mad: false,
    }
}

/// Packs 32 quants of at most 4 bits into nibbles (element j low, j + 16 high).
fn nibbles(q: &[u8; QK]) -> [u8; QK / 2] {
    std::array::from_fn(|j| (q[j] & 0xF) | ((q[j + QK / 2] & 0xF) << 4))
}

/// Bit 4 of every quant as the little-endian `qh` word.
fn high_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= (((v >> 4) & 1) as u32) << j;
    }
    qh.to_le_bytes()
}

/// Symmetric block: `x ≈ d · (L − nmax)`, L in `0..2·nmax`; `sigma2`: the row's mean square.
fn symmetric_block(x: &[f32], imp: &[f32], nmax: i32, sigma2: f32) -> (f32, [u8; QK]) {
    let w: [f32; QK] = element_weights(x, imp, sigma2);
    let mut l = [0i8; QK];
    let d = make_qx_quants(nmax, x, Some(&w), &mut l);
    (d, l.map(|v| v as u8))
}

/// Scale + min block: `x ≈ d · L + m`, L in `0..=nmax`, m ≤ 0; `sigma2`: the row's mean
/// square.
fn affine_block(x: &[f32], imp: &[f32], nmax: i32, sigma2: f32) -> (f32, f32, [u8; QK]) {
    let w: [f32; QK] = element_weights(x, imp, sigma2);
    let mut l = [0u8; QK];
    let (d, neg_min) = make_qkx2_quants(&fine_search(nmax), x, &w, &mut l);
    (d, -neg_min, l)
}

fn q4_0(x: &[f32], imp: &[f32], y: &mut [BlockQ4_0]) {
    // The legacy formats weigh by the whole row's mean square.
    let sigma2 = mean_square(x);
    for ((x, imp), b) in x.chunks_exact(QK).zip(imp.chunks_exact(QK)).zip(y) {
        let (d, l) = symmetric_block(x, imp, 8, sigma2);
        b.d = f32_to_f16(d);
        b.qs = nibbles(&l);
    }
}

fn q5_0(x: &[f32], imp: &[f32], y: &mut [BlockQ5_0]) {
    // The legacy formats weigh by the whole row's mean square.
    let sigma2 = mean_square(x);
    for ((x, imp), b) in x.chunks_exact(QK).zip(imp.chunks_exact(QK)).zip(y) {
        let (d, l) = symmetric_block(x, imp, 16, sigma2);
        b.d = f32_to_f16(d);
        b.qs = nibbles(&l);
        b.qh = high_bits(&l);
    }
}

fn q4_1(x: &[f32], imp: &[f32], y: &mut [BlockQ4_1]) {
    // The legacy formats weigh by the whole row's mean square.
    let sigma2 = mean_square(x);
    for ((x, imp), b) in x.chunks_exact(QK).zip(imp.chunks_exact(QK)).zip(y) {
        let (d, m, l) = affine_block(x, imp, 15, sigma2);
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(m);
        b.qs = nibbles(&l);
    }
}

fn q5_1(x: &[f32], imp: &[f32], y: &mut [BlockQ5_1]) {
    // The legacy formats weigh by the whole row's mean square.
    let sigma2 = mean_square(x);
    for ((x, imp), b) in x.chunks_exact(QK).zip(imp.chunks_exact(QK)).zip(y) {
        let (d, m, l) = affine_block(x, imp, 31, sigma2);
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(m);
        b.qs = nibbles(&l);
        b.qh = high_bits(&l);
    }
}

/// Quantizes `N` non-negative values (sub-block scales or mins) to `0..=nmax` with one
/// shared scale, minimizing `Σ w_j (v_j − s·L_j)²`: nine candidate scales around
/// `max / nmax`, then single-value moves while they lower the error, then the least-squares
/// scale for the chosen `L`. Returns `(s, L)`.
pub(crate) fn quantize_scales<const N: usize>(
    v: &[f32; N],
    w: &[f32; N],
    nmax: i32,
) -> (f32, [u8; N]) {
    let max = v.iter().copied().fold(0.0f32, f32::max);
    if max < 1e-15 {
        return (0.0, [0; N]);
    }
    let err = |iscale: f32| -> f32 {
        let s = 1.0 / iscale;
        (0..N)
            .map(|j| {
                let l = nearest_int(iscale * v[j]).min(nmax) as f32;
                w[j] * (v[j] - s * l) * (v[j] - s * l)
            })
            .sum()
    };
    let mut best = nmax as f32 / max;
    let mut best_err = err(best);
    for is in (-4..=4).filter(|&i| i != 0) {
        let iscale = (nmax as f32 + 0.1 * is as f32) / max;
        let e = err(iscale);
        if e < best_err {
            best_err = e;
            best = iscale;
        }
    }
    let mut l: [i32; N] = std::array::from_fn(|j| nearest_int(best * v[j]).min(nmax));
    let (mut slx, mut sl2) = (0.0f32, 0.0f32);
    for j in 0..N {
        let lj = l[j] as f32;
        slx += w[j] * v[j] * lj;
        sl2 += w[j] * lj * lj;
    }
    // Coordinate moves: maximizing slx²/sl2 minimizes the error at the optimal scale.
    for _ in 0..5 {
        let mut changed = false;
        for j in 0..N {
            let lj = l[j] as f32;
            let a = slx - w[j] * v[j] * lj;
            let b = sl2 - w[j] * lj * lj;
            if a <= 0.0 || b <= 0.0 {
                continue;
            }
            let nl = nearest_int(v[j] * b / a).clamp(0, nmax);
            if nl == l[j] {
                continue;
            }
            let (na, nb) = (a + w[j] * v[j] * nl as f32, b + w[j] * (nl * nl) as f32);
            if na * na * sl2 > slx * slx * nb {
                l[j] = nl;
                slx = na;
                sl2 = nb;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let s = if sl2 > 0.0 { slx / sl2 } else { 0.0 };
    (s, l.map(|x| x as u8))
}

/// Q4_K / Q5_K super-block: weighted sub-block fits, weighted six-bit scales and mins,
/// quants re-derived from the stored scales. Returns `L` (0..=nmax) in element order.
fn k4_block(
    x: &[f32],
    imp: &[f32],
    nmax: i32,
    d_out: &mut [u8; 2],
    dmin_out: &mut [u8; 2],
    scales_out: &mut [u8; 12],
) -> [u8; QK_K] {
    // llama.cpp's k-quant weighting uses twice the mean square here.
    let sigma2 = 2.0 * mean_square(x);
    let p = fine_search(nmax);
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let w: [f32; 32] = element_weights(xs, &imp[32 * j..32 * j + 32], sigma2);
        sw[j] = w.iter().sum();
        (scales[j], mins[j]) = make_qkx2_quants(&p, xs, &w, &mut l[32 * j..32 * j + 32]);
    }
    let (d, ls) = quantize_scales(&scales, &sw, 63);
    let (dmin, lm) = quantize_scales(&mins, &sw, 63);
    store_k4(
        x,
        nmax,
        (d, dmin),
        (&ls, &lm),
        (d_out, dmin_out, scales_out),
        &mut l,
    );
    l
}

fn q4k(x: &[f32], imp: &[f32], y: &mut [BlockQ4K]) {
    for ((x, imp), b) in x.chunks_exact(QK_K).zip(imp.chunks_exact(QK_K)).zip(y) {
        let l = k4_block(x, imp, 15, &mut b.d, &mut b.dmin, &mut b.scales);
        for k in 0..4 {
            for i in 0..32 {
                b.qs[32 * k + i] = l[64 * k + i] | (l[64 * k + 32 + i] << 4);
            }
        }
    }
}

fn q5k(x: &[f32], imp: &[f32], y: &mut [BlockQ5K]) {
    for ((x, imp), b) in x.chunks_exact(QK_K).zip(imp.chunks_exact(QK_K)).zip(y) {
        let l = k4_block(x, imp, 31, &mut b.d, &mut b.dmin, &mut b.scales);
        b.qh = [0; 32];
        for k in 0..4 {
            for i in 0..32 {
                let (l1, l2) = (l[64 * k + i], l[64 * k + 32 + i]);
                b.qh[i] |= ((l1 >> 4) << (2 * k)) | ((l2 >> 4) << (2 * k + 1));
                b.qs[32 * k + i] = (l1 & 0xF) | ((l2 & 0xF) << 4);
            }
        }
    }
}

/// Q2_K: weighted two-bit fits of the sixteen sub-blocks (scale + min), their scales and
/// mins quantized to four bits by [`quantize_scales`], quants re-derived from the stored
/// values.
fn q2k(x: &[f32], imp: &[f32], y: &mut [BlockQ2K]) {
    for ((x, imp), b) in x.chunks_exact(QK_K).zip(imp.chunks_exact(QK_K)).zip(y) {
        // Q2_K weighs by the block's mean square (not twice it, as the other k-quants).
        let sigma2 = mean_square(x);
        let p = fine_search(3);
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins, mut sw) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
        for j in 0..16 {
            let r = 16 * j..16 * j + 16;
            let w: [f32; 16] = element_weights(&x[r.clone()], &imp[r.clone()], sigma2);
            sw[j] = w.iter().sum();
            (scales[j], mins[j]) = make_qkx2_quants(&p, &x[r.clone()], &w, &mut l[r]);
        }
        let (d, ls) = quantize_scales(&scales, &sw, 15);
        let (dmin, lm) = quantize_scales(&mins, &sw, 15);
        b.d = f32_to_f16(d);
        b.dmin = f32_to_f16(dmin);
        b.scales = std::array::from_fn(|j| ls[j] | (lm[j] << 4));
        store_q2k(x, &mut l, b);
    }
}

/// Q3_K: weighted symmetric three-bit fits of the sixteen sub-blocks, then their signed
/// scales fitted to six bits by the same symmetric search weighted by each sub-block's
/// total weight; quants re-derived from the stored scales.
fn q3k(x: &[f32], imp: &[f32], y: &mut [BlockQ3K]) {
    for ((x, imp), b) in x.chunks_exact(QK_K).zip(imp.chunks_exact(QK_K)).zip(y) {
        let sigma2 = 2.0 * mean_square(x);
        let mut l = [0i8; QK_K];
        let (mut scales, mut sw) = ([0.0f32; 16], [0.0f32; 16]);
        for j in 0..16 {
            let r = 16 * j..16 * j + 16;
            let w: [f32; 16] = element_weights(&x[r.clone()], &imp[r.clone()], sigma2);
            sw[j] = w.iter().sum();
            scales[j] = make_qx_quants(4, &x[r.clone()], Some(&w), &mut l[r]);
        }
        let mut ls = [0i8; 16];
        let d = make_qx_quants(32, &scales, Some(&sw), &mut ls);
        b.scales = pack_q3k_scales(&ls.map(|v| v as u8));
        b.d = f32_to_f16(d);
        store_q3k(x, &mut l, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_row, quantize_row};

    /// Deterministic pseudo-random values in (-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn weighted_err(t: DType, x: &[f32], imp: &[f32], q: &[u8]) -> f64 {
        let mut y = vec![0f32; x.len()];
        dequantize_row(t, q, &mut y);
        x.iter()
            .zip(&y)
            .zip(imp)
            .map(|((a, b), w)| (*w as f64) * ((a - b) as f64).powi(2))
            .sum()
    }

    /// With skewed importance (a few columns 100× more important, as real activations are),
    /// the weighted quantizer must have a lower importance-weighted error than the
    /// reference one, for every weighted type, and stay close on the unweighted error.
    #[test]
    fn weighted_beats_reference_on_skewed_importance() {
        let n = 4096;
        let x: Vec<f32> = noise(n, 7)
            .iter()
            .zip(noise(n, 8))
            .map(|(a, b)| a * 0.05 + if b > 0.98 { 0.2 * b } else { 0.0 })
            .collect();
        let imp: Vec<f32> = noise(n, 9)
            .iter()
            .map(|&r| if r > 0.9 { 100.0 } else { 0.5 + r.abs() })
            .collect();
        let ones = vec![1.0f32; n];
        for t in [
            DType::Q4_0,
            DType::Q5_0,
            DType::Q4_1,
            DType::Q5_1,
            DType::Q2_K,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
        ] {
            let bytes = t.row_bytes(n).unwrap();
            let (mut a, mut b) = (vec![0u8; bytes], vec![0u8; bytes]);
            quantize_row(t, &x, &mut a);
            quantize_row_weighted(t, &x, &imp, &mut b);
            let (ea, eb) = (weighted_err(t, &x, &imp, &a), weighted_err(t, &x, &imp, &b));
            let (ua, ub) = (
                weighted_err(t, &x, &ones, &a),
                weighted_err(t, &x, &ones, &b),
            );
            println!("{t}: weighted error ref {ea:.4e} → {eb:.4e}; plain {ua:.4e} → {ub:.4e}");
            assert!(
                eb < 0.9 * ea,
                "{t}: weighted {eb:.4e} vs reference {ea:.4e}"
            );
            assert!(
                ub < 1.5 * ua,
                "{t}: unweighted error grew {ua:.4e} → {ub:.4e}"
            );
        }
    }

    /// Uniform importance: still a valid, accurate quantization (not worse than 10% over
    /// the reference on plain squared error).
    #[test]
    fn uniform_importance_is_accurate() {
        let n = 2048;
        let x = noise(n, 3);
        let ones = vec![1.0f32; n];
        for t in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
        ] {
            let bytes = t.row_bytes(n).unwrap();
            let (mut a, mut b) = (vec![0u8; bytes], vec![0u8; bytes]);
            quantize_row(t, &x, &mut a);
            quantize_row_weighted(t, &x, &ones, &mut b);
            let (ea, eb) = (
                weighted_err(t, &x, &ones, &a),
                weighted_err(t, &x, &ones, &b),
            );
            assert!(eb < 1.1 * ea, "{t}: {eb:.4e} vs reference {ea:.4e}");
        }
    }

    #[test]
    fn scale_quantizer_fits_exact_grids() {
        let v = [0.5f32, 1.0, 1.5, 2.0, 0.0, 3.15, 0.25, 0.75];
        let w = [1.0f32; 8];
        let (s, l) = quantize_scales(&v, &w, 63);
        for j in 0..8 {
            assert!(
                (s * l[j] as f32 - v[j]).abs() < 0.03,
                "{j}: {} vs {}",
                s * l[j] as f32,
                v[j]
            );
        }
        assert_eq!(quantize_scales(&[0.0; 8], &w, 63), (0.0, [0; 8]));
    }
}
