//! The model lifecycle: loading on first use, unloading by the memory budget, and reading
//! metadata without loading.
//!
//! **A failed load unloads nothing.** A load opens and validates the file first (header,
//! tensor directory, shapes, tokenizer, template — weights stay mapped, nothing is copied);
//! a corrupt or unsupported file fails there, with every loaded model still loaded. Then
//! the weights are repacked and the model's engine started. Only once the new model runs
//! are models unloaded, least recently used first, until at most `max_loaded` remain and
//! the memory budget holds. One exception keeps a swap possible on a machine that cannot
//! hold two models: when the new one would not fit next to the loaded ones, they are
//! unloaded after the file validated and before its weights are repacked.
//!
//! **Memory budget.** A model is estimated to need its weight files' size plus its KV cache
//! (`kv_mem`). A model that would not fit even with every other one unloaded is refused
//! with a 503 naming the numbers, before anything is read. An unloaded model keeps serving
//! the requests it has in flight (they hold it) and counts against the budget until they
//! end; it is freed by [`AppState::reap`] once nothing holds it.
//!
//! **Metadata** (`/api/show`, `/api/tags`) is read from the file's header or the folder's
//! `config.json`, never by loading weights, and cached per model.

use crate::config::model_bytes;
use crate::error::ServerError;
use crate::state::{AppState, ServerEvent};
use mica::engine::spec::{NgramCache, SpecConfig, SpecMethod, check_vocab};
use mica::engine::{EngineConfig, EngineHandle};
use mica::models::{LoadOptions, LoadedModel};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// A model loaded with its engine.
pub struct Loaded {
    pub name: String,
    pub path: PathBuf,
    pub model: Arc<LoadedModel>,
    pub engine: EngineHandle,
    pub loaded_at: SystemTime,
    /// Weight files plus KV cache bytes (the estimate the memory budget uses).
    pub bytes: u64,
    /// Speculative decoding for requests that do not choose (a draft model checked against
    /// this model's vocabulary, its context this model's).
    pub spec: SpecConfig,
    /// The vocabulary indexed for constrained decoding, built on the first request that
    /// needs it ([`crate::structured`]).
    pub grammar: std::sync::OnceLock<mica::grammar::GrammarCompiler>,
    /// The embedding routes' embedder, made on first use; one embedding request at a time
    /// per model runs on it ([`crate::embeddings`]).
    pub embedder: std::sync::Mutex<Option<mica::engine::Embedder<Arc<LoadedModel>>>>,
}

/// What `/api/show` and `/api/tags` report about a model, read without loading it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelMeta {
    /// `gguf`, `mica` or `safetensors`.
    pub format: &'static str,
    pub arch: String,
    pub context_length: Option<u64>,
    pub embedding_length: Option<u64>,
    pub block_count: Option<u64>,
    pub head_count: Option<u64>,
    pub head_count_kv: Option<u64>,
    pub feed_forward_length: Option<u64>,
    pub vocab_size: Option<u64>,
    pub size_label: String,
    pub file_type: Option<u32>,
    pub chat_template: Option<String>,
}

impl ModelMeta {
    /// Reads a GGUF or `.mica` file's header, or a Hugging Face folder's JSON files.
    pub fn read(path: &Path) -> Result<ModelMeta, String> {
        if path.is_dir() {
            return Self::read_hf(path);
        }
        let f = mica::formats::GgufFile::open(path).map_err(|e| e.to_string())?;
        let arch = f.get_str("general.architecture").unwrap_or("").to_string();
        let key = |k: &str| f.get_u64(&format!("{arch}.{k}"));
        Ok(ModelMeta {
            format: match f.container() {
                mica::formats::Container::Gguf => "gguf",
                mica::formats::Container::Mica => "mica",
            },
            context_length: key("context_length"),
            embedding_length: key("embedding_length"),
            block_count: key("block_count"),
            head_count: key("attention.head_count"),
            head_count_kv: key("attention.head_count_kv"),
            feed_forward_length: key("feed_forward_length"),
            vocab_size: f.get_array("tokenizer.ggml.tokens").map(|a| a.len() as u64),
            size_label: f.get_str("general.size_label").unwrap_or("").to_string(),
            file_type: f.get_u32("general.file_type"),
            chat_template: f.get_str("tokenizer.chat_template").map(str::to_string),
            arch,
        })
    }

