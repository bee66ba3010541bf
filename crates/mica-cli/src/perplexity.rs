//! `mica perplexity`: perplexity over non-overlapping windows, computed as llama.cpp's
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
//! With `--kl-base BASE`, the same windows also run through a base model (same vocabulary)
//! and each scored position adds `KL(p_base ‖ p_model) = Σ p_base (ln p_base − ln p_model)`
//! and whether both put the same token on top — llama-perplexity's `--kl-divergence`
//! figures (mean KLD ± its standard error, percentiles, "same top p"), computed from both
//! models' logits in one process rather than through a saved base-logits file.

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use mica_engine::Session;
use mica_models::LoadedModel;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// Model file (GGUF or .mica).
    #[arg(short, long)]
    pub model: PathBuf,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Window size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many windows.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Compute threads (default: physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Base model for KL-divergence (e.g. the F16 or F32 version of the same model): reports
    /// mean KL(base ‖ model), its percentiles and how often both rank the same token first.
    #[arg(long = "kl-base", value_name = "MODEL")]
    pub kl_base: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// llama.cpp's `log_softmax`: the log-probability of `tok`, with the max subtracted in f32
/// and the sum of exponentials accumulated in f64.
fn log_prob(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (logits[tok] - max) as f64 - sum.ln()
}

/// Running sums of the negative log-likelihoods.
#[derive(Default)]
struct Nll {
    sum: f64,
    sum2: f64,
    count: usize,
}

impl Nll {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.sum2 += v * v;
        self.count += 1;
    }

    fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    /// (PPL, its standard error) as llama-perplexity prints them.
    fn estimate(&self) -> (f64, f64) {
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

/// Log-softmax of a row of logits, in f64 (max subtracted, as [`log_prob`]).
fn log_softmax(logits: &[f32], out: &mut Vec<f64>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    let ln_sum = sum.ln();
    out.clear();
    out.extend(logits.iter().map(|&l| (l - max) as f64 - ln_sum));
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
#[derive(Default)]
struct Kl {
    klds: Vec<f64>,
    same_top: usize,
    base_nll: Nll,
    scratch: (Vec<f64>, Vec<f64>),
}

impl Kl {
    /// One scored position: `base` and `model` logits, `next` the true next token.
    fn add(&mut self, base: &[f32], model: &[f32], next: usize) {
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

    fn report(&mut self, model_nll: &Nll) {
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
        let (bppl, berr) = self.base_nll.estimate();
        let ln_ratio = (model_nll.sum - self.base_nll.sum) / n;
        println!("PPL(base) = {bppl:.4} ± {berr:.5}");
        println!("ln(PPL(Q)/PPL(base)) = {ln_ratio:.6}");
        println!("Mean KLD = {mean:.6} ± {err:.6}");
        println!(
            "KLD median {:.6}, 99% {:.6}, 99.9% {:.6}, max {:.6}",
            pct(0.5),
            pct(0.99),
            pct(0.999),
            pct(1.0)
        );
        println!("Same top p = {:.3} ± {:.3} %", 100.0 * top, 100.0 * top_err);
    }
}

pub fn perplexity(args: PerplexityArgs) -> Result<()> {
    if args.ctx < 4 {
        bail!("-c must be at least 4 tokens");
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let t_load = Instant::now();
    let lm = LoadedModel::open(&args.model)?;
    let load_ms = t_load.elapsed().as_secs_f64() * 1e3;
    let threads = args
        .threads
        .unwrap_or_else(mica_kernels::pool::physical_cores)
        .max(1);
    let tokens = lm.tokenizer.encode(&text, true, false)?;
    let n_ctx = args.ctx;
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} tokenizes to {} tokens; a context of {n_ctx} needs at least {}",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let max_chunks = tokens.len() / n_ctx;
    let n_chunk = args.chunks.map_or(max_chunks, |c| c.min(max_chunks));
    let add_bos = lm.tokenizer.add_bos();
    let bos = lm.tokenizer.bos();
    let n_vocab = lm.model.config.n_vocab;
    let base = match &args.kl_base {
        None => None,
        Some(p) => {
            let b = LoadedModel::open(p)?;
            if b.model.config.n_vocab != n_vocab {
                bail!(
                    "--kl-base {}: {} logits per token, the model {n_vocab}; KL-divergence needs \
                     the same vocabulary",
                    p.display(),
                    b.model.config.n_vocab
                );
            }
            if b.tokenizer.encode(&text, true, false)? != tokens {
                eprintln!(
                    "warning: the base model tokenizes the text differently; scoring the \
                     model's tokens with both"
                );
            }
            Some(b)
        }
    };
    let mut base_session = base.as_ref().map(|b| Session::new(b, n_ctx, threads));
    let mut kl = Kl::default();
    eprintln!(
        "perplexity: {} tokens, {n_chunk} windows of {n_ctx}, BOS {}, {threads} threads, \
         model loaded in {load_ms:.0} ms",
        tokens.len(),
        if add_bos { "added" } else { "not added" },
    );
    let mut session = Session::new(&lm, n_ctx, threads);
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(n_chunk as u64);
        b.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} windows ETA {eta} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    };
    let first = n_ctx / 2;
    let mut nll = Nll::default();
    let t0 = Instant::now();
    for i in 0..n_chunk {
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
            nll.add(-log_prob(row, next));
            if let Some(bl) = &base_logits {
                kl.add(&bl[j * n_vocab..(j + 1) * n_vocab], row, next);
            }
        }
        bar.set_message(format!("PPL {:.4}", nll.ppl()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let (ppl, err) = nll.estimate();
    eprintln!(
        "{} windows, {} scored tokens, {:.1} s ({:.1} tokens/s)",
        n_chunk,
        nll.count,
        secs,
        (n_chunk * n_ctx) as f64 / secs
    );
    println!("PPL = {ppl:.4} ± {err:.5}");
    if base.is_some() {
        kl.report(&nll);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_prob_is_a_log_softmax() {
        let l = [1.0f32, 2.0, 3.0];
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        assert!((log_prob(&l, 2) - (3.0 - z.ln())).abs() < 1e-6);
    }

    #[test]
    fn kl_is_zero_for_equal_logits_and_positive_otherwise() {
        let a = [1.0f32, 2.0, 3.0, -1.0];
        let mut kl = Kl::default();
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
