//! Server settings and shared state: the models it can serve (GGUF and `.mica` files and
//! Hugging Face folders, loaded on first use, least recently used unloaded beyond a limit,
//! refused when they would not fit in memory), API keys with their priority lanes, and how a
//! request's lane is resolved.
//!
//! **Memory budget.** A model is estimated to need its weight files' size (they are mapped,
//! not copied) plus its KV cache (`kv_mem`). Before a load, least recently used models are
//! unloaded until the new one fits under `mem_limit` (or, without one, what the system
//! reports available); a model that would not fit even with every other one unloaded is
//! refused with a 503 naming the numbers, and nothing is unloaded for it. An unloaded model
//! keeps serving the requests it has in flight (they hold it) and still counts against the
//! budget until they end.

use crate::error::ApiError;
use axum::http::HeaderMap;
use mica_engine::{EngineConfig, EngineHandle, Lane, SchedulerConfig};
use mica_models::{LoadOptions, LoadedModel};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
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
    /// Servable models: API name and path (GGUF or `.mica` file, or Hugging Face folder).
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
    /// Repack weights at load ([`LoadOptions::repack`]).
    pub repack: bool,
    /// Memory loaded models and their KV caches may take together, bytes (default: what the
    /// system reports available when loading).
    pub mem_limit: Option<u64>,
}

/// Whether `dir` is a Hugging Face model folder: a `config.json` and safetensors weights.
fn is_hf_folder(dir: &Path) -> bool {
    dir.join("config.json").is_file() && !safetensors_files(dir).is_empty()
}

fn safetensors_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && has_ext(p, "safetensors"))
        .collect()
}

fn has_ext(p: &Path, ext: &str) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// Bytes of a model's weights on disk: the file, or a folder's safetensors files.
pub fn model_bytes(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    if path.is_dir() {
        safetensors_files(path).iter().map(|p| size(p)).sum()
    } else {
        size(path)
    }
}

impl ServerConfig {
    /// The servable models in `dir`: every `.gguf` and `.mica` file, named by its file stem,
    /// and every Hugging Face folder (`config.json` + `*.safetensors`), named by the folder.
    /// Two models with one name are an error naming both.
    pub fn discover(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
        let mut out: Vec<(String, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let servable = if path.is_dir() {
                is_hf_folder(&path)
            } else {
                has_ext(&path, "gguf") || has_ext(&path, "mica")
            };
            if !servable {
                continue;
            }
            let name = Self::model_name(&path);
            if let Some((_, other)) = out.iter().find(|(n, _)| *n == name) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "two models would be named '{name}': {} and {}; rename one",
                        other.display(),
                        path.display()
                    ),
                ));
            }
            out.push((name, path));
        }
        out.sort();
        Ok(out)
    }

    /// The API name of a model: its file name without extension, or its folder's name.
    pub fn model_name(path: &Path) -> String {
        let name = if path.is_dir() {
            path.file_name()
        } else {
            path.file_stem()
        };
        name.and_then(|s| s.to_str()).unwrap_or("model").to_string()
    }
}

/// A model loaded with its engine.
pub struct Loaded {
    pub name: String,
    pub path: PathBuf,
    pub model: Arc<LoadedModel>,
    pub engine: EngineHandle,
    pub loaded_at: SystemTime,
    /// Weight files plus KV cache bytes (the estimate the memory budget uses).
    pub bytes: u64,
}

pub struct AppState {
    pub cfg: ServerConfig,
    /// Loaded models and when each was last used.
    loaded: Mutex<Vec<(Arc<Loaded>, Instant)>>,
    /// Models unloaded while requests were in flight on them: alive until those end.
    draining: Mutex<Vec<Weak<Loaded>>>,
    load_lock: tokio::sync::Mutex<()>,
}

impl AppState {
    pub fn new(cfg: ServerConfig) -> AppState {
        AppState {
            cfg,
            loaded: Mutex::new(Vec::new()),
            draining: Mutex::new(Vec::new()),
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
        let evicted = self.make_room(name, &path)?;
        // The last holder of an unloaded model joins its engine thread (which may be mid-step):
        // off the async workers, and before the load so its memory is back.
        let _ = tokio::task::spawn_blocking(move || drop(evicted)).await;
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
    /// memory budget (see the module docs); refuses the load, unloading nothing, when it
    /// would not fit even alone.
    /// Returns the models unloaded (to be dropped outside the lock).
    fn make_room(&self, name: &str, path: &Path) -> Result<Vec<Arc<Loaded>>, ApiError> {
        let file = model_bytes(path);
        let need = file + self.cfg.kv_mem as u64;
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let draining = self.draining_bytes();
        let loaded_bytes: u64 = l.iter().map(|(m, _)| m.bytes).sum();
        // What the load could have with every loaded model gone (draining ones stay).
        let best = match self.cfg.mem_limit {
            Some(limit) => limit.saturating_sub(draining),
            None => mem_available().map_or(u64::MAX, |a| a.saturating_add(loaded_bytes)),
        };
        if need > best {
            let limit = match self.cfg.mem_limit {
                Some(_) => "--mem-limit",
                None => "available memory",
            };
            return Err(ApiError::unavailable(
                format!(
                    "cannot load model '{name}': it needs {} MiB (weights {} MiB + KV cache {} MiB) but {limit} leaves {} MiB{}; lower --kv-mem, raise --mem-limit or free memory",
                    mib(need),
                    mib(file),
                    mib(self.cfg.kv_mem as u64),
                    mib(best),
                    if draining > 0 {
                        format!(
                            " ({} MiB held by unloaded models finishing requests)",
                            mib(draining)
                        )
                    } else {
                        String::new()
                    }
                ),
                30,
            ));
        }
        let available = |l: &[(Arc<Loaded>, Instant)]| {
            let held: u64 = l.iter().map(|(m, _)| m.bytes).sum();
            match self.cfg.mem_limit {
                Some(limit) => limit.saturating_sub(draining + held),
                // An unloaded model's memory returns when its last request ends (at once
                // when it has none).
                None => mem_available().map_or(u64::MAX, |a| a.saturating_add(loaded_bytes - held)),
            }
        };
        let mut evicted = Vec::new();
        while !l.is_empty() && (l.len() >= self.cfg.max_loaded.max(1) || need > available(&l)) {
            let i = lru(&l);
            let (m, _) = l.remove(i);
            self.draining
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::downgrade(&m));
            evicted.push(m);
        }
        Ok(evicted)
    }

    /// Bytes of unloaded models still finishing requests.
    fn draining_bytes(&self) -> u64 {
        let mut d = self.draining.lock().unwrap_or_else(|e| e.into_inner());
        d.retain(|w| w.strong_count() > 0);
        d.iter().filter_map(Weak::upgrade).map(|m| m.bytes).sum()
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

fn mib(b: u64) -> u64 {
    b >> 20
}

/// `MemAvailable` from /proc/meminfo, bytes.
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn load(cfg: &ServerConfig, name: String, path: PathBuf) -> Result<Loaded, ApiError> {
    let opts = LoadOptions { repack: cfg.repack };
    let model = LoadedModel::open_with(&path, opts)
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
        abandon_every: 0,
    };
    let engine = EngineHandle::start(model.clone(), ecfg)
        .map_err(|e| ApiError::internal(format!("cannot start model '{name}': {e}")))?;
    let file = model_bytes(&path);
    Ok(Loaded {
        name,
        path,
        model,
        engine,
        loaded_at: SystemTime::now(),
        bytes: file + cfg.kv_mem as u64,
    })
}
