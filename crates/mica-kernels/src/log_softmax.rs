//! Log-softmax of a row of logits: `log p_i = l_i − max − ln Σ_j exp(l_j − max)`.
//!
//! One implementation for every caller that turns logits into log-probabilities (the
//! sampler's reported log-probs, perplexity, KL-divergence). The callers were written against
//! different references and round differently — whether each `exp` is taken in f32 or f64,
//! and whether the result is formed in f32 or f64 — and their printed figures are compared
//! bit for bit, so the rounding is a parameter ([`LogSoftmaxRounding`]) rather than one
//! compromise. Every mode subtracts the maximum in f32 and sums the exponentials in f64, in
//! index order. Re-exported from [`crate::ops`].

/// How [`log_softmax_into`] rounds. Each mode reproduces one reference formula exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogSoftmaxRounding {
    /// Each `exp(l − max)` in f32 (`expf`), summed in f64; the result `(l − max) − ln Σ` in
    /// f64. llama.cpp's `log_softmax` in `llama-perplexity`, whose perplexity and
    /// KL-divergence figures mica's are compared with.
    ExpF32,
    /// Each `exp(l − max)` in f64, summed in f64; `ln Σ` rounded to f32 and the result
    /// `(l − max) − ln Σ` formed in f32.
    ShiftF32,
    /// Each `exp(l − max)` in f64, summed in f64; the result `l − (max + ln Σ)` formed in
    /// f64 (one rounding when written to f32).
    ExpF64,
}

/// An element type [`log_softmax_into`] writes: `f32` or `f64`.
pub trait LogProb: Copy {
    /// The value from the f64 the rounding mode produced (exact for a mode whose result is
    /// already an f32).
    fn from_f64(v: f64) -> Self;
}

impl LogProb for f32 {
    #[inline]
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
}

impl LogProb for f64 {
    #[inline]
    fn from_f64(v: f64) -> f64 {
        v
    }
}

/// Writes the log-softmax of `logits` to `out` (same length), rounded as `rounding` says.
///
/// # Panics
/// When `out` and `logits` differ in length.
pub fn log_softmax_into<T: LogProb>(logits: &[f32], rounding: LogSoftmaxRounding, out: &mut [T]) {
    assert_eq!(logits.len(), out.len(), "log_softmax_into: lengths differ");
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let rows = out.iter_mut().zip(logits);
    match rounding {
        LogSoftmaxRounding::ExpF32 => {
            let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
            let ln_sum = sum.ln();
            for (o, &l) in rows {
                *o = T::from_f64((l - max) as f64 - ln_sum);
            }
        }
        LogSoftmaxRounding::ShiftF32 => {
            let ln_sum = sum_exp_f64(logits, max).ln() as f32;
            for (o, &l) in rows {
                *o = T::from_f64((l - max - ln_sum) as f64);
            }
        }
        LogSoftmaxRounding::ExpF64 => {
            let lse = max as f64 + sum_exp_f64(logits, max).ln();
            for (o, &l) in rows {
                *o = T::from_f64(l as f64 - lse);
            }
        }
    }
}

/// `Σ exp(l − max)` with each exponential taken in f64.
fn sum_exp_f64(logits: &[f32], max: f32) -> f64 {
    logits.iter().map(|&l| ((l - max) as f64).exp()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits with a wide spread, ties, and values whose differences round in f32.
    fn logits() -> Vec<f32> {
        let mut s = 17u64;
        (0..1031)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                if i % 97 == 0 { 12.5 } else { 40.0 * u - 25.0 }
            })
            .collect()
    }

    /// Each mode is, bit for bit, the formula its callers wrote out before sharing it.
    #[test]
    fn each_mode_is_its_reference_formula() {
        let l = logits();
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);

        // llama-perplexity: expf, f64 sum, f64 result.
        let sum: f64 = l.iter().map(|&x| (x - max).exp() as f64).sum();
        let want: Vec<f64> = l.iter().map(|&x| (x - max) as f64 - sum.ln()).collect();
        let mut got = vec![0f64; l.len()];
        log_softmax_into(&l, LogSoftmaxRounding::ExpF32, &mut got);
        assert_eq!(got, want);

        // f64 exponentials, f32 result.
        let sum: f64 = l.iter().map(|&x| ((x - max) as f64).exp()).sum();
        let ln = sum.ln() as f32;
        let want: Vec<f32> = l.iter().map(|&x| x - max - ln).collect();
        let mut got = vec![0f32; l.len()];
        log_softmax_into(&l, LogSoftmaxRounding::ShiftF32, &mut got);
        assert_eq!(got, want);

        // f64 exponentials, l − (max + ln Σ) in f64 rounded once.
        let lse = max as f64 + sum.ln();
        let want: Vec<f32> = l.iter().map(|&x| (x as f64 - lse) as f32).collect();
        log_softmax_into(&l, LogSoftmaxRounding::ExpF64, &mut got);
        assert_eq!(got, want);

        // The modes really differ somewhere (else one parameter would do).
        let mut shift = vec![0f32; l.len()];
        log_softmax_into(&l, LogSoftmaxRounding::ShiftF32, &mut shift);
        assert_ne!(got, shift);
    }

    #[test]
    fn probabilities_sum_to_one_and_keep_the_order() {
        let l = logits();
        for mode in [
            LogSoftmaxRounding::ExpF32,
            LogSoftmaxRounding::ShiftF32,
            LogSoftmaxRounding::ExpF64,
        ] {
            let mut lp = vec![0f64; l.len()];
            log_softmax_into(&l, mode, &mut lp);
            let total: f64 = lp.iter().map(|v| v.exp()).sum();
            assert!((total - 1.0).abs() < 1e-6, "{mode:?}: {total}");
            assert!(lp.iter().all(|&v| v <= 0.0), "{mode:?}");
            // Monotonic: a larger logit never gets a smaller log-probability.
            for i in 1..l.len() {
                assert!(l[i] < l[0] || lp[i] >= lp[0], "{mode:?} {i}");
                assert!(l[i] > l[0] || lp[i] <= lp[0], "{mode:?} {i}");
            }
        }
        // One logit: probability 1.
        let mut one = [0f32];
        log_softmax_into(&[3.5], LogSoftmaxRounding::ShiftF32, &mut one);
        assert_eq!(one, [0.0]);
    }
}
