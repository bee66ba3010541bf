//! Status codes, the thread-local last-error message, and [`guard`]: the wrapper every entry
//! point runs its body in, so that a Rust error becomes a [`MicaStatus`] plus a message and
//! a panic is caught before it could unwind into C (which would abort the process).

use facade::Error;
use facade::engine::{EngineError, RequestError, SubmitError};
use facade::formats::FormatError;
use facade::models::tokenizer::TokenizerError;
use facade::models::{ChatPromptError, ModelError};
use std::any::Any;
use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// What a call did. `MICA_STATUS_OK` is zero; every other value is a failure whose message
/// `mica_last_error()` returns on the same thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MicaStatus {
    /// Success.
    Ok = 0,
    /// A pointer the call requires was NULL.
    NullArgument = 1,
    /// A string argument is not valid UTF-8.
    InvalidUtf8 = 2,
    /// An argument is out of range: a sampling parameter, a token id not in the vocabulary,
    /// an empty prompt, a prompt longer than the context, a request larger than the KV
    /// memory.
    InvalidArgument = 3,
    /// The caller's buffer is too small; the size needed was written to `*n_out`.
    BufferTooSmall = 4,
    /// No file at that path, or no model of that name in the store.
    NotFound = 5,
    /// The model could not be opened: a corrupt or unsupported file, an unknown
    /// architecture or tensor type.
    ModelLoad = 6,
    /// Tokenizing or detokenizing failed.
    Tokenizer = 7,
    /// The model's chat template could not render the conversation.
    ChatTemplate = 8,
    /// The engine's queue is full; retry later.
    QueueFull = 9,
    /// The engine stopped before the request finished.
    EngineStopped = 10,
    /// The model store or the hub failed (a download, a checksum, an ambiguous name).
    Hub = 11,
    /// Generation failed while running (a forward pass, the engine thread).
    Generation = 12,
    /// mica could not allocate memory for a result.
    OutOfMemory = 13,
    /// An internal error (a panic inside mica) was caught. A session it happened in refuses
    /// further calls; free it.
    Internal = 14,
}

/// A failed call: the status to return and the message `mica_last_error()` will give.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: MicaStatus,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: MicaStatus, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn null(what: &str) -> Failure {
        Failure::new(MicaStatus::NullArgument, format!("{what} is NULL"))
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(MicaStatus::InvalidArgument, message)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::new(status_of(&e), chain(&e))
    }
}

pub(crate) type Result<T, E = Failure> = std::result::Result<T, E>;

/// The status a facade error maps to.
fn status_of(e: &Error) -> MicaStatus {
    use MicaStatus as S;
    match e {
        Error::Model(m) => model_status(m, S::ModelLoad),
        Error::Tokenizer(t) => tokenizer_status(t),
        Error::ChatPrompt(ChatPromptError::Template(_)) => S::ChatTemplate,
        Error::ChatPrompt(ChatPromptError::Tokenize(t)) => tokenizer_status(t),
        Error::Engine(e) => match e {
            EngineError::Model(m) => model_status(m, S::Generation),
            EngineError::Tokenizer(t) => tokenizer_status(t),
            EngineError::PromptTooLong { .. } | EngineError::Params(_) => S::InvalidArgument,
            EngineError::Config(_) => S::InvalidArgument,
            EngineError::Thread(_) => S::Generation,
            EngineError::Spec(_) => S::InvalidArgument,
        },
        Error::Submit(e) => match e {
            SubmitError::QueueFull { .. } => S::QueueFull,
            SubmitError::PromptTooLong { .. } | SubmitError::Params(_) => S::InvalidArgument,
            SubmitError::Stopped => S::EngineStopped,
        },
        Error::Request(e) => match e {
            RequestError::Admission(_) => S::InvalidArgument,
            RequestError::Step(_) => S::Generation,
            RequestError::ShuttingDown => S::EngineStopped,
        },
        Error::EngineStopped => S::EngineStopped,
        Error::Hub(h) => match h {
            facade::hub::Error::NotFound { .. }
            | facade::hub::Error::NotInStore { .. }
            | facade::hub::Error::NotInCatalog { .. }
            | facade::hub::Error::EmptyName => S::NotFound,
            _ => S::Hub,
        },
        // The C API converts nothing; a conversion error can only be a model that failed
        // to load through the converter's reader.
        Error::Quant(_) => S::ModelLoad,
        // The C API takes no constraints; a grammar error can only be an invalid argument.
        Error::Grammar(_) => S::InvalidArgument,
        // The C API does not embed; kept total for the facade's error type.
        Error::Embed(facade::engine::EmbedError::Engine(_)) => S::Generation,
        Error::Embed(_) => S::InvalidArgument,
    }
}

