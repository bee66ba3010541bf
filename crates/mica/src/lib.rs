//! mica: local LLM inference on the CPU — the one crate that outside Rust users, the HTTP
//! server and the language bindings depend on.
//!
//! A [`Model`] is opened from a GGUF or `.mica` file, a Hugging Face folder, or a name in
//! the model [`Store`]. From it:
//! - [`Model::tokenize`] / [`Model::detokenize`], and [`Model::chat_prompt`]: a
//!   conversation rendered with the model's own chat template and tokenized — the one way
//!   every front end builds chat prompts;
//! - [`Model::session`]: one sequence at a time — [`Session::generate`], [`Session::stream`]
//!   (text as it becomes final; return `false` to stop), raw [`Session::logits`], and
//!   logits processors and speculative proposers ([`spec`]: n-gram lookup, draft models)
//!   through [`Session::generate_with`];
//! - [`Model::engine`]: many concurrent requests continuously batched on one engine thread
//!   ([`Engine::submit`] returns a [`Stream`] of [`Event`]s; dropping it cancels the
//!   request), as `mica serve` runs them;
//! - [`Model::embed`]: embeddings of texts, pooled as the model declares and normalized.
//!
//! Structured output: [`Model::compile`] checks a [`Constraint`] (JSON Schema, JSON object,
//! regular expression, Lark or GBNF grammar, choice list) before anything is generated;
//! the [`CompiledGrammar`] then constrains a session (its processor in [`Hooks`]) or engine
//! requests ([`Request::constrained`]). Tool calling lives in [`grammar::tools`]:
//! [`Model::chat_prompt_with_tools`] renders tools through the model's template, and a
//! [`ToolSet`](grammar::tools::ToolSet) parses, validates and forces calls.
//!
//! [`convert`] writes GGUF or `.mica` files (optionally quantized), [`Store::pull`] fetches
//! models. Errors from every layer arrive as one [`Error`]. The crates beneath are
//! re-exported ([`engine`], [`models`], [`kernels`], [`formats`], [`quant`], [`hub`]) for
//! what the facade does not cover.
//!
//! ```
//! use mica::{ChatMessage, EngineOptions, GenerateParams, Model, SamplingParams, SessionOptions};
//! # let dir = std::env::var("MICA_TEST_MODELS").expect("set MICA_TEST_MODELS (scripts/test does)");
//! # let path = std::path::Path::new(&dir).join("smollm2-135m-instruct-q4_1.gguf");
//! let model = Model::open(&path)?;
//! let prompt = model.chat_prompt(&[ChatMessage::new("user", "What is the capital of France?")])?;
//! let params = GenerateParams {
//!     max_tokens: 12,
//!     sampling: SamplingParams::greedy(),
//!     ..Default::default()
//! };
//!
//! // One sequence: stream the answer as it is generated.
//! let mut session = model.session(SessionOptions::default());
//! let answer = session.stream(&prompt, &params, |text| {
//!     print!("{text}");
//!     true // false would stop here
//! })?;
//!
//! // Raw logits of the next token, for custom sampling.
//! let logits = session.logits(&model.tokenize("The capital of France is")?)?;
//! assert_eq!(logits.len(), model.n_vocab());
//!
//! // Many requests at once: the same greedy answer from the batching engine.
//! let engine = model.engine(EngineOptions::default())?;
//! assert_eq!(engine.generate(&prompt, &params)?.text, answer.text);
//! # Ok::<(), mica::Error>(())
//! ```

mod embed;
mod engine_api;
mod error;
mod model;
mod session;
pub mod spec;

pub use embed::EmbedOptions;
pub use engine_api::{Completion, Engine, EngineOptions, Request, Stream};
pub use error::{Error, Result};
pub use model::{Model, ModelOptions};
pub use session::{Session, SessionOptions};

pub use mica_engine::{
    Embedder, Event, FinishReason, GenerateParams, Generation, Hooks, Lane, LogitsProcessor,
    ParamError, Pooling, Proposer, RequestError, SamplingParams, SubmitError, Timings,
    TokenLogprob, Usage,
};
pub use mica_grammar::{CompiledGrammar, Constraint, GrammarError};
pub use mica_hub::{Hub, HubConfig, Installed, Store};
pub use mica_models::chat::ChatMessage;
pub use mica_models::{Conversation, ConversationError};
pub use mica_quant::{ConvertOptions, ConvertReport, FileType};

/// The layers beneath the facade, for what it does not cover.
pub use mica_engine as engine;
pub use mica_formats as formats;
pub use mica_grammar as grammar;
pub use mica_hub as hub;
pub use mica_kernels as kernels;
pub use mica_models as models;
pub use mica_quant as quant;

/// Converts a GGUF file, `.mica` file or Hugging Face folder at `src` into `dst` (GGUF or
/// `.mica`, by its extension), optionally quantized as `opts` says; progress, warnings and
/// notes go to `on_event`. See [`mica_quant::convert()`].
pub fn convert(
    src: &std::path::Path,
    dst: &std::path::Path,
    opts: &ConvertOptions,
    on_event: &mut dyn FnMut(quant::Event),
) -> Result<ConvertReport> {
    Ok(mica_quant::convert(src, dst, opts, on_event)?)
}
