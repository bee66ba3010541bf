//! Structured output and tool calls for `mica.Model.create_chat_completion`, on the
//! facade's grammar engine (`mica::grammar`, llguidance) as `mica serve` uses it:
//!
//! - an output constraint (`response_format` `json_object` / `json_schema`, or mica's
//!   `grammar`, `regex`, `choice`) compiled for the model before anything is generated —
//!   an invalid or unsupported one raises `InvalidParameter` naming the argument, never
//!   unconstrained output;
//! - tools (OpenAI's `{"type": "function", "function": {...}}` objects), given to the chat
//!   template's `tools` variable, with `tool_choice` `required` or a named function
//!   forcing valid calls by grammar; the output parsed back into calls whose arguments
//!   validate against the tool's schema ([`NativeStructured::parse`], or streamed through
//!   [`NativeToolStream`]).
//!
//! [`NativeStructured`] holds one request's compiled constraint and tool set; the Python
//! side passes it to `NativeModel.submit` and `NativeModel.chat_prompt`.

use crate::errors::{IntoPyResult, internal, raise};
use mica::Model;
use mica::grammar::tools::{Tool, ToolChoice, ToolSet, ToolStream};
use mica::grammar::{CompiledGrammar, Constraint, GrammarError};
use mica::models::chat::{ChatMessage, ToolCall};
use pyo3::prelude::*;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// `InvalidParameter` naming the argument at fault.
fn invalid(param: &str, message: impl Into<String>) -> PyErr {
    raise(
        "InvalidParameter",
        message.into(),
        &[("param", Some(param.to_string()))],
    )
}

fn json(param: &str, text: &str) -> PyResult<Value> {
    serde_json::from_str(text).map_err(|e| invalid(param, format!("{param} is not JSON: {e}")))
}

/// The output constraint of `kind` (`json_object`, `json_schema`, `grammar`, `regex`,
/// `choice`) with its text (a schema or a choice list as JSON).
fn constraint(kind: &str, text: &str) -> PyResult<Constraint> {
    Ok(match kind {
        "json_object" => Constraint::JsonObject,
        "json_schema" => Constraint::JsonSchema(json("response_format", text)?),
        "regex" => Constraint::Regex(text.to_string()),
        "grammar" => Constraint::grammar(text, None),
        "choice" => {
            let v = json("choice", text)?;
            let items = v
                .as_array()
                .ok_or_else(|| invalid("choice", "choice must be a list of strings"))?;
            let strings: Option<Vec<String>> = items
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect();
            Constraint::Choice(
                strings.ok_or_else(|| invalid("choice", "choice must be a list of strings"))?,
            )
        }
        other => {
            return Err(invalid(
                "response_format",
                format!("unknown constraint {other:?}"),
            ));
        }
    })
}

/// The argument a constraint came from, for errors.
fn constraint_param(kind: &str) -> &'static str {
    match kind {
        "grammar" => "grammar",
        "regex" => "regex",
        "choice" => "choice",
        _ => "response_format",
    }
}

/// OpenAI's `tool_choice`: `"auto"`, `"none"`, `"required"` or
/// `{"type": "function", "function": {"name": ...}}`.
fn tool_choice(v: &Value) -> PyResult<ToolChoice> {
    match v {
        Value::Null => Ok(ToolChoice::Auto),
        Value::String(s) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(invalid(
                "tool_choice",
                format!("tool_choice must be auto, none, required or a function, not {other:?}"),
            )),
        },
        Value::Object(_) => v
            .pointer("/function/name")
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Function(n.to_string()))
            .ok_or_else(|| {
                invalid(
                    "tool_choice",
                    "a tool_choice object is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )
            }),
        _ => Err(invalid("tool_choice", "tool_choice must be a string or an object")),
    }
}

/// One request's compiled output constraint and tool set.
#[pyclass(module = "mica._mica", frozen)]
pub struct NativeStructured {
    pub(crate) grammar: Option<CompiledGrammar>,
    tools: Option<Arc<ToolSet>>,
}

