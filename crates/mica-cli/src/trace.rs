//! `--trace FILE`: a Chrome trace-event JSON of the run (open it in Perfetto or
//! `chrome://tracing`), written through the `tracing` ecosystem: the library crates open
//! spans (`forward` with its `layer`s, `attention` and `feed_forward` parts and every
//! `matmul` with its shape and type; the engine's `step` with its `execute` and `update`
//! parts and the batch composition), and `tracing-chrome` turns them into trace events, one
//! track per thread. Without `--trace` no subscriber is installed and every span is one
//! disabled-callsite check.

use anyhow::{Context, Result};
use std::path::Path;
use tracing_chrome::{ChromeLayerBuilder, FlushGuard};
use tracing_subscriber::prelude::*;

/// Starts writing `path`; the trace is complete when the returned guard is dropped.
pub fn start(path: &Path) -> Result<FlushGuard> {
    let file = std::fs::File::create(path)
        .with_context(|| format!("--trace: cannot create {}", path.display()))?;
    let (layer, guard) = ChromeLayerBuilder::new()
        .writer(file)
        .include_args(true)
        .include_locations(false)
        .build();
    // Not `try_init`: that would also route the `log` facade, which the CLI's own logger
    // (`crate::logging`) already holds.
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
        .context("--trace: a tracing subscriber is already installed")?;
    Ok(guard)
}
