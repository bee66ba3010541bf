//! Element-wise and row-wise ops of the transformer: RMS norm, rotary embeddings, SwiGLU,
//! and the f16 vector primitives attention is built from; and the log-softmax that turns
//! logits into log-probabilities (`log_softmax.rs`, re-exported here).
//!
//! Each op follows ggml's CPU implementation closely enough to reproduce its rounding: RMS
//! norm sums squares in f64, RoPE builds its angles by repeated multiplication in f32, and
//! the f16 helpers round to f16 after every step exactly where ggml does. This is what keeps
//! mica's greedy output on llama.cpp's tokens.

use half::f16;

/// `out[i] = x[i] * (1 / sqrt(mean(x²) + eps)) * w[i]`, mean accumulated in f64 as ggml does.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// LayerNorm: `out[i] = (x[i] - mean) / sqrt(var + eps) * w[i] + b[i]`, the mean and the
/// variance accumulated in f64 as ggml's `norm` does (GPT-2, GPT-NeoX).
pub fn layer_norm(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| v as f64).sum::<f64>() / n) as f32;
    let var: f64 = x
        .iter()
        .map(|&v| ((v - mean) * (v - mean)) as f64)
        .sum::<f64>()
        / n;
    let scale = 1.0 / (var as f32 + eps).sqrt();
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        let y = (v - mean) * scale * w[i];
        *o = b.map_or(y, |b| y + b[i]);
    }
}

/// How the rotated pairs are laid out inside a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (LLaMA as converted to GGUF).
    Normal,
    /// Halves `(x[i], x[i + n/2])` (GPT-NeoX, Qwen2, Gemma, Phi-3).
    Neox,
}

/// The rotation angles of one position: `cos_sin[2i] = cos θ_i`, `cos_sin[2i+1] = sin θ_i`
/// for the `n_dims / 2` rotated pairs. θ_i = pos · base^(-2i/n_dims) / freq_factor_i ·
/// freq_scale, built by repeated multiplication as ggml's rope cache does.
pub fn rope_angles(
    pos: f32,
    n_dims: usize,
    freq_base: f32,
    freq_scale: f32,
    freq_factors: Option<&[f32]>,
    cos_sin: &mut [f32],
) {
    debug_assert!(cos_sin.len() >= n_dims);
    let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
    let mut theta = pos;
    for i in 0..n_dims / 2 {
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let t = freq_scale * (theta / ff);
        cos_sin[2 * i] = t.cos();
        cos_sin[2 * i + 1] = t.sin();
        theta *= theta_scale;
    }
}

