//! Server settings and shared state: the models it can serve (loaded on first use, least
//! recently used unloaded beyond a limit, refused when they would not fit in memory), API
//! keys with their priority lanes, and how a request's lane is resolved.

use crate::error::ApiError;
use axum::http::HeaderMap;
use mica_engine::{EngineConfig, EngineHandle, Lane, SchedulerConfig};
use mica_models::LoadedModel;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

/// An API key and the highest lane its requests may use.
#[derive(Clone, Debug)]
pub struct ApiKey {
    pub key: String,
    pub lane: Lane,
}

/// Resolved settings of `mica serve`.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Servable models: API name and GGUF path.
    pub models: Vec<(String, PathBuf)>,
    /// Keys accepted (none: no authentication).
    pub api_keys: Vec<ApiKey>,
    /// KV cache memory per loaded model, bytes.
    pub kv_mem: usize,
    /// Context per sequence (default: the model's training context, at most 4096).
    pub n_ctx: Option<usize>,
    pub n_threads: usize,
    pub scheduler: SchedulerConfig,
    pub max_waiting_per_lane: usize,
    /// Models kept loaded at once.
    pub max_loaded: usize,
    /// Memory models and their KV caches may take, bytes (default: what the system reports
    /// available when loading).
    pub mem_limit: Option<u64>,
}

impl ServerConfig {
    /// The servable models in `dir`: every `.gguf` file, named by its file stem.
    pub fn discover(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                out.push((stem.to_string(), path));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The API name of a model file: its file name without extension.
    pub fn model_name(path: &Path) -> String {
        path.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("model")
            .to_string()
    }
}

/// A model loaded with its engine.
pub struct Loaded {
    pub name: String,
    pub path: PathBuf,
    pub model: Arc<LoadedModel>,
    pub engine: EngineHandle,
    pub loaded_at: SystemTime,
    /// File plus KV cache bytes.
    pub bytes: u64,
}

pub struct AppState {
    pub cfg: ServerConfig,
    loaded: Mutex<Vec<(Arc<Loaded>, Instant)>>,
    load_lock: tokio::sync::Mutex<()>,
}

impl AppState {
    pub fn new(cfg: ServerConfig) -> AppState {
        AppState {
            cfg,
            loaded: Mutex::new(Vec::new()),
            load_lock: tokio::sync::Mutex::new(()),
        }
    }

    pub fn model_names(&self) -> Vec<String> {
        self.cfg.models.iter().map(|m| m.0.clone()).collect()
    }

    /// Models loaded now.
    pub fn loaded(&self) -> Vec<Arc<Loaded>> {
        let l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        l.iter().map(|(m, _)| m.clone()).collect()
    }

    /// The model named `name`, loading it first if needed.
    pub async fn get(&self, name: &str) -> Result<Arc<Loaded>, ApiError> {
        // Names are checked even with one model, so a typo is an error, not a surprise.
        if let Some(m) = self.touch(name) {
            return Ok(m);
        }
        let Some((_, path)) = self.cfg.models.iter().find(|m| m.0 == name).cloned() else {
            return Err(ApiError::model_not_found(name, &self.model_names()));
        };
        let _guard = self.load_lock.lock().await;
        if let Some(m) = self.touch(name) {
            return Ok(m);
        }
        self.make_room(&path)?;
        let cfg = self.cfg.clone();
        let name = name.to_string();
        let loaded = tokio::task::spawn_blocking(move || load(&cfg, name, path))
            .await
            .map_err(|e| ApiError::internal(format!("model loading failed: {e}")))??;
        let loaded = Arc::new(loaded);
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((loaded.clone(), Instant::now()));
        Ok(loaded)
    }

    /// Loads a model now (at start-up).
    pub async fn preload(&self, name: &str) -> Result<(), ApiError> {
        self.get(name).await.map(|_| ())
    }

    fn touch(&self, name: &str) -> Option<Arc<Loaded>> {
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let e = l.iter_mut().find(|(m, _)| m.name == name)?;
        e.1 = Instant::now();
        Some(e.0.clone())
    }

