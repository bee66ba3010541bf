//! `mica serve`: flags → a validated [`ServerConfig`], then the HTTP server on a tokio
//! runtime (the engines run on their own threads; tokio only does I/O). SIGTERM and SIGINT
//! both start a graceful shutdown; the server's events are printed on stderr.

use crate::budget::{self, BudgetArgs, Sizing};
use crate::cache_args::CacheArgs;
use crate::lora_args::LoraArgs;
use crate::spec_args::SpecArgs;
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use mica::engine::{Lane, SchedulePolicy, SchedulerConfig};
use mica::models::memory::mib;
use mica_server::{Access, ApiKey, AppState, Limits, ServerConfig, ServerEvent, StreamConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SchedulerArg {
    Priority,
    Fifo,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Model to serve: a GGUF file or a store name (see `mica list`); its API name is the
    /// file name without extension. Without it (and without --models-dir), the default model.
    #[arg(short = 'm', long = "model", conflicts_with = "models_dir")]
    pub model: Option<String>,
    /// Serve every model in this folder — GGUF and `.mica` files and Hugging Face folders
    /// (config.json + safetensors) — by file or folder name, each loaded on first request.
    #[arg(long = "models-dir")]
    pub models_dir: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require this API key (`Authorization: Bearer KEY`) on every route but /health;
    /// `KEY:LANE` caps its requests at a lane (interactive, background, bulk). Repeatable.
    #[arg(long = "api-key")]
    pub api_key: Vec<String>,
    /// A route answered without a key even when keys are set (e.g. /ready, /metrics for
    /// probes and scrapers). Repeatable.
    #[arg(long = "open-route")]
    pub open_route: Vec<String>,
    /// Origins browser pages may call from: exact origins, `scheme://host:*` for any port,
    /// or `*`. Comma-separated or repeated. Default: loopback origins only.
    #[arg(long = "allowed-origins", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Host names the `Host` header may carry (`*.domain` wildcards, `*` for any).
    /// Comma-separated or repeated. Default: loopback names when bound to a loopback
    /// address, any host otherwise.
    #[arg(long = "allowed-hosts", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Largest request body, e.g. 8M (413 beyond).
    #[arg(long = "max-body", default_value = "8M")]
    pub max_body: String,
    /// Time a client has to send a request's headers once it starts one, e.g. 10s.
    #[arg(long = "header-timeout", default_value = "10s")]
    pub header_timeout: String,
    /// Time a client has to send a request's body, e.g. 30s (408 beyond).
    #[arg(long = "body-timeout", default_value = "30s")]
    pub body_timeout: String,
    /// Time a connection may sit idle between requests before it is closed, e.g. 60s.
    #[arg(long = "idle-timeout", default_value = "60s")]
    pub idle_timeout: String,
    /// On SIGTERM or SIGINT, how long requests in flight may run on before their streams
    /// are ended with a final event (finish reason "abort"), e.g. 30s.
    #[arg(long = "shutdown-grace", default_value = "30s")]
    pub shutdown_grace: String,
    /// KV cache memory per loaded model, e.g. 512M, 2G.
    #[arg(long = "kv-mem", default_value = "512M")]
    pub kv_mem: String,
    /// Scheduling: priority lanes with aging and preemption, or plain first-in-first-out.
    #[arg(long, value_enum, default_value = "priority")]
    pub scheduler: SchedulerArg,
    /// Context size per sequence (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Compute threads (default: physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Keep the weights in the file's layout instead of repacking them at load for faster
    /// products (same results; repacking reads the whole file up front).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Tokens per engine step (all sequences together).
    #[arg(long = "batch-tokens", default_value_t = 256)]
    pub batch_tokens: usize,
    /// Sequences running at once.
    #[arg(long = "parallel", default_value_t = 32)]
    pub parallel: usize,
    /// Seconds of waiting that raise a request one lane.
    #[arg(long = "aging", default_value_t = 10.0)]
    pub aging: f64,
    /// Requests per lane allowed to wait before new ones get 429.
    #[arg(long = "queue-limit", default_value_t = 256)]
    pub queue_limit: usize,
    /// Models kept loaded at once (with --models-dir); the least recently used one is
    /// unloaded to make room.
    #[arg(long = "max-loaded", default_value_t = 1)]
    pub max_loaded: usize,
    /// Memory all loaded models may take together, estimated as weight file sizes plus
    /// --kv-mem each (e.g. 8G). A load that would not fit even alone is refused (HTTP 503).
    /// Default: the memory the system reports available at each load.
    #[arg(long = "mem-limit")]
    pub mem_limit: Option<String>,
    /// Start even when the model named by -m does not fit: its memory estimate (weights,
    /// --kv-mem, compute buffers) is checked against --mem-limit, else the memory this
    /// process may use, before the server starts. Without --force, a model that does not
    /// fit streams layers instead (see --mem-budget); with it, it is loaded whole.
    #[arg(long = "force")]
    pub force: bool,
    /// Fit each model loaded in SIZE (e.g. 256M, 2G: its weights, --kv-mem, buffers) by
    /// streaming its last layers from the file a layer at a time. Without it, the model
    /// named by -m streams only when it does not fit in the memory available (instead of
    /// being refused). See docs/streaming.md.
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
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Log lines on stderr: text, or one JSON object per line. Either way every request
    /// leaves one line when it ends (its X-Request-Id, model, lane, token counts, time to
    /// first token, total time, finish reason, status; errors with their cause), and no
    /// prompt or output text unless --log-prompts.
    #[arg(long = "log-format", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Which lines to write: error (failed model loads, failed requests: status 500 and
    /// up), warn (also requests refused with a 4xx status), info (also every request and
    /// the server's life: loads, unloads, shutdown; the default).
    #[arg(long = "log-level", value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// Put each generation's prompt (as the model saw it, chat template applied) and output
    /// text in its request line. Off by default: prompts may hold private data.
    #[arg(long = "log-prompts")]
    pub log_prompts: bool,
    /// Adapters the served model's requests may select (one model: not with --models-dir).
    #[command(flatten)]
    pub lora: LoraArgs,
    /// KV cache types of every model served.
    #[command(flatten)]
    pub cache: CacheArgs,
    /// The last layers of every model loaded, and its head, on the first CUDA GPU.
    #[command(flatten)]
    pub gpu: crate::gpu_args::GpuArgs,
}

/// `512M`, `2G`, `1.5GiB`, `1048576` → bytes.
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.trim_end_matches("IB").trim_end_matches('B');
    let (num, mul) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("cannot read size '{s}' (try 512M or 2G)"))?;
    if v.is_nan() || v <= 0.0 {
        bail!("size '{s}' must be positive");
    }
    Ok((v * mul as f64) as usize)
}

