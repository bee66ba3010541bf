//! Adaptive draft length: [`Adaptive`] wraps any proposer and asks it for as many tokens as
//! pay off, given how often its drafts have been accepted lately and what a drafted token
//! costs; where nothing pays (a proposer that keeps guessing wrong, or a step so full of
//! other sequences that it no longer runs at the memory-bandwidth wall) it drafts nothing,
//! probing again now and then.
//!
//! The model (as in the analysis of Leviathan et al., 2023, with a measured cost):
//! - **acceptance**: each drafted token is accepted with probability `α` once the ones
//!   before it were; `α` is estimated from the drafts' outcomes (accepted runs and the
//!   rejection that ends them), with exponential forgetting and a prior of ½;
//! - **cost**: a step of `n` tokens takes `a + b·n` seconds, fitted by exponentially
//!   weighted least squares to the steps observed (the time from one draft request to the
//!   next, against the step's tokens: the proposer's own, or the engine's whole step as
//!   told by [`StepLoad`]), starting from a prior slope of
//!   [`AdaptiveConfig::prior_token_cost`] × the first step's time; the wrapped proposer's
//!   own time per drafted token `d` is measured too (a draft model's forward passes);
//! - **choice**: with `S` sequences sampling in a step of `N` tokens (`T = a + b·N`), `k`
//!   drafted tokens give `S − 1 + E(k)` tokens, `E(k) = 1 + α + … + α^k`, for a step
//!   `1 + k·(b + d)/T` times as long; the `k` maximizing the ratio is drafted (0: none);
//! - **ramp**: where drafting pays, after a draft of `k ≥ 2` tokens was accepted whole while
//!   `α` is at least [`RAMP_MIN_ACCEPTANCE`], the next draft asks for at least `2k` (up to
//!   the limit). `α` forgets slowly, so after a stretch of new text (an inserted line, an
//!   answer's preamble) it stays low for many steps once the output copies its source
//!   again, and the drafts would grow by about one token every two steps; whole accepted
//!   drafts are the sign of a copy going on (on the bench's `type_hints` task,
//!   Qwen2.5-Coder-0.5B, 128 tokens: 56 → 47 verification passes in a replay of its greedy
//!   output with a fixed step cost).
//!
//! Only how many tokens each step produces changes: the tokens themselves are the same
//! (greedy) or the same draws (deterministic drafts under sampling), whatever the timings.

use crate::proposer::{Draft, Proposer, StepLoad};
use crate::sampler::SamplingParams;
use std::time::Instant;

/// Settings of [`Adaptive`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveConfig {
    /// Most tokens per draft.
    pub max_draft: usize,
    /// No drafts while a step has more than this many sequences choosing tokens.
    pub max_batch: usize,
    /// The cost of one more token in a step relative to a one-token step, assumed until
    /// steps of different sizes have been timed.
    pub prior_token_cost: f64,
    /// Steps without a draft before a probe (doubling after each failed probe, up to 8×).
    pub probe_after: usize,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            max_draft: 16,
            max_batch: 8,
            prior_token_cost: 0.15,
            probe_after: 8,
        }
    }
}

/// The acceptance estimate from which a wholly accepted draft doubles the next one.
const RAMP_MIN_ACCEPTANCE: f64 = 0.6;

/// Forgetting factor per drafted token observed.
const ACCEPT_DECAY: f64 = 0.97;
/// Forgetting factor per step timed.
const COST_DECAY: f64 = 0.98;

/// `t = a + b·n` by exponentially weighted least squares.
#[derive(Clone, Debug, Default)]
struct CostFit {
    w: f64,
    n: f64,
    t: f64,
    nn: f64,
    nt: f64,
}

impl CostFit {
    fn add(&mut self, n: f64, t: f64, w: f64) {
        self.w += w;
        self.n += w * n;
        self.t += w * t;
        self.nn += w * n * n;
        self.nt += w * n * t;
    }

