//! What a caller may constrain output to, and how each kind becomes an llguidance grammar.
//!
//! - JSON Schema: compiled by llguidance (its supported subset; any keyword it does not
//!   implement is an error, never ignored). Unless the schema says otherwise through
//!   llguidance's `x-guidance` options, output is laid out as Python's `json.dumps` writes
//!   it (`", "` and `": "` separators, no other whitespace): a model cannot pad a value
//!   with endless whitespace, the failure mode of "flexible whitespace" on small models.
//! - JSON object mode: the schema `{"type": "object"}` under the same layout.
//! - Regular expressions (Rust `regex` syntax, matched whole), Lark grammars (llguidance's
//!   dialect), llama.cpp GBNF grammars (converted to Lark by [`crate::gbnf`]) and a fixed
//!   list of choices (exactly one of the strings).

use crate::error::{GrammarError, Result};
use crate::gbnf;
use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

/// A constraint on generated text.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// Text that is a JSON document valid under this schema.
    JsonSchema(Value),
    /// Text that is one JSON object.
    JsonObject,
    /// Text that matches this regular expression, whole.
    Regex(String),
    /// Text in the language of this Lark grammar (llguidance's dialect, `start` rule).
    Lark(String),
    /// Text in the language of this llama.cpp GBNF grammar (`root` rule).
    Gbnf(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// Which kind of constraint (names the request field at fault in errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConstraintKind {
    JsonSchema,
    JsonObject,
    Regex,
    Lark,
    Gbnf,
    Choice,
    /// The grammar of a forced tool call, generated from the tools' schemas.
    Tools,
}

impl ConstraintKind {
    /// What the kind is called in messages ("JSON schema", "regular expression"...).
    pub fn describe(self) -> &'static str {
        match self {
            ConstraintKind::JsonSchema => "JSON schema",
            ConstraintKind::JsonObject => "JSON object constraint",
            ConstraintKind::Regex => "regular expression",
            ConstraintKind::Lark => "Lark grammar",
            ConstraintKind::Gbnf => "GBNF grammar",
            ConstraintKind::Choice => "choice list",
            ConstraintKind::Tools => "tool schema",
        }
    }
}

/// llguidance's JSON layout options used unless a schema sets its own `x-guidance`.
pub(crate) fn json_layout() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// `schema` with mica's JSON layout, unless it carries llguidance options of its own.
pub(crate) fn with_layout(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut()
        && !obj.contains_key("x-guidance")
    {
        obj.insert("x-guidance".into(), json_layout());
    }
    schema
}

impl Constraint {
    /// A grammar file's constraint: GBNF when `path_hint` ends in `.gbnf` or the text
    /// defines rules with `::=`, else Lark.
    pub fn grammar(text: impl Into<String>, path_hint: Option<&str>) -> Constraint {
        let text = text.into();
        let by_ext = path_hint.and_then(|p| {
            let p = p.to_ascii_lowercase();
            if p.ends_with(".gbnf") {
                Some(true)
            } else if p.ends_with(".lark") {
                Some(false)
            } else {
                None
            }
        });
        if by_ext.unwrap_or_else(|| gbnf::looks_like_gbnf(&text)) {
            Constraint::Gbnf(text)
        } else {
            Constraint::Lark(text)
        }
    }

    pub fn kind(&self) -> ConstraintKind {
        match self {
            Constraint::JsonSchema(_) => ConstraintKind::JsonSchema,
            Constraint::JsonObject => ConstraintKind::JsonObject,
            Constraint::Regex(_) => ConstraintKind::Regex,
            Constraint::Lark(_) => ConstraintKind::Lark,
            Constraint::Gbnf(_) => ConstraintKind::Gbnf,
            Constraint::Choice(_) => ConstraintKind::Choice,
        }
    }

    /// The llguidance grammar of this constraint (syntax errors of GBNF and empty choice
    /// lists are found here; the rest when llguidance compiles it).
    pub(crate) fn to_grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Constraint::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(GrammarError::Compile {
                        kind: ConstraintKind::JsonSchema,
                        message: "a schema must be a JSON object or a boolean".into(),
                    });
                }
                TopLevelGrammar::from_json_schema(with_layout(schema.clone()))
            }
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(json!({"type": "object"})))
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Constraint::Gbnf(text) => TopLevelGrammar::from_lark(gbnf::to_lark(text)?),
            Constraint::Choice(choices) => TopLevelGrammar::from_lark(choice_lark(choices)?),
        })
    }
}

/// `start: "a" | "b" | ...` (string literals in JSON syntax, which llguidance's Lark reads).
fn choice_lark(choices: &[String]) -> Result<String> {
    if choices.is_empty() {
        return Err(GrammarError::EmptyChoice);
    }
    let alts: Vec<String> = choices.iter().map(|c| lark_string(c)).collect();
    Ok(format!("start: {}\n", alts.join(" | ")))
}

/// A Lark string literal of `s`.
pub(crate) fn lark_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}
