//! Choosing the next token from logits.
//!
//! The chain and its order follow llama.cpp's default sampler (`common_sampler`):
//! penalties → DRY → top-k → typical-p → top-p → min-p → XTC → temperature → draw
//! ([`crate::dry`], [`crate::typical`], [`crate::xtc`]; llama.cpp's top-n-σ, between DRY
//! and top-k, is not implemented). Temperature ≤ 0 is greedy: the highest logit (lowest id
//! on ties) of what the chain leaves, which is the highest logit of all unless typical-p or
//! XTC removed it (llama.cpp's chain runs them before its temperature-0 step too). Every
//! random draw (XTC's coin, the draw of the token) comes from a ChaCha20 stream seeded by
//! the request, so the same seed, prompt and model give the same tokens.
//!
//! With [`SamplingParams::mirostat`] set, the chain is llama.cpp's mirostat one instead:
//! temperature → mirostat v1 or v2 ([`crate::mirostat`]) → draw, with no penalties (as
//! llama.cpp's common sampler builds it); its state (`mu`) lives in the sampler, one per
//! sequence.
//!
//! The penalties and DRY are [`LogitsProcessor`]s ([`Penalties`], [`Dry`](crate::dry::Dry)):
//! a [`SequenceDecoder`](crate::decoder::SequenceDecoder) runs them with its other
//! processors and then calls [`Sampler::sample_processed`] for the rest of the chain;
//! [`Sampler::sample`] runs the penalties and the rest for callers without a decoder (DRY
//! needs the tokenizer's breaker sequences, so only the decoder runs it).
//!
//! **Verifying drafts** ([`Sampler::verify`], speculative decoding). At a position where a
//! proposer guessed token `x`, the target distribution `p` is what this chain draws from:
//! the processed logits (bias, penalties, custom processors — run by the decoder as if the
//! drafts before this position were accepted), cut by top-k, top-p and min-p, then the
//! softmax at the temperature over what is left ([`Sampler::distribution`]). With XTC on,
//! `p` is the mixture XTC's coin makes: `P · p_xtc + (1 − P) · p_plain`, still a function
//! of the logits alone. Two rules:
//! - `x` a deterministic guess (a point mass, `q(x) = 1`: n-gram lookup, a greedy draft
//!   model): the standard rule — accept with probability `min(1, p(x)/q(x)) = p(x)`, else
//!   draw from the normalized residual `max(0, p − q)`, which is `p` without `x` — is
//!   exactly "draw `y` from `p`; accept iff `y = x`, else emit `y`": `P(y = x) = p(x)`, and
//!   given `y ≠ x`, `y` follows `p` restricted to the other tokens. So the draw is made as
//!   plain sampling makes it, with the same uniform from the same stream, and the tokens
//!   are the very tokens plain sampling gives for the seed, drafts or not.
//! - `x` drawn from a proposal distribution `q` (a sampling draft model): accept with
//!   probability `min(1, p(x)/q(x))`, using a uniform from a second ChaCha20 stream of the
//!   same seed (stream 1; draws use stream 0), else draw from `max(0, p − q)` normalized
//!   with the next uniform of the main stream. The output follows `p` exactly (Leviathan
//!   et al., "Fast Inference from Transformers via Speculative Decoding", 2023); the tokens
//!   are deterministic for a seed and a proposer, but differ from plain sampling's.
//!
//! Greedy (`p` a point mass at the highest logit): both rules accept `x` iff it is the
//! argmax, and otherwise give the argmax (with XTC on, `p` is two point masses and the
//! rules apply as for any `p`).

