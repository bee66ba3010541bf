//! The memory budget of the commands that load a model (`run`, `chat`, `bench`,
//! `perplexity`, `serve`), and their load stages logged with timings.
//!
//! A model is opened without being prepared (header parsed, tokenizer built, weights only
//! mapped), its needs estimated ([`MemoryEstimate`]) and set against the memory this process
//! may use ([`host::available_memory`], or `--mem-limit`); a model that does not fit is
//! refused with the numbers unless `--force`. Only then are the weights repacked. After the
//! first forward pass (when the weights, the buffers and the prompt's KV blocks have been
//! touched) the resident set is compared with the estimate ([`ResidentCheck`]): a warning
//! past 10%, an `info` line otherwise. See docs/deploy.md.
//!
//! A model that does not fit (or any model, given `--mem-budget`) may instead stream its
//! last layers from the file ([`mica::models::stream`], docs/streaming.md): [`fit`] plans
//! how many layers stay resident and starts the streaming before the weights are repacked.

use anyhow::{Result, bail};
use clap::Args;
use log::{debug, info, warn};
use mica::engine::host::{self, Available, RssCheck};
use mica::models::memory::{
    EstimateParams, KvSizing, MemoryEstimate, compute_bytes, kv_bytes_for_positions, mib,
};
use mica::models::stream::{self, StreamMode};
use mica::models::{LoadOptions, LoadedModel, Model};
use std::path::Path;
use std::sync::Once;
use std::time::Instant;

#[derive(Args, Debug, Clone, Default)]
pub struct BudgetArgs {
    /// Load the model even when its memory estimate exceeds the memory available.
    #[arg(long = "force")]
    pub force: bool,
    /// Refuse unless the model fits in SIZE (e.g. 512M, 2G), instead of in the memory this
    /// process may use (its cgroup's limit, else MemAvailable, less a margin).
    #[arg(long = "mem-limit", value_name = "SIZE")]
    pub mem_limit: Option<String>,
    /// Fit the model in SIZE (e.g. 128M, 1G) by streaming its last layers from the file a
    /// layer at a time (the embeddings, norms and as many layers as fit stay resident; the
    /// output head too, unless streaming every layer is not enough). Without it, layers are
    /// streamed only when the model does not fit in the memory available (instead of
    /// refusing it). See docs/streaming.md.
    #[arg(long = "mem-budget", value_name = "SIZE")]
    pub mem_budget: Option<String>,
    /// How streamed layers are read: `overlapped` (an IO thread reads ahead of compute into
    /// three buffers) or `sync` (each layer read when the forward pass reaches it).
    #[arg(
        long = "stream-mode",
        value_name = "MODE",
        default_value = "overlapped"
    )]
    pub stream_mode: String,
}

impl BudgetArgs {
    /// `--mem-limit` in bytes.
    pub fn limit(&self) -> Result<Option<u64>> {
        self.mem_limit
            .as_deref()
            .map(|s| {
                crate::serve::parse_size(s)
                    .map(|b| b as u64)
                    .map_err(|e| e.context("--mem-limit"))
            })
            .transpose()
    }
}

impl BudgetArgs {
    /// `--mem-budget` in bytes.
    pub fn budget(&self) -> Result<Option<u64>> {
        self.mem_budget
            .as_deref()
            .map(|s| {
                crate::serve::parse_size(s)
                    .map(|b| b as u64)
                    .map_err(|e| e.context("--mem-budget"))
            })
            .transpose()
    }

    /// `--stream-mode`.
    pub fn mode(&self) -> Result<StreamMode> {
        self.stream_mode
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--stream-mode: {e}"))
    }
}

/// How a command will use the model: what sizes the KV cache and the buffers.
#[derive(Clone, Copy, Debug)]
pub struct Sizing {
    pub kv: KvSizing,
    /// Positions one sequence may reach.
    pub n_ctx: usize,
    /// Most tokens in one forward pass.
    pub batch_tokens: usize,
    /// Most tokens of a pass that produce logits.
    pub n_outputs: usize,
}

impl Sizing {
    /// One sequence of up to `n_ctx` positions, prompts in chunks of `batch_tokens`.
    pub fn one_sequence(n_ctx: usize, batch_tokens: usize) -> Sizing {
        Sizing {
            kv: KvSizing::Context { n_ctx, n_seq: 1 },
            n_ctx,
            batch_tokens: batch_tokens.min(n_ctx).max(1),
            n_outputs: 1,
        }
    }
}

