//! `mica embed`: embeddings of texts, printed as JSON (one vector per input, in order).

use anyhow::{Context, Result, bail};
use clap::Args;
use mica::engine::{Embedder, Pooling};
use mica::models::{LoadOptions, LoadedModel};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// Model: a GGUF file or a store name (see `mica list`). Without it, the default model.
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Text to embed (repeatable: one vector each).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Vec<String>,
    /// Read the texts from a file, one per line (empty lines skipped).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Pooling of the per-token states: mean, cls or last. Default: what the model's file
    /// declares (`<arch>.pooling_type`), else last (the only token a causal LM lets see the
    /// whole input).
    #[arg(long = "pooling", value_parser = ["mean", "cls", "last"])]
    pub pooling: Option<String>,
    /// Print the raw pooled vectors instead of dividing them by their Euclidean norm.
    #[arg(long = "no-normalize")]
    pub no_normalize: bool,
    /// Compute threads (default: physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Longest input in tokens (default: the model's context, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
}

pub fn embed(args: EmbedArgs) -> Result<()> {
    let mut texts = args.prompt.clone();
    if let Some(f) = &args.file {
        let s = std::fs::read_to_string(f)
            .with_context(|| format!("reading the texts from {}", f.display()))?;
        texts.extend(
            s.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    if texts.is_empty() {
        bail!("nothing to embed: pass -p TEXT (repeatable) or -f FILE");
    }
    let path = crate::store::resolve_model(args.model.as_deref(), true)?;
    let lm = LoadedModel::open_with(&path, LoadOptions { repack: true })?;
    let n_ctx = args
        .ctx_size
        .unwrap_or(lm.model.config.n_ctx_train.min(4096));
    let threads = args
        .threads
        .unwrap_or_else(mica::kernels::pool::physical_cores)
        .max(1);
    let pooling = args.pooling.as_deref().and_then(Pooling::parse);
    let mut e = Embedder::new(&lm, n_ctx, threads, pooling)?;
    let mut vectors = Vec::with_capacity(texts.len());
    for (i, t) in texts.iter().enumerate() {
        let tokens = lm.tokenizer.encode(t, true, false)?;
        let v = e
            .embed(&tokens, !args.no_normalize)
            .with_context(|| format!("embedding input {}", i + 1))?;
        vectors.push(v);
    }
    let out = serde_json::json!({
        "model": path.display().to_string(),
        "pooling": e.pooling().as_str(),
        "normalized": !args.no_normalize,
        "embeddings": vectors,
    });
    println!("{out}");
    Ok(())
}
