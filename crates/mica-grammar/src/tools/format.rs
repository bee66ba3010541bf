//! How model families write tool calls, and how to read them back.
//!
//! - [`ToolFormat::Hermes`] (Qwen2.5, Hermes 2 Pro and their fine-tunes): each call is
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, possibly after some
//!   text, several in a row for parallel calls. Where the tags are control tokens (Qwen2.5's
//!   GGUF files), decoding leaves them out of the text, so calls are also read as bare call
//!   objects, one after another.
//! - [`ToolFormat::Llama3`] (Llama 3.1 / 3.2 / 3.3 JSON tool calling): the answer is the
//!   JSON object `{"name": ..., "parameters": {...}}` (after `<|python_tag|>`, a control
//!   token that decoding leaves out of the text); several calls separated by `;`.
//! - [`ToolFormat::Json`] (any other template): the answer is a call object
//!   `{"name": ..., "arguments": {...}}` (or `"parameters"`), or a JSON list of them.
//!
//! In every format, an output that is one Markdown code block holding calls is read as
//! those calls (small models wrap calls in ```` ```json ```` when free to choose).
//!
//! The format is chosen from the chat template's source ([`ToolFormat::detect`]), as
//! llama.cpp's `common/chat.cpp` and vLLM's tool parsers choose theirs.

use super::{ParsedOutput, Tool, ToolCall, calls_schema};
use crate::constraint::lark_string;
use llguidance::api::TopLevelGrammar;
use serde_json::Value;

/// A model family's way of writing tool calls (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Json,
}

pub(crate) const HERMES_OPEN: &str = "<tool_call>";
pub(crate) const HERMES_CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format a chat template asks for: `<tool_call>` tags → Hermes; Llama 3's
    /// `<|python_tag|>` or `"parameters"` call instructions → Llama 3; else generic JSON.
    pub fn detect(template_source: &str) -> ToolFormat {
        if template_source.contains(HERMES_OPEN) {
            ToolFormat::Hermes
        } else if template_source.contains("<|python_tag|>")
            || (template_source.contains("<|start_header_id|>")
                && template_source.contains("\"parameters\""))
        {
            ToolFormat::Llama3
        } else {
            ToolFormat::Json
        }
    }

    /// The key of a call object that holds the arguments.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            ToolFormat::Hermes | ToolFormat::Json => "arguments",
        }
    }

    /// The grammar of a call to one of `tools` in this format — several in a row when
    /// `parallel` (Hermes; the JSON formats' grammar is one call object).
    /// `special_tags`: the Hermes tags are control tokens of the vocabulary, and the grammar
    /// names those tokens (what the model was trained to emit) rather than spelling the
    /// tags out as text.
    pub(crate) fn call_grammar(
        self,
        tools: &[&Tool],
        special_tags: bool,
        parallel: bool,
    ) -> TopLevelGrammar {
        let schema = calls_schema(tools, self.arguments_key());
        match self {
            ToolFormat::Hermes => {
                let (open, close) = if special_tags {
                    (
                        format!("{HERMES_OPEN} \"\\n\""),
                        format!("\"\\n\" {HERMES_CLOSE}"),
                    )
                } else {
                    (
                        lark_string(&format!("{HERMES_OPEN}\n")),
                        lark_string(&format!("\n{HERMES_CLOSE}")),
                    )
                };
                let start = if parallel {
                    "call (\"\\n\" call)*"
                } else {
                    "call"
                };
                let lark =
                    format!("start: {start}\ncall: {open} body {close}\nbody: %json {schema}\n");
                TopLevelGrammar::from_lark(lark)
            }
            ToolFormat::Llama3 | ToolFormat::Json => TopLevelGrammar::from_json_schema(schema),
        }
    }
}

/// Splits `text` into content and the calls it contains in `format` (calls are not
/// validated here; see [`ToolSet::parse`](super::ToolSet::parse)).
pub fn parse_calls(format: ToolFormat, text: &str) -> ParsedOutput {
    let parse = |t: &str| match format {
        ToolFormat::Hermes => parse_hermes(t),
        ToolFormat::Llama3 | ToolFormat::Json => parse_json(t, format),
    };
    let parsed = parse(text);
    if parsed.calls.is_empty()
        && let Some(inner) = unfence(text)
    {
        let fenced = parse(inner);
        if !fenced.calls.is_empty() {
            return fenced;
        }
    }
    parsed
}

/// The inside of an output that is one Markdown code block (```` ```json ... ``` ````):
/// small models often wrap a call in one when they are free to choose.
fn unfence(text: &str) -> Option<&str> {
    let t = text.trim().strip_prefix("```")?.strip_suffix("```")?;
    let body_at = t.find('\n')?;
    let lang = &t[..body_at];
    if !lang.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    Some(&t[body_at + 1..])
}

/// Calls between `<tool_call>` tags (an unclosed last tag is read to the end: a cut-off
/// output still yields the calls before it); text outside tags is content. Without tags,
/// the text may be bare call objects (the tags were control tokens, left out of the text).
fn parse_hermes(text: &str) -> ParsedOutput {
    if !text.contains(HERMES_OPEN) {
        return parse_bare(text);
    }
    let mut out = ParsedOutput::default();
    let mut rest = text;
    let mut content = String::new();
    while let Some(at) = rest.find(HERMES_OPEN) {
        content.push_str(&rest[..at]);
        let body_start = at + HERMES_OPEN.len();
        let (body, next) = match rest[body_start..].find(HERMES_CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + HERMES_CLOSE.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| call_of(&v))
        {
            Some(call) => out.calls.push(call),
            None => {
                // Not a call after all: keep it as text.
                content.push_str(&rest[at..rest.len() - next.len()]);
            }
        }
        rest = next;
    }
    content.push_str(rest);
    out.content = if out.calls.is_empty() {
        content
    } else {
        content.trim().to_string()
    };
    out
}

