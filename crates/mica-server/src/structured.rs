//! Structured output and tool calling for both APIs, on top of `mica-grammar`:
//!
//! - **Constraints**: OpenAI's `response_format` (`json_object`, `json_schema`), Ollama's
//!   `format` (`"json"` or a schema), and mica's extension fields on both — `grammar` (a
//!   llama.cpp GBNF grammar, or a Lark grammar in llguidance's dialect; GBNF when it defines
//!   rules with `::=`), `regex` (the whole output matches) and `choice` (exactly one of a
//!   list of strings). At most one per request. A `json_schema` is enforced whether or not
//!   it says `strict`: mica has no best-effort mode.
//! - **Tools**: `tools` and OpenAI's `tool_choice` (`auto`, `none`, `required`, or
//!   `{"type": "function", "function": {"name": ...}}`). Tools reach the model through its
//!   chat template; `required` and a named function constrain the output to valid calls
//!   — one call, or several with `parallel_tool_calls: true` (OpenAI's default is true;
//!   mica's is one, as llama.cpp's server, since small models repeat a forced call).
//!
//! Everything fails closed: a constraint or tool schema that does not compile is a 400
//! naming the field, before the request reaches the engine ([`prepare`]).

use crate::error::ParamError;
use crate::models::Loaded;
use mica::engine::ProcessorFactory;
use mica::grammar::tools::{Tool, ToolChoice, ToolFormat, ToolSet};
use mica::grammar::{Constraint, GrammarCompiler, GrammarError};
use mica::models::chat::{ChatMessage, ToolCall, ToolCallError};
use serde_json::Value;
use std::sync::Arc;

/// A request's constraint and tools, read from its body (no model involved).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Structured {
    /// The output constraint, and the field that asked for it.
    pub constraint: Option<(Constraint, &'static str)>,
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    /// `parallel_tool_calls: true`: a forced call may be followed by more (by default one).
    pub parallel_calls: bool,
}

fn unsupported(field: impl Into<String>, message: impl Into<String>) -> ParamError {
    ParamError::Unsupported {
        field: field.into(),
        message: message.into(),
    }
}

fn set(
    slot: &mut Option<(Constraint, &'static str)>,
    c: Constraint,
    field: &'static str,
) -> Result<(), ParamError> {
    if let Some((_, other)) = slot {
        return Err(unsupported(
            field,
            format!("give one output constraint per request ({other} is given too)"),
        ));
    }
    *slot = Some((c, field));
    Ok(())
}

/// The extension fields both APIs take: `grammar`, `regex`, `choice`.
fn extensions(v: &Value, slot: &mut Option<(Constraint, &'static str)>) -> Result<(), ParamError> {
    if let Some(g) = v.get("grammar").filter(|g| !g.is_null()) {
        let text = g
            .as_str()
            .ok_or_else(|| unsupported("grammar", "must be a string (GBNF or Lark)"))?;
        set(slot, Constraint::grammar(text, None), "grammar")?;
    }
    if let Some(r) = v.get("regex").filter(|r| !r.is_null()) {
        let rx = r
            .as_str()
            .ok_or_else(|| unsupported("regex", "must be a string"))?;
        set(slot, Constraint::Regex(rx.to_string()), "regex")?;
    }
    if let Some(c) = v.get("choice").filter(|c| !c.is_null()) {
        let list: Option<Vec<String>> = c
            .as_array()
            .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_string)).collect());
        let list = list.ok_or_else(|| unsupported("choice", "must be a list of strings"))?;
        set(slot, Constraint::Choice(list), "choice")?;
    }
    Ok(())
}

fn tools_of(v: &Value) -> Result<Vec<Tool>, ParamError> {
    let Some(list) = v.get("tools").filter(|t| !t.is_null()) else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| unsupported("tools", "must be a list of tools"))?;
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            Tool::from_openai(t).map_err(|e| unsupported(format!("tools[{i}]"), e.to_string()))
        })
        .collect()
}

