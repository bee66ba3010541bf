//! Tool calling, independent of any HTTP API (the OpenAI and Ollama routes use it, and so
//! can an Anthropic one): tool definitions in, calls out.
//!
//! 1. **Into the prompt**: a [`ToolSet`] holds the tools (name, description, JSON Schema
//!    of the parameters) and hands them to the model's own chat template as its `tools`
//!    variable ([`ToolSet::template_tools`]: OpenAI's `{"type": "function", "function":
//!    {...}}` shape, which the Qwen2.5, Llama 3.x and Hermes templates read).
//! 2. **Out of the output**: [`ToolSet::parse`] finds the calls in the generated text in the
//!    model family's format ([`ToolFormat`], detected from the template) and keeps those whose
//!    arguments validate against the function's parameter schema; text that is not a valid
//!    call stays content. [`ToolStream`] does the same incrementally, holding back only text
//!    that may be the start of a call, so a server can stream content and then the calls.
//! 3. **Forced calls**: when the caller requires a call (`tool_choice` `required`, or a
//!    named function), [`ToolSet::constraint`] builds an llguidance grammar from the tools'
//!    schemas in the family's format, so the output always parses into calls whose
//!    arguments validate. `auto` leaves the choice to the model; `none` renders no tools.

mod format;
mod stream;

pub use format::{ToolFormat, parse_calls};
pub use stream::ToolStream;

use crate::compiler::{CompiledGrammar, GrammarCompiler};
use crate::constraint::{ConstraintKind, json_layout};
use crate::error::{GrammarError, Result};
use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments object (`{}` when the function takes anything).
    pub parameters: Value,
}

impl Tool {
    /// A tool from OpenAI's `{"type": "function", "function": {name, description,
    /// parameters}}` (or the bare function object).
    pub fn from_openai(v: &Value) -> Result<Tool> {
        let f = v.get("function").unwrap_or(v);
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| GrammarError::Tool {
                name: String::new(),
                message: "a tool needs a function name".into(),
            })?
            .to_string();
        if let Some(t) = v.get("type").and_then(Value::as_str)
            && t != "function"
        {
            return Err(GrammarError::Tool {
                name,
                message: format!("unsupported tool type {t:?} (only \"function\")"),
            });
        }
        let parameters = f.get("parameters").cloned().unwrap_or_else(|| json!({}));
        Ok(Tool {
            description: f
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            name,
            parameters,
        })
    }

    /// OpenAI's shape, as chat templates read it.
    pub fn to_openai(&self) -> Value {
        let mut f = serde_json::Map::new();
        f.insert("name".into(), Value::from(self.name.as_str()));
        if let Some(d) = &self.description {
            f.insert("description".into(), Value::from(d.as_str()));
        }
        f.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": f})
    }
}

/// Whether and which tool the model must call.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// No call: the tools are not even shown to the model.
    None,
    /// The model decides.
    #[default]
    Auto,
    /// At least one call, to any of the tools.
    Required,
    /// A call to this function.
    Function(String),
}

/// A call found in (or forced on) the output.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object.
    pub arguments: Value,
}

/// Generated text split into content and tool calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedOutput {
    /// Text that is not a call (trimmed when calls were found).
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// The tools of one request, with their argument validators.
pub struct ToolSet {
    tools: Vec<Tool>,
    validators: Vec<jsonschema::Validator>,
    format: ToolFormat,
    /// Forced calls may be several in a row (OpenAI's `parallel_tool_calls`).
    parallel: bool,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSet")
            .field("tools", &self.tools)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl ToolSet {
    /// Checks the tools (unique names, parameters that are a JSON Schema) for a model whose
    /// calls come in `format`.
    pub fn new(tools: Vec<Tool>, format: ToolFormat) -> Result<ToolSet> {
        let mut validators = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            if tools[..i].iter().any(|u| u.name == t.name) {
                return Err(GrammarError::Tool {
                    name: t.name.clone(),
                    message: "two tools have this name".into(),
                });
            }
            let v = jsonschema::validator_for(&t.parameters).map_err(|e| GrammarError::Tool {
                name: t.name.clone(),
                message: format!("the parameters are not a valid JSON Schema: {e}"),
            })?;
            validators.push(v);
        }
        Ok(ToolSet {
            tools,
            validators,
            format,
            parallel: false,
        })
    }

    /// Whether a forced call may be followed by more (default: exactly one call, as
    /// llama.cpp's server does unless asked; OpenAI's `parallel_tool_calls: true` allows
    /// several).
    pub fn with_parallel_calls(mut self, parallel: bool) -> ToolSet {
        self.parallel = parallel;
        self
    }

    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    pub fn format(&self) -> ToolFormat {
        self.format
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The template's `tools` variable (OpenAI's shape).
    pub fn template_tools(&self) -> Vec<Value> {
        self.tools.iter().map(Tool::to_openai).collect()
    }

    /// Whether `call` names one of the tools with arguments valid under its schema; the
    /// reason when not.
    pub fn validate(&self, call: &ToolCall) -> std::result::Result<(), String> {
        let Some(i) = self.tools.iter().position(|t| t.name == call.name) else {
            return Err(format!("no tool is named {:?}", call.name));
        };
        self.validators[i]
            .validate(&call.arguments)
            .map_err(|e| format!("arguments of {:?}: {e}", call.name))
    }