impl NativeStructured {
    /// Checks and compiles a request's constraint and tools for `model` (the rules of
    /// `mica serve`: one constraint per request, none beside a forced call; `tool_choice`
    /// `none` hides the tools from the model).
    pub fn prepare(
        model: &Model,
        constraint_spec: Option<(String, String)>,
        tools_json: Option<String>,
        tool_choice_json: Option<String>,
        parallel: bool,
    ) -> PyResult<NativeStructured> {
        let choice = match &tool_choice_json {
            Some(t) => tool_choice(&json("tool_choice", t)?)?,
            None => ToolChoice::Auto,
        };
        let tools: Vec<Tool> = match &tools_json {
            Some(t) => {
                let v = json("tools", t)?;
                let list = v
                    .as_array()
                    .ok_or_else(|| invalid("tools", "tools must be a list"))?;
                list.iter()
                    .map(|t| Tool::from_openai(t).map_err(|e| invalid("tools", e.to_string())))
                    .collect::<PyResult<_>>()?
            }
            None => Vec::new(),
        };
        let forces = matches!(choice, ToolChoice::Required | ToolChoice::Function(_));
        if forces && tools.is_empty() {
            return Err(invalid("tool_choice", GrammarError::NoTools.to_string()));
        }
        let set = if tools.is_empty() || choice == ToolChoice::None {
            None
        } else {
            let set = ToolSet::new(tools, model.tool_format())
                .map_err(|e| invalid("tools", e.to_string()))?
                .with_parallel_calls(parallel);
            Some(Arc::new(set))
        };
        let grammar = match (&set, constraint_spec) {
            (Some(set), spec) if forces => {
                if let Some((kind, _)) = spec {
                    return Err(invalid(
                        constraint_param(&kind),
                        "an output constraint cannot be combined with a required tool call",
                    ));
                }
                let compiler = model.grammar_compiler().py_err()?;
                set.compile(&compiler, &choice).map_err(|e| match e {
                    GrammarError::UnknownTool(_) => invalid("tool_choice", e.to_string()),
                    e => invalid("tools", e.to_string()),
                })?
            }
            (_, Some((kind, text))) => {
                let c = constraint(&kind, &text)?;
                Some(
                    model
                        .compile(&c)
                        .map_err(|e| invalid(constraint_param(&kind), e.to_string()))?,
                )
            }
            (_, None) => None,
        };
        Ok(NativeStructured {
            grammar,
            tools: set,
        })
    }

    /// The tool definitions for the chat template (`None` without tools).
    pub fn template_tools(&self) -> Option<Vec<Value>> {
        self.tools.as_ref().map(|t| t.template_tools())
    }
}

/// Calls as `(name, arguments as a JSON string)` pairs.
fn calls(parsed: Vec<mica::grammar::tools::ToolCall>) -> Vec<(String, String)> {
    parsed
        .into_iter()
        .map(|c| (c.name, c.arguments.to_string()))
        .collect()
}

#[pymethods]
impl NativeStructured {
    /// Whether the request has tools the model sees.
    #[getter]
    fn has_tools(&self) -> bool {
        self.tools.is_some()
    }

    /// Generated text split into content and calls `[(name, arguments_json)]`: the calls
    /// whose arguments validate against their tool's schema; without tools, or when a
    /// call-shaped part does not validate, everything is content.
    fn parse(&self, text: &str) -> (String, Vec<(String, String)>) {
        match &self.tools {
            Some(set) => {
                let p = set.parse(text);
                (p.content, calls(p.calls))
            }
            None => (text.to_string(), Vec::new()),
        }
    }

    /// A streaming parser of one completion's text (requires tools).
    fn stream(&self) -> PyResult<NativeToolStream> {
        let set = self
            .tools
            .clone()
            .ok_or_else(|| internal("a tool stream needs tools"))?;
        Ok(NativeToolStream {
            state: Mutex::new(Some(set.stream())),
            set,
        })
    }
}

/// Splits streamed text into content (returned as it becomes certain not to be part of a
/// call) and the calls found at the end.
#[pyclass(module = "mica._mica", frozen)]
pub struct NativeToolStream {
    state: Mutex<Option<ToolStream>>,
    set: Arc<ToolSet>,
}

#[pymethods]
impl NativeToolStream {
    /// Feeds generated text; returns the content that can be shown now.
    fn push(&self, text: &str) -> PyResult<String> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| internal("tool stream lock poisoned"))?;
        let s = s
            .as_mut()
            .ok_or_else(|| internal("the tool stream is finished"))?;
        Ok(s.push(text))
    }

    /// Ends the stream: the rest of the content and the calls `[(name, arguments_json)]`.
    fn finish(&self) -> PyResult<(String, Vec<(String, String)>)> {
        let s = self
            .state
            .lock()
            .map_err(|_| internal("tool stream lock poisoned"))?
            .take()
            .ok_or_else(|| internal("the tool stream is finished"))?;
        let p = s.finish(&self.set);
        Ok((p.content, calls(p.calls)))
    }
}

/// A conversation from its JSON form (a list of OpenAI messages whose content is text):
/// `role`, `content`, and `tool_calls` on an assistant turn (arguments a JSON string or
/// an object), `tool_call_id` and `name` on a `tool` turn.
pub fn messages(json_text: &str) -> PyResult<Vec<ChatMessage>> {
    let v = json("messages", json_text)?;
    let list = v
        .as_array()
        .ok_or_else(|| invalid("messages", "messages must be a list"))?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let field = format!("messages[{i}]");
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("messages", format!("{field} has no role")))?;
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(_) => {
                    return Err(invalid("messages", format!("{field}.content must be text")));
                }
            };
            let mut msg = ChatMessage::new(role, content);
            if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
                msg.tool_calls = calls
                    .iter()
                    .map(|c| history_call(c, &field))
                    .collect::<PyResult<_>>()?;
            }
            msg.tool_call_id = m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .map(str::to_string);
            msg.name = m.get("name").and_then(Value::as_str).map(str::to_string);
            Ok(msg)
        })
        .collect()
}

/// A call an assistant turn made, as the chat template reads it.
fn history_call(v: &Value, field: &str) -> PyResult<ToolCall> {
    ToolCall::from_openai(v).map_err(|e| invalid("messages", format!("{field}.tool_calls: {e}")))
}