/// Rotates the first `n_dims` dimensions of one head in place with angles from
/// [`rope_angles`]; dimensions past `n_dims` (partial rotary) are left alone.
pub fn rope_apply(head: &mut [f32], n_dims: usize, style: RopeStyle, cos_sin: &[f32]) {
    // The same arithmetic with hardware FMA where the CPU has it (else `mul_add` is a libm
    // call per element).
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("fma") {
        // SAFETY: the feature was just detected.
        return unsafe { rope_apply_fma(head, n_dims, style, cos_sin) };
    }
    rope_apply_body(head, n_dims, style, cos_sin)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn rope_apply_fma(head: &mut [f32], n_dims: usize, style: RopeStyle, cos_sin: &[f32]) {
    rope_apply_body(head, n_dims, style, cos_sin)
}

#[inline(always)]
fn rope_apply_body(head: &mut [f32], n_dims: usize, style: RopeStyle, cos_sin: &[f32]) {
    let half = n_dims / 2;
    for i in 0..half {
        let (c, s) = (cos_sin[2 * i], cos_sin[2 * i + 1]);
        let (a, b) = match style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        // ggml's `rotate_pairs` as GCC contracts it: the first product of each line is fused.
        head[a] = x0.mul_add(c, -(x1 * s));
        head[b] = x0.mul_add(s, x1 * c);
    }
}

/// SiLU and SwiGLU with llama.cpp's arithmetic: `ggml_vec_swiglu_f32` as built for AVX-512
/// (`ggml_v_silu` over 16 lanes with its `ggml_v_expf`, an Arm optimized-routines `expf`:
/// range reduction by `x·log2(e)` rounded through the 1.5·2^23 trick, a degree-5 polynomial in
/// FMAs, `scalef` by 2^n), and the libm formula `x / (1 + expf(-x))` for the last `len % 16`
/// elements. A scalar version, an AVX2+FMA one and an AVX-512 one, picked at run time, agree
/// bit for bit; they differ from the correctly rounded SiLU by a few ulp at most.
pub mod silu {
    use std::sync::OnceLock;

    /// Elements per ggml vector (one `__m512`).
    const LANES: usize = 16;

    /// An in-place SwiGLU implementation: `(gate, up)`.
    pub type SwigluFn = fn(&mut [f32], &[f32]);

    // The constants of `ggml_v_expf` (hex floats in ggml's source).
    /// 0x1.8p23: adding it rounds `x·log2(e)` to an integer.
    const SHIFT: f32 = 12582912.0;
    /// 0x1.715476p+0 = log2(e).
    const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
    /// 0x1.62e4p-1 and 0x1.7f7d1cp-20: ln 2 in a high and a low part.
    const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    /// Polynomial coefficients c1..c5 (0x1.ffffecp-1, 0x1.fffdb6p-2, 0x1.555e66p-3,
    /// 0x1.573e2ep-5, 0x1.0e4020p-7).
    const C1: f32 = f32::from_bits(0x3f7f_fff6);
    const C2: f32 = f32::from_bits(0x3eff_fedb);
    const C3: f32 = f32::from_bits(0x3e2a_af33);
    const C4: f32 = f32::from_bits(0x3d2b_9f17);
    const C5: f32 = f32::from_bits(0x3c07_2010);

    /// `2^n · j` as `vscalefps` computes it for an integer-valued `n` (one rounding; the
    /// product is exact in f64).
    #[inline(always)]
    pub(super) fn scalef(j: f32, n: f32) -> f32 {
        // 2^n built from its exponent bits (callers keep |n| ≤ 192, well inside f64's range).
        let pow2 = f64::from_bits(((n as i64 + 1023) as u64) << 52);
        (j as f64 * pow2) as f32
    }

    /// One lane of AVX-512 `ggml_v_expf`: `(n, j)` with `e^x ≈ 2^n · j`, before scaling.
    #[inline(always)]
    pub(super) fn expf_parts(x: f32) -> (f32, f32) {
        let z = x.mul_add(LOG2E, SHIFT);
        let n = z - SHIFT;
        // b = x - n·ln2 (two fnmadd), then j = 1 + c1·b + ... + c5·b^5 in ggml's FMA tree.
        let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
        let u = b * b;
        let j = C5
            .mul_add(b, C4)
            .mul_add(u, C3.mul_add(b, C2))
            .mul_add(u, C1.mul_add(b, 1.0));
        (n, j)
    }

    /// One lane of AVX-512 `ggml_v_expf`.
    #[inline(always)]
    pub fn expf_lane(x: f32) -> f32 {
        let (n, j) = expf_parts(x);
        if n.abs() > 192.0 {
            // Far out of range: ggml flushes to 0 or infinity.
            if n <= 0.0 { 0.0 } else { f32::INFINITY }
        } else if n.is_nan() {
            f32::NAN
        } else {
            scalef(j, n)
        }
    }

    /// One lane of AVX-512 `ggml_v_silu`: `x / (1 + expf_lane(0 - x))`.
    #[inline(always)]
    pub fn silu_lane(x: f32) -> f32 {
        x / (1.0 + expf_lane(0.0 - x))
    }

    /// ggml's scalar `ggml_silu_f32` (libm `expf`), used for the tail of a row.
    #[inline(always)]
    pub fn silu_libm(x: f32) -> f32 {
        x / (1.0 + (-x).exp())
    }

    /// Scalar SwiGLU: `gate[i] = silu(gate[i]) * up[i]`, 16-lane arithmetic for whole groups
    /// of 16 and the libm formula for the rest (as `ggml_vec_swiglu_f32`).
    pub fn swiglu_ref(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let body = n / LANES * LANES;
        for (g, &u) in gate[..body].iter_mut().zip(&up[..body]) {
            *g = silu_lane(*g) * u;
        }
        for (g, &u) in gate[body..n].iter_mut().zip(&up[body..n]) {
            *g = silu_libm(*g) * u;
        }
    }

    /// SwiGLU in place with the fastest bit-identical implementation this CPU has.
    pub fn swiglu(gate: &mut [f32], up: &[f32]) {
        static F: OnceLock<SwigluFn> = OnceLock::new();
        let f = F.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the feature was just detected.
                    return |g, u| unsafe { x86::swiglu_avx512(g, u) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the features were just detected.
                    return |g, u| unsafe { x86::swiglu_avx2(g, u) };
                }
            }
            swiglu_ref
        });
        f(gate, up)
    }

    /// The implementations by name, for tests: `(name, function, supported here)`.
    #[doc(hidden)]
    pub fn all() -> Vec<(&'static str, SwigluFn, bool)> {
        #[allow(unused_mut)]
        let mut v: Vec<(&'static str, SwigluFn, bool)> = vec![("scalar", swiglu_ref, true)];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 =
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
            let avx512 = std::is_x86_feature_detected!("avx512f");
            // SAFETY: only called by tests when the flag says the CPU supports it.
            v.push(("avx2", |g, u| unsafe { x86::swiglu_avx2(g, u) }, avx2));
            v.push(("avx512", |g, u| unsafe { x86::swiglu_avx512(g, u) }, avx512));
        }
        v
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) mod x86 {
        use super::{
            C1, C2, C3, C4, C5, LANES, LN2_HI, LN2_LO, LOG2E, SHIFT, silu_lane, silu_libm,
        };
        use std::arch::x86_64::*;

        /// The polynomial part of `ggml_v_expf` on eight lanes: `(n, j)`.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        fn expf_parts8(x: __m256) -> (__m256, __m256) {
            let c = _mm256_set1_ps;
            let z = _mm256_fmadd_ps(x, c(LOG2E), c(SHIFT));
            let n = _mm256_sub_ps(z, c(SHIFT));
            let b = _mm256_fnmadd_ps(n, c(LN2_LO), _mm256_fnmadd_ps(n, c(LN2_HI), x));
            let u = _mm256_mul_ps(b, b);
            let hi = _mm256_fmadd_ps(c(C5), b, c(C4));
            let mid = _mm256_fmadd_ps(c(C3), b, c(C2));
            let lo = _mm256_fmadd_ps(c(C1), b, c(1.0));
            let j = _mm256_fmadd_ps(_mm256_fmadd_ps(hi, u, mid), u, lo);
            (n, j)
        }

        /// AVX2 emulation of the AVX-512 code: while every |n| <= 125, `scalef(j, n)` is the
        /// exact product `j · 2^n` (j lies in [0.7, 1.5], so the result stays normal); other
        /// groups of eight take the scalar lane path.
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
            let n = gate.len().min(up.len());
            let body = n / LANES * LANES;
            let limit = _mm256_set1_ps(125.0);
            let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
            let mut i = 0;
            while i < body {
                // SAFETY: i + 8 <= body <= both lengths.
                let (x, g) = unsafe {
                    (
                        _mm256_loadu_ps(gate.as_ptr().add(i)),
                        _mm256_loadu_ps(up.as_ptr().add(i)),
                    )
                };
                let neg = _mm256_sub_ps(_mm256_setzero_ps(), x);
                let (nn, j) = expf_parts8(neg);
                let big = _mm256_cmp_ps(_mm256_and_ps(nn, abs), limit, _CMP_NLE_UQ);
                if _mm256_movemask_ps(big) != 0 {
                    for k in i..i + 8 {
                        gate[k] = silu_lane(gate[k]) * up[k];
                    }
                } else {
                    // 2^n from its exponent bits (n is an integer in [-125, 125]).
                    let pow = _mm256_castsi256_ps(_mm256_slli_epi32(
                        _mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)),
                        23,
                    ));
                    let e = _mm256_mul_ps(j, pow);
                    let s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
                    // SAFETY: as for the loads.
                    unsafe { _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(s, g)) };
                }
                i += 8;
            }
            for k in body..n {
                gate[k] = silu_libm(gate[k]) * up[k];
            }
        }

        /// AVX-512 `ggml_v_expf` on sixteen lanes: [`super::expf_lane`] of each, bit for bit
        /// (`vscalefps`, flush to 0 or infinity where |n| > 192).
        #[inline]
        #[target_feature(enable = "avx512f")]
        pub(crate) fn expf16(x: __m512) -> __m512 {
            let c = _mm512_set1_ps;
            let z = _mm512_fmadd_ps(x, c(LOG2E), c(SHIFT));
            let nn = _mm512_sub_ps(z, c(SHIFT));
            let b = _mm512_fnmadd_ps(nn, c(LN2_LO), _mm512_fnmadd_ps(nn, c(LN2_HI), x));
            let u = _mm512_mul_ps(b, b);
            let hi = _mm512_fmadd_ps(c(C5), b, c(C4));
            let mid = _mm512_fmadd_ps(c(C3), b, c(C2));
            let lo = _mm512_fmadd_ps(c(C1), b, c(1.0));
            let j = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, u, mid), u, lo);
            let e = _mm512_scalef_ps(j, nn);
            let far = _mm512_cmp_ps_mask(_mm512_abs_ps(nn), c(192.0), _CMP_GT_OQ);
            if far == 0 {
                return e;
            }
            let nonpos = _mm512_cmp_ps_mask(nn, _mm512_setzero_ps(), _CMP_LE_OQ);
            let alt = _mm512_mask_blend_ps(nonpos, c(f32::INFINITY), _mm512_setzero_ps());
            _mm512_mask_blend_ps(far, e, alt)
        }

        /// `ggml_vec_swiglu_f32` as built with AVX-512F: 16 lanes, `vscalefps`, flush to 0
        /// or infinity where |n| > 192.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn swiglu_avx512(gate: &mut [f32], up: &[f32]) {
            let n = gate.len().min(up.len());
            let body = n / LANES * LANES;
            let c = _mm512_set1_ps;
            let one = c(1.0);
            let mut i = 0;
            while i < body {
                // SAFETY: i + 16 <= body <= both lengths.
                let (x, g) = unsafe {
                    (
                        _mm512_loadu_ps(gate.as_ptr().add(i)),
                        _mm512_loadu_ps(up.as_ptr().add(i)),
                    )
                };
                let e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), x));
                let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(gate.as_mut_ptr().add(i), _mm512_mul_ps(s, g)) };
                i += LANES;
            }
            for k in body..n {
                gate[k] = silu_libm(gate[k]) * up[k];
            }
        }
    }
}