    fn decay(&mut self, f: f64) {
        self.w *= f;
        self.n *= f;
        self.t *= f;
        self.nn *= f;
        self.nt *= f;
    }

    /// `(a, b)`, with `b` kept within `[0.005·a, 2·a]`.
    fn fit(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 {
            return None;
        }
        let (mn, mt) = (self.n / self.w, self.t / self.w);
        let var = self.nn / self.w - mn * mn;
        let b = if var > 1e-9 {
            (self.nt / self.w - mn * mt) / var
        } else {
            0.0
        };
        let a = (mt - b * mn).max(mt * 0.05).max(1e-9);
        Some((a, b.clamp(0.005 * a, 2.0 * a)))
    }
}

/// The last draft handed out.
struct Last {
    history_len: usize,
    tokens: Vec<u32>,
    /// When the draft was handed out.
    at: Instant,
    /// Tokens of the step that verifies it: its own `1 + tokens`, or the engine's.
    step_tokens: usize,
}

/// A proposer whose drafts are sized by their recent acceptance and cost (module docs).
pub struct Adaptive<P> {
    inner: P,
    cfg: AdaptiveConfig,
    hits: f64,
    misses: f64,
    cost: CostFit,
    /// Seconds of the wrapped proposer per drafted token (exponential average).
    draft_time: Option<f64>,
    load: Option<StepLoad>,
    last: Option<Last>,
    /// Steps since the last draft while none paid.
    idle: usize,
    backoff: usize,
    /// The length of the last draft when it was accepted whole (and had 2 tokens or more).
    whole: Option<usize>,
}

impl<P: Proposer> Adaptive<P> {
    pub fn new(inner: P, cfg: AdaptiveConfig) -> Adaptive<P> {
        Adaptive {
            inner,
            cfg,
            hits: 0.0,
            misses: 0.0,
            cost: CostFit::default(),
            draft_time: None,
            load: None,
            last: None,
            idle: 0,
            backoff: cfg.probe_after.max(1),
            whole: None,
        }
    }

    /// The wrapped proposer.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The estimated probability that a drafted token is accepted (after the ones before
    /// it were).
    pub fn acceptance(&self) -> f64 {
        (self.hits + 1.0) / (self.hits + self.misses + 2.0)
    }

    /// Learns from how the last draft fared and how long its step took, when `history`
    /// continues it by exactly one verification step.
    fn observe(&mut self, history: &[u32], now: Instant) {
        self.whole = None;
        let Some(last) = self.last.take() else {
            return;
        };
        let Some(new) = history.get(last.history_len..) else {
            return;
        };
        let a = new
            .iter()
            .zip(&last.tokens)
            .take_while(|(x, y)| x == y)
            .count();
        if new.len() != a + 1 {
            return; // not the step that verified this draft (a new generation, a fork)
        }
        let k = last.tokens.len();
        self.whole = (k >= 2 && a == k).then_some(k);
        if k > 0 {
            let miss = if a < k { 1.0 } else { 0.0 };
            let f = ACCEPT_DECAY.powf(a as f64 + miss);
            self.hits = self.hits * f + a as f64;
            self.misses = self.misses * f + miss;
        }
        let dt = now.saturating_duration_since(last.at).as_secs_f64();
        let n = last.step_tokens as f64;
        if self.cost.w == 0.0 {
            // Prior: the observed step, and a slope of `prior_token_cost` per token.
            let c = self.cfg.prior_token_cost;
            let base = dt / (1.0 + c * (n - 1.0));
            self.cost.add(1.0, base, 2.0);
            self.cost.add(9.0, base * (1.0 + 8.0 * c), 2.0);
        }
        self.cost.decay(COST_DECAY);
        self.cost.add(n, dt, 1.0);
    }

