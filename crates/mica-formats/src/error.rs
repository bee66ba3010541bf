//! The one error type of `mica-formats`. Every variant names the file, and where it applies
//! the byte offset or the tensor, so a user can tell which file is broken and where.

use std::path::PathBuf;

/// Anything that can go wrong reading a model file.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// (The cause is part of the message, not a separate `source`, so that error chains
    /// print it once.)
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// The file is malformed at a byte offset (truncated, bad magic, absurd count...).
    #[error("{path}: at byte {offset}: {msg}")]
    Parse {
        path: PathBuf,
        offset: u64,
        msg: String,
    },
    /// A tensor's description is invalid (range past the end, bad shape, unknown type...).
    #[error("{path}: tensor '{tensor}': {msg}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        msg: String,
    },
    /// A metadata key has the wrong type or an invalid value.
    #[error("{path}: metadata '{key}': {msg}")]
    Metadata {
        path: PathBuf,
        key: String,
        msg: String,
    },
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
