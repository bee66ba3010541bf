//! The server's shared state ([`AppState`]): settings, the model registry (see
//! [`crate::models`]), the lifecycle the probes and the shutdown follow ([`Lifecycle`]:
//! ready, draining, requests in flight, the signal that ends remaining streams), request
//! counters for `/metrics`, and the observer through which the server reports what an
//! operator should see ([`ServerEvent`]; the library prints nothing itself).

use crate::config::{ApiKey, ServerConfig};
use crate::error::ServerError;
use crate::metrics::Exposition;
use crate::models::{Loaded, ModelMeta};
use axum::http::HeaderMap;
use mica::engine::Lane;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

/// What the server reports to its operator (the CLI prints these on stderr).
// One event per request or model load, passed by reference to the observer: the size of the
// request record does not matter, and boxing it would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum ServerEvent {
    ModelLoading {
        name: String,
    },
    ModelLoaded {
        name: String,
        seconds: f64,
    },
    /// A load failed; `error` is the full message, file paths included (clients get it
    /// without the paths).
    ModelLoadFailed {
        name: String,
        error: String,
    },
    ModelUnloaded {
        name: String,
    },
    /// A model being loaded streams layers to fit the memory budget
    /// ([`crate::streaming`]).
    ModelStreamed {
        name: String,
        /// What streams, in words (`layers 3..=23 of 24 and the output head`).
        what: String,
        /// Layers streamed, of `n_layers`.
        layers: usize,
        n_layers: usize,
        /// The output head is streamed too.
        head: bool,
        /// `overlapped` or `sync`.
        mode: &'static str,
        /// Bytes read from the file per forward pass.
        bytes_per_pass: u64,
        /// Bytes of the ring's buffers.
        ring_bytes: u64,
        /// Bytes the plan keeps resident (the ring's buffers included).
        resident_bytes: u64,
        budget: u64,
    },
    /// Shutdown began: new requests get 503, these may finish within `grace`.
    Draining {
        in_flight: usize,
        grace: Duration,
    },
    /// The grace period ended with requests still running: their streams are ended now.
    GraceExpired {
        in_flight: usize,
    },
    Stopped,
    /// A request ended ([`crate::reqlog`]).
    Request(crate::reqlog::RequestRecord),
}

/// Receives [`ServerEvent`]s.
pub type Observer = Arc<dyn Fn(&ServerEvent) + Send + Sync>;

/// Where the server is in its life: what `/ready` reports and what shutdown waits for.
pub struct Lifecycle {
    ready: AtomicBool,
    draining: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
    abort: watch::Sender<bool>,
}

/// A request counted as in flight until dropped (with its response body).
pub struct InFlight(Arc<AppState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let life = &self.0.life;
        if life.in_flight.fetch_sub(1, SeqCst) == 1 {
            life.idle.notify_waiters();
        }
    }
}

impl Lifecycle {
    fn new(ready: bool) -> Lifecycle {
        Lifecycle {
            ready: AtomicBool::new(ready),
            draining: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            abort: watch::channel(false).0,
        }
    }

    /// The default model is loaded (or there is none) and the server is not draining.
    pub fn is_ready(&self) -> bool {
        self.ready.load(SeqCst) && !self.is_draining()
    }

    pub fn is_loading(&self) -> bool {
        !self.ready.load(SeqCst)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(SeqCst)
    }

    pub(crate) fn set_ready(&self) {
        self.ready.store(true, SeqCst);
    }

    pub(crate) fn begin_drain(&self) {
        self.draining.store(true, SeqCst);
    }

    /// Ends every stream still running with a final event (after the grace period).
    pub(crate) fn abort_streams(&self) {
        self.abort.send_replace(true);
    }

    /// Fires when remaining streams must end.
    pub fn abort_signal(&self) -> watch::Receiver<bool> {
        self.abort.subscribe()
    }

