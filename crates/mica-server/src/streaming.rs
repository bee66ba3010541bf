//! Layer streaming of the models the server loads (docs/streaming.md): with a
//! [`StreamConfig`] (`mica serve --mem-budget`, or the budget `mica serve` found for a
//! preload model that does not fit), each model is fitted in the budget at load by
//! streaming its last layers from its file — before its weights are repacked and its
//! engine started. The budget counts what [`estimate_params`] sizes: the weights, the KV
//! cache of `--kv-mem`, the buffers of a step of `--batch-tokens` over `--parallel`
//! sequences, and the process's resident set before loading.
//!
//! Passes over one model are serialised by the stream, so the engine's batched steps, the
//! embedding routes' passes and an abandoned step (which still takes its remaining turns)
//! interleave safely.

use crate::config::ServerConfig;
use crate::state::{AppState, ServerEvent};
use mica::engine::EngineConfig;
use mica::models::LoadedModel;
use mica::models::memory::{EstimateParams, MemoryEstimate};
use mica::models::stream::{self, StreamMode};

/// Layer streaming of every model the server loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    /// Bytes each model must fit in (its whole memory estimate).
    pub budget: u64,
    pub mode: StreamMode,
}

/// How the server will use `lm`, for its memory estimate: the KV cache that `--kv-mem`
/// holds for `--parallel` sequences, the context per sequence, a step's tokens and outputs,
/// with `runtime` bytes of the process besides. Its cache types must be chosen first (they
/// decide how many blocks fit).
pub fn estimate_params(cfg: &ServerConfig, lm: &LoadedModel, runtime: u64) -> EstimateParams {
    let running = cfg.scheduler.max_running;
    let plan = EngineConfig::memory_plan(lm, cfg.kv_mem, running);
    EstimateParams {
        repack: cfg.repack,
        kv: plan.kv_sizing(running),
        n_ctx: cfg.n_ctx.unwrap_or(lm.model.config.n_ctx_train.min(4096)),
        batch_tokens: cfg.scheduler.max_batch_tokens,
        n_outputs: running,
        runtime: runtime as usize,
    }
}

/// Bytes the memory budget of the server (`--mem-limit`, or the memory available) counts
/// for a model whose weight files and KV cache take `bytes`: when models stream, no more
/// than the streaming budget less the process's own part of it (the server's count leaves
/// the process out).
pub(crate) fn counted(st: &AppState, bytes: u64) -> u64 {
    st.cfg
        .stream
        .map_or(bytes, |s| bytes.min(s.budget.saturating_sub(st.runtime)))
}

/// Fits the opened model `name` in the configured budget by streaming its last layers
/// (nothing when it fits already, or when no budget is configured); announces what
/// streams. Call before repacking.
pub(crate) fn fit(st: &AppState, name: &str, lm: &mut LoadedModel) -> Result<(), String> {
    let Some(sc) = st.cfg.stream else {
        return Ok(());
    };
    // Each model fits in the budget with the process as it was before any model loaded.
    let full = MemoryEstimate::new(&lm.model, &estimate_params(&st.cfg, lm, st.runtime));
    let budget = usize::try_from(sc.budget).unwrap_or(usize::MAX);
    let plan = stream::fit(&mut lm.model, st.cfg.repack, full.total(), budget, sc.mode)
        .map_err(|e| e.to_string())?;
    let Some(s) = &lm.model.stream else {
        return Ok(());
    };
    // Loading's read-around cached pages of the file that a cgroup counts as used.
    stream::drop_page_cache(&lm.model);
    st.emit(ServerEvent::ModelStreamed {
        name: name.into(),
        what: s.describe(),
        layers: s.layers().len(),
        n_layers: lm.model.layers.len(),
        head: s.streams_head(),
        mode: sc.mode.name(),
        bytes_per_pass: s.bytes_per_pass() as u64,
        ring_bytes: plan.ring as u64,
        resident_bytes: plan.resident as u64,
        budget: sc.budget,
    });
    Ok(())
}

/// The `/metrics` series of the loaded models that stream layers.
pub(crate) fn render_metrics(st: &AppState, e: &mut crate::metrics::Exposition) {
    for m in st.loaded() {
        let Some(s) = &m.model.model.stream else {
            continue;
        };
        let name = crate::metrics::label(&m.name);
        let series = [
            (
                "mica_stream_layers",
                "Layers read from the file each forward pass (layer streaming).",
                s.layers().len() as f64,
            ),
            (
                "mica_stream_head",
                "1 when the output head is streamed too.",
                f64::from(u8::from(s.streams_head())),
            ),
            (
                "mica_stream_bytes_per_pass",
                "Bytes of weights read from the file each forward pass.",
                s.bytes_per_pass() as f64,
            ),
            (
                "mica_stream_ring_bytes",
                "Bytes of the buffers streamed layers are read into.",
                s.buffer_bytes() as f64,
            ),
            (
                "mica_stream_read_bytes",
                "Bytes of weights streamed from the file since the model loaded.",
                s.stats().bytes_read as f64,
            ),
        ];
        for (family, help, v) in series {
            e.add(
                family,
                help,
                "gauge",
                format!("{family}{{model=\"{name}\"}}"),
                v,
            );
        }
    }
}