    fn read_hf(dir: &Path) -> Result<ModelMeta, String> {
        let read = |name: &str| -> Result<Option<serde_json::Value>, String> {
            match std::fs::read(dir.join(name)) {
                Ok(b) => serde_json::from_slice(&b)
                    .map(Some)
                    .map_err(|e| format!("{name}: {e}")),
                Err(_) => Ok(None),
            }
        };
        let c = read("config.json")?.ok_or("config.json is missing")?;
        let num = |k: &str| c.get(k).and_then(serde_json::Value::as_u64);
        let template = read("tokenizer_config.json")?
            .and_then(|t| t.get("chat_template")?.as_str().map(str::to_string))
            .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        // A folder of PyTorch weights (read without running their pickles) says so.
        let safetensors = mica::models::hf::weight_files(dir)
            .first()
            .is_none_or(|p| p.extension().is_some_and(|e| e == "safetensors"));
        Ok(ModelMeta {
            format: if safetensors {
                "safetensors"
            } else {
                "pytorch"
            },
            arch: c
                .get("model_type")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string(),
            context_length: num("max_position_embeddings"),
            embedding_length: num("hidden_size"),
            block_count: num("num_hidden_layers"),
            head_count: num("num_attention_heads"),
            head_count_kv: num("num_key_value_heads").or(num("num_attention_heads")),
            feed_forward_length: num("intermediate_size"),
            vocab_size: num("vocab_size"),
            size_label: String::new(),
            file_type: None,
            chat_template: template,
        })
    }
}

/// `msg` without the folder `path` lives in: clients see file names, not where the files
/// are.
pub fn without_paths(msg: &str, path: &Path) -> String {
    let mut out = msg.to_string();
    if let Some(dir) = path
        .parent()
        .and_then(Path::to_str)
        .filter(|d| !d.is_empty())
    {
        out = out.replace(&format!("{dir}/"), "");
    }
    out
}

fn mib(b: u64) -> u64 {
    b >> 20
}

/// The memory this process may still use, bytes: its cgroup limit's headroom where that is
/// tighter than `MemAvailable` ([`mica::engine::host::available_memory`], before its margin).
fn mem_available() -> Option<u64> {
    mica::engine::host::available_memory().map(|a| a.raw)
}

/// Hands the heap memory an unloaded model freed back to the system. glibc keeps freed
/// blocks in its per-thread arenas, so without this the process's resident memory would
/// stay at its high-water mark after every unload (repacked weights are many allocations
/// below its mmap threshold), and grow as models are swapped from different threads.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas; it
    // touches no live allocation and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Tokens of recent outputs each model's n-gram cache keeps.
const NGRAM_CACHE_TOKENS: usize = 1 << 16;

/// Opens and validates a model, weights left mapped as in the file.
fn open(path: &Path) -> Result<LoadedModel, String> {
    LoadedModel::open_with(path, LoadOptions::READ_ONLY).map_err(|e| e.to_string())
}

/// Repacks an opened model's weights (if configured) and starts its engine.
fn start(
    st: &AppState,
    name: String,
    path: PathBuf,
    mut lm: LoadedModel,
) -> Result<Loaded, String> {
    let cfg = &st.cfg;
    // The `--lora` adapters, for requests to select ([`crate::lora`]).
    st.open_configured(&name, &lm)?;
    lm.model
        .config
        .choose_cache_types(cfg.cache_type_k, cfg.cache_type_v)
        .map_err(|e| e.to_string())?;
    // Layer streaming, when configured, before the weights are repacked (below).
    crate::streaming::fit(st, &name, &mut lm)?;
    let n_ctx = cfg.n_ctx.unwrap_or(lm.model.config.n_ctx_train.min(4096));
    let mem = EngineConfig::memory_plan(&lm, cfg.kv_mem, cfg.scheduler.max_running);
    let ecfg = EngineConfig {
        n_threads: cfg.n_threads,
        n_ctx,
        kv_blocks: mem.kv_blocks,
        scheduler: cfg.scheduler.clone(),
        max_waiting_per_lane: cfg.max_waiting_per_lane,
        prefix_caching: true,
        max_n: crate::params::MAX_N,
        abandon_every: 0,
        state_checkpoints: mem.state_checkpoints,
        state_checkpoint_interval: 0,
    };
    // The offloaded layers' weights leave host memory once on the device.
    let offload = match &cfg.offload {
        Some(o) => (o.place)(&lm.model, ecfg.kv_blocks, ecfg.scheduler.max_batch_tokens)
            .map_err(|e| format!("{e} (the {name} model, {})", o.name))?,
        None => None,
    };
    if let Some(o) = &offload {
        lm.model.evict_offloaded(o.first_layer());
    }
    // After the eviction: only the layers the host runs are repacked.
    if cfg.repack {
        lm.model.repack();
    }
    let model = Arc::new(lm);
    let mut spec = cfg.spec.clone();
    // A hybrid model's recurrent state cannot drop rejected drafts: no speculation for it
    // by default (a request that asks for it gets a 400 naming `spec`).
    if model.model.config.has_recurrent_state() {
        spec.method = SpecMethod::Off;
    }
    match &mut spec.method {
        SpecMethod::Draft {
            model: draft,
            config,
        } => {
            check_vocab(&model.tokenizer, &draft.tokenizer)
                .map_err(|e| format!("the draft model cannot serve {name}: {e}"))?;
            config.n_ctx = n_ctx;
        }
        // Each model's n-gram proposers share a cache of its recent outputs.
        SpecMethod::Ngram { config, cache } if cache.is_none() => {
            *cache = Some(Arc::new(NgramCache::new(
                NGRAM_CACHE_TOKENS,
                config.max_ngram,
            )));
        }
        _ => {}
    }
    let engine =
        EngineHandle::start_offloaded(model.clone(), ecfg, offload).map_err(|e| e.to_string())?;
    Ok(Loaded {
        spec,
        bytes: crate::streaming::counted(st, model_bytes(&path) + cfg.kv_mem as u64),
        name,
        path,
        model,
        engine,
        loaded_at: SystemTime::now(),
        grammar: std::sync::OnceLock::new(),
        embedder: Default::default(),
    })
}