    /// The calls in `text` (in this set's format) whose arguments validate; everything else
    /// is content. When a call-shaped part does not validate, the whole text is content.
    pub fn parse(&self, text: &str) -> ParsedOutput {
        let parsed = parse_calls(self.format, text);
        if parsed.calls.iter().all(|c| self.validate(c).is_ok()) {
            parsed
        } else {
            ParsedOutput {
                content: text.to_string(),
                calls: Vec::new(),
            }
        }
    }

    /// A streaming parser of output in this set's format.
    pub fn stream(&self) -> ToolStream {
        ToolStream::new(self.format)
    }

    /// The grammar that forces `choice` (`None` for `auto` and `none`: nothing is forced).
    /// Errors name the tool whose schema cannot be compiled, or a `choice` naming no tool.
    pub fn constraint(&self, choice: &ToolChoice) -> Result<Option<TopLevelGrammar>> {
        let tools: Vec<&Tool> = match choice {
            ToolChoice::None | ToolChoice::Auto => return Ok(None),
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Function(name) => {
                let t = self
                    .tools
                    .iter()
                    .find(|t| &t.name == name)
                    .ok_or_else(|| GrammarError::UnknownTool(name.clone()))?;
                vec![t]
            }
        };
        if tools.is_empty() {
            return Err(GrammarError::NoTools);
        }
        Ok(Some(self.format.call_grammar(&tools, false, self.parallel)))
    }

    /// [`ToolSet::constraint`], compiled for a model.
    pub fn compile(
        &self,
        compiler: &GrammarCompiler,
        choice: &ToolChoice,
    ) -> Result<Option<CompiledGrammar>> {
        let Some(g) = self.constraint(choice)? else {
            return Ok(None);
        };
        let special = self.format == ToolFormat::Hermes
            && compiler.has_special_token(format::HERMES_OPEN)
            && compiler.has_special_token(format::HERMES_CLOSE);
        let g = if special {
            let tools: Vec<&Tool> = match choice {
                ToolChoice::Function(name) => {
                    self.tools.iter().filter(|t| &t.name == name).collect()
                }
                _ => self.tools.iter().collect(),
            };
            self.format.call_grammar(&tools, true, self.parallel)
        } else {
            g
        };
        compiler.compile_grammar(g, ConstraintKind::Tools).map(Some)
    }
}

/// The schema of one call object: `{"name": <const>, <args_key>: <parameters>}`, in that
/// order, nothing else.
pub(crate) fn call_schema(tool: &Tool, args_key: &str) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("name".into(), json!({"const": tool.name}));
    props.insert(args_key.into(), tool.parameters.clone());
    json!({
        "type": "object",
        "properties": props,
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// The schema of a call to any of `tools`, with mica's JSON layout.
pub(crate) fn calls_schema(tools: &[&Tool], args_key: &str) -> Value {
    let alts: Vec<Value> = tools.iter().map(|t| call_schema(t, args_key)).collect();
    let mut s = if alts.len() == 1 {
        alts.into_iter().next().unwrap_or_default()
    } else {
        json!({ "anyOf": alts })
    };
    if let Some(o) = s.as_object_mut() {
        o.insert("x-guidance".into(), json_layout());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool::from_openai(&json!({"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}))
        .unwrap()
    }

    #[test]
    fn tools_round_trip_and_validate() {
        let t = weather();
        assert_eq!(t.to_openai()["function"]["name"], "get_weather");
        let set = ToolSet::new(vec![t], ToolFormat::Hermes).unwrap();
        let ok = ToolCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}),
        };
        assert!(set.validate(&ok).is_ok());
        let bad = ToolCall {
            name: "get_weather".into(),
            arguments: json!({"unit": "k"}),
        };
        assert!(set.validate(&bad).is_err());
        let unknown = ToolCall {
            name: "x".into(),
            arguments: json!({}),
        };
        assert!(set.validate(&unknown).unwrap_err().contains("no tool"));
    }

    #[test]
    fn bad_definitions_are_errors() {
        assert!(Tool::from_openai(&json!({"type": "function", "function": {}})).is_err());
        assert!(
            Tool::from_openai(&json!({"type": "retrieval", "function": {"name": "x"}})).is_err()
        );
        let t = Tool {
            name: "x".into(),
            description: None,
            parameters: json!({"type": 12}),
        };
        assert!(ToolSet::new(vec![t], ToolFormat::Json).is_err());
        let set = ToolSet::new(vec![weather(), weather()], ToolFormat::Json);
        assert!(set.is_err());
        let set = ToolSet::new(vec![weather()], ToolFormat::Json).unwrap();
        assert_eq!(
            set.constraint(&ToolChoice::Function("nope".into()))
                .unwrap_err(),
            GrammarError::UnknownTool("nope".into())
        );
        assert!(set.constraint(&ToolChoice::Auto).unwrap().is_none());
        let empty = ToolSet::new(vec![], ToolFormat::Json).unwrap();
        assert_eq!(
            empty.constraint(&ToolChoice::Required).unwrap_err(),
            GrammarError::NoTools
        );
    }

    #[test]
    fn invalid_calls_stay_content() {
        let set = ToolSet::new(vec![weather()], ToolFormat::Hermes).unwrap();
        let good = set.parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
        assert_eq!(good.calls.len(), 1);
        let text =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": 3}}\n</tool_call>";
        let bad = set.parse(text);
        assert!(bad.calls.is_empty());
        assert_eq!(bad.content, text);
    }
}