/// `30`, `30s`, `500ms`, `2m`, `1.5h` → a duration (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim().to_ascii_lowercase();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t.as_str(), "s"),
    };
    let mul = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => bail!("cannot read duration '{s}' (try 30s, 500ms or 2m)"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("cannot read duration '{s}' (try 30s, 500ms or 2m)"))?;
    if !v.is_finite() || v < 0.0 {
        bail!("duration '{s}' must be a positive number");
    }
    Ok(Duration::from_secs_f64(v * mul))
}

fn config(args: &ServeArgs) -> Result<ServerConfig> {
    let models = match (&args.model, &args.models_dir) {
        (_, Some(dir)) => {
            let found = ServerConfig::discover(dir)
                .with_context(|| format!("cannot read models folder {}", dir.display()))?;
            if found.is_empty() {
                bail!(
                    "no models in {} (looked for .gguf and .mica files and Hugging Face folders)",
                    dir.display()
                );
            }
            found
        }
        (m, None) => {
            let path = crate::store::resolve_model(m.as_deref(), false)?;
            vec![(ServerConfig::model_name(&path), path)]
        }
    };
    let mut api_keys = Vec::new();
    for k in &args.api_key {
        let (key, lane) = match k.rsplit_once(':') {
            Some((key, lane)) if Lane::parse(lane).is_some() => {
                (key.to_string(), Lane::parse(lane).expect("checked"))
            }
            _ => (k.clone(), Lane::Interactive),
        };
        if key.is_empty() {
            bail!("--api-key must not be empty");
        }
        api_keys.push(ApiKey { key, lane });
    }
    if args.aging.is_nan() || args.aging < 0.0 {
        bail!("--aging must be a number of seconds ≥ 0");
    }
    let threads = args
        .threads
        .unwrap_or_else(mica::kernels::pool::physical_cores);
    if threads == 0 {
        bail!("the thread count must be positive");
    }
    if args.max_loaded == 0 {
        bail!("--max-loaded must be at least 1");
    }
    let mem_limit = match &args.mem_limit {
        Some(s) => Some(parse_size(s).context("--mem-limit")? as u64),
        None => None,
    };
    for r in &args.open_route {
        if !r.starts_with('/') {
            bail!("--open-route '{r}' must be a path starting with /");
        }
    }
    let list = |v: &[String]| -> Vec<String> {
        v.iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let access = Access {
        api_keys,
        open_routes: args.open_route.clone(),
        allowed_origins: if args.allowed_origins.is_empty() {
            Access::loopback_origins()
        } else {
            list(&args.allowed_origins)
        },
        allowed_hosts: (!args.allowed_hosts.is_empty()).then(|| list(&args.allowed_hosts)),
    };
    let limits = Limits {
        max_body: parse_size(&args.max_body).context("--max-body")?,
        header_timeout: parse_duration(&args.header_timeout).context("--header-timeout")?,
        body_timeout: parse_duration(&args.body_timeout).context("--body-timeout")?,
        idle_timeout: parse_duration(&args.idle_timeout).context("--idle-timeout")?,
        shutdown_grace: parse_duration(&args.shutdown_grace).context("--shutdown-grace")?,
    };
    let preload = (models.len() == 1 && args.models_dir.is_none()).then(|| models[0].0.clone());
    if !args.lora.lora.is_empty() && preload.is_none() {
        bail!("--lora applies to one model: name it with -m (not with --models-dir)");
    }
    let names: Vec<String> = args.lora.lora.iter().map(|s| s.name()).collect();
    if let Some((i, n)) = names
        .iter()
        .enumerate()
        .find(|(i, n)| names[..*i].contains(n))
    {
        bail!(
            "--lora: adapters {} and {} are both named '{n}'; name them apart with NAME=PATH",
            names.iter().position(|m| m == n).unwrap_or(0),
            i
        );
    }
    Ok(ServerConfig {
        models,
        preload,
        access,
        limits,
        kv_mem: parse_size(&args.kv_mem)?,
        n_ctx: args.ctx_size,
        spec: args.spec.resolve(None, 0, false)?,
        n_threads: threads,
        scheduler: SchedulerConfig {
            policy: match args.scheduler {
                SchedulerArg::Priority => SchedulePolicy::Priority,
                SchedulerArg::Fifo => SchedulePolicy::Fifo,
            },
            max_batch_tokens: args.batch_tokens,
            max_running: args.parallel,
            aging: Duration::from_secs_f64(args.aging),
            ..Default::default()
        },
        max_waiting_per_lane: args.queue_limit,
        max_loaded: args.max_loaded,
        repack: !args.no_repack,
        mem_limit,
        lora: args.lora.lora.clone(),
        cache_type_k: args.cache.cache_type_k,
        cache_type_v: args.cache.cache_type_v,
        log_prompts: args.log_prompts,
        stream: None,
        offload: args.gpu.offloader(),
    })
}

/// How `serve` writes its log lines on stderr.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Plain sentences.
    #[default]
    Text,
    /// One JSON object per line (`"event"` names what happened; requests carry their ID,
    /// model, lane, token counts, timings, finish reason and status).
    Json,
}

