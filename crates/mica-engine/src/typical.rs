//! Locally typical sampling (Meister et al. 2022, "Locally Typical Sampling"), as llama.cpp's
//! `llama_sampler_typical` computes it: with `p_i` the softmax of the candidates (f32, as
//! llama.cpp's `llama_sampler_softmax_impl`) and `H = −Σ p_i ln p_i` their entropy, the
//! candidates are ranked by how far their surprise is from the entropy, `|−ln p_i − H|`,
//! and the closest are kept until their probabilities add up to more than `typical_p` (and
//! at least `min_keep` are kept). `typical_p` ≥ 1 changes nothing.
//!
//! The kept candidates come back sorted by logit (descending, lowest id on ties), the order
//! the rest of mica's chain works in. Tokens of probability exactly 0 (an `exp` that
//! underflowed) add nothing to the entropy here, where llama.cpp's `0 · ln 0` makes it NaN.

use crate::sampler::Candidate;

/// Keeps the locally typical candidates of `c` (any order) for mass `p`.
pub fn typical(c: &mut Vec<Candidate>, p: f32, min_keep: usize) {
    if p >= 1.0 || c.is_empty() {
        return;
    }
    let probs = crate::mirostat::softmax_sorted(c);
    let entropy: f32 = probs
        .iter()
        .filter(|&&x| x > 0.0)
        .map(|&x| -x * x.ln())
        .sum();
    let shifted: Vec<f32> = probs.iter().map(|&x| (-x.ln() - entropy).abs()).collect();
    let mut order: Vec<usize> = (0..c.len()).collect();
    order.sort_by(|&a, &b| shifted[a].total_cmp(&shifted[b]));
    let mut cum = 0.0f32;
    let mut keep = order.len();
    for (i, &idx) in order.iter().enumerate() {
        cum += probs[idx];
        if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
            keep = i + 1;
            break;
        }
    }
    let mut kept: Vec<Candidate> = order[..keep].iter().map(|&i| c[i]).collect();
    kept.sort_unstable_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
    *c = kept;
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

    fn ids(c: &[Candidate]) -> Vec<u32> {
        c.iter().map(|x| x.id).collect()
    }

    /// Probabilities 0.5, 0.2, 0.15, 0.1, 0.05. Entropy
    /// H = −(0.5 ln 0.5 + 0.2 ln 0.2 + 0.15 ln 0.15 + 0.1 ln 0.1 + 0.05 ln 0.05)
    ///   = 0.34657 + 0.32189 + 0.28457 + 0.23026 + 0.14979 = 1.33308.
    /// Surprises −ln p: 0.69315, 1.60944, 1.89712, 2.30259, 2.99573; their distances to H:
    /// 0.63993, 0.27636, 0.56404, 0.96951, 1.66265. Typical order: 1, 2, 0, 3, 4 with
    /// cumulative mass 0.2, 0.35, 0.85, 0.95, 1.0.
    #[test]
    fn keeps_the_tokens_nearest_the_entropy_until_the_mass_passes_p() {
        let probs = [0.5, 0.2, 0.15, 0.1, 0.05];
        let run = |p, min_keep| {
            let mut c = cands(&probs);
            typical(&mut c, p, min_keep);
            ids(&c)
        };
        assert_eq!(run(0.1, 0), vec![1], "0.2 > 0.1 at once");
        assert_eq!(run(0.3, 0), vec![1, 2], "0.35 > 0.3");
        // The most likely token is not the most typical one: it comes in third.
        assert_eq!(run(0.5, 0), vec![0, 1, 2], "0.85 > 0.5; sorted by logit");
        assert_eq!(run(0.9, 0), vec![0, 1, 2, 3]);
        assert_eq!(run(0.99, 0), vec![0, 1, 2, 3, 4]);
        assert_eq!(run(1.0, 0), vec![0, 1, 2, 3, 4], "1 disables");
        assert_eq!(run(0.1, 4), vec![0, 1, 2, 3], "min_keep 4");
        let mut c = cands(&probs);
        c.reverse();
        typical(&mut c, 0.3, 0);
        assert_eq!(ids(&c), vec![1, 2], "input order does not matter");
    }
}