use crate::error::ParamError;
use crate::mirostat::{Mirostat, MirostatState};
use crate::processor::{LogitsProcessor, Penalties};
use crate::typical::typical;
use crate::xtc;
use mica_kernels::ops::{LogSoftmaxRounding, log_softmax_into};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// What the sampler does; `Default` is llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// ≤ 0 means greedy.
    pub temperature: f32,
    /// Keep the `k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `p`; 1 disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one; 0 disables.
    pub min_p: f32,
    /// Divides positive / multiplies negative logits of recently seen tokens; 1 disables.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every recently seen token; 0 disables.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from recently seen tokens' logits; 0 disables.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
    /// Mirostat v1 or v2 in place of top-k / typical-p / top-p / min-p / XTC, the
    /// penalties and DRY; `None` disables (the default).
    pub mirostat: Option<Mirostat>,
    /// Locally typical sampling's mass ([`crate::typical`]); 1 disables.
    pub typical_p: f32,
    /// XTC's chance per token of excluding the top choices ([`crate::xtc`]); 0 disables.
    pub xtc_probability: f32,
    /// XTC's threshold: the tokens at least this likely are the top choices; above 0.5
    /// disables.
    pub xtc_threshold: f32,
    /// DRY's penalty multiplier ([`crate::dry`]); 0 disables.
    pub dry_multiplier: f32,
    /// DRY's base: the penalty grows by this factor per repeated token; below 1 disables.
    pub dry_base: f32,
    /// Repeats up to this long are not penalized.
    pub dry_allowed_length: u32,
    /// How many recent tokens DRY looks at: −1 the whole history, 0 disables.
    pub dry_penalty_last_n: i32,
    /// Strings that end a repeat (matched as token sequences of the vocabulary).
    pub dry_sequence_breakers: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            mirostat: None,
            typical_p: 1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dry_multiplier: 0.0,
            dry_base: crate::dry::DEFAULT_BASE,
            dry_allowed_length: crate::dry::DEFAULT_ALLOWED_LENGTH,
            dry_penalty_last_n: crate::dry::DEFAULT_PENALTY_LAST_N,
            dry_sequence_breakers: crate::dry::default_breakers(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Whether tokens are chosen greedily (temperature ≤ 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Whether a token is chosen by taking the highest logit (greedy, with no filter that
    /// may remove the most likely token).
    pub fn takes_top(&self) -> bool {
        self.is_greedy() && !self.filters_top()
    }

    /// Whether typical-p or XTC may remove the most likely token, so that greedy choice is
    /// not simply the highest logit (never under mirostat, whose chain has neither).
    fn filters_top(&self) -> bool {
        self.mirostat.is_none()
            && (self.typical_p < 1.0 || xtc::active(self.xtc_probability, self.xtc_threshold, 2))
    }

    /// Checks ranges, naming the parameter at fault.
    pub fn validate(&self) -> Result<(), ParamError> {
        if !self.temperature.is_finite() {
            return Err(ParamError::Temperature(self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(ParamError::TopP(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(ParamError::MinP(self.min_p));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(ParamError::RepeatPenalty(self.repeat_penalty));
        }
        if !self.presence_penalty.is_finite() {
            return Err(ParamError::PresencePenalty(self.presence_penalty));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(ParamError::FrequencyPenalty(self.frequency_penalty));
        }
        if let Some(m) = self.mirostat
            && !(m.tau().is_finite() && m.tau() > 0.0 && m.eta().is_finite() && m.eta() >= 0.0)
        {
            return Err(ParamError::Mirostat {
                tau: m.tau(),
                eta: m.eta(),
            });
        }
        if !(0.0..=1.0).contains(&self.typical_p) {
            return Err(ParamError::TypicalP(self.typical_p));
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return Err(ParamError::XtcProbability(self.xtc_probability));
        }
        if !(0.0..=1.0).contains(&self.xtc_threshold) {
            return Err(ParamError::XtcThreshold(self.xtc_threshold));
        }
        if !(self.dry_multiplier.is_finite() && self.dry_multiplier >= 0.0) {
            return Err(ParamError::DryMultiplier(self.dry_multiplier));
        }
        if !(self.dry_base.is_finite() && self.dry_base >= 1.0) {
            return Err(ParamError::DryBase(self.dry_base));
        }
        if self.dry_penalty_last_n < -1 {
            return Err(ParamError::DryPenaltyLastN(self.dry_penalty_last_n));
        }
        if self.dry_sequence_breakers.iter().any(String::is_empty) {
            return Err(ParamError::DrySequenceBreakers);
        }
        Ok(())
    }
}

/// A token and its (possibly modified) logit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
}

/// A sampler with its own random stream.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    /// Acceptance tests of drafts drawn from a proposal distribution (stream 1 of the seed).
    accept_rng: ChaCha20Rng,
    cands: Vec<Candidate>,
    /// The penalties of `params` (`None` when inactive), for [`Sampler::sample`].
    penalties: Option<Penalties>,
    /// Penalized logits (`[n_vocab]`), reused by [`Sampler::sample`].
    scratch: Vec<f32>,
    /// Mirostat's running state, made on the first draw (it needs the vocabulary size).
    mirostat: Option<MirostatState>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = ChaCha20Rng::seed_from_u64(params.seed);
        let mut accept_rng = ChaCha20Rng::seed_from_u64(params.seed);
        accept_rng.set_stream(1);
        Sampler {
            penalties: Penalties::from_params(&params),
            params,
            rng,
            accept_rng,
            cands: Vec::new(),
            scratch: Vec::new(),
            mirostat: None,
        }
    }

    /// Mirostat's current threshold `mu`, once a mirostat sampler has drawn.
    pub fn mirostat_mu(&self) -> Option<f32> {
        self.mirostat.as_ref().map(|m| m.mu)
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token. `history` is every token so far (prompt and output); the
    /// penalties look at its last `penalty_last_n` entries.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let Some(pen) = &mut self.penalties else {
            return self.sample_processed(logits);
        };
        let mut l = std::mem::take(&mut self.scratch);
        l.clear();
        l.extend_from_slice(logits);
        pen.process(history, &mut l);
        let t = self.sample_processed(&l);
        self.scratch = l;
        t
    }

    /// The chain after the penalties and DRY (top-k → typical-p → top-p → min-p → XTC →
    /// temperature → draw; greedy: the highest logit left), for logits that processors
    /// have already adjusted.
    pub fn sample_processed(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.takes_top() {
            return argmax(logits);
        }
        self.cands.clear();
        if let Some(kind) = p.mirostat {
            return self.sample_mirostat(kind, logits);
        }
        self.cands
            .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l,
            }));
        truncate(&mut self.cands, p);
        if xtc::active(p.xtc_probability, p.xtc_threshold, self.cands.len()) {
            let coin: f32 = self.rng.random();
            if coin <= p.xtc_probability {
                let cut = xtc::cut(&self.cands, p.xtc_threshold, MIN_KEEP);
                self.cands.drain(..cut);
            }
        }
        if p.is_greedy() {
            return self.cands[0].id;
        }
        let u: f64 = self.rng.random();
        draw(&self.cands, p.temperature, u)
    }

    /// The distribution [`Sampler::sample_processed`] draws from for processed `logits`:
    /// the candidates left by top-k, typical-p, top-p and min-p, most likely first, with
    /// their probabilities at the temperature (summing to 1); with XTC on, the mixture of
    /// that and the distribution after XTC's cut, weighted by XTC's probability. Greedy:
    /// the highest logit left with probability 1 (two point masses under XTC).
    pub fn distribution(&mut self, logits: &[f32]) -> Vec<(u32, f64)> {
        let p = &self.params;
        if p.takes_top() {
            return vec![(argmax(logits), 1.0)];
        }
        self.cands.clear();
        self.cands
            .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l,
            }));
        truncate(&mut self.cands, p);
        let of = |c: &[Candidate]| -> Vec<f64> {
            if p.is_greedy() {
                let mut v = vec![0.0; c.len()];
                v[0] = 1.0;
                v
            } else {
                softmax(c, p.temperature)
            }
        };
        let mut probs = of(&self.cands);
        if xtc::active(p.xtc_probability, p.xtc_threshold, self.cands.len()) {
            let cut = xtc::cut(&self.cands, p.xtc_threshold, MIN_KEEP);
            if cut > 0 {
                let w = p.xtc_probability as f64;
                let after = of(&self.cands[cut..]);
                for (i, pr) in probs.iter_mut().enumerate() {
                    *pr = (1.0 - w) * *pr + i.checked_sub(cut).map_or(0.0, |j| w * after[j]);
                }
            }
        }
        let d = self.cands.iter().map(|c| c.id).zip(probs);
        if p.is_greedy() {
            // The point masses only.
            return d.filter(|c| c.1 > 0.0).collect();
        }
        d.collect()
    }

    /// The token at a position where `draft` was proposed, from the position's processed
    /// `logits` (module docs): `draft` itself when it is accepted, else a token drawn from
    /// the residual. `q` is the distribution `draft` was drawn from, `None` for a
    /// deterministic guess. Consumes the random draws the rule needs, so calling it at
    /// every drafted position in order (and [`Sampler::sample_processed`] after the last)
    /// keeps the stream deterministic.
    pub fn verify(&mut self, logits: &[f32], draft: u32, q: Option<&[(u32, f32)]>) -> u32 {
        let Some(q) = q else {
            // A point mass: draw as plain sampling does; the caller accepts iff it is `draft`.
            return self.sample_processed(logits);
        };
        if self.params.takes_top() {
            return argmax(logits);
        }
        let p = self.distribution(logits);
        let p_of = |t: u32| p.iter().find(|c| c.0 == t).map_or(0.0, |c| c.1);
        let q_of = |t: u32| q.iter().find(|c| c.0 == t).map_or(0.0, |c| c.1 as f64);
        let (px, qx) = (p_of(draft), q_of(draft));
        let u: f64 = self.accept_rng.random();
        if qx > 0.0 && u * qx < px {
            return draft;
        }
        // Rejected: draw from max(0, p − q), normalized (zero wherever p is).
        let residual: Vec<(u32, f64)> = p
            .iter()
            .map(|&(t, pt)| (t, (pt - q_of(t)).max(0.0)))
            .collect();
        let total: f64 = residual.iter().map(|r| r.1).sum();
        let u: f64 = self.rng.random();
        if total <= 0.0 {
            // p ≤ q everywhere yet `draft` was rejected: only by rounding; p itself.
            return draw_probs(&p, u);
        }
        draw_probs(&residual, u * total)
    }

    /// Temperature, then mirostat's truncation, a draw, and the update of `mu`.
    fn sample_mirostat(&mut self, kind: Mirostat, logits: &[f32]) -> u32 {
        let t = self.params.temperature;
        self.cands
            .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l / t,
            }));
        let state = self
            .mirostat
            .get_or_insert_with(|| MirostatState::new(kind, logits.len()));
        let probs = state.truncate(&mut self.cands);
        let u: f32 = self.rng.random();
        let mut cum = 0.0f32;
        let mut idx = probs.len() - 1;
        for (i, &pr) in probs.iter().enumerate() {
            cum += pr;
            if u < cum {
                idx = i;
                break;
            }
        }
        state.update(probs[idx]);
        self.cands[idx].id
    }

    /// The candidates left after penalties and truncation (top-k, typical-p, top-p, min-p),
    /// most likely first: the set a draw is made from when XTC does not act. For tests and
    /// diagnostics.
    pub fn candidates(&mut self, logits: &[f32], history: &[u32]) -> Vec<Candidate> {
        let mut l = logits.to_vec();
        if let Some(pen) = &mut self.penalties {
            pen.process(history, &mut l);
        }
        let mut c: Vec<Candidate> = l
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l,
            })
            .collect();
        truncate(&mut c, &self.params);
        c
    }
}