/// Which server events `serve` writes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
}

impl LogLevel {
    /// The level of a server event.
    fn of(ev: &ServerEvent) -> LogLevel {
        match ev {
            ServerEvent::ModelLoadFailed { .. } => LogLevel::Error,
            ServerEvent::Request(r) if r.status >= 500 => LogLevel::Error,
            ServerEvent::Request(r) if r.status >= 400 => LogLevel::Warn,
            ServerEvent::GraceExpired { .. } => LogLevel::Warn,
            _ => LogLevel::Info,
        }
    }
}

/// One line on stderr per server event at `level` or more severe, as `format` says.
fn print_event(format: LogFormat, level: LogLevel, ev: &ServerEvent) {
    if LogLevel::of(ev) > level {
        return;
    }
    if format == LogFormat::Json {
        return eprintln!("{}", event_json(ev));
    }
    match ev {
        ServerEvent::ModelLoading { name } => eprintln!("loading {name} ..."),
        ServerEvent::ModelLoaded { name, seconds } => eprintln!("loaded {name} in {seconds:.1} s"),
        ServerEvent::ModelLoadFailed { name, error } => {
            eprintln!("error: cannot load model '{name}': {error}")
        }
        ServerEvent::ModelUnloaded { name } => eprintln!("unloaded {name}"),
        ServerEvent::ModelStreamed {
            name,
            what,
            mode,
            bytes_per_pass,
            ring_bytes,
            budget,
            ..
        } => eprintln!(
            "streaming {name}: {what} ({mode}), {} read per forward pass through a ring of {}, \
             within a memory budget of {}",
            mib(*bytes_per_pass as usize),
            mib(*ring_bytes as usize),
            mib(*budget as usize)
        ),
        ServerEvent::Draining { in_flight, grace } => eprintln!(
            "shutting down: {in_flight} request(s) in flight, up to {:.0} s to finish",
            grace.as_secs_f64()
        ),
        ServerEvent::GraceExpired { in_flight } => {
            eprintln!("grace period over: ending {in_flight} request(s)")
        }
        ServerEvent::Stopped => eprintln!("stopped"),
        ServerEvent::Request(r) => {
            let ttft = r.ttft_ms.map_or("-".to_string(), |t| format!("{t:.0}ms"));
            let mut err = r
                .error
                .as_deref()
                .map_or(String::new(), |e| format!(" error={e:?}"));
            if let Some(p) = &r.prompt {
                err.push_str(&format!(" prompt={p:?}"));
            }
            if let Some(o) = &r.output {
                err.push_str(&format!(" output={o:?}"));
            }
            eprintln!(
                "request {} {} {} status={} model={} lane={} prompt={} cached={} generated={} \
                 ttft={ttft} total={:.0}ms finish={}{err}",
                r.id,
                r.method,
                r.path,
                r.status,
                if r.model.is_empty() { "-" } else { &r.model },
                if r.lane.is_empty() { "-" } else { &r.lane },
                r.prompt_tokens,
                r.cached_tokens,
                r.generated_tokens,
                r.total_ms,
                if r.finish.is_empty() { "-" } else { &r.finish },
            )
        }
    }
}