    /// Waits until no request is in flight.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Waits until `rx` reads true (never, if its sender is gone).
pub async fn fired(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Models loaded, models unloaded but finishing requests, and what `/metrics` keeps of
/// engines that are gone.
#[derive(Default)]
pub(crate) struct Registry {
    /// Loaded models and when each was last used.
    pub loaded: Vec<(Arc<Loaded>, Instant)>,
    /// Unloaded models still finishing requests; freed (by [`AppState::reap`]) once the
    /// registry holds the only reference.
    pub retired: Vec<Arc<Loaded>>,
    /// Counters and histograms of engines that have stopped, so that `/metrics` stays
    /// monotonic across unloads and reloads.
    pub past: Exposition,
    /// Loads that succeeded and failed, and unloads, per model.
    pub loads: BTreeMap<String, [u64; 3]>,
}

pub struct AppState {
    pub cfg: ServerConfig,
    pub life: Lifecycle,
    pub(crate) reg: Mutex<Registry>,
    pub(crate) load_lock: tokio::sync::Mutex<()>,
    pub(crate) meta: Mutex<HashMap<String, Arc<ModelMeta>>>,
    /// Responses sent, by status code.
    pub(crate) responses: Mutex<BTreeMap<u16, u64>>,
    observer: Option<Observer>,
    bound: OnceLock<SocketAddr>,
    /// Generations running, by request ID ([`crate::reqlog`]).
    live: Mutex<BTreeMap<String, crate::reqlog::Live>>,
    /// LoRA adapters requests may select ([`crate::lora`]).
    pub(crate) lora: Mutex<crate::lora::Adapters>,
    /// The process's resident bytes before any model loaded: the runtime part of a
    /// streamed model's budget ([`crate::streaming`]).
    pub(crate) runtime: u64,
}

impl AppState {
    pub fn new(cfg: ServerConfig) -> AppState {
        AppState::with_observer(cfg, None)
    }

    pub fn with_observer(cfg: ServerConfig, observer: Option<Observer>) -> AppState {
        let ready = cfg.preload.is_none();
        let lora = Mutex::new(crate::lora::Adapters::new(cfg.lora.len()));
        AppState {
            lora,
            cfg,
            life: Lifecycle::new(ready),
            reg: Mutex::new(Registry::default()),
            load_lock: tokio::sync::Mutex::new(()),
            meta: Mutex::new(HashMap::new()),
            responses: Mutex::new(BTreeMap::new()),
            observer,
            bound: OnceLock::new(),
            live: Mutex::new(BTreeMap::new()),
            runtime: mica::engine::host::resident_bytes().unwrap_or(0),
        }
    }

    pub(crate) fn emit(&self, ev: ServerEvent) {
        if let Some(o) = &self.observer {
            o(&ev);
        }
    }

    /// The generations running, by request ID.
    pub fn live(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, crate::reqlog::Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The address the server listens on (set by [`crate::serve`]).
    pub fn bound(&self) -> Option<SocketAddr> {
        self.bound.get().copied()
    }

    pub(crate) fn set_bound(&self, addr: SocketAddr) {
        let _ = self.bound.set(addr);
    }

    /// Counts a request in flight, unless the server is draining (then `None`: answer 503).
    pub fn enter(self: &Arc<Self>) -> Option<InFlight> {
        self.life.in_flight.fetch_add(1, SeqCst);
        let guard = InFlight(self.clone());
        (!self.life.is_draining()).then_some(guard)
    }

    pub(crate) fn count_response(&self, status: u16) {
        *self
            .responses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status)
            .or_default() += 1;
    }

    pub fn model_names(&self) -> Vec<String> {
        self.cfg.models.iter().map(|m| m.0.clone()).collect()
    }

    /// The lane of a request: the `X-Mica-Priority` header, else the body's `priority`,
    /// else interactive; never above the API key's lane.
    pub fn lane(
        &self,
        headers: &HeaderMap,
        body_priority: Option<&str>,
    ) -> Result<Lane, ServerError> {
        let asked = match headers
            .get("x-mica-priority")
            .and_then(|v| v.to_str().ok())
            .or(body_priority)
        {
            Some(s) => Lane::parse(s).ok_or_else(|| crate::error::ParamError::Invalid {
                field: "priority".into(),
                rule: "interactive, background or bulk",
                got: format!("'{s}'"),
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
        self.cfg.access.api_keys.iter().find(|k| k.key == given)
    }

    /// Whether a request may pass: no keys configured, or it presents one of them.
    pub fn authorized(&self, headers: &HeaderMap) -> bool {
        self.cfg.access.api_keys.is_empty() || self.key(headers).is_some()
    }
}