/// Highest logit, lowest id on ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// llama.cpp's `min_keep` for typical-p and XTC (its default: 0, so at least one token).
const MIN_KEEP: usize = 0;

/// Sorts descending and applies top-k, typical-p, top-p and min-p, always keeping at least
/// one token.
fn truncate(c: &mut Vec<Candidate>, p: &SamplingParams) {
    let by_logit = |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
    if p.top_k > 0 && p.top_k < c.len() {
        c.select_nth_unstable_by(p.top_k - 1, by_logit);
        c.truncate(p.top_k);
    }
    c.sort_unstable_by(by_logit);
    typical(c, p.typical_p, MIN_KEEP);
    if p.top_p < 1.0 {
        let probs = softmax(c, 1.0);
        let mut cum = 0.0;
        let mut keep = c.len();
        for (i, pr) in probs.iter().enumerate() {
            cum += pr;
            if cum >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep.max(1));
    }
    if p.min_p > 0.0 {
        // p_i ≥ min_p · p_max  ⇔  logit_i ≥ logit_max + ln(min_p)
        let floor = c[0].logit + p.min_p.ln();
        let keep = c.iter().take_while(|x| x.logit >= floor).count();
        c.truncate(keep.max(1));
    }
}

/// Probabilities of the candidates at temperature `t` (f64 for a stable sum).
fn softmax(c: &[Candidate], t: f32) -> Vec<f64> {
    let max = c.iter().map(|x| x.logit).fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = c
        .iter()
        .map(|x| ((x.logit as f64 - max) / t as f64).exp())
        .collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// Draws from the candidates at temperature `t` with a uniform `u` in [0, 1).
fn draw(c: &[Candidate], t: f32, u: f64) -> u32 {
    let probs = softmax(c, t);
    let mut cum = 0.0;
    for (x, p) in c.iter().zip(&probs) {
        cum += p;
        if u < cum {
            return x.id;
        }
    }
    c[c.len() - 1].id
}

/// Draws from `(token, weight)` pairs with `u` in `[0, total weight)`.
pub(crate) fn draw_probs(w: &[(u32, f64)], u: f64) -> u32 {
    let mut cum = 0.0;
    for &(t, p) in w {
        cum += p;
        if u < cum && p > 0.0 {
            return t;
        }
    }
    w.iter()
        .rev()
        .find(|c| c.1 > 0.0)
        .map_or(w[w.len() - 1].0, |c| c.0)
}

/// Natural-log softmax over the whole vocabulary (for reporting log-probabilities).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; logits.len()];
    log_softmax_into(logits, LogSoftmaxRounding::ExpF64, &mut out);
    out
}

