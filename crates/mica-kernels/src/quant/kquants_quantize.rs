//! Round-to-nearest reference quantizers for the k-quant weight formats, following
//! llama.cpp's `quantize_row_q{2,3,4,5,6}_K_ref` (ggml-quants.c, the path taken when no
//! importance matrix is given) and their helpers `make_qx_quants`, `make_q3_quants` and
//! `make_qkx2_quants`. Float expressions keep ggml's evaluation order (and no fused
//! multiply-adds), so the output is what an unfused build of llama.cpp writes.
//!
//! These search for good sub-block scales by trying a handful of candidate scales and
//! keeping the one with the lowest weighted error; they are for conversion and tests, not
//! for hot paths.

use super::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, QK_K, f16_to_f32, f32_to_f16, scale_min_k4,
};
use super::kquants::nearest_int;

/// Below this magnitude a group counts as all zeros (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// The value of largest magnitude (first on ties) and that magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// `make_qx_quants` with `rmse_type = 1`: symmetric quants `L` in `0..2*nmax` (offset by
/// `nmax`), trying 18 scales around `-nmax / max` and keeping the best weighted
/// least-squares fit. Weights `w` (importance), or `x^2` without. Returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], w: Option<&[f32]>, l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // Weighted sums of x*l and l*l for one candidate inverse scale.
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (i, &v) in x.iter().enumerate() {
            let l = quant(iscale, v) as f32;
            let w = w.map_or(v * v, |w| w[i]);
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (o, &v) in l_out.iter_mut().zip(x) {
        *o = (quant(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&i| i != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l_out.iter_mut().zip(x) {
                *o = (quant(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` with `do_rmse`: start from `-nmax / max`, then up to five passes that
/// move single quants when that improves the weighted (`x^2`) fit. `L` in `0..2*nmax`.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut l = [0i32; 16];
    let l = &mut l[..x.len()];
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        *li = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * *li as f32;
        suml2 += w * *li as f32 * *li as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let mut slx = sumlx - w * v * *li as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *li as f32 * *li as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for (o, &li) in l_out.iter_mut().zip(l.iter()) {
        *o = (li + nmax) as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Search parameters of `make_qkx2_quants`: candidate inverse scales
/// `(rmin + rdelta * is + nmax) / (max - min)` for `is` in `0..=nstep`.
pub(crate) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Minimize weighted absolute error instead of squared error.
    pub use_mad: bool,
}

/// `make_qkx2_quants`: asymmetric quants `L` in `0..=nmax` with `x ≈ scale * L - the_min`
/// (the min clamped to be <= 0 before negation), fitted by weighted least squares over the
/// candidate scales. Returns `(scale, the_min)`.
pub(crate) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax;
    let err = |d: f32| if p.use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        best_error += weights[i] * err(scale * l as f32 + min - x[i]);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 64];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 256 two-bit values: element `128h + 32j + l` into bits `2j` of byte `32h + l`.
fn pack_2bit(l: &[u8; QK_K]) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for h in 0..2 {
        for i in 0..32 {
            let e = 128 * h + i;
            qs[32 * h + i] = l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6);
        }
    }
    qs
}

pub fn quantize_q2k(x: &[f32], y: &mut [BlockQ2K]) {
    const Q4SCALE: f32 = 15.0;
    let p = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weights: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
            (scales[j], mins[j]) = make_qkx2_quants(&p, xs, &weights, &mut l[16 * j..16 * j + 16]);
            max_scale = if scales[j] > max_scale {
                scales[j]
            } else {
                max_scale
            };
            max_min = if mins[j] > max_min { mins[j] } else { max_min };
        }
        b.scales = [0; 16];
        b.d = f32_to_f16(0.0);
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = f32_to_f16(max_scale / Q4SCALE);
        }
        b.dmin = f32_to_f16(0.0);
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                b.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            b.dmin = f32_to_f16(max_min / Q4SCALE);
        }
        store_q2k(x, &mut l, b);
    }
}

/// Re-quantizes a Q2_K super-block against its scales and mins as stored (`l` keeps the
/// fit's quants where a sub-block's scale is zero) and packs the quants.
pub(super) fn store_q2k(x: &[f32], l: &mut [u8; QK_K], b: &mut BlockQ2K) {
    for j in 0..16 {
        let d = f16_to_f32(b.d) * (b.scales[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = f16_to_f32(b.dmin) * (b.scales[j] >> 4) as f32;
        for i in 0..16 {
            l[16 * j + i] = nearest_int((x[16 * j + i] + dm) / d).clamp(0, 3) as u8;
        }
    }
    b.qs = pack_2bit(l);
}

pub fn quantize_q3k(x: &[f32], y: &mut [BlockQ3K]) {
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            // C: int8_t l = nearest_int(...); then clamp to -32..31 and offset by 32.
            let ls = scales.map(|s| ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8);
            b.scales = pack_q3k_scales(&ls);
            b.d = f32_to_f16(1.0 / iscale);
        } else {
            b.scales = [0; 12];
            b.d = f32_to_f16(0.0);
        }
        store_q3k(x, &mut l, b);
    }
}

/// Packs sixteen six-bit Q3_K sub-block scales (`0..64`, the stored `sc + 32`).
pub(super) fn pack_q3k_scales(ls: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &v) in ls.iter().enumerate() {
        if j < 8 {
            s[j] = v & 0xF;
        } else {
            s[j - 8] |= (v & 0xF) << 4;
        }
        s[j % 4 + 8] |= (v >> 4) << (2 * (j / 4));
    }
    s
}

/// Re-quantizes a Q3_K super-block against its scales as stored (`l`, offset by 4, keeps
/// the fit's quants where a sub-block's scale is zero) and packs the quants.
pub(super) fn store_q3k(x: &[f32], l: &mut [i8; QK_K], b: &mut BlockQ3K) {
    let sc = super::blocks::q3k_scales(&b.scales);
    for j in 0..16 {
        let d = f16_to_f32(b.d) * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    // High bit of element e goes to bit e / 32 of hmask[e % 32]; the rest is 2-bit.
    b.hmask = [0; 32];
    let mut low = [0u8; QK_K];
    for e in 0..QK_K {
        let mut v = l[e] as u8;
        if v > 3 {
            b.hmask[e % 32] |= 1 << (e / 32);
            v -= 4;
        }
        low[e] = v;
    }
    b.qs = pack_2bit(&low);
}

/// Shared by Q4_K and Q5_K: per-sub-block fits, six-bit scales and mins, re-quantization
/// against the stored scales. Returns the quants `L` (0..=nmax) in element order.
fn quantize_k4_common(
    x: &[f32],
    p: &Qkx2,
    d_out: &mut [u8; 2],
    dmin_out: &mut [u8; 2],
    scales_out: &mut [u8; 12],
) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0.0f32; 8], [0.0f32; 8]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2 = xs.iter().fold(0.0f32, |s, &v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        (scales[j], mins[j]) = make_qkx2_quants(p, xs, &weights, &mut l[32 * j..32 * j + 32]);
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let d = (max_scale / 63.0, max_min / 63.0);
    store_k4(
        x,
        p.nmax,
        d,
        (&ls, &lm),
        (d_out, dmin_out, scales_out),
        &mut l,
    );
    l
}

/// The end of a Q4_K / Q5_K super-block, shared by the plain and the importance-weighted
/// quantizers: stores the super-scales `(d, dmin)` as f16 and the six-bit sub-block scales
/// `ls` and mins `lm` in the 12-byte packing, then re-derives each quant of `x` (0..=nmax)
/// from the stored values into `l` (sub-blocks whose scale stores as 0 keep their fit).
pub(super) fn store_k4(
    x: &[f32],
    nmax: i32,
    (d, dmin): (f32, f32),
    (ls, lm): (&[u8; 8], &[u8; 8]),
    (d_out, dmin_out, scales_out): (&mut [u8; 2], &mut [u8; 2], &mut [u8; 12]),
    l: &mut [u8; QK_K],
) {
    *scales_out = [0; 12];
    for j in 0..8 {
        let (s, m) = (ls[j], lm[j]);
        if j < 4 {
            scales_out[j] = s;
            scales_out[j + 4] = m;
        } else {
            scales_out[j + 4] = (s & 0xF) | ((m & 0xF) << 4);
            scales_out[j - 4] |= (s >> 4) << 6;
            scales_out[j] |= (m >> 4) << 6;
        }
    }
    *d_out = f32_to_f16(d);
    *dmin_out = f32_to_f16(dmin);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales_out);
        let dd = f16_to_f32(*d_out) * sc as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = f16_to_f32(*dmin_out) * m as f32;
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / dd).clamp(0, nmax) as u8;
        }
    }
}

pub fn quantize_q4k(x: &[f32], y: &mut [BlockQ4K]) {
    let p = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let l = quantize_k4_common(x, &p, &mut b.d, &mut b.dmin, &mut b.scales);
        for k in 0..4 {
            for i in 0..32 {
                b.qs[32 * k + i] = l[64 * k + i] | (l[64 * k + 32 + i] << 4);
            }
        }
    }
}

pub fn quantize_q5k(x: &[f32], y: &mut [BlockQ5K]) {
    let p = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let l = quantize_k4_common(x, &p, &mut b.d, &mut b.dmin, &mut b.scales);
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

pub fn quantize_q6k(x: &[f32], y: &mut [BlockQ6K]) {
    quantize_q6k_with(x, None, y)
}

/// Q6_K, optionally weighted by importance `imp` (`[x.len()]`, one per column): each
/// sub-block's scale search then weighs element `i` by `imp[i]` alone, as llama.cpp's
/// `quantize_row_q6_K_impl` does.
pub(crate) fn quantize_q6k_with(x: &[f32], imp: Option<&[f32]>, y: &mut [BlockQ6K]) {
    for (bi, (x, b)) in x.chunks_exact(QK_K).zip(y).enumerate() {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        let imp = imp.map(|q| &q[bi * QK_K..(bi + 1) * QK_K]);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let w = imp.map(|q| &q[16 * j..16 * j + 16]);
            scales[j] = make_qx_quants(32, xs, w, &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > max_abs_scale {
                max_abs_scale = scales[j].abs();
                max_scale = scales[j];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *b = BlockQ6K {
                ql: [0; 128],
                qh: [0; 64],
                scales: [0; 16],
                d: f32_to_f16(0.0),
            };
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f32_to_f16(1.0 / iscale);
        for j in 0..16 {
            b.scales[j] = nearest_int(iscale * scales[j]).min(127) as i8;
        }
        for j in 0..16 {
            let d = f16_to_f32(b.d) * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 0..16 {
                l[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        let l = l.map(|v| v as u8);
        for h in 0..2 {
            let (ql, qh) = (
                &mut b.ql[64 * h..64 * h + 64],
                &mut b.qh[32 * h..32 * h + 32],
            );
            let l = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                ql[i] = (l[i] & 0xF) | ((l[i + 64] & 0xF) << 4);
                ql[i + 32] = (l[i + 32] & 0xF) | ((l[i + 96] & 0xF) << 4);
                qh[i] = (l[i] >> 4)
                    | ((l[i + 32] >> 4) << 2)
                    | ((l[i + 64] >> 4) << 4)
                    | ((l[i + 96] >> 4) << 6);
            }
        }
    }
}
