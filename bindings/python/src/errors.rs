//! `mica::Error` to Python exceptions. The classes live in `mica/_errors.py` (so that
//! `InvalidParameter` can be both a `MicaError` and a `ValueError`, which `pyo3`'s
//! `create_exception!` cannot express); this module picks the class for each variant of
//! the facade's error, never by parsing the message.

use mica::engine::scheduler::AddError;
use mica::engine::{EngineError, RequestError, SubmitError};
use mica::models::ModelError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// The Python exception class named `name` in `mica._errors`.
fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    Ok(py
        .import("mica._errors")?
        .getattr(name)?
        .cast_into::<PyType>()?)
}

/// An exception of class `name` with `msg`, and `attrs` set on it.
pub fn raise(name: &str, msg: String, attrs: &[(&str, Option<String>)]) -> PyErr {
    Python::attach(|py| {
        let ty = match class(py, name) {
            Ok(ty) => ty,
            Err(e) => return e,
        };
        let err = PyErr::from_type(ty, (msg,));
        let value = err.value(py);
        for (k, v) in attrs {
            if let Err(e) = value.setattr(*k, v.clone()) {
                return e;
            }
        }
        err
    })
}

/// The exception class for each kind of failure, by name in `mica._errors`.
fn classify(e: &mica::Error) -> (&'static str, Option<String>) {
    use mica::Error as E;
    match e {
        // A KV cache type the model's heads cannot hold is a bad argument, not a bad model.
        E::Model(ModelError::CacheType(_)) => ("InvalidParameter", None),
        E::Model(_) => ("ModelError", None),
        E::Tokenizer(_) => ("TokenizerError", None),
        E::ChatPrompt(_) => ("ChatTemplateError", None),
        E::Engine(e) => match e {
            // Raw logits of more tokens than the session's context.
            EngineError::Model(ModelError::ContextOverflow { .. }) => ("PromptTooLong", None),
            EngineError::Model(_) => ("ModelError", None),
            EngineError::Tokenizer(_) => ("TokenizerError", None),
            EngineError::PromptTooLong { .. } => ("PromptTooLong", None),
            EngineError::Params(p) => ("InvalidParameter", Some(p.param().as_str().into())),
            EngineError::Config(_) => ("InvalidParameter", None),
            EngineError::Thread(_) => ("EngineError", None),
            EngineError::Spec(_) => ("InvalidParameter", None),
        },
        E::Submit(e) => match e {
            SubmitError::QueueFull { .. } => ("QueueFull", None),
            SubmitError::PromptTooLong { .. } => ("PromptTooLong", None),
            SubmitError::Params(p) => ("InvalidParameter", Some(p.param().as_str().into())),
            SubmitError::Stopped => ("EngineStopped", None),
        },
        E::Request(e) => match e {
            RequestError::Admission(AddError::TooLarge { .. }) => ("PromptTooLong", None),
            RequestError::Admission(AddError::Empty) => ("InvalidParameter", Some("prompt".into())),
            RequestError::Admission(_) | RequestError::Step(_) => ("EngineError", None),
            RequestError::ShuttingDown => ("EngineStopped", None),
        },
        E::EngineStopped => ("EngineStopped", None),
        E::Hub(h) => match h {
            mica::hub::Error::NotFound { .. }
            | mica::hub::Error::NotInStore { .. }
            | mica::hub::Error::NotInCatalog { .. } => ("ModelNotFound", None),
            _ => ("HubError", None),
        },
        E::Quant(_) => ("ConvertError", None),
        E::Grammar(_) => ("InvalidParameter", None),
        E::Embed(mica::engine::EmbedError::TooLong { .. }) => ("PromptTooLong", None),
        E::Embed(mica::engine::EmbedError::Engine(_)) => ("EngineError", None),
        E::Embed(_) => ("InvalidParameter", None),
    }
}

/// The Python exception for a facade error.
pub fn to_py(e: mica::Error) -> PyErr {
    let (name, param) = classify(&e);
    let msg = error_chain(&e);
    if name == "InvalidParameter" {
        raise(name, msg, &[("param", param)])
    } else {
        raise(name, msg, &[])
    }
}

/// The message of `e` followed by its sources (", caused by: …"), so the one line a
/// Python traceback shows names the file or field at fault.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_msg = s.to_string();
        if !msg.contains(&s_msg) {
            msg.push_str(": ");
            msg.push_str(&s_msg);
        }
        src = s.source();
    }
    msg
}

/// `Result<T, mica::Error>` into `PyResult<T>`.
pub trait IntoPyResult<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for mica::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// A runtime error for an internal invariant broken (a poisoned lock).
pub fn internal(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!("mica: {what}"))
}