/// Opens `path` without preparing the weights (stage 1, logged with its time).
pub fn open(path: &Path) -> Result<LoadedModel> {
    info!("load: opening {}", path.display());
    let lm = LoadedModel::open_observed(path, LoadOptions::READ_ONLY, &mut |stage, took| {
        info!(
            "load: {} in {:.0} ms",
            stage.describe(),
            took.as_secs_f64() * 1e3
        )
    })?;
    Ok(lm)
}

/// Warns, once per process, about settings that slow decoding.
fn slow_settings() {
    static SLOW: Once = Once::new();
    SLOW.call_once(|| {
        for w in host::slow_settings() {
            warn!("{w}");
        }
    });
}

fn estimate(lm: &LoadedModel, repack: bool, sizing: Sizing) -> MemoryEstimate {
    MemoryEstimate::new(
        &lm.model,
        &EstimateParams {
            repack,
            kv: sizing.kv,
            n_ctx: sizing.n_ctx,
            batch_tokens: sizing.batch_tokens,
            n_outputs: sizing.n_outputs,
            runtime: host::resident_bytes().unwrap_or(0) as usize,
        },
    )
}

/// `est` against the memory available: an error when it does not fit, unless `force`.
fn verdict(est: MemoryEstimate, force: bool, limit: Option<u64>) -> Result<MemoryEstimate> {
    let available = limit.map(Available::limit).or_else(host::available_memory);
    let Some(available) = available else {
        debug!("memory: nothing says how much is available; not checked");
        return Ok(est);
    };
    info!("memory: {available}");
    if let Err(e) = host::check_fits(&est, &available) {
        if force {
            warn!("{e}; loading anyway (--force)");
        } else {
            bail!("{e}\n(pass --force to load it anyway)");
        }
    }
    Ok(est)
}

/// Estimates what `lm` will need as `sizing` uses it and checks it against the memory
/// available (`--mem-limit` when given): an error naming every number when it does not fit,
/// unless `--force` (also warning, once per process, about settings that slow decoding).
/// With layer streaming: given `--mem-budget`, the model is fitted in it by
/// streaming its last layers (then checked against the memory available as usual);
/// without, a model that does not fit is streamed within the memory available rather than
/// refused (unless `--force`, which loads it whole). Call before [`prepare`].
pub fn fit(
    lm: &mut LoadedModel,
    repack: bool,
    sizing: Sizing,
    args: &BudgetArgs,
) -> Result<MemoryEstimate> {
    fit_within(lm, repack, sizing, args).map(|(est, _)| est)
}

/// [`fit`], also returning the budget the model's layers were streamed within (`None`
/// when nothing streams): what `serve` hands its loader for the same model.
pub fn fit_within(
    lm: &mut LoadedModel,
    repack: bool,
    sizing: Sizing,
    args: &BudgetArgs,
) -> Result<(MemoryEstimate, Option<u64>)> {
    let mode = args.mode()?;
    let limit = args.limit()?;
    let streamed = |lm: &LoadedModel, budget: u64| lm.model.stream.is_some().then_some(budget);
    if let Some(budget) = args.budget()? {
        let full = estimate(lm, repack, sizing);
        info!("memory estimate fully resident: {full}");
        stream_within(lm, repack, &full, budget, mode)?;
        let est = estimate(lm, repack, sizing);
        info!("memory estimate: {est}");
        // Loading's read-around cached pages of the file that a cgroup counts as used.
        stream::drop_page_cache(&lm.model);
        return Ok((verdict(est, args.force, limit)?, streamed(lm, budget)));
    }
    slow_settings();
    let est = estimate(lm, repack, sizing);
    info!("memory estimate: {est}");
    let available = limit.map(Available::limit).or_else(host::available_memory);
    let fits = available.as_ref().map(|a| host::check_fits(&est, a));
    if args.force || !matches!(fits, Some(Err(_))) {
        return Ok((verdict(est, args.force, limit)?, None));
    }
    // A cgroup counts the page cache loading read around the small tensors it touched (up to
    // the device's read-ahead per fault) as used: give it back and look again.
    stream::drop_page_cache(&lm.model);
    let available = limit.map(Available::limit).or_else(host::available_memory);
    let fits = available.as_ref().map(|a| host::check_fits(&est, a));
    let (Some(available), Some(Err(e))) = (available, fits) else {
        return Ok((verdict(est, args.force, limit)?, None));
    };
    // What the estimate may total: the usable bytes, plus what a measured figure already
    // left out (the process's resident set).
    let held = est.total() as u64 - host::still_needed(&est, &available);
    let budget = available.usable() + held;
    if let Err(why) = stream_within(lm, repack, &est, budget, mode) {
        bail!("{e}\n{why:#}\n(pass --force to load it anyway)");
    }
    warn!("{e}: streaming layers instead (see --mem-budget)");
    let est = estimate(lm, repack, sizing);
    info!("memory estimate: {est}");
    Ok((est, streamed(lm, budget)))
}

