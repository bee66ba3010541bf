//! `mica._mica.EventStream`: the events of one engine request, as a Python iterator.
//! `__next__` waits with the GIL released; closing the stream (or dropping it, which
//! CPython does as soon as the last reference goes) cancels the request, and the engine
//! frees its KV blocks at its next step.
//!
//! Events are plain tuples, shaped by the Python layer:
//! - `("token", index, token_id, text, logprob)` with `logprob` `None` or
//!   `(logprob, [(token_id, logprob), ...])`;
//! - `("done", index, finish_reason, text)`;
//! - `("finished", prompt_tokens, cached_tokens, completion_tokens)`, the last one.
//!
//! A failed request raises its exception from `__next__`.

use crate::errors::{internal, to_py};
use mica::Event;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::Mutex;

#[pyclass(module = "mica._mica", frozen)]
pub struct EventStream {
    /// `None` once the request ended or the stream was closed.
    inner: Mutex<Option<mica::Stream>>,
}

impl EventStream {
    pub fn new(stream: mica::Stream) -> EventStream {
        EventStream {
            inner: Mutex::new(Some(stream)),
        }
    }
}

#[pymethods]
impl EventStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let event = py.detach(|| -> PyResult<Option<Event>> {
            let mut slot = self
                .inner
                .lock()
                .map_err(|_| internal("stream lock poisoned"))?;
            let Some(stream) = slot.as_mut() else {
                return Ok(None);
            };
            let ev = stream.next();
            if matches!(ev, None | Some(Event::Finished { .. } | Event::Error(_))) {
                *slot = None;
            }
            // The channel closed before the request ended: the engine stopped.
            ev.map(Some)
                .ok_or_else(|| to_py(mica::Error::EngineStopped))
        })?;
        let Some(event) = event else {
            return Ok(None);
        };
        let t = match event {
            Event::Token {
                index,
                token,
                text,
                logprob,
            } => {
                let lp = logprob.map(|l| (l.logprob, l.top));
                ("token", index, token, text, lp).into_pyobject(py)?
            }
            Event::Done {
                index,
                finish,
                text,
            } => ("done", index, finish.as_str(), text).into_pyobject(py)?,
            Event::Finished { usage } => (
                "finished",
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
            )
                .into_pyobject(py)?,
            Event::Error(e) => return Err(to_py(mica::Error::Request(e))),
        };
        Ok(Some(t))
    }

    /// Stops the request (if it is still running) and frees its sequence.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut slot = self
                .inner
                .lock()
                .map_err(|_| internal("stream lock poisoned"))?;
            *slot = None;
            Ok(())
        })
    }

    /// Whether the request is still producing events.
    #[getter]
    fn running(&self) -> PyResult<bool> {
        Ok(self
            .inner
            .lock()
            .map_err(|_| internal("stream lock poisoned"))?
            .is_some())
    }
}