/// A model-layer error: a missing file is [`MicaStatus::NotFound`], a malformed batch or an
/// overflowing context an invalid argument, anything else `otherwise` (a load failure when
/// opening, a generation failure when running).
fn model_status(e: &ModelError, otherwise: MicaStatus) -> MicaStatus {
    match e {
        ModelError::Format(FormatError::Io { cause, .. })
            if cause.kind() == std::io::ErrorKind::NotFound =>
        {
            MicaStatus::NotFound
        }
        ModelError::Batch(_) | ModelError::ContextOverflow { .. } => MicaStatus::InvalidArgument,
        _ => otherwise,
    }
}

fn tokenizer_status(e: &TokenizerError) -> MicaStatus {
    match e {
        TokenizerError::IdOutOfRange { .. } => MicaStatus::InvalidArgument,
        _ => MicaStatus::Tokenizer,
    }
}

/// `e`'s message followed by each cause not already part of it.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_msg = s.to_string();
        if !msg.contains(&s_msg) {
            msg.push_str(": ");
            msg.push_str(&s_msg);
        }
        source = s.source();
    }
    msg
}

thread_local! {
    /// The message of the last call that failed on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A NUL inside the message would cut it short in C; show it instead.
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // `try_with`: during thread teardown the slot may be gone; the status still says it.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = c);
}

/// The message of the last failed call on this thread ("" when none has failed). The
/// pointer stays valid until the next failing call on this thread.
pub(crate) fn last_error() -> *const c_char {
    static EMPTY: &[u8; 1] = b"\0";
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(EMPTY.as_ptr().cast())
}

/// Runs `body`, turning its failure or panic into a status (and the message into
/// `mica_last_error()`).
pub(crate) fn guard(body: impl FnOnce() -> Result<()>) -> MicaStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => MicaStatus::Ok,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.status
        }
        Err(payload) => {
            set_last_error(&panic_message(payload.as_ref()));
            MicaStatus::Internal
        }
    }
}

/// Runs `body` for a function that returns a value rather than a status: `fallback` (and a
/// message in `mica_last_error()`) when it fails or panics.
pub(crate) fn guard_value<T>(fallback: T, body: impl FnOnce() -> Result<T>) -> T {
    let mut out = None;
    let status = guard(|| {
        out = Some(body()?);
        Ok(())
    });
    match (status, out) {
        (MicaStatus::Ok, Some(v)) => v,
        _ => fallback,
    }
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    format!("internal error in mica (a panic): {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        unsafe { CStr::from_ptr(last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn failures_and_panics_become_statuses_with_messages() {
        assert_eq!(guard(|| Ok(())), MicaStatus::Ok);
        assert_eq!(
            guard(|| Err(Failure::invalid("top_p must be in (0, 1]"))),
            MicaStatus::InvalidArgument
        );
        assert_eq!(last(), "top_p must be in (0, 1]");
        // A success leaves the previous message in place.
        assert_eq!(guard(|| Ok(())), MicaStatus::Ok);
        assert_eq!(last(), "top_p must be in (0, 1]");
        let s = guard(|| panic!("index out of bounds"));
        assert_eq!(s, MicaStatus::Internal);
        assert!(last().contains("index out of bounds"), "{}", last());
        assert_eq!(guard_value(7usize, || Err(Failure::null("model"))), 7);
        assert_eq!(last(), "model is NULL");
    }

    #[test]
    fn the_last_error_is_per_thread() {
        guard(|| Err(Failure::null("text")));
        std::thread::spawn(|| {
            assert_eq!(last(), "");
            guard(|| Err(Failure::null("other")));
            assert_eq!(last(), "other is NULL");
        })
        .join()
        .unwrap();
        assert_eq!(last(), "text is NULL");
    }

    #[test]
    fn nul_bytes_in_messages_are_shown() {
        guard(|| Err(Failure::invalid("a\0b")));
        assert_eq!(last(), "a\\0b");
    }
}
