//! The orthonormal Walsh–Hadamard rotation llama.cpp applies to queries, keys and values
//! when the KV cache is quantized (`llama_mul_mat_hadamard`, computed on the CPU by
//! `ggml_compute_forward_fwht`): rotating spreads a head's outlier channels over all of
//! its values before they are rounded to 8 or 4 bits, and since the matrix `H` is
//! orthonormal and symmetric (`H·H = I`), `(Hq)·(Hk) = q·k` and `H(Σ p·Hv) = Σ p·v`.
//!
//! Arithmetic, as ggml's: each chunk of `n` values is first multiplied by `1/sqrt(n)`
//! (`sqrtf` of `n` as f32), then transformed in place by butterflies `(u, v) → (u + v,
//! u − v)` over strides 1, 2, 4, …, n/2. Every butterfly is exact up to one rounding of
//! the sum, so the SIMD width ggml uses does not change the result.

/// Rotates every consecutive chunk of `n` values of `x` in place (`n` a power of two that
/// divides `x.len()`).
pub fn fwht(x: &mut [f32], n: usize) {
    assert!(
        n.is_power_of_two() && x.len().is_multiple_of(n),
        "fwht: chunks of {n} over {} values",
        x.len()
    );
    let scale = 1.0 / (n as f32).sqrt();
    for chunk in x.chunks_exact_mut(n) {
        for v in chunk.iter_mut() {
            *v *= scale;
        }
        let mut len = 1;
        while len < n {
            for block in chunk.chunks_exact_mut(2 * len) {
                let (lo, hi) = block.split_at_mut(len);
                for (u, v) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (a, b) = (*u, *v);
                    *u = a + b;
                    *v = a - b;
                }
            }
            len <<= 1;
        }
    }
}

/// The `n × n` matrix `fwht` multiplies by, built as ggml's `ggml_gen_hadamard` builds it
/// (Sylvester's recursion from `1/sqrt(n)`), row-major. For tests.
pub fn hadamard_matrix(n: usize) -> Vec<f32> {
    assert!(n.is_power_of_two());
    let mut h = vec![0f32; n * n];
    h[0] = (1.0 / (n as f64).sqrt()) as f32;
    let mut s = 1;
    while s < n {
        for i in 0..s {
            for j in 0..s {
                let v = h[i * n + j];
                h[(i + s) * n + j] = v;
                h[i * n + j + s] = v;
                h[(i + s) * n + j + s] = -v;
            }
        }
        s *= 2;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect()
    }

    #[test]
    fn equals_the_matrix_product_per_chunk() {
        for n in [64, 128, 256] {
            let x = random(3 * n, n as u64);
            let mut y = x.clone();
            fwht(&mut y, n);
            let h = hadamard_matrix(n);
            for (c, chunk) in x.chunks(n).enumerate() {
                for i in 0..n {
                    let want: f64 = (0..n).map(|j| h[i * n + j] as f64 * chunk[j] as f64).sum();
                    let got = y[c * n + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "n {n} chunk {c} row {i}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn is_its_own_inverse_and_keeps_dot_products() {
        let n = 64;
        let (a, b) = (random(n, 1), random(n, 2));
        let (mut ha, mut hb) = (a.clone(), b.clone());
        fwht(&mut ha, n);
        fwht(&mut hb, n);
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        assert!((dot(&a, &b) - dot(&ha, &hb)).abs() < 1e-3);
        let mut back = ha.clone();
        fwht(&mut back, n);
        for (x, y) in back.iter().zip(&a) {
            assert!((x - y).abs() < 1e-5);
        }
    }

    #[test]
    #[should_panic(expected = "fwht: chunks of 48")]
    fn refuses_a_size_that_is_not_a_power_of_two() {
        fwht(&mut [0.0; 96], 48);
    }
}