/// SwiGLU in place: `gate[i] = silu(gate[i]) * up[i]` with llama.cpp's arithmetic (see
/// [`silu`]). llama.cpp applies it row by row; calling it on several rows at once is the
/// same whenever the row length is a multiple of 16 (otherwise only the tail rule moves).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    silu::swiglu(gate, up)
}

/// SiLU in place, `x / (1 + e^-x)` with libm's `expf` (the ungated MLPs that use it).
pub fn silu_in_place(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = silu::silu_libm(*v);
    }
}

pub mod hadamard;
pub mod libm_expf;
pub mod vec_f32;

/// `y += x`.
pub fn add_assign(y: &mut [f32], x: &[f32]) {
    debug_assert_eq!(y.len(), x.len());
    for (a, &b) in y.iter_mut().zip(x) {
        *a += b;
    }
}

/// Rounds f32 values to f16.
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    debug_assert_eq!(src.len(), dst.len());
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(s);
    }
}

pub mod f16v;

pub use crate::gelu::{geglu, geglu_precise, gelu, gelu_erf, gelu_precise};
pub use crate::log_softmax::{LogProb, LogSoftmaxRounding, log_softmax_into};

/// `y *= v` for every element (ggml_scale).
pub fn scale(y: &mut [f32], v: f32) {
    for a in y.iter_mut() {
        *a *= v;
    }
}

