//! `mica.Server`: `mica serve` started and stopped from Python (tests, notebooks, a Ray
//! replica's sidecar). The server runs `mica_server::serve` on its own tokio runtime in a
//! background thread; the engines run on their own threads as in `mica serve`. Stopping it
//! is `mica serve`'s graceful shutdown: new requests get 503, requests in flight may finish
//! within the shutdown grace period, then the thread is joined.

use crate::errors::raise;
use mica_server::{Access, ApiKey, AppState, Limits, ServerConfig};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A running server: its state (readiness), how to stop it and the thread to join.
struct Running {
    addr: std::net::SocketAddr,
    state: Arc<AppState>,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: JoinHandle<Result<(), String>>,
}

#[pyclass(module = "mica._mica", frozen)]
pub struct NativeServer {
    cfg: ServerConfig,
    host: String,
    port: u16,
    running: Mutex<Option<Running>>,
}

fn server_error(msg: String) -> PyErr {
    raise("ServerError", msg, &[])
}

/// Ends the server thread and says why it ended early (its error, or a panic).
fn thread_end(py: Python<'_>, thread: JoinHandle<Result<(), String>>) -> PyErr {
    match py.detach(|| thread.join()) {
        Ok(Err(msg)) => server_error(msg),
        Ok(Ok(())) => server_error("the server stopped before it was ready".into()),
        Err(_) => server_error("the server thread panicked".into()),
    }
}

#[pymethods]
impl NativeServer {
    /// `models`: `(name, path)` pairs the server offers (`mica.Server` builds them from a
    /// models directory or a list of names and paths). `preload`: the model loaded at
    /// start (`/ready` answers 503 until it is). `open_routes`: paths answered without a
    /// key when `api_keys` are set. `shutdown_grace`: seconds requests in flight may run on
    /// after `stop()`.
    #[new]
    #[pyo3(signature = (models, *, host="127.0.0.1".to_string(), port=8080, n_threads=None, n_ctx=None, kv_mem=512 << 20, api_keys=Vec::new(), open_routes=Vec::new(), max_loaded=1, queue_limit=256, preload=None, shutdown_grace=30.0))]
    fn new(
        models: Vec<(String, PathBuf)>,
        host: String,
        port: u16,
        n_threads: Option<usize>,
        n_ctx: Option<usize>,
        kv_mem: usize,
        api_keys: Vec<String>,
        open_routes: Vec<String>,
        max_loaded: usize,
        queue_limit: usize,
        preload: Option<String>,
        shutdown_grace: f64,
    ) -> PyResult<NativeServer> {
        if models.is_empty() {
            return Err(server_error("no models to serve".into()));
        }
        if let Some(name) = &preload
            && !models.iter().any(|(n, _)| n == name)
        {
            return Err(server_error(format!(
                "preload: no model named {name:?} among the served models"
            )));
        }
        if let Some(r) = open_routes.iter().find(|r| !r.starts_with('/')) {
            return Err(raise(
                "InvalidParameter",
                format!("open route {r:?} must be a path starting with /"),
                &[("param", Some("open_routes".into()))],
            ));
        }
        let grace = Duration::try_from_secs_f64(shutdown_grace).map_err(|_| {
            raise(
                "InvalidParameter",
                format!("shutdown_grace must be a number of seconds >= 0, got {shutdown_grace}"),
                &[("param", Some("shutdown_grace".into()))],
            )
        })?;
        let cfg = ServerConfig {
            preload,
            access: Access {
                api_keys: api_keys
                    .into_iter()
                    .map(|key| ApiKey {
                        key,
                        lane: mica::Lane::Interactive,
                    })
                    .collect(),
                open_routes,
                ..Access::default()
            },
            limits: Limits {
                shutdown_grace: grace,
                ..Limits::default()
            },
            kv_mem,
            n_ctx,
            n_threads: n_threads.unwrap_or_else(mica::kernels::pool::physical_cores),
            max_waiting_per_lane: queue_limit,
            max_loaded: max_loaded.max(1),
            ..ServerConfig::new(models)
        };
        Ok(NativeServer {
            cfg,
            host,
            port,
            running: Mutex::new(None),
        })
    }

