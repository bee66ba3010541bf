//! Speculative sampling keeps the target's distribution: a synthetic model over a
//! 7-token vocabulary drives a `SequenceDecoder` under a full sampler chain (repeat
//! penalty, top-k, top-p, min-p, temperature; and a second chain adding DRY, typical-p and
//! XTC, whose random coin makes the target a mixture), with drafts from a deterministic guesser
//! (point masses) and from a sampling proposer with its own distribution `q`; the first
//! three generated tokens of many seeded runs are compared with the exact distribution of
//! three plainly sampled tokens (enumerated through the same chain) by a chi-square test.
//!
//! False-failure rate: each test rejects at significance 1e-4 (Wilson–Hilferty critical
//! value), so a correct implementation fails a fresh choice of seeds with probability about
//! 1e-4 per test; the seeds are fixed, so the outcome is deterministic. The test's power is
//! shown by the same statistic rejecting a wrong rule (drafts accepted without
//! verification).

use mica_engine::dry::Dry;
use mica_engine::sampler::Sampler;
use mica_engine::{GenerateParams, LogitsProcessor, Penalties, SamplingParams, SequenceDecoder};
use mica_models::tokenizer::{Tokenizer, TokenizerSpec};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::collections::HashMap;

const V: usize = 7;
/// Generated tokens compared per run.
const L: usize = 3;
const RUNS: u64 = 30_000;
/// Standard normal quantile of 1 − 1e-4.
const Z: f64 = 3.719;

fn tokenizer() -> Tokenizer {
    let tokens = ["<|end|>", "a", "b", "c", "Ġ", "x", "y"];
    let mut types = vec![1; V];
    types[0] = 3;
    Tokenizer::from_spec(&TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens: tokens.iter().map(|s| s.to_string()).collect(),
        token_types: Some(types),
        merges: Some(Vec::new()),
        eos_id: Some(0),
        ..TokenizerSpec::default()
    })
    .unwrap()
}

/// The synthetic model: logits of the next token from the last two.
fn model(history: &[u32]) -> Vec<f32> {
    let (a, b) = (history[history.len() - 2], history[history.len() - 1]);
    (0..V as u32)
        .map(|t| ((a * 5 + b * 3 + t * 7) % 13) as f32 * 0.35 - 1.0)
        .collect()
}

/// Which sampler chain a run uses.
#[derive(Clone, Copy)]
enum Chain {
    /// Repeat penalty, top-k, top-p, min-p, temperature.
    Base,
    /// The base chain with DRY, typical-p and XTC.
    Extended,
}

fn params(seed: u64, chain: Chain) -> GenerateParams {
    let base = SamplingParams {
        temperature: 0.8,
        top_k: 5,
        top_p: 0.9,
        min_p: 0.05,
        repeat_penalty: 1.3,
        penalty_last_n: 8,
        seed,
        ..Default::default()
    };
    let sampling = match chain {
        Chain::Base => base,
        Chain::Extended => SamplingParams {
            typical_p: 0.9,
            xtc_probability: 0.5,
            xtc_threshold: 0.15,
            dry_multiplier: 0.8,
            dry_allowed_length: 1,
            ..base
        },
    };
    GenerateParams {
        max_tokens: 64,
        ignore_eos: true,
        sampling,
        ..Default::default()
    }
}

const PROMPT: [u32; 2] = [1, 2];

/// The target's next-token distribution after `history`: the chain's penalties and DRY,
/// then truncation (XTC's mixture) and temperature.
fn target(history: &[u32], chain: Chain) -> Vec<(u32, f64)> {
    let p = params(0, chain).sampling;
    let mut logits = model(history);
    if let Some(mut pen) = Penalties::from_params(&p) {
        pen.process(history, &mut logits);
    }
    if let Some(mut dry) = Dry::from_tokenizer(&p, &tokenizer()) {
        dry.process(history, &mut logits);
    }
    Sampler::new(p).distribution(&logits)
}