impl AppState {
    /// Models loaded now.
    pub fn loaded(&self) -> Vec<Arc<Loaded>> {
        self.registry()
            .loaded
            .iter()
            .map(|(m, _)| m.clone())
            .collect()
    }

    fn path_of(&self, name: &str) -> Option<PathBuf> {
        self.cfg
            .models
            .iter()
            .find(|m| m.0 == name)
            .map(|m| m.1.clone())
    }

    fn touch(&self, name: &str) -> Option<Arc<Loaded>> {
        let mut r = self.registry();
        let e = r.loaded.iter_mut().find(|(m, _)| m.name == name)?;
        e.1 = Instant::now();
        Some(e.0.clone())
    }

    /// Loads the configured preload model and marks the server ready.
    pub async fn preload(self: &Arc<Self>, name: &str) -> Result<(), ServerError> {
        self.get(name).await?;
        self.life.set_ready();
        Ok(())
    }

    /// The model named `name`, loading it first if needed (see the module docs).
    pub async fn get(self: &Arc<Self>, name: &str) -> Result<Arc<Loaded>, ServerError> {
        // `MODEL:ADAPTER` runs on MODEL ([`crate::lora`]).
        let name = self.split_model(name).0;
        // Names are checked even with one model, so a typo is an error, not a surprise.
        if let Some(m) = self.touch(name) {
            return Ok(m);
        }
        let path = self
            .path_of(name)
            .ok_or_else(|| ServerError::ModelNotFound(name.to_string()))?;
        let _guard = self.load_lock.lock().await;
        if let Some(m) = self.touch(name) {
            return Ok(m);
        }
        let need = crate::streaming::counted(self, model_bytes(&path) + self.cfg.kv_mem as u64);
        self.admit(name, &path, need)?;
        self.emit(ServerEvent::ModelLoading { name: name.into() });
        let t0 = Instant::now();
        let p = path.clone();
        let opened = tokio::task::spawn_blocking(move || open(&p))
            .await
            .unwrap_or_else(|e| Err(format!("the loader panicked: {e}")));
        let lm = match opened {
            Ok(lm) => lm,
            Err(e) => return Err(self.load_failed(name, &path, e)),
        };
        if need > self.room_now() {
            // Not enough memory for both: unload now, the new file being valid.
            self.evict(name, need, usize::MAX);
            self.clone().reap().await;
        }
        let (st, n, p) = (self.clone(), name.to_string(), path.clone());
        let started = tokio::task::spawn_blocking(move || start(&st, n, p, lm))
            .await
            .unwrap_or_else(|e| Err(format!("the loader panicked: {e}")));
        let loaded = match started {
            Ok(l) => Arc::new(l),
            Err(e) => return Err(self.load_failed(name, &path, e)),
        };
        {
            let mut r = self.registry();
            r.loaded.push((loaded.clone(), Instant::now()));
            r.loads.entry(name.to_string()).or_default()[0] += 1;
        }
        self.emit(ServerEvent::ModelLoaded {
            name: name.into(),
            seconds: t0.elapsed().as_secs_f64(),
        });
        // Only now, with the new model running, does the budget unload others.
        self.evict(name, 0, self.cfg.max_loaded.max(1));
        self.clone().reap().await;
        Ok(loaded)
    }

    fn load_failed(&self, name: &str, path: &Path, error: String) -> ServerError {
        self.registry().loads.entry(name.to_string()).or_default()[1] += 1;
        let reason = without_paths(&error, path);
        self.emit(ServerEvent::ModelLoadFailed {
            name: name.into(),
            error,
        });
        ServerError::ModelLoad {
            name: name.into(),
            reason,
        }
    }

    /// Bytes held by loaded and retired models.
    fn held(r: &crate::state::Registry) -> (u64, u64) {
        let loaded = r.loaded.iter().map(|(m, _)| m.bytes).sum();
        let retired = r.retired.iter().map(|m| m.bytes).sum();
        (loaded, retired)
    }

