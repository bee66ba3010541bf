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

/// `[65536]` the f16 GELU table, indexed by the f16 bits of the input.
fn table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_f32(f16::from_bits(bits).to_f32())))
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
    for v in x.iter_mut() {
        *v = gelu_table(t, *v);
    }
}

/// GeGLU in place: `gate[i] = gelu(gate[i]) * up[i]`, as `ggml_vec_geglu_f32` (f16 table).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    let t = table();
    for (g, &u) in gate.iter_mut().zip(up) {
        // ggml: `x >= 10` gives `x * g`, the table gives `f32(table) * g`: one rule.
        *g = gelu_table(t, *g) * u;
    }
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