/// Exact probabilities of the first `L` generated tokens.
fn exact(chain: Chain) -> HashMap<Vec<u32>, f64> {
    let mut out = HashMap::new();
    let mut stack = vec![(PROMPT.to_vec(), 1.0)];
    while let Some((h, pr)) = stack.pop() {
        if h.len() == PROMPT.len() + L {
            out.insert(h[PROMPT.len()..].to_vec(), pr);
            continue;
        }
        for (t, p) in target(&h, chain) {
            let mut h2 = h.clone();
            h2.push(t);
            stack.push((h2, pr * p));
        }
    }
    out
}

/// How a run drafts.
#[derive(Clone, Copy)]
enum Drafts {
    None,
    /// Deterministic guesses: the token after the last, cyclically, three at a time.
    Points,
    /// Three tokens sampled from a proposal `q` (softmax of other logits).
    Sampled,
    /// Sampled proposals accepted without verification (a wrong rule).
    Unverified,
}

/// The proposal distribution of [`Drafts::Sampled`] after `history`.
fn proposal(history: &[u32]) -> Vec<(u32, f32)> {
    let b = history[history.len() - 1];
    let w: Vec<f32> = (0..V as u32)
        .map(|t| (((t + b) % 4) as f32 * 0.6).exp())
        .collect();
    let s: f32 = w.iter().sum();
    (0..V as u32).map(|t| (t, w[t as usize] / s)).collect()
}

/// The first `L` generated tokens of the run with `seed`.
fn run(tok: &Tokenizer, seed: u64, drafts: Drafts, chain: Chain) -> Vec<u32> {
    let mut d = SequenceDecoder::new(tok, &params(seed, chain), &PROMPT, 1000);
    let mut q_rng = ChaCha20Rng::seed_from_u64(seed ^ 0xABCD_EF01_2345_6789);
    let mut out = Vec::new();
    while d.generated().len() < L {
        let mut h = d.history().to_vec();
        let (mut tokens, mut dists) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = match drafts {
                Drafts::None => break,
                Drafts::Points => (h[h.len() - 1] + 1) % V as u32,
                Drafts::Sampled | Drafts::Unverified => {
                    let q = proposal(&h);
                    let u: f32 = q_rng.random();
                    let mut cum = 0.0;
                    let t = q
                        .iter()
                        .find(|c| {
                            cum += c.1;
                            u < cum
                        })
                        .map_or(q[V - 1].0, |c| c.0);
                    dists.push(q);
                    t
                }
            };
            tokens.push(t);
            h.push(t);
        }
        if let Drafts::Unverified = drafts {
            for &t in &tokens {
                d.commit(t);
            }
            continue;
        }
        // The model's rows at the last token and at each drafted one.
        let mut rows = Vec::new();
        let mut h = d.history().to_vec();
        rows.extend(model(&h));
        for &t in &tokens {
            h.push(t);
            rows.extend(model(&h));
        }
        d.choose_with(&rows, &tokens, &dists, &mut out);
        for &t in &out {
            d.commit(t);
        }
    }
    d.generated()[..L].to_vec()
}

/// Chi-square statistic of `counts` against `probs` (cells expected under 5 pooled) and
/// its critical value at significance 1e-4.
fn chi_square(counts: &HashMap<Vec<u32>, u64>, probs: &HashMap<Vec<u32>, f64>) -> (f64, f64) {
    let n = RUNS as f64;
    let (mut stat, mut df) = (0.0, 0usize);
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (cell, &p) in probs {
        let o = counts.get(cell).copied().unwrap_or(0) as f64;
        let e = p * n;
        if e < 5.0 {
            pooled_obs += o;
            pooled_exp += e;
        } else {
            stat += (o - e) * (o - e) / e;
            df += 1;
        }
    }
    if pooled_exp > 0.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(1e-9);
        df += 1;
    }
    // Outcomes the target cannot produce count against the rule with any frequency.
    let impossible: u64 = counts
        .iter()
        .filter(|(c, _)| !probs.contains_key(*c))
        .map(|(_, &o)| o)
        .sum();
    stat += impossible as f64 * 1e6;
    let df = (df - 1) as f64;
    let k = 2.0 / (9.0 * df);
    (stat, df * (1.0 - k + Z * k.sqrt()).powi(3))
}

