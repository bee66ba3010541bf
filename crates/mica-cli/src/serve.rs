//! `mica serve`: flags → a validated [`ServerConfig`], then the HTTP server on a tokio
//! runtime (the engines run on their own threads; tokio only does I/O).

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use mica_engine::{Lane, SchedulePolicy, SchedulerConfig};
use mica_server::{ApiKey, AppState, ServerConfig};
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
    /// Require this API key (`Authorization: Bearer KEY`); `KEY:LANE` caps its requests at
    /// a lane (interactive, background, bulk). Repeatable.
    #[arg(long = "api-key")]
    pub api_key: Vec<String>,
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
        .unwrap_or_else(mica_kernels::pool::physical_cores);
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
    Ok(ServerConfig {
        models,
        api_keys,
        kv_mem: parse_size(&args.kv_mem)?,
        n_ctx: args.ctx_size,
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
    })
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let cfg = config(&args)?;
    let single = (cfg.models.len() == 1).then(|| cfg.models[0].0.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let state = Arc::new(AppState::new(cfg));
        if let Some(name) = &single {
            eprintln!("loading {name} ...");
            state
                .preload(name)
                .await
                .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        }
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!(
            "mica serve: listening on http://{local} ({} model(s): {})",
            state.cfg.models.len(),
            state.model_names().join(", ")
        );
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        mica_server::serve(listener, state, shutdown)
            .await
            .context("server error")
    })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
    }
}