/// Final-logit soft-capping as ggml computes it: `cap · tanhf(x · (1/cap))`.
pub fn softcap(y: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for a in y.iter_mut() {
        *a = (*a * inv).tanh() * cap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let (w, b) = ([1.0f32, 2.0, 0.5, -1.0], [0.1f32, 0.0, -0.2, 0.3]);
        let mut out = [0f32; 4];
        layer_norm(&x, &w, Some(&b), 1e-5, &mut out);
        let mean = 0.625f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 4.0;
        for i in 0..4 {
            let want = (x[i] as f64 - mean) / (var + 1e-5).sqrt() * w[i] as f64 + b[i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-6, "{i}");
        }
    }

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 2.0, 0.5, -1.0];
        let mut out = [0f32; 4];
        rms_norm(&x, &w, 1e-5, &mut out);
        let ms = x.iter().map(|v| v * v).sum::<f32>() / 4.0;
        for i in 0..4 {
            let want = x[i] / (ms + 1e-5).sqrt() * w[i];
            assert!((out[i] - want).abs() < 1e-6, "{i}: {} vs {want}", out[i]);
        }
    }

    #[test]
    fn rope_styles_rotate_the_right_pairs() {
        let mut cs = [0f32; 4];
        rope_angles(3.0, 4, 10000.0, 1.0, None, &mut cs);
        assert!((cs[0] - 3f32.cos()).abs() < 1e-6 && (cs[1] - 3f32.sin()).abs() < 1e-6);
        let theta1 = 3.0 * 10000f32.powf(-0.5);
        assert!((cs[2] - theta1.cos()).abs() < 1e-6);

        let mut h = [1.0f32, 0.0, 0.0, 0.0];
        rope_apply(&mut h, 4, RopeStyle::Normal, &cs);
        assert!((h[0] - cs[0]).abs() < 1e-6 && (h[1] - cs[1]).abs() < 1e-6);
        let mut h = [1.0f32, 0.0, 0.0, 0.0];
        rope_apply(&mut h, 4, RopeStyle::Neox, &cs);
        assert!((h[0] - cs[0]).abs() < 1e-6 && (h[2] - cs[1]).abs() < 1e-6);
        assert_eq!(h[1], 0.0);
        // Position 0 is the identity; partial rotary leaves the tail alone.
        let mut cs0 = [0f32; 2];
        rope_angles(0.0, 2, 10000.0, 1.0, None, &mut cs0);
        let mut h = [0.3f32, -0.7, 9.0];
        rope_apply(&mut h, 2, RopeStyle::Neox, &cs0);
        assert_eq!(h, [0.3, -0.7, 9.0]);
    }

    #[test]
    fn f16_simd_matches_reference() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for n in [1usize, 7, 8, 15, 16, 17, 63, 64, 65, 100, 128, 256, 300] {
            let a: Vec<f16> = (0..n)
                .map(|_| f16::from_f32(rng.random_range(-4.0..4.0)))
                .collect();
            let b: Vec<f16> = (0..n)
                .map(|_| f16::from_f32(rng.random_range(-4.0..4.0)))
                .collect();
            let d = f16v::dot(&a, &b);
            let r = f16v::dot_ref(&a, &b);
            assert_eq!(d.to_bits(), r.to_bits(), "dot n={n}: {d} vs {r}");
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| x.to_f64() * y.to_f64()).sum();
            let mag: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x.to_f64() * y.to_f64()).abs())
                .sum();
            assert!(
                (d as f64 - exact).abs() <= 1e-6 * mag + 1e-30,
                "dot n={n}: {d} vs {exact}"
            );
            let (mut y1, mut y2) = (a.clone(), a.clone());
            f16v::mad(&mut y1, &b, 0.37);
            f16v::mad_ref(&mut y2, &b, 0.37);
            assert_eq!(y1, y2, "mad n={n}");
            f16v::scale(&mut y1, -1.7);
            f16v::scale_ref(&mut y2, -1.7);
            assert_eq!(y1, y2, "scale n={n}");
        }
    }

    /// Distance in units in the last place between two finite f32 of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn swiglu_implementations_agree_bit_for_bit() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        // Ordinary values, values past the 125 / 192 thresholds of the exp, NaN and infinities.
        let mut gate: Vec<f32> = (0..4096).map(|_| rng.random_range(-12.0..12.0)).collect();
        let specials = [
            0.0,
            -0.0,
            80.0,
            -80.0,
            87.0,
            -87.0,
            88.5,
            -88.5,
            90.0,
            -90.0,
            104.0,
            -104.0,
            120.0,
            -120.0,
            140.0,
            -140.0,
            1e30,
            -1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -1e-40,
        ];
        for (k, v) in specials.iter().enumerate() {
            gate[37 * k + 5] = *v;
        }
        let up: Vec<f32> = (0..gate.len())
            .map(|_| rng.random_range(-3.0..3.0))
            .collect();
        for n in [1usize, 7, 15, 16, 17, 31, 33, 1536, 4093, 4096] {
            let mut want = gate[..n].to_vec();
            silu::swiglu_ref(&mut want, &up[..n]);
            for (name, f, ok) in silu::all() {
                if !ok {
                    continue;
                }
                let mut got = gate[..n].to_vec();
                f(&mut got, &up[..n]);
                for i in 0..n {
                    assert!(
                        got[i].to_bits() == want[i].to_bits()
                            || got[i].is_nan() && want[i].is_nan(),
                        "{name} n={n} i={i} x={}: {} vs {}",
                        gate[i],
                        got[i],
                        want[i]
                    );
                }
            }
            let mut got = gate[..n].to_vec();
            swiglu(&mut got, &up[..n]);
            assert_eq!(got.len(), want.len());
        }
    }

    #[test]
    fn silu_is_within_a_few_ulp_of_the_exact_value() {
        let mut worst = 0;
        let mut x = -100.0f32;
        while x < 100.0 {
            let exact = (x as f64 / (1.0 + (-x as f64).exp())) as f32;
            let got = silu::silu_lane(x);
            if exact.abs() > 1e-30 {
                worst = worst.max(ulps(got, exact));
            } else {
                assert!(got.abs() <= 1e-30, "x={x}: {got}");
            }
            x += 0.001_7;
        }
        assert!(worst <= 4, "silu: worst error {worst} ulp");
        assert_eq!(silu::silu_lane(200.0), 200.0);
        assert_eq!(silu::silu_lane(-200.0), -0.0);
        assert_eq!(silu::expf_lane(0.0), 1.0);
    }
}
