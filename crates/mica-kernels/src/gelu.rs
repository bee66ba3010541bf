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
}
