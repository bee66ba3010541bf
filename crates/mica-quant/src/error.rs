//! The error type of `mica-quant`: converting and quantizing, importance matrices, and
//! perplexity. Each variant names the file, tensor, rule or option at fault. As in the
//! other mica crates, a wrapped cause is part of the message rather than a separate
//! `source`, so that error chains print it once.
//!
//! Messages name the options by their command-line spelling (`--mix`, `--tensor-type`,
//! `--calibrate`): the fields of [`ConvertOptions`](crate::ConvertOptions) carry the same
//! names, and the `mica` binary prints these messages as they are.

use crate::convert::gptq::GptqError;
use mica_engine::EngineError;
use mica_formats::FormatError;
use mica_kernels::DType;
use mica_models::ModelError;
use mica_models::tokenizer::TokenizerError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),

    // ---- Sources, outputs and options of a conversion.
    #[error(
        "{}: a PyTorch pickle checkpoint alone is not a model: give the Hugging Face folder \
         holding it and its config.json (mica reads its tensors without running the pickle), \
         or the model's safetensors weights",
        path.display()
    )]
    PickleSource { path: PathBuf },
    #[error(
        "{}: is a directory without config.json; give a .gguf or .mica file or a \
         Hugging Face model folder",
        path.display()
    )]
    NotAModelFolder { path: PathBuf },
    #[error(
        "{}: the output must end in .mica or .gguf (that chooses the format)",
        path.display()
    )]
    OutputExtension { path: PathBuf },
    #[error("the output would overwrite the source")]
    OverwritesSource,
    #[error("--mix {bpw}: the budget is an average bits per weight, between 1 and 32")]
    MixBudget { bpw: f64 },
    #[error("--mix chooses among quantized types; --type must be a quantized type")]
    MixNeedsQuantizedType,
    #[error("--imatrix and --calibrate need a quantized --type")]
    ImportanceNeedsQuantizedType,
    #[error(
        "--mix {bpw}: the smallest mix is {smallest:.3} bits per weight (the tensors that are \
         not mixed, and the cheapest type of each that is, already take that)"
    )]
    MixTooSmall { bpw: f64, smallest: f64 },

    // ---- `--tensor-type REGEX=TYPE` rules.
    #[error("--tensor-type '{rule}': expected REGEX=TYPE, e.g. 'attn_v=q8_0'")]
    TensorTypeSyntax { rule: String },
    #[error("--tensor-type '{rule}': bad regular expression: {cause}")]
    TensorTypeRegex { rule: String, cause: regex::Error },
    #[error(
        "--tensor-type '{rule}': unknown type '{ty}' (one of: f32, f16, bf16, q8_0, q6_k, \
         q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, q3_k, q2_k)"
    )]
    TensorTypeUnknown { rule: String, ty: String },
    #[error(
        "--tensor-type '{rule}': tensor '{tensor}' has rows of {row_len}, not a multiple of \
         {ty}'s block of {}",
        ty.block_size()
    )]
    TensorTypeBlock {
        rule: String,
        tensor: String,
        row_len: usize,
        ty: DType,
    },
    #[error("--tensor-type '{pattern}': the pattern matches no quantizable tensor of the source")]
    TensorTypeUnmatched { pattern: String },

    // ---- One tensor of a conversion.
    #[error("tensor '{tensor}' has type {ggml_type}, which mica cannot convert")]
    UnconvertibleType { tensor: String, ggml_type: String },
    #[error("tensor '{tensor}': mica cannot read its type")]
    UnreadableType { tensor: String },
    #[error("tensor '{tensor}': mica cannot write its target type")]
    UnwritableType { tensor: String },
    #[error(
        "tensor '{tensor}': mica cannot write {ty} (it reads and runs it; of the grid i-quants \
         it writes only IQ2_XS)"
    )]
    UnwritableGridType { tensor: String, ty: DType },
    #[error(
        "tensor '{tensor}': {ty} needs an importance matrix (llama.cpp's quantizer requires \
         one); give one with --imatrix FILE or compute one with --calibrate TEXT"
    )]
    ImportanceRequired { tensor: String, ty: DType },
    #[error(
        "tensor '{tensor}': {ty} needs an importance matrix, and the importance matrix has no \
         entry with {row_len} columns for this tensor"
    )]
    ImportanceMissing {
        tensor: String,
        ty: DType,
        row_len: u64,
    },
    #[error("tensor '{tensor}': row length {row_len} does not fit {from} or {to}")]
    RowLength {
        tensor: String,
        row_len: usize,
        from: DType,
        to: DType,
    },
    #[error("tensor '{tensor}': bad row length")]
    BadRowLength { tensor: String },
    #[error("tensor '{tensor}': no candidate type fits rows of {row_len}")]
    NoMixCandidate { tensor: String, row_len: usize },
    #[error("tensor '{tensor}': {cause}")]
    Gptq { tensor: String, cause: GptqError },
    #[error("a sensitivity thread panicked")]
    ThreadPanicked,

    // ---- Hugging Face folders: what the folder's family cannot write as GGUF, or a
    // checkpoint tensor it cannot convert, is a `Model` error (`ModelError::Unconvertible`,
    // `ModelError::CheckpointTensor`), raised where the family descriptors are.

    // ---- Calibration, importance matrices and the KL probe.
    #[error("--calibrate runs the source model, which failed to load: {cause}")]
    CalibrationModel { cause: ModelError },
    #[error("calibration forward pass: {cause}")]
    CalibrationForward { cause: ModelError },
    #[error("the calibration text has {tokens} tokens, less than one window of {n_ctx}")]
    CalibrationTooShort { tokens: usize, n_ctx: usize },
    #[error(
        "the calibration text has {tokens} tokens; --mix needs at least {needed} to measure \
         sensitivities"
    )]
    ProbeTextTooShort { tokens: usize, needed: usize },
    #[error("reading {}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "{}: not a GGUF imatrix and not a valid legacy .dat imatrix: {msg}",
        path.display()
    )]
    ImatrixDat { path: PathBuf, msg: String },
    #[error("{}: tensor '{tensor}' is not F32", path.display())]
    ImatrixNotF32 { path: PathBuf, tensor: String },
    #[error("{}: '{tensor}' has no '{counts}'", path.display())]
    ImatrixNoCounts {
        path: PathBuf,
        tensor: String,
        counts: String,
    },
    #[error("{}: no '*.in_sum2' tensors: not an imatrix file", path.display())]
    NotAnImatrix { path: PathBuf },

    // ---- Perplexity.
    #[error("a window of {n_ctx} tokens is too small: perplexity needs at least 4")]
    WindowTooSmall { n_ctx: usize },
    #[error("the text tokenizes to {tokens} tokens; a context of {n_ctx} needs at least {needed}")]
    TextTooShort {
        tokens: usize,
        n_ctx: usize,
        needed: usize,
    },
    #[error("{base} logits per token, the model {model}; KL-divergence needs the same vocabulary")]
    VocabularyMismatch { base: usize, model: usize },
}

pub type Result<T, E = QuantError> = std::result::Result<T, E>;
