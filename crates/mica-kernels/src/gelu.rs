//! GELU (tanh approximation) and GeGLU with llama.cpp's CPU arithmetic.
//!
//! ggml-cpu builds with `GGML_GELU_FP16`: `ggml_vec_gelu_f32` / `ggml_vec_geglu_f32` round
//! each input to f16 and look the result up in a 65 536-entry table of
//! `f16(gelu_f32(f16 value))`, filled once at start-up (`ggml_cpu_init`); inputs at or below
//! -10 give 0 and inputs at or above 10 pass through unchanged. `gelu_f32` is
//! `0.5·x·(1 + tanhf(√(2/π)·x·(1 + 0.044715·x²)))` with the inner `1 + a·x·x` fused into one
//! FMA, as GCC contracts it. Following the table (not the exact formula) is what keeps
//! Gemma's greedy tokens on llama.cpp's.
//!
//! For float32 checkpoints checked against transformers, [`gelu_precise`], [`geglu_precise`]
//! and [`gelu_erf`] compute the formulas without the table: the tanh approximation (HF's
//! `gelu_new` / `gelu_pytorch_tanh`) in f32, and the exact GELU `0.5·x·(1 + erf(x/√2))`
//! (HF's `gelu`, GPT-NeoX / Pythia) with `erf` evaluated in f64.
//!
//! Reference: Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)", 2016; ggml-cpu
//! `vec.h` for the table rules.

use half::f16;
use std::sync::OnceLock;

/// √(2/π) as ggml's f32 constant (bits 0x3f4c422a).
const SQRT_2_OVER_PI: f32 = f32::from_bits(0x3f4c_422a);
const COEF_A: f32 = 0.044715;

/// `gelu_f32` of ggml: the tanh approximation in f32.
pub fn gelu_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// `[65536]` the f16 GELU table, indexed by the f16 bits of the input (plus one zero entry
/// of padding, so a 4-byte gather of the last entry stays inside).
fn table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_f32(f16::from_bits(bits).to_f32())))
            .chain([f16::ZERO])
            .collect()
    })
}

/// One element of `ggml_vec_gelu_f32` (table version).
#[inline]
fn gelu_table(t: &[f16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        t[f16::from_f32(x).to_bits() as usize].to_f32()
    }
}

/// GELU in place, as llama.cpp's CPU backend computes it (f16 table).
pub fn gelu(x: &mut [f32]) {
    let t = table();
    let done = simd_table(t, x, None);
    for v in &mut x[done..] {
        *v = gelu_table(t, *v);
    }
}

/// GeGLU in place: `gate[i] = gelu(gate[i]) * up[i]`, as `ggml_vec_geglu_f32` (f16 table).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let t = table();
    let done = simd_table(t, gate, Some(up));
    for (g, &u) in gate[done..].iter_mut().zip(&up[done..]) {
        // ggml: `x >= 10` gives `x * g`, the table gives `f32(table) * g`: one rule.
        *g = gelu_table(t, *g) * u;
    }
}

/// The scalar reference of [`gelu`] / [`geglu`] (what the SIMD path is tested against).
pub fn gelu_table_ref(x: &mut [f32], up: Option<&[f32]>) {
    let t = table();
    for (i, v) in x.iter_mut().enumerate() {
        *v = gelu_table(t, *v) * up.map_or(1.0, |u| u[i]);
    }
}

/// [`gelu_table`] (times `up`) on a whole number of SIMD groups from the start of `x` (16
/// elements with AVX-512 and F16C, 8 with AVX2 and F16C); returns how many elements it did
/// (0 on other CPUs).
fn simd_table(t: &[f16], x: &mut [f32], up: Option<&[f32]>) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        static ISA: OnceLock<u8> = OnceLock::new();
        let isa = *ISA.get_or_init(|| {
            let f16c = std::is_x86_feature_detected!("f16c");
            if f16c && std::is_x86_feature_detected!("avx512f") {
                2
            } else if f16c && std::is_x86_feature_detected!("avx2") {
                1
            } else {
                0
            }
        });
        // SAFETY: the features were detected.
        match isa {
            2 => return unsafe { table_avx512(t, x, up) },
            1 => return unsafe { table_avx2(t, x, up) },
            _ => {}
        }
    }
    let _ = (t, x, up);
    0
}

