//! One error type for everything the facade does, wrapping each layer's own typed error so
//! that bindings can map them to exception classes (and the server to HTTP statuses)
//! without parsing messages.

use mica_engine::{EngineError, RequestError, SubmitError};
use mica_models::tokenizer::TokenizerError;
use mica_models::{ChatPromptError, ModelError};

/// What can go wrong in the facade. Each variant keeps its layer's error, whose message
/// names the file, tensor, parameter or model at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Opening a model: a missing, corrupt or unsupported file or folder.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Tokenizing or detokenizing.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Rendering a conversation with the chat template, or tokenizing it.
    #[error(transparent)]
    ChatPrompt(#[from] ChatPromptError),
    /// A generation in a [`Session`](crate::Session) (invalid parameters, a prompt longer
    /// than the context, a failed forward pass), or an engine that could not start.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The engine refused a request (invalid parameters, full queue, prompt too long).
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// A request the engine accepted failed while it ran.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The engine stopped before the request finished.
    #[error("the engine stopped before the request finished")]
    EngineStopped,
    /// Resolving or pulling a model from the store.
    #[error(transparent)]
    Hub(#[from] mica_hub::Error),
    /// Converting or quantizing.
    #[error(transparent)]
    Quant(#[from] mica_quant::QuantError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
