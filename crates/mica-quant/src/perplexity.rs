//! Perplexity over non-overlapping windows, computed as llama.cpp's
//! `llama-perplexity` computes it (`tools/perplexity/perplexity.cpp`, `perplexity()`):
//!
//! - the whole text is tokenized once, with BOS when the model adds one and special-token
//!   text left as plain text;
//! - it is cut into `n_chunk = n_tokens / n_ctx` windows of `n_ctx` tokens; each window is
//!   evaluated from an empty cache, its first token replaced by BOS when the model adds BOS;
//! - only the second half is scored: positions `first = n_ctx / 2 .. n_ctx - 2` predict the
//!   next token, so each window contributes `n_ctx - 1 - first` log-likelihoods;
//! - `PPL = exp(mean nll)`, and its uncertainty is `sqrt((mean nll² − mean nll²)/(N − 1))·PPL`
//!   (llama.cpp's `Final estimate: PPL = X +/- Y`).
//!
//! With a base model (same vocabulary), the same windows also run through it
//! and each scored position adds `KL(p_base ‖ p_model) = Σ p_base (ln p_base − ln p_model)`
//! and whether both put the same token on top — llama-perplexity's `--kl-divergence`
//! figures (mean KLD ± its standard error, percentiles, "same top p"), computed from both
//! models' logits in one process rather than through a saved base-logits file.

use crate::error::{QuantError, Result};
use crate::progress::{Event, Task};
use mica_engine::Session;
use mica_kernels::ops::{LogSoftmaxRounding, log_softmax_into};
use mica_models::LoadedModel;

/// llama.cpp's rounding: the max subtracted in f32, each exponential in f32, their sum in
/// f64 ([`LogSoftmaxRounding::ExpF32`]).
const ROUNDING: LogSoftmaxRounding = LogSoftmaxRounding::ExpF32;

/// Running sums of the negative log-likelihoods.
#[derive(Clone, Debug, Default)]
pub struct Nll {
    pub sum: f64,
    pub sum2: f64,
    pub count: usize,
}

impl Nll {
    pub fn add(&mut self, v: f64) {
        self.sum += v;
        self.sum2 += v * v;
        self.count += 1;
    }

    /// exp(mean negative log-likelihood).
    pub fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    /// (PPL, its standard error) as llama-perplexity prints them.
    pub fn estimate(&self) -> (f64, f64) {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum2 / n - mean * mean;
        let ppl = mean.exp();
        let err = if var > 0.0 && self.count > 1 {
            (var / (n - 1.0)).sqrt() * ppl
        } else {
            0.0
        };
        (ppl, err)
    }
}

/// Log-softmax of a row of logits into `out`, in f64, rounded as llama-perplexity rounds.
fn log_softmax(logits: &[f32], out: &mut Vec<f64>) {
    out.resize(logits.len(), 0.0);
    log_softmax_into(logits, ROUNDING, out);
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// KL-divergence statistics against a base model.
#[derive(Clone, Debug, Default)]
pub struct KlStats {
    /// KL(base ‖ model) of each scored position.
    pub klds: Vec<f64>,
    /// Positions where both models rank the same token first.
    pub same_top: usize,
    /// The base model's negative log-likelihoods.
    pub base_nll: Nll,
    scratch: (Vec<f64>, Vec<f64>),
}

/// The KL-divergence figures llama-perplexity's `--kl-divergence` prints.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlSummary {
    /// The base model's perplexity and its standard error.
    pub base_ppl: (f64, f64),
    /// ln(PPL(model) / PPL(base)).
    pub ln_ppl_ratio: f64,
    /// Mean KL-divergence and its standard error.
    pub mean: f64,
    pub mean_err: f64,
    pub median: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    /// Fraction of positions where both rank the same token first, and its standard error.
    pub same_top: f64,
    pub same_top_err: f64,
}

impl KlStats {
    /// One scored position: `base` and `model` logits, `next` the true next token.
    pub fn add(&mut self, base: &[f32], model: &[f32], next: usize) {
        let (lb, lm) = &mut self.scratch;
        log_softmax(base, lb);
        log_softmax(model, lm);
        let kld: f64 = lb
            .iter()
            .zip(lm.iter())
            .map(|(&b, &m)| if b > -80.0 { b.exp() * (b - m) } else { 0.0 })
            .sum();
        // Rounding can leave a hair below zero when the two distributions are equal.
        self.klds.push(kld.max(0.0));
        self.same_top += (argmax(base) == argmax(model)) as usize;
        self.base_nll.add(-lb[next]);
    }

