//! Mirostat (Basu et al. 2020, "Mirostat: a neural text decoding algorithm that directly
//! controls perplexity"), as llama.cpp's `llama_sampler_mirostat` (v1) and
//! `llama_sampler_mirostat_v2` compute it: a target surprise `tau` (bits), a learning rate
//! `eta`, and a running threshold `mu` that starts at `2·tau` and after every draw moves by
//! `eta · (observed surprise − tau)`.
//!
//! - **v1** estimates the Zipf exponent `s` of the sorted distribution from its `m = 100`
//!   most likely tokens (least squares of `ln(p_i / p_{i+1})` on `ln((i+2)/(i+1))`), keeps
//!   the `k = ((ε·2^mu) / (1 − n_vocab^−ε))^(1/s)` most likely tokens (`ε = s − 1`), and
//!   draws from them.
//! - **v2** keeps the tokens whose surprise `−log2 p` is at most `mu` (at least one) and
//!   draws from them.
//!
//! Probabilities follow llama.cpp's f32 softmax over the temperature-scaled logits. As in
//! llama.cpp's common sampler, mirostat replaces the top-k / top-p / min-p chain and the
//! repetition penalties; the logit bias still applies. The draw itself uses the sampler's
//! seeded ChaCha20 stream (llama.cpp's `mt19937` stream is not reproduced), so tokens are
//! reproducible per seed within mica.

use crate::sampler::Candidate;

/// Which mirostat, with its target surprise and learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mirostat {
    V1 { tau: f32, eta: f32 },
    V2 { tau: f32, eta: f32 },
}

/// llama.cpp's defaults: `tau` 5, `eta` 0.1.
pub const DEFAULT_TAU: f32 = 5.0;
pub const DEFAULT_ETA: f32 = 0.1;
/// Tokens v1 estimates the Zipf exponent from (llama.cpp's `m`).
pub const V1_M: usize = 100;

impl Mirostat {
    pub fn tau(self) -> f32 {
        match self {
            Mirostat::V1 { tau, .. } | Mirostat::V2 { tau, .. } => tau,
        }
    }
    pub fn eta(self) -> f32 {
        match self {
            Mirostat::V1 { eta, .. } | Mirostat::V2 { eta, .. } => eta,
        }
    }
}

/// Sorts candidates by logit (descending, lowest id on ties) and returns their f32
/// probabilities (llama.cpp's `llama_sampler_softmax_impl`: `exp(l − max)` summed in f32).
pub fn softmax_sorted(c: &mut [Candidate]) -> Vec<f32> {
    c.sort_unstable_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
    probs(c)
}

/// f32 softmax of candidates already sorted.
fn probs(c: &[Candidate]) -> Vec<f32> {
    let max = c.first().map_or(0.0, |x| x.logit);
    let mut p: Vec<f32> = c.iter().map(|x| (x.logit - max).exp()).collect();
    let sum: f32 = p.iter().sum();
    for v in &mut p {
        *v /= sum;
    }
    p
}

/// v1's `k` for sorted probabilities `p`, threshold `mu` and vocabulary size (at least 1).
pub fn v1_k(p: &[f32], mu: f32, n_vocab: usize) -> usize {
    let (mut sum_ti_bi, mut sum_ti_sq) = (0.0f32, 0.0f32);
    let mut i = 0;
    while i + 1 < V1_M && i + 1 < p.len() {
        let t_i = ((i + 2) as f32 / (i + 1) as f32).ln();
        let b_i = (p[i] / p[i + 1]).ln();
        sum_ti_bi += t_i * b_i;
        sum_ti_sq += t_i * t_i;
        i += 1;
    }
    let s_hat = sum_ti_bi / sum_ti_sq;
    let eps = s_hat - 1.0;
    let k = ((eps * 2f32.powf(mu)) / (1.0 - (n_vocab as f32).powf(-eps))).powf(1.0 / s_hat);
    // `int(k)` of a NaN or negative k is at most 0 in llama.cpp, then raised to 1.
    if k.is_finite() && k >= 1.0 {
        (k as usize).min(p.len())
    } else if k.is_infinite() && k > 0.0 {
        p.len()
    } else {
        1
    }
}

/// v2's kept prefix: tokens whose surprise `−log2 p` is at most `mu`, at least one.
pub fn v2_keep(p: &[f32], mu: f32) -> usize {
    p.iter().take_while(|&&x| -x.log2() <= mu).count().max(1)
}

/// The state of one sequence's mirostat sampler.
#[derive(Clone, Debug)]
pub struct MirostatState {
    pub kind: Mirostat,
    /// The running surprise threshold, `2·tau` at the start.
    pub mu: f32,
    n_vocab: usize,
}

impl MirostatState {
    pub fn new(kind: Mirostat, n_vocab: usize) -> MirostatState {
        MirostatState {
            kind,
            mu: 2.0 * kind.tau(),
            n_vocab,
        }
    }

    /// Truncates `c` (the temperature-scaled candidates) to the set mirostat draws from,
    /// sorted, and returns the renormalized probabilities of that set.
    pub fn truncate(&self, c: &mut Vec<Candidate>) -> Vec<f32> {
        let p = softmax_sorted(c);
        let keep = match self.kind {
            Mirostat::V1 { .. } => v1_k(&p, self.mu, self.n_vocab),
            Mirostat::V2 { .. } => v2_keep(&p, self.mu),
        };
        c.truncate(keep);
        probs(c)
    }