/// Streams as few of `lm`'s last layers as make `full` (its estimate fully resident) fit in
/// `budget` bytes; nothing when it fits already.
fn stream_within(
    lm: &mut LoadedModel,
    repack: bool,
    full: &MemoryEstimate,
    budget: u64,
    mode: StreamMode,
) -> Result<()> {
    let budget = usize::try_from(budget).unwrap_or(usize::MAX);
    let plan = stream::fit(&mut lm.model, repack, full.total(), budget, mode)?;
    let Some(s) = lm.model.stream.as_ref() else {
        info!(
            "memory: the model fits in the budget of {} fully resident; nothing streamed",
            mib(budget)
        );
        return Ok(());
    };
    info!(
        "memory: streaming {} ({mode:?}, {} read per forward pass) through a ring of {}; {} \
         resident of a budget of {}",
        s.describe(),
        mib(s.bytes_per_pass()),
        mib(plan.ring),
        mib(plan.resident),
        mib(budget)
    );
    Ok(())
}

/// Repacks the weights when asked (stage 2, logged with its time).
pub fn prepare(lm: &mut LoadedModel, repack: bool) {
    if !repack {
        return;
    }
    let t0 = Instant::now();
    let bytes = lm.model.repack();
    info!(
        "load: repacked {} of weights in {:.0} ms",
        mib(bytes),
        t0.elapsed().as_secs_f64() * 1e3
    );
}

/// [`open`], the KV cache types of `cache` (which the estimate counts), [`fit`] and
/// [`prepare`] in turn.
pub fn load(
    path: &Path,
    repack: bool,
    args: &BudgetArgs,
    cache: &crate::cache_args::CacheArgs,
    sizing: impl FnOnce(&LoadedModel) -> Sizing,
) -> Result<(LoadedModel, MemoryEstimate)> {
    let mut lm = open(path)?;
    cache.apply(&mut lm)?;
    let sizing = sizing(&lm);
    let est = fit(&mut lm, repack, sizing, args)?;
    prepare(&mut lm, repack);
    Ok((lm, est))
}

/// What the forward passes so far have touched: KV cache and buffer bytes.
#[derive(Clone, Copy, Debug)]
pub struct InUse {
    pub kv: usize,
    pub compute: usize,
}

impl InUse {
    /// One sequence of `positions` positions computed in chunks of up to `chunk` tokens.
    pub fn one_sequence(model: &Model, positions: usize, chunk: usize) -> InUse {
        InUse {
            kv: kv_bytes_for_positions(model, positions),
            compute: compute_bytes(model, positions.min(chunk), 1, positions),
        }
    }
}

/// The resident-set check after the first forward pass (once).
pub struct ResidentCheck {
    est: MemoryEstimate,
    done: bool,
}

impl ResidentCheck {
    pub fn new(est: MemoryEstimate) -> ResidentCheck {
        ResidentCheck { est, done: false }
    }

    /// Compares `rss` (the resident set now, or its peak; read from /proc when `None`) with
    /// what should be resident once the forward passes so far have touched `in_use`.
    /// Only the first call checks.
    pub fn after_forward(&mut self, rss: Option<u64>, in_use: InUse) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let Some(rss) = rss.or_else(host::resident_bytes) else {
            return;
        };
        let c = RssCheck {
            expected: self.est.expected_resident(in_use.kv, in_use.compute) as u64,
            rss,
        };
        if c.within_tolerance() {
            info!("memory after the first forward pass: {c}");
        } else {
            warn!(
                "memory after the first forward pass: {c}, off by more than {:.0}%",
                RssCheck::TOLERANCE * 100.0
            );
        }
    }
}