    /// Drafted tokens worth asking for, at most `max`.
    fn choose_len(&mut self, max: usize) -> usize {
        let max = max.min(self.cfg.max_draft);
        let load = self.load.unwrap_or(StepLoad {
            tokens: 1,
            sequences: 1,
        });
        if max == 0 || load.sequences > self.cfg.max_batch {
            return 0;
        }
        let Some((a, b)) = self.cost.fit() else {
            // Nothing timed yet: a short first draft.
            return max.min(4);
        };
        let own = self.last.as_ref().map_or(0, |l| l.tokens.len());
        let t = a + b * load.tokens.saturating_sub(own).max(1) as f64;
        let per_token = (b + self.draft_time.unwrap_or(0.0)) / t;
        let alpha = self.acceptance();
        let others = load.sequences.saturating_sub(1) as f64;
        let (mut best, mut best_k) = (1.0 + others, 0);
        let (mut e, mut pw) = (1.0, 1.0);
        for k in 1..=max {
            pw *= alpha;
            e += pw;
            let v = (others + e) / (1.0 + k as f64 * per_token);
            if v > best {
                (best, best_k) = (v, k);
            }
        }
        // The ramp (module docs), where drafting pays at all.
        if let Some(k) = self.whole
            && best_k > 0
            && alpha >= RAMP_MIN_ACCEPTANCE
        {
            best_k = best_k.max((2 * k).min(max));
        }
        if best_k > 0 {
            self.idle = 0;
            self.backoff = self.cfg.probe_after.max(1);
            return best_k;
        }
        self.idle += 1;
        if self.idle >= self.backoff {
            // Probe: one token, to learn whether the proposer has become right.
            self.idle = 0;
            self.backoff = (self.backoff * 2).min(8 * self.cfg.probe_after.max(1));
            return 1;
        }
        0
    }
}

impl<P: Proposer> Proposer for Adaptive<P> {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        self.draft(history, max, &SamplingParams::greedy()).tokens
    }

    fn draft(&mut self, history: &[u32], max: usize, sampling: &SamplingParams) -> Draft {
        self.draft_at(history, max, sampling, Instant::now())
    }

    fn step_load(&mut self, load: StepLoad) {
        self.load = Some(load);
        self.inner.step_load(load);
    }
}

impl<P: Proposer> Adaptive<P> {
    /// [`Proposer::draft`] at time `now` (tests drive the clock).
    fn draft_at(
        &mut self,
        history: &[u32],
        max: usize,
        sampling: &SamplingParams,
        now: Instant,
    ) -> Draft {
        self.observe(history, now);
        let k = self.choose_len(max);
        let t0 = Instant::now();
        let draft = if k == 0 {
            Draft::default()
        } else {
            let mut d = self.inner.draft(history, k, sampling);
            d.truncate(k);
            if !d.is_empty() {
                let per = t0.elapsed().as_secs_f64() / d.len() as f64;
                self.draft_time = Some(self.draft_time.map_or(per, |x| 0.8 * x + 0.2 * per));
            }
            d
        };
        let at = now + t0.elapsed();
        let step_tokens = match self.load.take() {
            // The engine's next step: about as full as the last, with this draft instead.
            Some(l) => l.tokens + draft.len(),
            None => 1 + draft.len(),
        };
        self.last = Some(Last {
            history_len: history.len(),
            tokens: draft.tokens.clone(),
            at,
            step_tokens,
        });
        draft
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proposes `right` correct tokens of a known continuation, then wrong ones.
    struct Fixed {
        continuation: Vec<u32>,
        prompt_len: usize,
        right: usize,
    }

    impl Proposer for Fixed {
        fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
            let done = history.len() - self.prompt_len;
            (0..max)
                .map(|i| {
                    let t = self.continuation[done + i];
                    if i < self.right { t } else { t + 1000 }
                })
                .collect()
        }
    }

