//! XTC, "exclude top choices" (p-e-w's sampler from text-generation-webui), as llama.cpp's
//! `llama_sampler_xtc` computes it: with probability `xtc_probability` per token, every
//! candidate whose probability (softmax at temperature 1 of the candidates left by the
//! truncations before it, f32) is at least `xtc_threshold` is removed except the least
//! likely of them, so the model moves off its most predictable continuations while keeping
//! one viable choice. Nothing is removed when fewer than two candidates reach the
//! threshold, when the cut would leave fewer than `min_keep`, or when the threshold is above
//! 0.5 (two tokens cannot both reach it).
//!
//! The coin is drawn from the sequence's seeded stream only when XTC can act (probability
//! above 0, threshold at most 0.5, at least two candidates), as llama.cpp draws it; XTC
//! applies when the uniform draw is at most the probability.

use crate::sampler::Candidate;

/// Whether XTC draws its coin for `n` candidates.
pub fn active(probability: f32, threshold: f32, n: usize) -> bool {
    probability > 0.0 && threshold <= 0.5 && n >= 2
}

/// How many of the most likely candidates of `c` (sorted by logit, descending) XTC removes
/// when it applies: all those at or above `threshold` but the last, or 0.
pub fn cut(c: &[Candidate], threshold: f32, min_keep: usize) -> usize {
    let Some(first) = c.first() else {
        return 0;
    };
    let e: Vec<f32> = c.iter().map(|x| (x.logit - first.logit).exp()).collect();
    let sum: f32 = e.iter().sum();
    let above = e.iter().take_while(|&&x| x / sum >= threshold).count();
    let last = above.saturating_sub(1);
    if last > 0 && c.len() - last >= min_keep {
        last
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(probs: &[f32]) -> Vec<Candidate> {
        probs
            .iter()
            .enumerate()
            .map(|(i, &p)| Candidate {
                id: i as u32,
                logit: p.ln(),
            })
            .collect()
    }

    /// Probabilities 0.4, 0.3, 0.15, 0.1, 0.05 (already normalized, so the softmax gives
    /// them back).
    #[test]
    fn removes_all_but_the_least_likely_above_the_threshold() {
        let c = cands(&[0.4, 0.3, 0.15, 0.1, 0.05]);
        // ≥ 0.09: tokens 0..=3 (pos_last 3): the three above token 3 go.
        assert_eq!(cut(&c, 0.09, 0), 3);
        // ≥ 0.2: tokens 0, 1: token 0 goes, token 1 stays.
        assert_eq!(cut(&c, 0.2, 0), 1);
        // ≥ 0.35: only token 0 reaches it: nothing to exclude.
        assert_eq!(cut(&c, 0.35, 0), 0);
        // min_keep: cutting 3 leaves 2; min_keep 3 forbids it.
        assert_eq!(cut(&c, 0.09, 2), 3);
        assert_eq!(cut(&c, 0.09, 3), 0);
        // Everything at or above 0.04: all but the last go.
        assert_eq!(cut(&c, 0.04, 0), 4);
        assert!(active(0.5, 0.1, 2));
        assert!(!active(0.0, 0.1, 5), "probability 0 is off");
        assert!(!active(1.0, 0.51, 5), "threshold above 0.5 is off");
        assert!(!active(1.0, 0.1, 1), "one candidate");
    }
}