    /// Refuses a load that would not fit even with every loaded model unloaded.
    fn admit(&self, name: &str, path: &Path, need: u64) -> Result<(), ServerError> {
        let (loaded, retired) = Self::held(&self.registry());
        let best = match self.cfg.mem_limit {
            Some(limit) => limit.saturating_sub(retired),
            None => mem_available().map_or(u64::MAX, |a| a.saturating_add(loaded)),
        };
        if need <= best {
            return Ok(());
        }
        Err(ServerError::OutOfMemory {
            name: name.into(),
            need_mib: mib(need),
            weights_mib: mib(model_bytes(path)),
            kv_mib: mib(self.cfg.kv_mem as u64),
            limit: if self.cfg.mem_limit.is_some() {
                "--mem-limit"
            } else {
                "available memory"
            },
            left_mib: mib(best),
            draining_mib: mib(retired),
        })
    }

    /// Memory a new model could take now without unloading anything.
    fn room_now(&self) -> u64 {
        let (loaded, retired) = Self::held(&self.registry());
        match self.cfg.mem_limit {
            Some(limit) => limit.saturating_sub(loaded + retired),
            None => mem_available().unwrap_or(u64::MAX),
        }
    }

    /// Unloads least recently used models other than `keep` until at most `max` remain and
    /// `need` more bytes fit (under `--mem-limit`, or in available memory without one).
    fn evict(&self, keep: &str, need: u64, max: usize) {
        let mut r = self.registry();
        // Without a limit: what the system has now, plus what unloading gives back (an
        // unloaded model's memory returns when its last request ends).
        let available = mem_available().unwrap_or(u64::MAX);
        let loaded_at_start = Self::held(&r).0;
        loop {
            let others: Vec<usize> = (0..r.loaded.len())
                .filter(|&i| r.loaded[i].0.name != keep)
                .collect();
            let (loaded, retired) = Self::held(&r);
            let over_budget = match self.cfg.mem_limit {
                Some(limit) => loaded + retired + need > limit,
                None => need > available.saturating_add(loaded_at_start - loaded),
            };
            if others.is_empty() || (r.loaded.len() <= max && !over_budget) {
                return;
            }
            let Some(&i) = others.iter().min_by_key(|&&i| r.loaded[i].1) else {
                return;
            };
            let (m, _) = r.loaded.remove(i);
            r.loads.entry(m.name.clone()).or_default()[2] += 1;
            self.emit(ServerEvent::ModelUnloaded {
                name: m.name.clone(),
            });
            r.retired.push(m);
        }
    }

    /// Frees unloaded models no request holds any more: stops each engine, keeps its
    /// counters for `/metrics`, then drops the model (off the async workers).
    pub async fn reap(self: Arc<Self>) {
        let _ = tokio::task::spawn_blocking(move || self.reap_now()).await;
    }

    fn reap_now(&self) {
        let done: Vec<Arc<Loaded>> = self
            .registry()
            .retired
            .iter()
            .filter(|m| Arc::strong_count(m) == 1)
            .cloned()
            .collect();
        for m in done {
            // Nothing is in flight: the engine is idle and stops at once. Until the counters
            // are folded in below, `/metrics` still reads them from the live engine.
            m.engine.shutdown();
            let mut text = String::new();
            m.engine.metrics().render(&m.name, &mut text);
            let mut r = self.registry();
            r.past.add_text(&text, true);
            r.retired.retain(|x| !Arc::ptr_eq(x, &m));
            drop(r);
            drop(m);
            return_freed_memory();
        }
    }

    /// A model's metadata, read once from its file (see the module docs).
    pub async fn meta(&self, name: &str) -> Result<Arc<ModelMeta>, ServerError> {
        let path = self
            .path_of(name)
            .ok_or_else(|| ServerError::ModelNotFound(name.to_string()))?;
        if let Some(m) = self
            .meta
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(m.clone());
        }
        let p = path.clone();
        let read = tokio::task::spawn_blocking(move || ModelMeta::read(&p))
            .await
            .unwrap_or_else(|e| Err(format!("the reader panicked: {e}")));
        let meta = Arc::new(read.map_err(|e| ServerError::ModelLoad {
            name: name.into(),
            reason: without_paths(&e, &path),
        })?);
        self.meta
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), meta.clone());
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn paths_are_stripped() {
        let p = Path::new("/srv/models/broken.gguf");
        assert_eq!(
            super::without_paths("/srv/models/broken.gguf: bad magic at offset 0", p),
            "broken.gguf: bad magic at offset 0"
        );
        let p = Path::new("/srv/models/tiny");
        assert_eq!(
            super::without_paths("/srv/models/tiny/tokenizer.json: missing", p),
            "tiny/tokenizer.json: missing"
        );
    }
}