/// A server event as one JSON object (with the time, seconds since the epoch).
fn event_json(ev: &ServerEvent) -> serde_json::Value {
    use serde_json::json;
    let mut v = match ev {
        ServerEvent::ModelLoading { name } => json!({"event": "model_loading", "model": name}),
        ServerEvent::ModelLoaded { name, seconds } => {
            json!({"event": "model_loaded", "model": name, "seconds": seconds})
        }
        ServerEvent::ModelLoadFailed { name, error } => {
            json!({"event": "model_load_failed", "model": name, "error": error})
        }
        ServerEvent::ModelUnloaded { name } => json!({"event": "model_unloaded", "model": name}),
        ServerEvent::ModelStreamed {
            name,
            what,
            layers,
            n_layers,
            head,
            mode,
            bytes_per_pass,
            ring_bytes,
            resident_bytes,
            budget,
        } => json!({
            "event": "model_streamed", "model": name, "streamed": what, "layers": layers,
            "n_layers": n_layers, "head": head, "mode": mode, "bytes_per_pass": bytes_per_pass,
            "ring_bytes": ring_bytes, "resident_bytes": resident_bytes, "budget": budget
        }),
        ServerEvent::Draining { in_flight, grace } => json!({
            "event": "draining", "in_flight": in_flight, "grace_s": grace.as_secs_f64()
        }),
        ServerEvent::GraceExpired { in_flight } => {
            json!({"event": "grace_expired", "in_flight": in_flight})
        }
        ServerEvent::Stopped => json!({"event": "stopped"}),
        ServerEvent::Request(r) => {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["event"] = "request".into();
            v
        }
    };
    v["ts"] = json!(crate::logging::now_s());
    v
}

