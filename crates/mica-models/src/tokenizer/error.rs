//! The error type of the tokenizer: every variant names the field, token or index at fault.

/// Anything that can go wrong building a [`Tokenizer`](super::Tokenizer) or using it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The GGUF file (or spec) has no `tokenizer.ggml.tokens`, or it is empty.
    #[error("tokenizer vocabulary missing or empty (GGUF key 'tokenizer.ggml.tokens')")]
    MissingVocab,
    /// A required metadata key is absent.
    #[error("tokenizer metadata '{0}' is missing")]
    MissingKey(&'static str),
    /// A metadata key is present with the wrong type or shape.
    #[error("tokenizer metadata '{key}' is invalid: {msg}")]
    BadKey { key: &'static str, msg: String },
    /// `tokenizer.ggml.model` names a tokenizer family mica does not implement.
    #[error(
        "unknown tokenizer model '{0}' (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece, 'gemma4', 'bert' WordPiece)"
    )]
    UnknownModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer mica has no regex list for.
    #[error(
        "unknown pre-tokenizer '{0}' (GGUF key 'tokenizer.ggml.pre'); mica cannot split text the way this model was trained"
    )]
    UnknownPreTokenizer(String),
    /// An entry of `tokenizer.ggml.merges` is not two symbols separated by a space.
    #[error("tokenizer merges entry {index} ('{entry}') is not 'left right'")]
    BadMerge { index: usize, entry: String },
    /// A per-token array (scores, token types) is shorter than the vocabulary.
    #[error("tokenizer '{key}' has {len} entries but the vocabulary has {vocab}")]
    LengthMismatch {
        key: &'static str,
        len: usize,
        vocab: usize,
    },
    /// `add_bos`/`add_eos` is set but the model names no such token.
    #[error("'{flag}' is true but the model has no valid '{id_key}'")]
    MissingSpecialToken {
        flag: &'static str,
        id_key: &'static str,
    },
    /// A token id is not in the vocabulary.
    #[error("token id {id} is out of range (vocabulary size {vocab_size})")]
    IdOutOfRange { id: u32, vocab_size: usize },
    /// Building or running the Hugging Face `tokenizers` pipeline failed.
    #[error("tokenizer backend: {0}")]
    Backend(String),
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
