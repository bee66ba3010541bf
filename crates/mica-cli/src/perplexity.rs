//! `mica perplexity`: perplexity of a model over a text file, and with `--kl-base` the
//! KL-divergence from a base model, computed by [`mica::quant::Perplexity`] as llama.cpp's
//! `llama-perplexity` computes them (see that module for the method).

use crate::budget::{self, BudgetArgs, Sizing};
use crate::cache_args::CacheArgs;
use crate::lora_args::LoraArgs;
use crate::progress::Progress;
use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use mica::models::{KvSizing, LoadedModel};
use mica::quant::{KlSummary, Perplexity, PerplexityOptions, QuantError};
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
    /// Score the model with these LoRA adapters applied unmerged.
    #[command(flatten)]
    pub lora: LoraArgs,
    /// Score with these KV cache types (llama-perplexity's -ctk/-ctv).
    #[command(flatten)]
    pub cache: CacheArgs,
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
    /// With --kl-base: also draw the histogram of per-token KL-divergences as an SVG file.
    #[arg(long = "kl-chart", value_name = "FILE", requires = "kl_base")]
    pub kl_chart: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Checks the scored model (not the --kl-base one).
    #[command(flatten)]
    pub budget: BudgetArgs,
}

pub fn perplexity(args: PerplexityArgs) -> Result<()> {
    if args.ctx < 4 {
        bail!("-c must be at least 4 tokens");
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let t_load = Instant::now();
    // Whole windows in one pass, every position's logits kept.
    let sizing = Sizing {
        kv: KvSizing::Context {
            n_ctx: args.ctx,
            n_seq: 1,
        },
        n_ctx: args.ctx,
        batch_tokens: args.ctx,
        n_outputs: args.ctx,
    };
    let (mut lm, _) = budget::load(&args.model, true, &args.budget, &args.cache, |_| sizing)?;
    args.lora.apply(&mut lm, false)?;
    let load_ms = t_load.elapsed().as_secs_f64() * 1e3;
    let threads = args
        .threads
        .unwrap_or_else(mica::kernels::pool::physical_cores)
        .max(1);
    let base = args.kl_base.as_ref().map(LoadedModel::open).transpose()?;
    let opts = PerplexityOptions {
        n_ctx: args.ctx,
        max_windows: args.chunks,
        threads,
    };
    let eval = Perplexity::new(&lm, base.as_ref(), &text, opts).map_err(|e| {
        match (&e, &args.kl_base) {
            (QuantError::TextTooShort { .. }, _) => anyhow!("{}: {e}", args.file.display()),
            (QuantError::VocabularyMismatch { .. }, Some(p)) => {
                anyhow!("--kl-base {}: {e}", p.display())
            }
            _ => e.into(),
        }
    })?;
    if eval.base_tokenizes_differently() {
        eprintln!(
            "warning: the base model tokenizes the text differently; scoring the model's \
             tokens with both"
        );
    }
    eprintln!(
        "perplexity: {} tokens, {} windows of {}, BOS {}, {threads} threads, model loaded in \
         {load_ms:.0} ms",
        eval.n_tokens(),
        eval.n_windows(),
        args.ctx,
        if eval.adds_bos() {
            "added"
        } else {
            "not added"
        },
    );
    let mut progress = Progress::new(args.quiet);
    let t0 = Instant::now();
    let report = eval.run(&mut |e| progress.handle(e))?;
    let secs = t0.elapsed().as_secs_f64();
    let (ppl, err) = report.nll.estimate();
    eprintln!(
        "{} windows, {} scored tokens, {:.1} s ({:.1} tokens/s)",
        report.windows,
        report.nll.count,
        secs,
        (report.windows * args.ctx) as f64 / secs
    );
    println!("PPL = {ppl:.4} ± {err:.5}");
    if let Some(kl) = &report.kl {
        print_kl(kl);
        if let Some(path) = &args.kl_chart {
            let title = kl_title(&args);
            crate::charts::kl_histogram(path, &title, &report.klds, kl.mean, kl.p99)
                .with_context(|| format!("--kl-chart {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// llama-perplexity's `--kl-divergence` lines.
fn print_kl(k: &KlSummary) {
    let (bppl, berr) = k.base_ppl;
    println!("PPL(base) = {bppl:.4} ± {berr:.5}");
    println!("ln(PPL(Q)/PPL(base)) = {:.6}", k.ln_ppl_ratio);
    println!("Mean KLD = {:.6} ± {:.6}", k.mean, k.mean_err);
    println!(
        "KLD median {:.6}, 99% {:.6}, 99.9% {:.6}, max {:.6}",
        k.median, k.p99, k.p999, k.max
    );
    println!(
        "Same top p = {:.3} ± {:.3} %",
        100.0 * k.same_top,
        100.0 * k.same_top_err
    );
}

/// The KL chart's title: both models by file stem, the model's KV cache types when not the
/// default (the base always runs with the default f16 cache).
fn kl_title(args: &PerplexityArgs) -> String {
    let stem = |p: &std::path::Path| {
        p.file_stem().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    let (k, v) = (args.cache.cache_type_k, args.cache.cache_type_v);
    let cache = if k.is_some() || v.is_some() {
        let name = |t: Option<mica::models::kv_cache::KvType>| t.map_or("f16", |t| t.name());
        format!(" ({}/{} KV cache)", name(k), name(v))
    } else {
        String::new()
    };
    let base = args.kl_base.as_deref().map_or_else(String::new, stem);
    let model = stem(&args.model);
    if base == model {
        format!("Per-token KL-divergence: {model}{cache} against itself with the f16 cache")
    } else {
        format!("Per-token KL-divergence: {model}{cache} against {base}")
    }
}
