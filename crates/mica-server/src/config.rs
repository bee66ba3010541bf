//! Resolved settings of `mica serve` ([`ServerConfig`]): the models it can serve, the engine
//! knobs, who may call it ([`Access`]: API keys with their lanes, open routes, allowed
//! origins and hosts) and the limits that protect it ([`Limits`]: body size, read and idle
//! timeouts, the shutdown grace period). The CLI builds one from flags; tests build one
//! with [`ServerConfig::new`] and struct update syntax.

use mica::engine::spec::SpecConfig;
use mica::engine::{Lane, SchedulerConfig};
use mica::models::hf::{is_hf_folder, weight_files};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An API key and the highest lane its requests may use.
#[derive(Clone, Debug)]
pub struct ApiKey {
    pub key: String,
    pub lane: Lane,
}

/// Who may call the server.
#[derive(Clone, Debug)]
pub struct Access {
    /// Keys accepted (none: no authentication).
    pub api_keys: Vec<ApiKey>,
    /// Paths answered without a key even when keys are set. The liveness probe `/health` is
    /// always open; [`Access::default`] opens nothing else.
    pub open_routes: Vec<String>,
    /// Origins a browser page may call from (the `Origin` header): exact origins
    /// (`https://app.example`), `scheme://host:*` for any port, or `*` for any. Requests
    /// without an `Origin` header (curl, SDKs) are not browser requests and pass.
    pub allowed_origins: Vec<String>,
    /// Host names the `Host` header may carry (`*` for any; a name matches with any port).
    /// `None`: loopback names and addresses only when the server is bound to a loopback
    /// address, anything otherwise (see [`crate::guard`]).
    pub allowed_hosts: Option<Vec<String>>,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            api_keys: Vec::new(),
            open_routes: Vec::new(),
            allowed_origins: Access::loopback_origins(),
            allowed_hosts: None,
        }
    }
}

impl Access {
    /// The default origin allow-list: pages served from this machine's loopback names.
    pub fn loopback_origins() -> Vec<String> {
        ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .flat_map(|h| [format!("http://{h}:*"), format!("https://{h}:*")])
            .collect()
    }
}

/// Limits that keep slow or oversized clients from holding the server.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body accepted, bytes (413 beyond).
    pub max_body: usize,
    /// Time a client has to send a request's headers once it starts one (the connection
    /// is closed beyond).
    pub header_timeout: Duration,
    /// Time a client has to send a request's body once its headers arrived (408 beyond).
    pub body_timeout: Duration,
    /// Time a connection may sit with no request in flight before it is closed.
    pub idle_timeout: Duration,
    /// On shutdown, how long requests in flight may run on before their streams are ended
    /// with a final event.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: 8 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Resolved settings of `mica serve`.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Servable models: API name and path (GGUF or `.mica` file, or Hugging Face folder).
    pub models: Vec<(String, PathBuf)>,
    /// A model loaded when the server starts; `/ready` answers 503 until it is.
    pub preload: Option<String>,
    pub access: Access,
    pub limits: Limits,
    /// KV cache memory per loaded model, bytes.
    pub kv_mem: usize,
    /// Context per sequence (default: the model's training context, at most 4096).
    pub n_ctx: Option<usize>,
    pub n_threads: usize,
    pub scheduler: SchedulerConfig,
    pub max_waiting_per_lane: usize,
    /// Models kept loaded at once.
    pub max_loaded: usize,
    /// Repack weights at load ([`mica::models::LoadOptions::repack`]).
    pub repack: bool,
    /// Memory loaded models and their KV caches may take together, bytes (default: what the
    /// system reports available when loading).
    pub mem_limit: Option<u64>,
    /// Speculative decoding for requests that do not choose (see [`crate::spec`]); a draft
    /// model applies to every model served, and one whose vocabulary differs is refused at
    /// load.
    pub spec: SpecConfig,
    /// LoRA adapters the requests of every model loaded may select ([`crate::lora`]; an
    /// adapter that does not fit a model fails that model's load, naming the adapter).
    pub lora: Vec<mica::models::LoraSpec>,
    /// KV cache types of every model loaded (`None`: the model's own, f16 for quantized
    /// models); a type a model cannot store fails that model's load.
    pub cache_type_k: Option<mica::models::kv_cache::KvType>,
    pub cache_type_v: Option<mica::models::kv_cache::KvType>,
    /// Put each generation's prompt and output text in its request record (off: records
    /// carry counts and timings only, never text).
    pub log_prompts: bool,
    /// Layer streaming of every model loaded ([`crate::streaming`]; `None`: models are
    /// loaded whole).
    pub stream: Option<crate::streaming::StreamConfig>,
    /// Runs the last layers of every model loaded on another device (`mica serve
    /// --gpu-layers`); `None`: everything on the CPU.
    pub offload: Option<Offloader>,
}

/// What places a model's last layers and output head on another device: called with the
/// model, the KV blocks per layer of its engine and the most tokens one step carries; gives
/// the offload (`None`: the model stays on the CPU) or why it cannot (the model's load
/// fails with that message).
pub type OffloadFn = dyn Fn(
        &mica::models::Model,
        usize,
        usize,
    ) -> Result<Option<Box<dyn mica::models::LayerOffload + Send>>, String>
    + Send
    + Sync;

/// An [`OffloadFn`] with a name for logs and `Debug`.
#[derive(Clone)]
pub struct Offloader {
    /// What it offloads to, e.g. `"--gpu-layers 12"`.
    pub name: String,
    pub place: std::sync::Arc<OffloadFn>,
}

impl std::fmt::Debug for Offloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offloader")
            .field("name", &self.name)
            .finish()
    }
}

impl ServerConfig {
    /// Settings for serving `models` with the defaults of `mica serve`.
    pub fn new(models: Vec<(String, PathBuf)>) -> ServerConfig {
        ServerConfig {
            models,
            preload: None,
            access: Access::default(),
            limits: Limits::default(),
            kv_mem: 512 << 20,
            n_ctx: None,
            n_threads: 1,
            scheduler: SchedulerConfig::default(),
            max_waiting_per_lane: 256,
            max_loaded: 1,
            repack: true,
            mem_limit: None,
            spec: SpecConfig::default(),
            lora: Vec::new(),
            cache_type_k: None,
            cache_type_v: None,
            log_prompts: false,
            stream: None,
            offload: None,
        }
    }

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

pub(crate) fn has_ext(p: &Path, ext: &str) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// Bytes of a model's weights on disk: the file, or a folder's safetensors files.
pub fn model_bytes(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    if path.is_dir() {
        weight_files(path).iter().map(|p| size(p)).sum()
    } else {
        size(path)
    }
}
