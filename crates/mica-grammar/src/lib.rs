//! mica-grammar: structured output — generated text that is guaranteed to fit a JSON
//! Schema, a JSON object, a regular expression, a Lark or llama.cpp GBNF grammar, or a list
//! of choices — and tool calling.
//!
//! Constraints act through the engine's `LogitsProcessor` seam, backed by `llguidance` (a
//! grammar engine made for this: token masks over the whole vocabulary in tens of
//! microseconds, with rollback for speculative decoding):
//! 1. a [`GrammarCompiler`] indexes a model's vocabulary once ([`vocab`]);
//! 2. [`GrammarCompiler::compile`] checks a [`Constraint`] before anything is generated —
//!    an invalid or unsupported one is a [`GrammarError`], never unconstrained output;
//! 3. each sequence gets its own [`GrammarProcessor`] ([`CompiledGrammar::processor`], or
//!    [`CompiledGrammar::factory`] for the engine's per-completion processors), which masks
//!    every disallowed token, computes the next mask on a helper thread while the forward
//!    pass runs, and ends the sequence once the grammar is complete
//!    (`FinishReason::Constraint`).
//!
//! [`tools`] turns tool definitions into chat-template input, parses the model's output
//! back into calls (per model family's format), validates their arguments against each
//! tool's schema, and builds the grammar that forces a valid call when the caller requires
//! one.

pub mod compiler;
pub mod constraint;
pub mod error;
pub mod gbnf;
pub mod processor;
pub mod tools;
pub mod vocab;

pub use compiler::{CompiledGrammar, GrammarCompiler};
pub use constraint::{Constraint, ConstraintKind};
pub use error::{GrammarError, Result};
pub use processor::{ConstraintStats, GrammarProcessor, ProcessorOptions};