    /// The figures, given the model's negative log-likelihoods over the same positions.
    /// `None` before any position was added.
    pub fn summary(&mut self, model_nll: &Nll) -> Option<KlSummary> {
        if self.klds.is_empty() {
            return None;
        }
        let n = self.klds.len() as f64;
        let mean = self.klds.iter().sum::<f64>() / n;
        let var = self
            .klds
            .iter()
            .map(|k| (k - mean) * (k - mean))
            .sum::<f64>()
            / n;
        let err = if n > 1.0 {
            (var / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        self.klds.sort_by(f64::total_cmp);
        let pct = |p: f64| self.klds[((n - 1.0) * p).round() as usize];
        let top = self.same_top as f64 / n;
        let top_err = if n > 1.0 {
            (top * (1.0 - top) / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let ln_ratio = (model_nll.sum - self.base_nll.sum) / n;
        Some(KlSummary {
            base_ppl: self.base_nll.estimate(),
            ln_ppl_ratio: ln_ratio,
            mean,
            mean_err: err,
            median: pct(0.5),
            p99: pct(0.99),
            p999: pct(0.999),
            max: pct(1.0),
            same_top: top,
            same_top_err: top_err,
        })
    }
}

/// How text is scored.
#[derive(Clone, Copy, Debug)]
pub struct PerplexityOptions {
    /// Window size in tokens (at least 4; the text must hold two windows).
    pub n_ctx: usize,
    /// Score at most this many windows.
    pub max_windows: Option<usize>,
    /// Compute threads.
    pub threads: usize,
}

/// A text ready to score with a model (and optionally a base model for KL-divergence).
pub struct Perplexity<'m> {
    model: &'m LoadedModel,
    base: Option<&'m LoadedModel>,
    tokens: Vec<u32>,
    n_windows: usize,
    opts: PerplexityOptions,
    base_tokenizes_differently: bool,
}

/// What scoring found.
#[derive(Clone, Debug)]
pub struct PerplexityReport {
    /// Windows scored.
    pub windows: usize,
    /// The model's negative log-likelihoods; [`Nll::estimate`] gives PPL ± error.
    pub nll: Nll,
    /// With a base model: the KL-divergence figures.
    pub kl: Option<KlSummary>,
    /// With a base model: KL(base ‖ model) of every scored position, in ascending order
    /// (empty without one).
    pub klds: Vec<f64>,
}

impl<'m> Perplexity<'m> {
    /// Tokenizes `text` with `model` (BOS when the model adds one, special-token text as plain
    /// text) and checks that it holds two windows and that `base`, when given, has the same
    /// vocabulary.
    pub fn new(
        model: &'m LoadedModel,
        base: Option<&'m LoadedModel>,
        text: &str,
        opts: PerplexityOptions,
    ) -> Result<Perplexity<'m>> {
        let n_ctx = opts.n_ctx;
        if n_ctx < 4 {
            return Err(QuantError::WindowTooSmall { n_ctx });
        }
        let tokens = model.tokenizer.encode(text, true, false)?;
        if tokens.len() < 2 * n_ctx {
            return Err(QuantError::TextTooShort {
                tokens: tokens.len(),
                n_ctx,
                needed: 2 * n_ctx,
            });
        }
        let max_windows = tokens.len() / n_ctx;
        let n_windows = opts.max_windows.map_or(max_windows, |c| c.min(max_windows));
        let mut base_tokenizes_differently = false;
        if let Some(b) = base {
            let (nb, nm) = (b.model.config.n_vocab, model.model.config.n_vocab);
            if nb != nm {
                return Err(QuantError::VocabularyMismatch {
                    base: nb,
                    model: nm,
                });
            }
            base_tokenizes_differently = b.tokenizer.encode(text, true, false)? != tokens;
        }
        Ok(Perplexity {
            model,
            base,
            tokens,
            n_windows,
            opts,
            base_tokenizes_differently,
        })
    }

    /// Tokens of the text.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Windows that will be scored.
    pub fn n_windows(&self) -> usize {
        self.n_windows
    }

    /// Whether each window starts with BOS.
    pub fn adds_bos(&self) -> bool {
        self.model.tokenizer.add_bos()
    }

    /// The base model tokenizes the text differently (the model's tokens are scored with
    /// both).
    pub fn base_tokenizes_differently(&self) -> bool {
        self.base_tokenizes_differently
    }

    /// Scores every window, reporting a [`Task::Perplexity`] (with the running figure) to
    /// `on_event`.
    pub fn run(&self, on_event: &mut dyn FnMut(Event)) -> Result<PerplexityReport> {
        let (n_ctx, threads) = (self.opts.n_ctx, self.opts.threads);
        let tokens = &self.tokens;
        let bos = self.model.tokenizer.bos();
        let add_bos = self.adds_bos();
        let n_vocab = self.model.model.config.n_vocab;
        let mut session = Session::new(self.model, n_ctx, threads);
        let mut base_session = self.base.map(|b| Session::new(b, n_ctx, threads));
        let mut kl = KlStats::default();
        let mut nll = Nll::default();
        let mut lp = Vec::new();
        on_event(Event::Start {
            task: Task::Perplexity,
            total: self.n_windows as u64,
        });
        let first = n_ctx / 2;
        for i in 0..self.n_windows {
            let start = i * n_ctx;
            let mut window = tokens[start..start + n_ctx].to_vec();
            if add_bos && let Some(b) = bos {
                window[0] = b;
            }
            session.reset();
            let logits = session.eval(&window, true)?; // [n_ctx, n_vocab]
            let base_logits = match &mut base_session {
                Some(b) => {
                    b.reset();
                    Some(b.eval(&window, true)?)
                }
                None => None,
            };
            for j in first..n_ctx - 1 {
                let row = &logits[j * n_vocab..(j + 1) * n_vocab];
                let next = tokens[start + j + 1] as usize;
                log_softmax(row, &mut lp);
                nll.add(-lp[next]);
                if let Some(bl) = &base_logits {
                    kl.add(&bl[j * n_vocab..(j + 1) * n_vocab], row, next);
                }
            }
            on_event(Event::Perplexity(nll.ppl()));
            on_event(Event::Advance(1));
        }
        on_event(Event::Finish);
        let summary = match self.base {
            Some(_) => kl.summary(&nll),
            None => None,
        };
        Ok(PerplexityReport {
            windows: self.n_windows,
            nll,
            kl: summary,
            klds: std::mem::take(&mut kl.klds),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_prob_is_a_log_softmax() {
        let l = [1.0f32, 2.0, 3.0];
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        let mut lp = Vec::new();
        log_softmax(&l, &mut lp);
        assert!((lp[2] - (3.0 - z.ln())).abs() < 1e-6);
    }

    #[test]
    fn kl_is_zero_for_equal_logits_and_positive_otherwise() {
        let a = [1.0f32, 2.0, 3.0, -1.0];
        let mut kl = KlStats::default();
        kl.add(&a, &a, 0);
        assert!(kl.klds[0].abs() < 1e-12);
        let b = [1.0f32, 3.0, 2.0, -1.0];
        kl.add(&a, &b, 0);
        // By hand: p = softmax(a), q = softmax(b), Σ p (ln p − ln q).
        let sm = |x: &[f32]| {
            let z: f64 = x.iter().map(|&v| (v as f64).exp()).sum();
            x.iter().map(|&v| (v as f64).exp() / z).collect::<Vec<_>>()
        };
        let (p, q) = (sm(&a), sm(&b));
        let want: f64 = p.iter().zip(&q).map(|(p, q)| p * (p / q).ln()).sum();
        assert!((kl.klds[1] - want).abs() < 1e-6, "{} vs {want}", kl.klds[1]);
        assert_eq!(kl.same_top, 1);
    }

    #[test]
    fn estimate_matches_llama_perplexity_formula() {
        let mut n = Nll::default();
        for v in [1.0, 2.0, 3.0, 2.0] {
            n.add(v);
        }
        let (ppl, err) = n.estimate();
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
        // mean 2, mean of squares 4.5, variance 0.5, /(N-1) = 1/6.
        assert!((err - (0.5f64 / 3.0).sqrt() * ppl).abs() < 1e-12);
    }
}
