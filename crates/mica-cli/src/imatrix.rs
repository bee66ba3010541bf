//! `mica imatrix`: an importance matrix over a text (as llama.cpp's `llama-imatrix`),
//! collected by [`mica::quant::imatrix::collect`] and written in llama.cpp's GGUF form.

use crate::progress::Progress;
use anyhow::{Context, Result};
use clap::Args;
use mica::models::LoadedModel;
use mica::quant::imatrix::{Windows, collect};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ImatrixArgs {
    /// Model (GGUF, .mica or a Hugging Face folder).
    #[arg(short, long)]
    pub model: PathBuf,
    /// Calibration text.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Output (GGUF imatrix, as llama-imatrix writes).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Window size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Use at most this many windows.
    #[arg(long)]
    pub chunks: Option<usize>,
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    #[arg(long)]
    pub quiet: bool,
}

pub fn imatrix(args: ImatrixArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let lm = LoadedModel::open(&args.model)?;
    let threads = args
        .threads
        .unwrap_or_else(mica::kernels::pool::physical_cores)
        .max(1);
    let windows = Windows {
        n_ctx: args.ctx,
        max: args.chunks,
    };
    let mut progress = Progress::new(args.quiet);
    let m = collect(
        &lm,
        &text,
        &args.file.to_string_lossy(),
        windows,
        threads,
        &mut |e| progress.handle(e),
    )?;
    m.write(&args.output)?;
    eprintln!(
        "wrote {}: {} matrices, {} windows of {} tokens",
        args.output.display(),
        m.entries.len(),
        m.chunk_count,
        m.chunk_size
    );
    Ok(())
}