/// A fresh seed for a run that asked for none: the process's random hasher over the clock,
/// kept below 2^63 so it round-trips through signed JSON integers.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    RandomState::new().hash_one(nanos) >> 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        // Token i has logit ln(weight_i): probabilities proportional to these weights.
        [40.0f32, 20.0, 15.0, 10.0, 8.0, 4.0, 2.0, 1.0]
            .iter()
            .map(|w| w.ln())
            .collect()
    }

    fn ids(c: &[Candidate]) -> Vec<u32> {
        c.iter().map(|x| x.id).collect()
    }

    #[test]
    fn greedy_takes_the_highest_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let l = logits();
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams {
                seed,
                temperature: 1.5,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..Default::default()
            });
            (0..64).map(|_| s.sample(&l, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn top_k_keeps_exactly_k() {
        let mut s = Sampler::new(SamplingParams {
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        });
        assert_eq!(ids(&s.candidates(&logits(), &[])), vec![0, 1, 2]);
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        // Weights sum to 100: cumulative 0.40, 0.60, 0.75, 0.85, 0.93, ...
        let mk = |top_p| {
            let mut s = Sampler::new(SamplingParams {
                top_k: 0,
                top_p,
                min_p: 0.0,
                ..Default::default()
            });
            ids(&s.candidates(&logits(), &[]))
        };
        assert_eq!(mk(0.59), vec![0, 1]);
        assert_eq!(mk(0.61), vec![0, 1, 2]);
        assert_eq!(mk(0.84), vec![0, 1, 2, 3]);
        assert_eq!(mk(0.01), vec![0]);
    }

    #[test]
    fn min_p_drops_tokens_below_the_fraction_of_the_best() {
        let mk = |min_p| {
            let mut s = Sampler::new(SamplingParams {
                top_k: 0,
                top_p: 1.0,
                min_p,
                ..Default::default()
            });
            ids(&s.candidates(&logits(), &[]))
        };
        // p_max = 0.40: min_p 0.25 keeps p ≥ 0.10 (weights ≥ 10).
        assert_eq!(mk(0.25), vec![0, 1, 2, 3]);
        assert_eq!(mk(0.5), vec![0, 1]);
        assert_eq!(mk(1.0), vec![0]);
    }

    #[test]
    fn draws_only_from_the_truncated_set_and_follow_probabilities() {
        let mut s = Sampler::new(SamplingParams {
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            seed: 9,
            ..Default::default()
        });
        let l = logits();
        let mut counts = [0usize; 8];
        for _ in 0..6000 {
            counts[s.sample(&l, &[]) as usize] += 1;
        }
        assert_eq!(counts[2..].iter().sum::<usize>(), 0);
        // 40 : 20 → token 0 about two thirds of the time.
        let frac = counts[0] as f64 / 6000.0;
        assert!((frac - 2.0 / 3.0).abs() < 0.03, "{frac}");
    }

    #[test]
    fn penalties_follow_llama_cpp() {
        let p = SamplingParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let mut s = Sampler::new(p);
        let c = s.candidates(&[2.0, -2.0, 1.0], &[0, 1, 1]);
        let get = |id| c.iter().find(|x| x.id == id).unwrap().logit;
        assert_eq!(get(0), 2.0 / 2.0 - 0.5 - 0.25);
        assert_eq!(get(1), -2.0 * 2.0 - 1.0 - 0.25);
        assert_eq!(get(2), 1.0);
    }

    #[test]
    fn log_softmax_normalizes() {
        let ls = log_softmax(&logits());
        let s: f64 = ls.iter().map(|&l| (l as f64).exp()).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!((ls[0] - 0.4f32.ln()).abs() < 1e-5);
    }

    #[test]
    fn validation_names_the_parameter() {
        let p = SamplingParams {
            top_p: 1.5,
            ..Default::default()
        };
        let err = p.validate().unwrap_err();
        assert!(err.to_string().contains("top-p"));
        assert_eq!(err.param(), crate::error::Param::TopP);
        assert!(SamplingParams::default().validate().is_ok());
    }

    /// Weights 40 20 15 10 8 4 2 1 (`logits()`). Typical-p 0.3: entropy
    /// H = Σ −p ln p = 1.6585; |−ln p − H| is 0.049 for token 1 (p 0.2) and 0.239 for
    /// token 2 (0.15), the two nearest, whose mass 0.35 passes 0.3: {1, 2} are kept, and
    /// greedy takes token 1. XTC with threshold 0.12: tokens 0, 1, 2 reach it, all but
    /// token 2 go, and greedy takes token 2 when the coin (probability `P`) says so.
    #[test]
    fn greedy_takes_the_best_token_typical_p_and_xtc_leave() {
        let l = logits();
        let greedy = |typical_p, xtc_probability, seed| SamplingParams {
            typical_p,
            xtc_probability,
            xtc_threshold: 0.12,
            seed,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(greedy(0.3, 0.0, 0));
        assert_eq!(s.sample(&l, &[]), 1);
        assert_eq!(s.distribution(&l), vec![(1, 1.0)]);
        let mut s = Sampler::new(greedy(1.0, 1.0, 0));
        assert_eq!(s.sample(&l, &[]), 2);
        let run = |seed| {
            let mut s = Sampler::new(greedy(1.0, 0.5, seed));
            (0..400).map(|_| s.sample(&l, &[])).collect::<Vec<_>>()
        };
        let a = run(5);
        assert_eq!(a, run(5), "seeded");
        assert_ne!(a, run(6));
        let twos = a.iter().filter(|&&t| t == 2).count();
        assert_eq!(a.iter().filter(|&&t| t == 0).count() + twos, 400);
        assert!((150..250).contains(&twos), "{twos} of 400");
        // The verification distribution: two point masses.
        let mut s = Sampler::new(greedy(1.0, 0.5, 0));
        let d = s.distribution(&l);
        let mass = |t| d.iter().find(|c| c.0 == t).map_or(0.0, |c| c.1);
        assert_eq!((mass(0), mass(2), mass(1)), (0.5, 0.5, 0.0));
    }

    #[test]
    fn validation_names_the_new_parameters() {
        let bad = [
            SamplingParams {
                typical_p: 1.5,
                ..Default::default()
            },
            SamplingParams {
                xtc_probability: -0.1,
                ..Default::default()
            },
            SamplingParams {
                xtc_threshold: 2.0,
                ..Default::default()
            },
            SamplingParams {
                dry_multiplier: -1.0,
                ..Default::default()
            },
            SamplingParams {
                dry_base: 0.5,
                ..Default::default()
            },
            SamplingParams {
                dry_penalty_last_n: -2,
                ..Default::default()
            },
            SamplingParams {
                dry_sequence_breakers: vec![String::new()],
                ..Default::default()
            },
        ];
        let names: Vec<&str> = bad
            .iter()
            .map(|p| p.validate().unwrap_err().param().as_str())
            .collect();
        assert_eq!(
            names,
            [
                "typical_p",
                "xtc_probability",
                "xtc_threshold",
                "dry_multiplier",
                "dry_base",
                "dry_penalty_last_n",
                "dry_sequence_breakers"
            ]
        );
    }

    /// The chain as it was before the penalties became a processor: penalties applied to
    /// the candidates, then greedy `best` or truncation and a draw.
    fn reference_sample(p: &SamplingParams, rng: &mut ChaCha20Rng, l: &[f32], h: &[u32]) -> u32 {
        let mut c: Vec<Candidate> = l
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l,
            })
            .collect();
        let recent = &h[h.len().saturating_sub(p.penalty_last_n)..];
        let mut counts = std::collections::HashMap::<u32, u32>::new();
        for &t in recent {
            *counts.entry(t).or_default() += 1;
        }
        for cand in c.iter_mut() {
            let Some(&n) = counts.get(&cand.id) else {
                continue;
            };
            if cand.logit <= 0.0 {
                cand.logit *= p.repeat_penalty;
            } else {
                cand.logit /= p.repeat_penalty;
            }
            cand.logit -= n as f32 * p.frequency_penalty + p.presence_penalty;
        }
        if p.temperature <= 0.0 {
            let mut b = c[0];
            for &x in &c {
                if x.logit > b.logit || (x.logit == b.logit && x.id < b.id) {
                    b = x;
                }
            }
            return b.id;
        }
        truncate(&mut c, p);
        let u: f64 = rng.random();
        draw(&c, p.temperature, u)
    }

    #[test]
    fn penalties_as_a_processor_give_the_chain_s_tokens() {
        for temperature in [0.0, 0.7] {
            let p = SamplingParams {
                temperature,
                repeat_penalty: 1.3,
                presence_penalty: 0.4,
                frequency_penalty: 0.2,
                penalty_last_n: 16,
                seed: 21,
                ..Default::default()
            };
            let mut s = Sampler::new(p.clone());
            let mut rng = ChaCha20Rng::seed_from_u64(p.seed);
            let mut noise = ChaCha20Rng::seed_from_u64(5);
            let mut history: Vec<u32> = vec![3, 3, 7];
            for _ in 0..300 {
                // Peaked logits over 64 tokens, some negative.
                let l: Vec<f32> = (0..64).map(|_| noise.random::<f32>() * 6.0 - 2.0).collect();
                let want = reference_sample(&p, &mut rng, &l, &history);
                assert_eq!(s.sample(&l, &history), want);
                history.push(want);
            }
        }
    }

    #[test]
    fn mirostat_is_seeded_moves_mu_and_ignores_the_penalties() {
        use crate::mirostat::Mirostat;
        let l: Vec<f32> = (0..64).map(|i| -1.3 * ((i + 1) as f32).ln()).collect();
        let run = |seed, kind| {
            let mut s = Sampler::new(SamplingParams {
                seed,
                temperature: 1.0,
                mirostat: Some(kind),
                repeat_penalty: 5.0,
                ..Default::default()
            });
            let toks: Vec<u32> = (0..200).map(|_| s.sample(&l, &[0, 0, 0])).collect();
            (toks, s.mirostat_mu().unwrap())
        };
        for kind in [
            Mirostat::V1 { tau: 3.0, eta: 0.1 },
            Mirostat::V2 { tau: 3.0, eta: 0.1 },
        ] {
            let (a, mu) = run(7, kind);
            assert_eq!(a, run(7, kind).0);
            assert_ne!(a, run(8, kind).0);
            assert_ne!(mu, 6.0, "mu never moved");
            // Token 0 is the most likely; a repeat penalty of 5 would have all but removed it.
            assert!(a.iter().filter(|&&t| t == 0).count() > 20);
        }
    }
}