/// The whole text as call objects one after another (whitespace between them), or
/// content.
fn parse_bare(text: &str) -> ParsedOutput {
    let values: Result<Vec<Value>, _> = serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect();
    let calls: Option<Vec<ToolCall>> = values
        .ok()
        .filter(|v| !v.is_empty())
        .and_then(|v| v.iter().map(call_of).collect());
    match calls {
        Some(calls) => ParsedOutput {
            content: String::new(),
            calls,
        },
        None => ParsedOutput {
            content: text.to_string(),
            calls: Vec::new(),
        },
    }
}

/// The whole (trimmed) text as one call object, a list of them, or `;`-separated objects;
/// anything else is content.
fn parse_json(text: &str, format: ToolFormat) -> ParsedOutput {
    let t = text.trim();
    let not_calls = || ParsedOutput {
        content: text.to_string(),
        calls: Vec::new(),
    };
    if !t.starts_with('{') && !t.starts_with('[') {
        return not_calls();
    }
    let values: Vec<Value> = match serde_json::from_str::<Value>(t) {
        Ok(Value::Array(items)) => items,
        Ok(v) => vec![v],
        Err(_) if format == ToolFormat::Llama3 => {
            let parts: Option<Vec<Value>> = t
                .split(';')
                .map(|p| serde_json::from_str(p.trim()).ok())
                .collect();
            match parts {
                Some(p) => p,
                None => return not_calls(),
            }
        }
        Err(_) => return not_calls(),
    };
    let calls: Option<Vec<ToolCall>> = values.iter().map(call_of).collect();
    match calls {
        Some(calls) if !calls.is_empty() => ParsedOutput {
            content: String::new(),
            calls,
        },
        _ => not_calls(),
    }
}

/// A call object `{"name": ..., "arguments" | "parameters": {...}}` (arguments given as a
/// JSON string are parsed).
fn call_of(v: &Value) -> Option<ToolCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.to_string();
    let args = o
        .get("arguments")
        .or_else(|| o.get("parameters"))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let arguments = match args {
        Value::String(s) => serde_json::from_str(&s).ok()?,
        v => v,
    };
    Some(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn detects_formats() {
        assert_eq!(
            ToolFormat::detect("... <tool_call>\\n{\"name\": ...}"),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::detect(
                "<|start_header_id|> {\"name\": function name, \"parameters\": ...}"
            ),
            ToolFormat::Llama3
        );
        assert_eq!(ToolFormat::detect("{{ messages }}"), ToolFormat::Json);
    }

    #[test]
    fn hermes_calls_and_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"y\\\": 2}\"}\n</tool_call>";
        let p = parse_calls(ToolFormat::Hermes, text);
        assert_eq!(p.content, "Let me check.");
        assert_eq!(
            p.calls,
            vec![
                ToolCall {
                    name: "a".into(),
                    arguments: json!({"x": 1})
                },
                ToolCall {
                    name: "b".into(),
                    arguments: json!({"y": 2})
                }
            ]
        );
        // Tags that were control tokens leave bare call objects.
        let p = parse_calls(
            ToolFormat::Hermes,
            "\n{\"name\": \"a\", \"arguments\": {}}\n\n{\"name\": \"b\", \"arguments\": {}}\n",
        );
        assert_eq!(p.calls.len(), 2);
        assert_eq!(parse_calls(ToolFormat::Hermes, "{\"x\": 1}").calls.len(), 0);
        // A call in a Markdown code block.
        let p = parse_calls(
            ToolFormat::Hermes,
            "```json\n{\"name\": \"a\", \"arguments\": {\"k\": 1}}\n```",
        );
        assert_eq!(p.calls.len(), 1);
        assert_eq!(p.calls[0].arguments, json!({"k": 1}));
        assert_eq!(
            parse_calls(ToolFormat::Json, "```\n[{\"name\": \"a\"}]\n```")
                .calls
                .len(),
            1
        );
        assert!(
            parse_calls(ToolFormat::Json, "```py\nx = {}\n```")
                .calls
                .is_empty()
        );
        let p = parse_calls(ToolFormat::Hermes, "no calls <tool_call> oops");
        assert!(p.calls.is_empty());
        assert_eq!(p.content, "no calls <tool_call> oops");
    }

    #[test]
    fn json_and_llama3_calls() {
        let p = parse_calls(
            ToolFormat::Llama3,
            " {\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}; {\"name\": \"g\", \"parameters\": {}}",
        );
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].arguments, json!({"q": "x"}));
        let p = parse_calls(ToolFormat::Json, "[{\"name\": \"f\", \"arguments\": {}}]");
        assert_eq!(p.calls.len(), 1);
        let p = parse_calls(ToolFormat::Json, "{\"answer\": 4}");
        assert!(p.calls.is_empty());
        let p = parse_calls(ToolFormat::Json, "The answer is 4.");
        assert_eq!(p.content, "The answer is 4.");
    }
}
