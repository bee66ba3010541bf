//! The errors of `mica-grammar`: a constraint that cannot be compiled (so that no token is
//! ever generated under it), a GBNF grammar that does not parse, a vocabulary llguidance
//! cannot index, and tool definitions or calls that do not fit their schemas.

use crate::constraint::ConstraintKind;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// llguidance refused the constraint: invalid JSON Schema, a keyword it does not
    /// support, an invalid regular expression or Lark grammar. The message is llguidance's.
    #[error("invalid {kind}: {message}", kind = .kind.describe())]
    Compile {
        kind: ConstraintKind,
        message: String,
    },
    /// A GBNF grammar that llama.cpp's grammar parser would refuse too.
    #[error("invalid GBNF grammar at line {line}, column {column}: {message}")]
    Gbnf {
        line: usize,
        column: usize,
        message: String,
    },
    /// A choice constraint with no choices.
    #[error("a choice constraint needs at least one choice")]
    EmptyChoice,
    /// The model's vocabulary could not be indexed for constrained decoding.
    #[error("cannot index the vocabulary for constrained decoding: {0}")]
    Vocabulary(String),
    /// A tool definition that cannot be used (no name, parameters that are not a schema).
    #[error("tool {name:?}: {message}")]
    Tool { name: String, message: String },
    /// `tool_choice` names a function that is not among the tools.
    #[error("tool_choice names {0:?}, which is not among the tools")]
    UnknownTool(String),
    /// `tool_choice` asks for a call but no tools were given.
    #[error("tool_choice asks for a tool call but no tools were given")]
    NoTools,
}

pub type Result<T, E = GrammarError> = std::result::Result<T, E>;