/// [`table_avx512`]'s steps eight elements at a time: the f16 bits widened to 32-bit
/// indices, a 4-byte gather whose low half is the entry, packed back to eight f16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn table_avx2(t: &[f16], x: &mut [f32], up: Option<&[f32]>) -> usize {
    use std::arch::x86_64::*;
    assert!(t.len() > u16::MAX as usize + 1, "padded table");
    assert!(up.is_none_or(|u| u.len() == x.len()));
    let n = x.len() / 8 * 8;
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let low16 = _mm256_set1_epi32(0xFFFF);
    let tp = t.as_ptr().cast::<i32>();
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 <= n <= x.len() (and up's length); gathers read 4 bytes at 2·idx of
        // a table with one padding entry past the largest index.
        unsafe {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            let idx = _mm256_cvtepu16_epi32(h);
            let g = _mm256_and_si256(_mm256_i32gather_epi32::<2>(tp, idx), low16);
            // Values below 2^16: the unsigned saturation of the pack keeps them as they are.
            let packed =
                _mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256::<1>(g));
            let gv = _mm256_cvtph_ps(packed);
            let below = _mm256_cmp_ps::<_CMP_LE_OQ>(v, lo);
            let above = _mm256_cmp_ps::<_CMP_GE_OQ>(v, hi);
            // `above` and `below` never both hold; NaN is in neither and takes the table.
            let r = _mm256_andnot_ps(below, _mm256_blendv_ps(gv, v, above));
            let r = match up {
                Some(u) => _mm256_mul_ps(r, _mm256_loadu_ps(u.as_ptr().add(i))),
                None => r,
            };
            _mm256_storeu_ps(x.as_mut_ptr().add(i), r);
        }
    }
    n
}

/// Sixteen elements at a time: round to f16 (`vcvtps2ph`, nearest-even as `f16::from_f32`),
/// gather the table entries, widen, then the ±10 rules by masks, in [`gelu_table`]'s order
/// of tests (NaN takes the table, as there).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn table_avx512(t: &[f16], x: &mut [f32], up: Option<&[f32]>) -> usize {
    use std::arch::x86_64::*;
    assert!(t.len() > u16::MAX as usize + 1, "padded table");
    assert!(up.is_none_or(|u| u.len() == x.len()));
    let n = x.len() / 16 * 16;
    let (lo, hi) = (_mm512_set1_ps(-10.0), _mm512_set1_ps(10.0));
    let tp = t.as_ptr().cast::<u8>();
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n <= x.len() (and up's length); gathers read 4 bytes at 2·idx of
        // a table with one padding entry past the largest index.
        unsafe {
            let v = _mm512_loadu_ps(x.as_ptr().add(i));
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            let idx = _mm512_cvtepu16_epi32(h);
            let g = _mm512_i32gather_epi32::<2>(idx, tp.cast());
            let gv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
            let below = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, lo);
            let above = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, hi);
            let r = _mm512_maskz_mov_ps(!below, _mm512_mask_mov_ps(gv, above & !below, v));
            let r = match up {
                Some(u) => _mm512_mul_ps(r, _mm512_loadu_ps(u.as_ptr().add(i))),
                None => r,
            };
            _mm512_storeu_ps(x.as_mut_ptr().add(i), r);
        }
    }
    n
}

/// GELU (tanh approximation) in place, by the formula in f32 (no table).
pub fn gelu_precise(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = gelu_f32(*v);
    }
}

/// GeGLU in place with [`gelu_f32`] (no table).
pub fn geglu_precise(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_f32(*g) * u;
    }
}

/// The exact GELU `0.5·x·(1 + erf(x/√2))` in place (computed in f64, rounded once).
pub fn gelu_erf(x: &mut [f32]) {
    for v in x.iter_mut() {
        let d = *v as f64;
        *v = (0.5 * d * (1.0 + erf(d * std::f64::consts::FRAC_1_SQRT_2))) as f32;
    }
}