    /// Binds and starts serving in a background thread; returns the port bound (useful
    /// with `port=0`). With a preload model, returns once it is loaded (the server is
    /// ready) and raises if it cannot be.
    fn start(&self, py: Python<'_>) -> PyResult<u16> {
        let mut slot = self
            .running
            .lock()
            .map_err(|_| server_error("server lock poisoned".into()))?;
        if let Some(r) = slot.as_ref() {
            return Ok(r.addr.port());
        }
        let cfg = self.cfg.clone();
        let bind = format!("{}:{}", self.host, self.port);
        type Ready = (std::net::SocketAddr, Arc<AppState>);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Ready>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("mica-server".into())
            .spawn(move || -> Result<(), String> {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the async runtime: {e}"))?;
                let result = rt.block_on(async move {
                    let listener = tokio::net::TcpListener::bind(&bind)
                        .await
                        .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
                    let addr = listener
                        .local_addr()
                        .map_err(|e| format!("cannot read the address bound: {e}"))?;
                    let state = Arc::new(AppState::new(cfg));
                    let _ = ready_tx.send((addr, state.clone()));
                    mica_server::serve(listener, state, async move {
                        let _ = stop_rx.await;
                    })
                    .await
                    .map_err(|e| e.to_string())
                });
                // A load still running in the background is not waited for (as `mica
                // serve` does).
                rt.shutdown_timeout(Duration::from_secs(1));
                result
            })
            .map_err(|e| server_error(format!("cannot start the server thread: {e}")))?;
        let Ok((addr, state)) = py.detach(move || ready_rx.recv()) else {
            return Err(thread_end(py, thread));
        };
        // With a preload model: ready once it is loaded; the thread ends if it fails.
        let loaded = py.detach(|| {
            while state.life.is_loading() {
                if thread.is_finished() {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            true
        });
        if !loaded {
            return Err(thread_end(py, thread));
        }
        *slot = Some(Running {
            addr,
            state,
            stop: stop_tx,
            thread,
        });
        Ok(addr.port())
    }

    /// Stops taking requests, lets those in flight finish (within the shutdown grace),
    /// and joins the thread.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let running = self
            .running
            .lock()
            .map_err(|_| server_error("server lock poisoned".into()))?
            .take();
        let Some(r) = running else { return Ok(()) };
        let _ = r.stop.send(());
        match py.detach(|| r.thread.join()) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(server_error(format!("the server failed: {e}"))),
            Err(_) => Err(server_error("the server thread panicked".into())),
        }
    }

    /// The port bound while running, else `None`.
    #[getter]
    fn port(&self) -> PyResult<Option<u16>> {
        Ok(self
            .running
            .lock()
            .map_err(|_| server_error("server lock poisoned".into()))?
            .as_ref()
            .map(|r| r.addr.port()))
    }

    /// Whether the server runs, its preload model is loaded and it is not draining (what
    /// `/ready` answers).
    #[getter]
    fn ready(&self) -> PyResult<bool> {
        Ok(self
            .running
            .lock()
            .map_err(|_| server_error("server lock poisoned".into()))?
            .as_ref()
            .is_some_and(|r| r.state.life.is_ready()))
    }
}

impl Drop for NativeServer {
    fn drop(&mut self) {
        if let Ok(mut slot) = self.running.lock()
            && let Some(r) = slot.take()
        {
            let _ = r.stop.send(());
            let _ = r.thread.join();
        }
    }
}

/// The servable models in `dir` as `mica serve --models-dir` finds them: `(name, path)`
/// for every `.gguf` and `.mica` file and Hugging Face folder.
#[pyfunction]
pub fn discover(dir: PathBuf) -> PyResult<Vec<(String, PathBuf)>> {
    ServerConfig::discover(&dir)
        .map_err(|e| server_error(format!("cannot list models in {}: {e}", dir.display())))
}
