//! f32 vector kernels with the arithmetic of llama.cpp's CPU build for AVX-512 (`vec.cpp`,
//! `vec.h`), for operations mica runs outside the matrix products (Qwen3.5's Gated DeltaNet).
//! Each runs with hardware FMA where the CPU has it (else `mul_add` is a libm call per
//! element); the results are the same either way. The bodies ([`dot_body`], [`mad_body`])
//! are public and always inlined, for callers that compile a whole loop for one SIMD tier.

/// `ggml_vec_dot_f32`: whole groups of 64 into four 16-lane FMA accumulators, reduced
/// pairwise (`GGML_F32x16_REDUCE`, then `_mm512_reduce_add_ps`), then the rest one by
/// one (`sum += x·y`, contracted into an FMA).
pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("fma") {
        // SAFETY: the feature was just detected.
        return unsafe { dot_fma(x, y) };
    }
    dot_body(x, y)
}

/// `ggml_vec_mad_f32`: `y += x · v`, each element one fused multiply-add.
pub fn mad(y: &mut [f32], x: &[f32], v: f32) {
    debug_assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("fma") {
        // SAFETY: the feature was just detected.
        return unsafe { mad_fma(y, x, v) };
    }
    mad_body(y, x, v)
}

/// `acc += a · b` element by element, each one fused multiply-add (a `sum += a·b` loop
/// as GCC contracts it; one tap of ggml's `ssm_conv` over a row of channels).
pub fn fma_assign(acc: &mut [f32], a: &[f32], b: &[f32]) {
    debug_assert!(acc.len() == a.len() && a.len() == b.len());
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("fma") {
        // SAFETY: the feature was just detected.
        return unsafe { fma_assign_fma(acc, a, b) };
    }
    fma_assign_body(acc, a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn dot_fma(x: &[f32], y: &[f32]) -> f32 {
    dot_body(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn mad_fma(y: &mut [f32], x: &[f32], v: f32) {
    mad_body(y, x, v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn fma_assign_fma(acc: &mut [f32], a: &[f32], b: &[f32]) {
    fma_assign_body(acc, a, b)
}

/// [`dot`]'s arithmetic, inlined into the caller (with the caller's target features).
#[inline(always)]
pub fn dot_body(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for (xs, ys) in x[..np].chunks_exact(64).zip(y[..np].chunks_exact(64)) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, s) in a.iter_mut().enumerate() {
                *s = xs[16 * j + l].mul_add(ys[16 * j + l], *s);
            }
        }
    }
    let mut s = 0f32;
    if np > 0 {
        let r: [f32; 16] =
            std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
        let h: [f32; 8] = std::array::from_fn(|l| r[l] + r[l + 8]);
        let u: [f32; 4] = std::array::from_fn(|l| h[l] + h[l + 4]);
        s = (u[0] + u[2]) + (u[1] + u[3]);
    }
    for k in np..n {
        s = x[k].mul_add(y[k], s);
    }
    s
}

/// [`mad`]'s arithmetic, inlined into the caller (with the caller's target features).
#[inline(always)]
pub fn mad_body(y: &mut [f32], x: &[f32], v: f32) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = xi.mul_add(v, *yi);
    }
}

/// [`fma_assign`]'s arithmetic, inlined into the caller (with the caller's target features).
#[inline(always)]
pub fn fma_assign_body(acc: &mut [f32], a: &[f32], b: &[f32]) {
    for ((s, &x), &w) in acc.iter_mut().zip(a).zip(b) {
        *s = x.mul_add(w, *s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatched kernels equal their bodies run without hardware FMA, and the dot
    /// product's reduction order is the documented one.
    #[test]
    fn dispatch_matches_the_body_and_the_reduction_order() {
        let x: Vec<f32> = (0..150)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let y: Vec<f32> = (0..150)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 3.0)
            .collect();
        for n in [0, 5, 16, 64, 100, 128, 150] {
            assert_eq!(
                dot(&x[..n], &y[..n]).to_bits(),
                dot_body(&x[..n], &y[..n]).to_bits()
            );
        }
        // 64 elements: lane l of accumulator j holds x[16j + l]·y[16j + l] exactly
        // rounded; then the pairwise reduction.
        let p: Vec<f32> = (0..64).map(|k| x[k] * y[k]).collect();
        let r: Vec<f32> = (0..16)
            .map(|l| (p[l] + p[32 + l]) + (p[16 + l] + p[48 + l]))
            .collect();
        let h: Vec<f32> = (0..8).map(|l| r[l] + r[l + 8]).collect();
        let u: Vec<f32> = (0..4).map(|l| h[l] + h[l + 4]).collect();
        assert_eq!(dot(&x[..64], &y[..64]), (u[0] + u[2]) + (u[1] + u[3]));
        let (mut a, mut b) = (y.clone(), y.clone());
        mad(&mut a, &x, 0.3);
        mad_body(&mut b, &x, 0.3);
        assert_eq!(a, b);
        let (mut a, mut b) = (y.clone(), y.clone());
        fma_assign(&mut a, &x, &y);
        fma_assign_body(&mut b, &x, &y);
        assert_eq!(a, b);
    }
}