/// The error function to about 1e-15: its Maclaurin series for |x| < 2.5, the continued
/// fraction of erfc (Lentz's method) beyond.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a < 2.5 {
        // erf x = 2/√π · Σ (-1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, x2) = (a, a, a * a);
        for n in 1..80 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        return (sum * std::f64::consts::FRAC_2_SQRT_PI).copysign(x);
    }
    if a > 6.0 {
        return 1f64.copysign(x);
    }
    // erfc a = e^(-a²)/√π · 1/(a + 1/2/(a + 1/(a + 3/2/(a + ...)))), evaluated backwards.
    let mut f = a;
    for k in (1..60).rev() {
        f = a + (k as f64 / 2.0) / f;
    }
    let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / f;
    (1.0 - erfc).copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_follows_the_formula_within_f16_rounding() {
        for &x in &[-9.5f32, -3.0, -1.0, -0.1, 0.0, 0.1, 0.5, 1.0, 2.0, 9.9] {
            let mut v = [x];
            gelu(&mut v);
            let exact = gelu_f32(x);
            assert!((v[0] - exact).abs() <= 2e-3 * exact.abs().max(1e-2), "{x}");
        }
        let mut v = [-10.0f32, 10.0, 20.0];
        gelu(&mut v);
        assert_eq!(v, [0.0, 10.0, 20.0]);
        let mut g = [1.0f32, 12.0];
        geglu(&mut g, &[2.0, 0.5]);
        assert_eq!(g, [2.0 * gelu_table(table(), 1.0), 6.0]);
    }

    /// The SIMD table path equals the scalar one bit for bit: random values, the ±10 edges,
    /// f16 rounding ties, subnormals, infinities, NaN, and lengths with a scalar tail.
    #[test]
    fn simd_table_gelu_equals_scalar_bitwise() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        // Edge values first, so the SIMD groups (not the scalar tail) meet them.
        let mut xs: Vec<f32> = vec![
            -10.0,
            10.0,
            -10.000001,
            9.999999,
            -9.999999,
            10.000001,
            0.0,
            -0.0,
            1e-8,
            -1e-8,
            6.1e-5,
            f32::MIN_POSITIVE,
            1.0 + 1.0 / 2048.0,
            65504.0,
            70000.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        xs.extend((0..5000).map(|_| rng.random_range(-12.0f32..12.0)));
        let up: Vec<f32> = (0..xs.len()).map(|_| rng.random_range(-3.0..3.0)).collect();
        #[cfg(target_arch = "x86_64")]
        {
            // Each SIMD path this CPU has, directly (the dispatch below runs only the best).
            let t = table();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut ran = Vec::new();
            type Path = unsafe fn(&[f16], &mut [f32], Option<&[f32]>) -> usize;
            let paths: [(&str, bool, Path); 2] = [
                (
                    "avx2",
                    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c"),
                    table_avx2,
                ),
                (
                    "avx512",
                    std::is_x86_feature_detected!("avx512f")
                        && std::is_x86_feature_detected!("f16c"),
                    table_avx512,
                ),
            ];
            for (name, ok, f) in paths {
                if !ok {
                    eprintln!("gelu table: {name} path skipped (this CPU lacks it)");
                    continue;
                }
                ran.push(name);
                for u in [None, Some(&up[..])] {
                    let mut want = xs.clone();
                    gelu_table_ref(&mut want, u);
                    let mut got = xs.clone();
                    // SAFETY: the features were detected above.
                    let done = unsafe { f(t, &mut got, u) };
                    let group = if name == "avx2" { 8 } else { 16 };
                    assert_eq!(done, xs.len() / group * group, "{name} elements done");
                    assert_eq!(
                        bits(&got[..done]),
                        bits(&want[..done]),
                        "{name}, up {}",
                        u.is_some()
                    );
                }
            }
            eprintln!("gelu table: SIMD paths tested: {ran:?}");
        }
        for len in [xs.len(), 17, 16, 15, 1] {
            let mut want = xs[..len].to_vec();
            gelu_table_ref(&mut want, None);
            let mut got = xs[..len].to_vec();
            gelu(&mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "gelu, {len} elements");
            let mut want = xs[..len].to_vec();
            gelu_table_ref(&mut want, Some(&up[..len]));
            let mut got = xs[..len].to_vec();
            geglu(&mut got, &up[..len]);
            assert_eq!(bits(&got), bits(&want), "geglu, {len} elements");
        }
    }

    #[test]
    fn erf_matches_known_values_and_precise_gelus_their_formulas() {
        // erf values from tables (Abramowitz & Stegun 7.1), to 1e-12.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.999_977_909_503_001_4),
            (-1.5, -0.966_105_146_475_310_7),
            (7.0, 1.0),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-12,
                "erf({x}) = {} vs {want}",
                erf(x)
            );
        }
        let mut v = [-3.0f32, -0.5, 0.0, 0.7, 4.0];
        gelu_erf(&mut v);
        let want = [
            -0.004_049_694,
            -0.154_268_77,
            0.0,
            0.530_625_44,
            3.999_873_3,
        ];
        for (a, b) in v.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        let mut t = [0.7f32, -2.0];
        gelu_precise(&mut t);
        assert_eq!(t, [gelu_f32(0.7), gelu_f32(-2.0)]);
        let mut g = [0.7f32, -2.0];
        geglu_precise(&mut g, &[2.0, 3.0]);
        assert_eq!(g, [gelu_f32(0.7) * 2.0, gelu_f32(-2.0) * 3.0]);
    }
}