/// Reads `response_format`, the extensions, `tools` and `tool_choice` of an OpenAI body.
pub fn openai(v: &Value) -> Result<Structured, ParamError> {
    let mut constraint = None;
    if let Some(rf) = v.get("response_format").filter(|r| !r.is_null()) {
        let kind = rf.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => {}
            "json_object" => set(&mut constraint, Constraint::JsonObject, "response_format")?,
            "json_schema" => {
                let js = rf.get("json_schema").ok_or(ParamError::Missing {
                    field: "response_format.json_schema".into(),
                })?;
                let c = match js.get("schema") {
                    Some(s) => Constraint::JsonSchema(s.clone()),
                    None => Constraint::JsonObject,
                };
                set(&mut constraint, c, "response_format")?;
            }
            other => {
                return Err(unsupported(
                    "response_format.type",
                    format!("use text, json_object or json_schema, got {other:?}"),
                ));
            }
        }
    }
    extensions(v, &mut constraint)?;
    let tools = tools_of(v)?;
    let tool_choice = match v.get("tool_choice").filter(|c| !c.is_null()) {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(unsupported(
                    "tool_choice",
                    format!("use auto, none, required or a function, got {other:?}"),
                ));
            }
        },
        Some(obj) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    unsupported(
                        "tool_choice",
                        "a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            ToolChoice::Function(name.to_string())
        }
    };
    Ok(Structured {
        constraint,
        tools,
        tool_choice,
        parallel_calls: v
            .get("parallel_tool_calls")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// Reads `format`, the extensions and `tools` of an Ollama body.
pub fn ollama(v: &Value) -> Result<Structured, ParamError> {
    let mut constraint = None;
    match v.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            set(&mut constraint, Constraint::JsonObject, "format")?
        }
        Some(s @ Value::Object(_)) => {
            set(&mut constraint, Constraint::JsonSchema(s.clone()), "format")?
        }
        Some(other) => {
            return Err(unsupported(
                "format",
                format!("use \"json\" or a JSON schema, got {other}"),
            ));
        }
    }
    extensions(v, &mut constraint)?;
    Ok(Structured {
        constraint,
        tools: tools_of(v)?,
        tool_choice: ToolChoice::Auto,
        parallel_calls: false,
    })
}

/// A request's processors (the constraint, compiled) and its tools (when the model is shown
/// any).
pub struct Prepared {
    pub processors: Option<ProcessorFactory>,
    pub tools: Option<Arc<ToolSet>>,
}

fn compiler(loaded: &Loaded, field: &str) -> Result<GrammarCompiler, ParamError> {
    if let Some(c) = loaded.grammar.get() {
        return Ok(c.clone());
    }
    let c =
        GrammarCompiler::for_model(&loaded.model).map_err(|e| unsupported(field, e.to_string()))?;
    Ok(loaded.grammar.get_or_init(|| c).clone())
}

/// How `loaded` writes tool calls (from its chat template).
pub fn tool_format(loaded: &Loaded) -> ToolFormat {
    ToolFormat::detect(loaded.model.tokenizer.chat_template().unwrap_or_default())
}

/// Compiles `s` for `loaded` (blocking: indexing a vocabulary the first time and compiling
/// a grammar take milliseconds to a second; call it off the async workers). Any error is a
/// 400 naming the field, and nothing is generated.
pub fn prepare(loaded: &Loaded, s: &Structured) -> Result<Prepared, ParamError> {
    let choice_forces = matches!(
        s.tool_choice,
        ToolChoice::Required | ToolChoice::Function(_)
    );
    if choice_forces && s.tools.is_empty() {
        return Err(unsupported(
            "tool_choice",
            GrammarError::NoTools.to_string(),
        ));
    }
    let tools = if s.tools.is_empty() || s.tool_choice == ToolChoice::None {
        None
    } else {
        let set = ToolSet::new(s.tools.clone(), tool_format(loaded))
            .map_err(|e| unsupported("tools", e.to_string()))?
            .with_parallel_calls(s.parallel_calls);
        Some(Arc::new(set))
    };
    let mut processors = None;
    if let Some(set) = &tools
        && choice_forces
    {
        if let Some((_, field)) = &s.constraint {
            return Err(unsupported(
                *field,
                "an output constraint cannot be combined with a required tool call",
            ));
        }
        let c = compiler(loaded, "tools")?;
        let g = set.compile(&c, &s.tool_choice).map_err(|e| match e {
            GrammarError::UnknownTool(_) => unsupported("tool_choice", e.to_string()),
            e => unsupported("tools", e.to_string()),
        })?;
        processors = g.map(|g| g.factory());
    } else if let Some((constraint, field)) = &s.constraint {
        let c = compiler(loaded, field)?;
        let g = c
            .compile(constraint)
            .map_err(|e| unsupported(*field, e.to_string()))?;
        processors = Some(g.factory());
    }
    Ok(Prepared { processors, tools })
}

/// [`prepare`] on a blocking thread.
pub async fn prepare_async(
    loaded: Arc<Loaded>,
    s: Structured,
) -> Result<Prepared, crate::error::ServerError> {
    if s.constraint.is_none() && s.tools.is_empty() && s.tool_choice == ToolChoice::Auto {
        return Ok(Prepared {
            processors: None,
            tools: None,
        });
    }
    tokio::task::spawn_blocking(move || prepare(&loaded, &s))
        .await
        .map_err(|e| crate::error::ServerError::Generation(e.to_string()))?
        .map_err(Into::into)
}