/// The memory budget and layer streaming of the served models. With `--mem-budget`, every
/// model loaded streams within it. The model loaded at start-up (`-m`) is opened (not
/// prepared) to estimate what its engine will take with the server's KV memory and step
/// budget, and fitted as `mica run` fits its model: streamed within `--mem-budget`, or,
/// when it does not fit in the memory available, within that (unless `--force`); then
/// dropped, the server loading it again with the budget found.
fn check_preload(cfg: &mut ServerConfig, args: &ServeArgs) -> Result<()> {
    let budget_args = BudgetArgs {
        force: args.force,
        mem_limit: args.mem_limit.clone(),
        mem_budget: args.mem_budget.clone(),
        stream_mode: args.stream_mode.clone(),
    };
    let mode = budget_args.mode()?;
    if let Some(budget) = budget_args.budget()? {
        cfg.stream = Some(StreamConfig { budget, mode });
    }
    let self_spec = |streams: bool| {
        if streams && args.spec.draft_layers.is_some() {
            bail!(
                "--draft-layers: self-speculation runs a truncated copy of the model's layers \
                 resident, which layer streaming cannot give it; use the default n-gram \
                 speculation (or --spec off) with a streamed model, or load the model whole \
                 (no --mem-budget; --force when it does not fit)"
            );
        }
        Ok(())
    };
    self_spec(cfg.stream.is_some())?;
    no_streamed_offload(cfg)?;
    let Some(name) = &cfg.preload else {
        return Ok(());
    };
    let Some((_, path)) = cfg.models.iter().find(|(n, _)| n == name) else {
        return Ok(());
    };
    let mut lm = budget::open(path)?;
    // The cache types decide the blocks' bytes, hence how many fit in --kv-mem.
    lm.model
        .config
        .choose_cache_types(cfg.cache_type_k, cfg.cache_type_v)?;
    let p = mica_server::streaming::estimate_params(cfg, &lm, 0);
    let sizing = Sizing {
        kv: p.kv,
        n_ctx: p.n_ctx,
        batch_tokens: p.batch_tokens,
        n_outputs: p.n_outputs,
    };
    let (_, streamed) = budget::fit_within(&mut lm, cfg.repack, sizing, &budget_args)?;
    if let Some(budget) = streamed {
        cfg.stream = Some(StreamConfig { budget, mode });
    }
    self_spec(streamed.is_some())?;
    no_streamed_offload(cfg)
}

/// Streamed layers are read a layer at a time during host passes: they cannot be uploaded.
fn no_streamed_offload(cfg: &ServerConfig) -> Result<()> {
    if let (Some(o), Some(_)) = (&cfg.offload, &cfg.stream) {
        bail!(
            "{}: the model would stream its last layers from the file (it does not fit in \
             memory, or --mem-budget), and streamed layers cannot run on the GPU; load it \
             whole (--force) or drop --mem-budget",
            o.name
        );
    }
    Ok(())
}

