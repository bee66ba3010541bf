//! The error type of `mica-models`: loading a model (file, config, tensors), tokenizing, and
//! running a batch. Each variant names the file, key, tensor or sequence at fault.

use crate::chat::ChatTemplateError;
use crate::tokenizer::TokenizerError;
use mica_formats::FormatError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] FormatError),
    /// (The cause is part of the message, not a separate `source`, so that error chains
    /// print it once.)
    #[error("{path}: {cause}")]
    Tokenizer {
        path: PathBuf,
        cause: TokenizerError,
    },
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error("{path}: unknown architecture '{arch}' (mica runs: {supported})")]
    UnknownArchitecture {
        path: PathBuf,
        arch: String,
        supported: String,
    },
    /// A GGUF file with metadata but no tensors (llama.cpp's `ggml-vocab-*.gguf`): it can
    /// tokenize, not run.
    #[error(
        "{path} has no tensors: it is a vocabulary-only GGUF (it can tokenize text but holds no weights to run)"
    )]
    VocabOnly { path: PathBuf },
    #[error("{path}: missing tensor '{tensor}', required by the {arch} architecture")]
    MissingTensor {
        path: PathBuf,
        arch: String,
        tensor: String,
    },
    #[error(
        "{path}: tensor '{tensor}' has type {ggml_type}, which mica cannot compute with (supported: {supported})"
    )]
    UnsupportedType {
        path: PathBuf,
        tensor: String,
        ggml_type: String,
        supported: String,
    },
    #[error("{path}: tensor '{tensor}' has shape {got:?}, expected {expected:?}")]
    BadShape {
        path: PathBuf,
        tensor: String,
        expected: Vec<u64>,
        got: Vec<u64>,
    },
    /// A Hugging Face model GGUF (as llama.cpp reads it) cannot describe faithfully.
    #[error("{path}: cannot write this {class} model as GGUF '{gguf}': {reason}")]
    Unconvertible {
        path: PathBuf,
        class: String,
        gguf: String,
        reason: String,
    },
    #[error("{path}: checkpoint tensor '{tensor}' {msg}")]
    CheckpointTensor {
        path: PathBuf,
        tensor: String,
        msg: String,
    },
    #[error("{path}: metadata '{key}': {msg}")]
    Config {
        path: PathBuf,
        key: String,
        msg: String,
    },
    /// A batch would put a sequence past the context it was given.
    #[error(
        "sequence {seq}: {needed} tokens do not fit in the context of {n_ctx} tokens (use a larger context or a shorter prompt)"
    )]
    ContextOverflow {
        seq: usize,
        needed: usize,
        n_ctx: usize,
    },
    /// A KV cache type this model cannot store (see [`crate::kv_cache::KvType`]).
    #[error("KV cache type: {0}")]
    CacheType(String),
    /// Layer streaming cannot run as asked ([`crate::stream`]).
    #[error("layer streaming: {0}")]
    Streaming(String),
    /// The device running offloaded layers failed ([`crate::offload`]).
    #[error("offloaded layers: {0}")]
    Offload(String),
    /// A batch is malformed (bad token id, positions that skip or rewind...).
    #[error("invalid batch: {0}")]
    Batch(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
