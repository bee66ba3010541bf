//! Element-wise and row-wise ops of the transformer: RMS norm, rotary embeddings, SwiGLU,
//! and the f16 vector primitives attention is built from.
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
    let half = n_dims / 2;
    for i in 0..half {
        let (c, s) = (cos_sin[2 * i], cos_sin[2 * i + 1]);
        let (a, b) = match style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}

/// SiLU, `x / (1 + e^-x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SwiGLU in place: `gate[i] = silu(gate[i]) * up[i]`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

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

/// The f16 vector primitives of attention, with a scalar reference and an AVX2+F16C+FMA
/// version picked at run time. Both round exactly the same way (per element, f32 math with a
/// single rounding to f16 at the end of each update), so they agree bit for bit except for
/// the f32 summation order inside `dot`.
pub mod f16v {
    use half::f16;
    use std::sync::OnceLock;

    struct Table {
        dot: fn(&[f16], &[f16]) -> f32,
        mad: fn(&mut [f16], &[f16], f32),
        scale: fn(&mut [f16], f32),
    }

    fn table() -> &'static Table {
        static T: OnceLock<Table> = OnceLock::new();
        T.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return Table {
                    dot: |a, b| unsafe { x86::dot(a, b) },
                    mad: |y, x, v| unsafe { x86::mad(y, x, v) },
                    scale: |y, v| unsafe { x86::scale(y, v) },
                };
            }
            Table {
                dot: dot_ref,
                mad: mad_ref,
                scale: scale_ref,
            }
        })
    }

    /// Σ a[i]·b[i] in f32.
    #[inline]
    pub fn dot(a: &[f16], b: &[f16]) -> f32 {
        (table().dot)(a, b)
    }

    /// `y[i] = f16(f32(y[i]) + f32(x[i]) · v)`, one fused multiply-add then one rounding.
    #[inline]
    pub fn mad(y: &mut [f16], x: &[f16], v: f32) {
        (table().mad)(y, x, v)
    }

    /// `y[i] = f16(f32(y[i]) · v)`.
    #[inline]
    pub fn scale(y: &mut [f16], v: f32) {
        (table().scale)(y, v)
    }

    pub fn dot_ref(a: &[f16], b: &[f16]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x.to_f32() * y.to_f32()).sum()
    }

    pub fn mad_ref(y: &mut [f16], x: &[f16], v: f32) {
        for (a, b) in y.iter_mut().zip(x) {
            *a = f16::from_f32(b.to_f32().mul_add(v, a.to_f32()));
        }
    }

    pub fn scale_ref(y: &mut [f16], v: f32) {
        for a in y.iter_mut() {
            *a = f16::from_f32(a.to_f32() * v);
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use half::f16;
        use std::arch::x86_64::*;

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn dot(a: &[f16], b: &[f16]) -> f32 {
            let n = a.len().min(b.len());
            let mut acc0 = _mm256_setzero_ps();
            let mut acc1 = _mm256_setzero_ps();
            let mut i = 0;
            // SAFETY (all loads): i + 16 <= n <= both lengths.
            while i + 16 <= n {
                unsafe {
                    let a0 = _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(i).cast()));
                    let b0 = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i).cast()));
                    let a1 = _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(i + 8).cast()));
                    let b1 = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i + 8).cast()));
                    acc0 = _mm256_fmadd_ps(a0, b0, acc0);
                    acc1 = _mm256_fmadd_ps(a1, b1, acc1);
                }
                i += 16;
            }
            let acc = _mm256_add_ps(acc0, acc1);
            let mut lanes = [0f32; 8];
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
            let mut s: f32 = lanes.iter().sum();
            for j in i..n {
                s += a[j].to_f32() * b[j].to_f32();
            }
            s
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn mad(y: &mut [f16], x: &[f16], v: f32) {
            let n = y.len().min(x.len());
            let vv = _mm256_set1_ps(v);
            let mut i = 0;
            while i + 8 <= n {
                // SAFETY: i + 8 <= n.
                unsafe {
                    let py = y.as_mut_ptr().add(i).cast::<__m128i>();
                    let yy = _mm256_cvtph_ps(_mm_loadu_si128(py));
                    let xx = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i).cast()));
                    let r = _mm256_fmadd_ps(xx, vv, yy);
                    _mm_storeu_si128(py, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
                }
                i += 8;
            }
            for j in i..n {
                y[j] = f16::from_f32(x[j].to_f32().mul_add(v, y[j].to_f32()));
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn scale(y: &mut [f16], v: f32) {
            let n = y.len();
            let vv = _mm256_set1_ps(v);
            let mut i = 0;
            while i + 8 <= n {
                // SAFETY: i + 8 <= n.
                unsafe {
                    let py = y.as_mut_ptr().add(i).cast::<__m128i>();
                    let r = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(py)), vv);
                    _mm_storeu_si128(py, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
                }
                i += 8;
            }
            for a in &mut y[i..] {
                *a = f16::from_f32(a.to_f32() * v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for n in [1usize, 7, 8, 15, 16, 17, 64, 100, 256] {
            let a: Vec<f16> = (0..n)
                .map(|_| f16::from_f32(rng.random_range(-4.0..4.0)))
                .collect();
            let b: Vec<f16> = (0..n)
                .map(|_| f16::from_f32(rng.random_range(-4.0..4.0)))
                .collect();
            let d = f16v::dot(&a, &b);
            let r = f16v::dot_ref(&a, &b);
            assert!((d - r).abs() <= 1e-4 * (1.0 + r.abs()), "n={n}: {d} vs {r}");
            let (mut y1, mut y2) = (a.clone(), a.clone());
            f16v::mad(&mut y1, &b, 0.37);
            f16v::mad_ref(&mut y2, &b, 0.37);
            assert_eq!(y1, y2, "mad n={n}");
            f16v::scale(&mut y1, -1.7);
            f16v::scale_ref(&mut y2, -1.7);
            assert_eq!(y1, y2, "scale n={n}");
        }
    }
}