/// Completes on SIGTERM (Kubernetes, systemd, Docker) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

pub fn serve(args: ServeArgs) -> Result<()> {
    crate::logging::set_json(args.log_format == LogFormat::Json);
    let mut cfg = config(&args)?;
    check_preload(&mut cfg, &args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let (format, level) = (args.log_format, args.log_level);
        let print = move |ev: &ServerEvent| print_event(format, level, ev);
        let state = Arc::new(AppState::with_observer(cfg, Some(Arc::new(print))));
        if format == LogFormat::Json {
            let line = serde_json::json!({
                "event": "listening", "address": format!("http://{local}"),
                "models": state.model_names(), "ts": crate::logging::now_s()
            });
            eprintln!("{line}");
        } else {
            eprintln!(
                "mica serve: listening on http://{local} ({} model(s): {})",
                state.cfg.models.len(),
                state.model_names().join(", ")
            );
        }
        mica_server::serve(listener, state, shutdown_signal())
            .await
            .context("mica serve stopped")
    });
    // A load still running in the background (shutdown during the preload) is not waited
    // for.
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, parse_size};
    use std::time::Duration;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("3d").is_err());
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;

    /// JSON log lines parse and carry the request's fields.
    #[test]
    fn request_events_as_json_lines() {
        let rec = mica_server::reqlog::RequestRecord {
            id: "req-1".into(),
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            model: "m".into(),
            lane: "interactive".into(),
            prompt_tokens: 7,
            cached_tokens: 3,
            generated_tokens: 5,
            ttft_ms: Some(12.5),
            total_ms: 40.0,
            finish: "stop".into(),
            status: 200,
            error: None,
            prompt: None,
            output: None,
        };
        let line = event_json(&ServerEvent::Request(rec)).to_string();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], "request");
        assert_eq!(v["id"], "req-1");
        assert_eq!(v["cached_tokens"], 3);
        assert!(v["ts"].as_f64().unwrap() > 1.7e9);
        assert!(v.get("prompt").is_none(), "no text unless asked: {v}");
        let v = event_json(&ServerEvent::Stopped);
        assert_eq!(v["event"], "stopped");
        let v = event_json(&ServerEvent::ModelStreamed {
            name: "m".into(),
            what: "layers 9..=17 of 18".into(),
            layers: 9,
            n_layers: 18,
            head: false,
            mode: "sync",
            bytes_per_pass: 1 << 26,
            ring_bytes: 1 << 22,
            resident_bytes: 1 << 27,
            budget: 1 << 28,
        });
        assert_eq!(v["event"], "model_streamed");
        assert_eq!(v["layers"], 9);
        assert_eq!(v["mode"], "sync");
        assert_eq!(v["bytes_per_pass"], 1 << 26);
    }

    #[test]
    fn levels_filter_events() {
        let req = |status| {
            ServerEvent::Request(mica_server::reqlog::RequestRecord {
                id: "r".into(),
                method: "POST".into(),
                path: "/v1/completions".into(),
                model: String::new(),
                lane: String::new(),
                prompt_tokens: 0,
                cached_tokens: 0,
                generated_tokens: 0,
                ttft_ms: None,
                total_ms: 1.0,
                finish: String::new(),
                status,
                error: None,
                prompt: None,
                output: None,
            })
        };
        assert_eq!(LogLevel::of(&req(200)), LogLevel::Info);
        assert_eq!(LogLevel::of(&req(429)), LogLevel::Warn);
        assert_eq!(LogLevel::of(&req(500)), LogLevel::Error);
        assert_eq!(LogLevel::of(&ServerEvent::Stopped), LogLevel::Info);
        assert!(LogLevel::Error < LogLevel::Warn && LogLevel::Warn < LogLevel::Info);
    }
}