/// The prompt of `messages`, with the tools given to the chat template when there are any.
pub fn chat_prompt(
    loaded: &Loaded,
    messages: &[ChatMessage],
    tools: Option<&ToolSet>,
) -> Result<Vec<u32>, ParamError> {
    let defs = tools.map(ToolSet::template_tools);
    loaded
        .model
        .chat_prompt_with_tools(messages, defs.as_deref())
        .map_err(|e| unsupported("messages", e.to_string()))
}

/// A call an assistant turn made, as a chat template reads it. `arguments` may be a JSON
/// string (OpenAI) or an object (Ollama).
pub fn history_call(v: &Value, field: &str) -> Result<ToolCall, ParamError> {
    ToolCall::from_openai(v).map_err(|e| match e {
        ToolCallError::MissingName => ParamError::Missing {
            field: format!("{field}.function.name"),
        },
        ToolCallError::ArgumentsNotJson(e) => unsupported(
            format!("{field}.function.arguments"),
            format!("not JSON: {e}"),
        ),
    })
}

/// A fresh tool-call id (`call_` and 24 hex digits).
pub fn call_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    let a = RandomState::new().hash_one(std::time::Instant::now());
    let b = RandomState::new().hash_one(a);
    format!("call_{a:016x}{:08x}", b as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(e: ParamError) -> String {
        e.field().to_string()
    }

    #[test]
    fn openai_fields() {
        let s = openai(&json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "strict": true, "schema": {"type": "object"}}}}))
        .unwrap();
        assert_eq!(
            s.constraint,
            Some((
                Constraint::JsonSchema(json!({"type": "object"})),
                "response_format"
            ))
        );
        let s = openai(&json!({"response_format": {"type": "json_object"}})).unwrap();
        assert_eq!(
            s.constraint,
            Some((Constraint::JsonObject, "response_format"))
        );
        assert_eq!(
            openai(&json!({"response_format": {"type": "text"}}))
                .unwrap()
                .constraint,
            None
        );
        let s = openai(&json!({"choice": ["yes", "no"]})).unwrap();
        assert_eq!(s.constraint.unwrap().1, "choice");
        let s = openai(&json!({"grammar": "root ::= \"a\""})).unwrap();
        assert!(matches!(
            s.constraint,
            Some((Constraint::Gbnf(_), "grammar"))
        ));
        let s = openai(
            &json!({"tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        )
        .unwrap();
        assert_eq!(s.tool_choice, ToolChoice::Function("f".into()));
        assert_eq!(
            openai(&json!({"tool_choice": "required"}))
                .unwrap()
                .tool_choice,
            ToolChoice::Required
        );
        // Errors name the field.
        assert_eq!(
            field(openai(&json!({"response_format": {"type": "xml"}})).unwrap_err()),
            "response_format.type"
        );
        assert_eq!(
            field(openai(&json!({"response_format": {"type": "json_schema"}})).unwrap_err()),
            "response_format.json_schema"
        );
        assert_eq!(
            field(openai(&json!({"regex": "a", "choice": ["a"]})).unwrap_err()),
            "choice"
        );
        assert_eq!(field(openai(&json!({"regex": 3})).unwrap_err()), "regex");
        assert_eq!(
            field(openai(&json!({"tools": [{"type": "function", "function": {}}]})).unwrap_err()),
            "tools[0]"
        );
        assert_eq!(
            field(openai(&json!({"tool_choice": "always"})).unwrap_err()),
            "tool_choice"
        );
    }

    #[test]
    fn ollama_fields() {
        assert_eq!(
            ollama(&json!({"format": "json"})).unwrap().constraint,
            Some((Constraint::JsonObject, "format"))
        );
        let s = ollama(&json!({"format": {"type": "object"}})).unwrap();
        assert!(matches!(
            s.constraint,
            Some((Constraint::JsonSchema(_), "format"))
        ));
        assert_eq!(ollama(&json!({"format": ""})).unwrap().constraint, None);
        assert_eq!(
            field(ollama(&json!({"format": "yaml"})).unwrap_err()),
            "format"
        );
        assert_eq!(
            field(ollama(&json!({"format": "json", "regex": "a"})).unwrap_err()),
            "regex"
        );
    }

    #[test]
    fn history_calls() {
        let c = history_call(&json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}), "m").unwrap();
        assert_eq!(c.function.arguments, json!({"a": 1}));
        assert_eq!(c.id.as_deref(), Some("c1"));
        let c = history_call(
            &json!({"function": {"name": "f", "arguments": {"a": 1}}}),
            "m",
        )
        .unwrap();
        assert_eq!(c.function.arguments, json!({"a": 1}));
        assert!(history_call(&json!({"function": {"name": "f", "arguments": "{"}}), "m").is_err());
        assert!(call_id().starts_with("call_"));
    }
}
