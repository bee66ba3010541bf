//! `mica.Server`: `mica serve` started and stopped from Python (tests, notebooks, a Ray
//! replica's sidecar). The server runs `mica_server::serve` on its own tokio runtime in a
//! background thread; the engines run on their own threads as in `mica serve`.

use crate::errors::raise;
use mica_server::{ApiKey, AppState, ServerConfig};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A running server: how to stop it and the thread to join.
struct Running {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: JoinHandle<std::io::Result<()>>,
}

#[pyclass(module = "mica._mica", frozen)]
pub struct NativeServer {
    cfg: ServerConfig,
    host: String,
    port: u16,
    preload: Vec<String>,
    running: Mutex<Option<Running>>,
}

fn server_error(msg: String) -> PyErr {
    raise("ServerError", msg, &[])
}

#[pymethods]
impl NativeServer {
    /// `models`: `(name, path)` pairs the server offers (`mica.Server` builds them from a
    /// models directory or a list of names and paths).
    #[new]
    #[pyo3(signature = (models, *, host="127.0.0.1".to_string(), port=8080, n_threads=None, n_ctx=None, kv_mem=512 << 20, api_keys=Vec::new(), max_loaded=1, queue_limit=256, preload=Vec::new()))]
    fn new(
        models: Vec<(String, PathBuf)>,
        host: String,
        port: u16,
        n_threads: Option<usize>,
        n_ctx: Option<usize>,
        kv_mem: usize,
        api_keys: Vec<String>,
        max_loaded: usize,
        queue_limit: usize,
        preload: Vec<String>,
    ) -> PyResult<NativeServer> {
        if models.is_empty() {
            return Err(server_error("no models to serve".into()));
        }
        let cfg = ServerConfig {
            models,
            api_keys: api_keys
                .into_iter()
                .map(|key| ApiKey {
                    key,
                    lane: mica::Lane::Interactive,
                })
                .collect(),
            kv_mem,
            n_ctx,
            n_threads: n_threads.unwrap_or_else(mica::kernels::pool::physical_cores),
            scheduler: Default::default(),
            max_waiting_per_lane: queue_limit,
            max_loaded: max_loaded.max(1),
            repack: true,
            mem_limit: None,
        };
        Ok(NativeServer {
            cfg,
            host,
            port,
            preload,
            running: Mutex::new(None),
        })
    }

    /// Binds and starts serving in a background thread; returns the port bound (useful
    /// with `port=0`). Models in `preload` are loaded before this returns.
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
        let preload = self.preload.clone();
        let (ready_tx, ready_rx) =
            std::sync::mpsc::channel::<Result<std::net::SocketAddr, String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("mica-server".into())
            .spawn(move || -> std::io::Result<()> {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("cannot start the runtime: {e}")));
                        return Err(e);
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::bind(&bind).await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("cannot listen on {bind}: {e}")));
                            return Err(e);
                        }
                    };
                    let state = Arc::new(AppState::new(cfg));
                    for name in &preload {
                        if let Err(e) = state.preload(name).await {
                            let _ = ready_tx.send(Err(format!("cannot load {name}: {e:?}")));
                            return Ok(());
                        }
                    }
                    let addr = listener.local_addr()?;
                    let _ = ready_tx.send(Ok(addr));
                    mica_server::serve(listener, state, async move {
                        let _ = stop_rx.await;
                    })
                    .await
                })
            })
            .map_err(|e| server_error(format!("cannot start the server thread: {e}")))?;
        let ready = py.detach(move || ready_rx.recv());
        match ready {
            Ok(Ok(addr)) => {
                *slot = Some(Running {
                    addr,
                    stop: stop_tx,
                    thread,
                });
                Ok(addr.port())
            }
            Ok(Err(msg)) => {
                let _ = py.detach(|| thread.join());
                Err(server_error(msg))
            }
            Err(_) => {
                let _ = py.detach(|| thread.join());
                Err(server_error(
                    "the server thread ended before it was ready".into(),
                ))
            }
        }
    }

    /// Stops accepting connections, lets requests in flight finish, and joins the thread.
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
