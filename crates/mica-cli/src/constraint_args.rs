//! The output-constraint flags shared by `mica run` and `mica chat` (structured output):
//! at most one of `--json-schema`, `--json-object`, `--grammar-file`, `--regex`,
//! `--choice`. The constraint is read and compiled before anything is generated, so a bad
//! one is an error, never unconstrained output.

use anyhow::{Context, Result};
use clap::Args;
use mica::grammar::{CompiledGrammar, Constraint, GrammarCompiler};
use mica::models::LoadedModel;
use std::path::Path;

#[derive(Args, Debug, Clone, Default)]
#[group(multiple = false)]
pub struct ConstraintArgs {
    /// Constrain the output to JSON valid under this JSON Schema: a file, or the schema
    /// itself as JSON text.
    #[arg(long = "json-schema", value_name = "FILE|JSON")]
    pub json_schema: Option<String>,
    /// Constrain the output to one JSON object.
    #[arg(long = "json-object")]
    pub json_object: bool,
    /// Constrain the output to a grammar: llama.cpp GBNF (`.gbnf`, or rules written with
    /// `::=`) or llguidance Lark (`.lark`, or anything else).
    #[arg(long = "grammar-file", value_name = "FILE")]
    pub grammar_file: Option<String>,
    /// Constrain the output to text matching this regular expression (Rust regex syntax,
    /// matched whole).
    #[arg(long = "regex", value_name = "RE")]
    pub regex: Option<String>,
    /// Constrain the output to exactly one of these comma-separated strings.
    #[arg(long = "choice", value_name = "A,B,...", value_delimiter = ',')]
    pub choice: Option<Vec<String>>,
}

impl ConstraintArgs {
    /// The constraint the flags ask for (files read, JSON parsed), if any.
    pub fn constraint(&self) -> Result<Option<Constraint>> {
        if let Some(s) = &self.json_schema {
            let text = if Path::new(s).is_file() {
                std::fs::read_to_string(s).with_context(|| format!("reading the schema {s}"))?
            } else {
                s.clone()
            };
            let schema: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema: {s:?} is neither a file nor JSON text"))?;
            return Ok(Some(Constraint::JsonSchema(schema)));
        }
        if self.json_object {
            return Ok(Some(Constraint::JsonObject));
        }
        if let Some(f) = &self.grammar_file {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading the grammar {f}"))?;
            return Ok(Some(Constraint::grammar(text, Some(f))));
        }
        if let Some(rx) = &self.regex {
            return Ok(Some(Constraint::Regex(rx.clone())));
        }
        if let Some(c) = &self.choice {
            return Ok(Some(Constraint::Choice(c.clone())));
        }
        Ok(None)
    }
}

/// Compiles `constraint` for `lm` (an error names what is wrong with it).
pub fn compile(lm: &LoadedModel, constraint: &Constraint) -> Result<CompiledGrammar> {
    let compiler = GrammarCompiler::for_model(lm)?;
    Ok(compiler.compile(constraint)?)
}