    /// Runs `steps` verification steps of a simulated sequence, each taking
    /// `1 ms + 0.15 ms·tokens` on a simulated clock, and returns the draft lengths asked for.
    fn simulate(right: usize, load: Option<StepLoad>, steps: usize) -> Vec<usize> {
        let continuation: Vec<u32> = (0..10_000).collect();
        let mut p = Adaptive::new(
            Fixed {
                continuation: continuation.clone(),
                prompt_len: 1,
                right,
            },
            AdaptiveConfig::default(),
        );
        let mut history = vec![0u32];
        let mut lens = Vec::new();
        let mut clock = Instant::now();
        for _ in 0..steps {
            if let Some(l) = load {
                p.step_load(l);
            }
            let d = p.draft_at(&history, 32, &SamplingParams::greedy(), clock);
            lens.push(d.len());
            let n = load.map_or(1, |l| l.tokens) + d.len();
            clock += std::time::Duration::from_micros(1000 + 150 * n as u64);
            let a = d.tokens.iter().take(right).count();
            let done = history.len() - 1;
            history.extend_from_slice(&continuation[done..done + a + 1]);
        }
        lens
    }

    #[test]
    fn right_drafts_grow_and_wrong_ones_stop() {
        let good = simulate(usize::MAX, None, 40);
        assert!(
            good[30..].iter().all(|&k| k >= 8),
            "always right: long drafts, {good:?}"
        );
        let bad = simulate(0, None, 200);
        let drafted: usize = bad[40..].iter().sum();
        assert!(
            drafted <= 160 / 8,
            "never right: at most a probe every 8 steps, {bad:?}"
        );
        assert!(drafted > 0, "but it keeps probing");
    }

    /// Guesses wrong until the history reaches `switch`, then the continuation exactly (new
    /// text, then a copy of the source).
    struct Switch {
        switch: usize,
    }

    impl Proposer for Switch {
        fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
            let done = history.len() as u32;
            let off = if history.len() < self.switch { 1000 } else { 0 };
            (0..max as u32).map(|i| done + i + off).collect()
        }
    }

    /// Steps after the proposer turns right until a draft of at least 8 tokens.
    fn steps_to_long_drafts(switch: usize) -> usize {
        let mut p = Adaptive::new(Switch { switch }, AdaptiveConfig::default());
        // history[i] = i: the continuation of a history of n tokens starts at n.
        let mut history = vec![0u32];
        let mut clock = Instant::now();
        let mut after = None;
        for _ in 0..400 {
            let d = p.draft_at(&history, 32, &SamplingParams::greedy(), clock);
            clock += std::time::Duration::from_micros(1000 + 300 * (1 + d.len() as u64));
            let n = history.len() as u32;
            let a = d
                .tokens
                .iter()
                .zip(n..)
                .take_while(|(t, c)| *t == c)
                .count();
            if history.len() >= switch {
                let s = after.get_or_insert(0);
                if d.len() >= 8 {
                    return *s;
                }
                *s += 1;
            }
            history.extend(n..n + a as u32 + 1);
        }
        panic!("no long drafts after the switch");
    }

    #[test]
    fn wholly_accepted_drafts_ramp_up_after_new_text() {
        // 60 tokens of wrong guesses (α falls to about 0.1), then a copy: once α is back
        // at 0.6 the drafts double after each whole acceptance instead of growing by a
        // token every other step (8 steps to drafts of 8 tokens; 18 without the ramp).
        let steps = steps_to_long_drafts(60);
        assert!(steps <= 10, "{steps} steps to drafts of 8 tokens");
    }

    #[test]
    fn a_full_batch_takes_no_drafts() {
        let many = StepLoad {
            tokens: 40,
            sequences: 40,
        };
        assert!(simulate(usize::MAX, Some(many), 20).iter().all(|&k| k == 0));
        // A few sequences: a cost-weighted, shorter draft than alone.
        let few = StepLoad {
            tokens: 4,
            sequences: 4,
        };
        let lens = simulate(usize::MAX, Some(few), 30);
        assert!(lens[20..].iter().all(|&k| k > 0), "{lens:?}");
    }
}