fn check(drafts: Drafts, chain: Chain) -> (f64, f64) {
    let tok = tokenizer();
    let probs = exact(chain);
    let total: f64 = probs.values().sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "the exact distribution sums to {total}"
    );
    let mut counts = HashMap::new();
    for seed in 0..RUNS {
        *counts.entry(run(&tok, seed, drafts, chain)).or_insert(0u64) += 1;
    }
    let (stat, crit) = chi_square(&counts, &probs);
    println!(
        "chi-square {stat:.1}, critical value {crit:.1} ({} cells)",
        probs.len()
    );
    (stat, crit)
}

#[test]
fn plain_sampling_follows_the_chain() {
    let (stat, crit) = check(Drafts::None, Chain::Base);
    assert!(stat < crit, "chi-square {stat:.1} ≥ {crit:.1}");
}

#[test]
fn point_mass_drafts_keep_the_distribution_and_plain_tokens() {
    let (stat, crit) = check(Drafts::Points, Chain::Base);
    assert!(stat < crit, "chi-square {stat:.1} ≥ {crit:.1}");
    // The draws are plain sampling's, seed for seed.
    let tok = tokenizer();
    for seed in 0..200 {
        assert_eq!(
            run(&tok, seed, Drafts::Points, Chain::Base),
            run(&tok, seed, Drafts::None, Chain::Base)
        );
    }
}

#[test]
fn sampled_drafts_keep_the_distribution() {
    let (stat, crit) = check(Drafts::Sampled, Chain::Base);
    assert!(stat < crit, "chi-square {stat:.1} ≥ {crit:.1}");
    // Deterministic for a seed.
    let tok = tokenizer();
    for seed in 0..50 {
        assert_eq!(
            run(&tok, seed, Drafts::Sampled, Chain::Base),
            run(&tok, seed, Drafts::Sampled, Chain::Base)
        );
    }
}

#[test]
fn the_test_rejects_unverified_drafts() {
    let (stat, crit) = check(Drafts::Unverified, Chain::Base);
    assert!(
        stat > crit,
        "a wrong rule passed: chi-square {stat:.1} < {crit:.1}"
    );
}

/// DRY, typical-p and XTC: plain sampling follows the exact mixture the verification uses,
/// point-mass drafts give plain sampling's tokens seed for seed (XTC's coin drawn from the
/// same stream at the same time), and sampled drafts keep the distribution.
#[test]
fn dry_typical_and_xtc_fit_the_verification_rule() {
    let (stat, crit) = check(Drafts::None, Chain::Extended);
    assert!(stat < crit, "plain: chi-square {stat:.1} ≥ {crit:.1}");
    let (stat, crit) = check(Drafts::Points, Chain::Extended);
    assert!(stat < crit, "points: chi-square {stat:.1} ≥ {crit:.1}");
    let (stat, crit) = check(Drafts::Sampled, Chain::Extended);
    assert!(stat < crit, "sampled: chi-square {stat:.1} ≥ {crit:.1}");
    let tok = tokenizer();
    for seed in 0..200 {
        assert_eq!(
            run(&tok, seed, Drafts::Points, Chain::Extended),
            run(&tok, seed, Drafts::None, Chain::Extended)
        );
    }
    // The extended chain is another distribution than the base one.
    let (stat, crit) = check(Drafts::None, Chain::Base);
    assert!(stat < crit);
    let (ext, base) = (exact(Chain::Extended), exact(Chain::Base));
    let diff: f64 = base
        .iter()
        .map(|(c, p)| (p - ext.get(c).copied().unwrap_or(0.0)).abs())
        .sum();
    assert!(diff > 0.1, "total variation {diff}");
}
