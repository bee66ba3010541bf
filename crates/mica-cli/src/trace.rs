//! `--trace FILE`: a Chrome trace-event JSON of the run (open it in Perfetto or
//! `chrome://tracing`, or draw it with `mica trace-chart`), written through the `tracing`
//! ecosystem: the library crates open spans (model loading stages, chat template and
//! tokenizer, the engine's `step` with its `schedule` / `execute` / `update` parts and the
//! batch composition, `forward` with its `layer`s, `attention` and `feed_forward` parts and
//! every `matmul` with its shape and type, and each compute thread's `pool_job`;
//! `docs/observability.md` lists them), and `tracing-chrome` turns them into trace events, one
//! track per thread. The file is complete when the returned guard drops at the end of `main`
//! (after `mica serve` has drained on SIGTERM / SIGINT). Without `--trace` no subscriber is
//! installed and every span is one disabled-callsite check.

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
