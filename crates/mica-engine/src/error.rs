//! The error type of `mica-engine`.

use mica_models::ModelError;
use mica_models::tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(
        "the prompt has {tokens} tokens but the context holds {n_ctx}; shorten the prompt or raise the context size"
    )]
    PromptTooLong { tokens: usize, n_ctx: usize },
    #[error("invalid parameters: {0}")]
    Params(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