    /// Unloads least recently used models until one more fits under `max_loaded` and the
    /// memory budget; refuses the load when even then it would not fit. A model unloaded
    /// here keeps serving the requests it has in flight (they hold it) and goes when they end.
    fn make_room(&self, path: &Path) -> Result<(), ApiError> {
        let file = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let need = file + self.cfg.kv_mem as u64;
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        while !l.is_empty() && l.len() >= self.cfg.max_loaded.max(1) {
            let i = lru(&l);
            l.remove(i);
        }
        let available = match self.cfg.mem_limit {
            Some(limit) => limit.saturating_sub(l.iter().map(|(m, _)| m.bytes).sum::<u64>()),
            None => mem_available().unwrap_or(u64::MAX),
        };
        if need > available {
            while !l.is_empty() {
                let i = lru(&l);
                l.remove(i);
            }
            let available = match self.cfg.mem_limit {
                Some(limit) => limit,
                None => mem_available().unwrap_or(u64::MAX),
            };
            if need > available {
                return Err(ApiError::unavailable(
                    format!(
                        "cannot load {}: it needs {} MiB (file {} MiB + KV cache {} MiB) but {} MiB are available; lower --kv-mem or free memory",
                        path.display(),
                        need >> 20,
                        file >> 20,
                        self.cfg.kv_mem >> 20,
                        available >> 20
                    ),
                    30,
                ));
            }
        }
        Ok(())
    }

    /// The lane of a request: the `X-Mica-Priority` header, else the body's `priority`,
    /// else interactive; never above the API key's lane.
    pub fn lane(&self, headers: &HeaderMap, body_priority: Option<&str>) -> Result<Lane, ApiError> {
        let asked = match headers
            .get("x-mica-priority")
            .and_then(|v| v.to_str().ok())
            .or(body_priority)
        {
            Some(s) => Lane::parse(s).ok_or_else(|| {
                ApiError::bad_request(
                    Some("priority"),
                    format!("unknown priority '{s}'; use interactive, background or bulk"),
                )
            })?,
            None => Lane::Interactive,
        };
        let cap = self.key(headers).map_or(Lane::Interactive, |k| k.lane);
        Ok(asked.max(cap))
    }

    /// The API key a request presents (`Authorization: Bearer`, or `X-Api-Key`).
    pub fn key(&self, headers: &HeaderMap) -> Option<&ApiKey> {
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let given = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))?;
        self.cfg.api_keys.iter().find(|k| k.key == given)
    }

    /// Checks the API key when keys are configured.
    pub fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.cfg.api_keys.is_empty() || self.key(headers).is_some() {
            Ok(())
        } else {
            Err(ApiError::unauthorized())
        }
    }
}

fn lru(l: &[(Arc<Loaded>, Instant)]) -> usize {
    l.iter()
        .enumerate()
        .min_by_key(|(_, (_, t))| *t)
        .map_or(0, |(i, _)| i)
}

/// `MemAvailable` from /proc/meminfo, bytes.
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn load(cfg: &ServerConfig, name: String, path: PathBuf) -> Result<Loaded, ApiError> {
    let model = LoadedModel::open(&path)
        .map_err(|e| ApiError::internal(format!("cannot load model '{name}': {e}")))?;
    let model = Arc::new(model);
    let n_ctx = cfg
        .n_ctx
        .unwrap_or(model.model.config.n_ctx_train.min(4096));
    let kv_blocks = EngineConfig::blocks_for_memory(&model, cfg.kv_mem);
    let ecfg = EngineConfig {
        n_threads: cfg.n_threads,
        n_ctx,
        kv_blocks,
        scheduler: cfg.scheduler.clone(),
        max_waiting_per_lane: cfg.max_waiting_per_lane,
        prefix_caching: true,
        max_n: 16,
    };
    let engine = EngineHandle::start(model.clone(), ecfg)
        .map_err(|e| ApiError::internal(format!("cannot start model '{name}': {e}")))?;
    let file = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    Ok(Loaded {
        name,
        path,
        model,
        engine,
        loaded_at: SystemTime::now(),
        bytes: file + cfg.kv_mem as u64,
    })
}