    /// Moves `mu` after drawing a token of probability `p` (in the truncated set).
    pub fn update(&mut self, p: f32) {
        let observed = -p.log2();
        self.mu -= self.kind.eta() * (observed - self.kind.tau());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Vec<Candidate> {
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l,
            })
            .collect()
    }

    #[test]
    fn mu_starts_at_twice_tau_and_follows_the_error() {
        let mut s = MirostatState::new(Mirostat::V2 { tau: 5.0, eta: 0.1 }, 10);
        assert_eq!(s.mu, 10.0);
        // Surprise of p = 1/8 is 3 bits: error 3 − 5 = −2, mu += 0.2.
        s.update(0.125);
        assert!((s.mu - 10.2).abs() < 1e-6);
    }

    #[test]
    fn v2_keeps_tokens_within_mu_bits() {
        // Probabilities 1/2, 1/4, 1/8, 1/8: surprises 1, 2, 3, 3 bits.
        let p = [0.5, 0.25, 0.125, 0.125];
        assert_eq!(v2_keep(&p, 2.5), 2);
        assert_eq!(v2_keep(&p, 3.0), 4);
        assert_eq!(v2_keep(&p, 0.5), 1);
    }

    #[test]
    fn v1_k_of_a_zipf_distribution() {
        // p_i ∝ 1/(i+1)^s with s = 1.5: the estimate is exact, and
        // k = ((0.5 · 2^mu) / (1 − n^−0.5))^(1/1.5).
        let n = 1000usize;
        let w: Vec<f32> = (0..n).map(|i| 1.0 / ((i + 1) as f32).powf(1.5)).collect();
        let sum: f32 = w.iter().sum();
        let p: Vec<f32> = w.iter().map(|x| x / sum).collect();
        for mu in [2.0f32, 6.0, 10.0] {
            let want = ((0.5 * 2f32.powf(mu)) / (1.0 - (n as f32).powf(-0.5))).powf(1.0 / 1.5);
            let k = v1_k(&p, mu, n);
            assert!(
                (k as f32 - want.floor()).abs() <= 1.0,
                "mu {mu}: {k} vs {want}"
            );
        }
    }

    #[test]
    fn truncate_sorts_and_renormalizes() {
        let s = MirostatState::new(Mirostat::V2 { tau: 1.0, eta: 0.1 }, 4);
        // mu = 2: keeps surprises ≤ 2 bits.
        let mut c = cands(&[0.25f32.ln(), 0.5f32.ln(), 0.125f32.ln(), 0.125f32.ln()]);
        let p = s.truncate(&mut c);
        assert_eq!(c.iter().map(|x| x.id).collect::<Vec<_>>(), vec![1, 0]);
        assert!((p[0] - 2.0 / 3.0).abs() < 1e-6 && (p[1] - 1.0 / 3.0).abs() < 1e-6);
    }

    /// llama.cpp's own samplers on fixed logits (fixtures/sampling/mirostat_ref.py through
    /// llama-cpp-python): `(tau, v1 kept, v2 kept, v2's first ids, their probabilities)` on
    /// the first call (mu = 2 tau).
    #[test]
    fn first_truncation_matches_llama_cpp() {
        /// `(tau, v1 kept, v2 kept, v2's first ids, their probabilities)`.
        type Row = (f32, usize, usize, &'static [u32], &'static [f32]);
        #[rustfmt::skip]
        let want: [Row; 7] = [
            (1.0, 1, 1, &[0], &[1.0]),
            (1.5, 2, 2, &[0, 1], &[0.6588124, 0.3411876]),
            (2.0, 4, 4, &[0, 1, 2, 3], &[0.4788027, 0.2479637, 0.165607, 0.1076267]),
            (2.5, 7, 5, &[0, 1, 2, 3], &[0.4494462, 0.2327604, 0.1554532, 0.1010278]),
            (3.0, 13, 10, &[0, 1, 2, 3], &[0.3945796, 0.204346, 0.1364761, 0.0886948]),
            (4.0, 44, 29, &[0, 1, 2, 3], &[0.3333999, 0.1726621, 0.1153155, 0.0749426]),
            (5.0, 64, 64, &[0, 1, 2, 3], &[0.3075811, 0.159291, 0.1063853, 0.069139]),
        ];
        let logits: Vec<f32> = (0..64)
            .map(|i| -1.3 * ((i + 1) as f32).ln() + 0.37 * (7.0 * i as f32).sin())
            .collect();
        for (tau, k1, k2, ids, probs) in want {
            let v1 = MirostatState::new(Mirostat::V1 { tau, eta: 0.1 }, 64);
            let mut c = cands(&logits);
            v1.truncate(&mut c);
            assert_eq!(c.len(), k1, "v1 tau {tau}");
            let v2 = MirostatState::new(Mirostat::V2 { tau, eta: 0.1 }, 64);
            let mut c = cands(&logits);
            let p = v2.truncate(&mut c);
            assert_eq!(c.len(), k2, "v2 tau {tau}");
            for (i, (&id, &pr)) in ids.iter().zip(probs).enumerate() {
                assert_eq!(c[i].id, id);
                assert!(
                    (p[i] - pr).abs() < 2e-6,
                    "v2 tau {tau} p[{i}] {} vs {pr}",
                    p[i]
                );
            }
        }
    }
}
