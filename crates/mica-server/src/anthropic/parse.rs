//! Reading and validating Anthropic request bodies, with no model and no socket involved:
//! [`parse_messages`] and [`parse_count_tokens`] turn bytes into a checked request or a 400
//! naming the field. The conversation becomes the chat template's messages: `system` a
//! system turn; text blocks joined (a blank line between blocks); an assistant's `tool_use`
//! blocks its `tool_calls`; each `tool_result` block a `tool` turn carrying the call's id
//! and tool name, as the OpenAI route's `tool` messages are rendered. `output_config.format`
//! (a JSON schema) is an output constraint, enforced as the OpenAI route's `json_schema`.

use super::types::{BlockIn, MessagesFields, TextOrBlocks, ToolChoiceIn};
use crate::error::{ParamError, ServerError, from_value, parse_body};
use crate::openai::Generation;
use crate::params::{
    MAX_STOP, OPENAI_DEFAULTS, SamplingFields, validate_max_tokens, validate_role,
    validate_sampling,
};
use crate::spec::{SpecFields, validate_spec};
use crate::structured::Structured;
use mica::grammar::Constraint;
use mica::grammar::tools::{Tool, ToolChoice};
use mica::models::chat::{ChatMessage, FunctionCall, ToolCall};
use std::collections::HashMap;

/// The roles of Anthropic's API (the system prompt is a field of its own).
pub const ANTHROPIC_ROLES: &[&str] = &["user", "assistant"];

/// What goes between two text blocks of one turn.
const BLOCK_SEPARATOR: &str = "\n\n";

/// A checked `/v1/messages` or `/v1/messages/count_tokens` request.
#[derive(Clone, Debug)]
pub struct MessagesRequest {
    /// Sampling, the token budget, streaming, the lane and speculative decoding (`n` is 1).
    pub job: Generation,
    /// The system prompt first (when given), then the conversation.
    pub messages: Vec<ChatMessage>,
    /// `tools`, `tool_choice` and the `output_config.format` constraint.
    pub structured: Structured,
}

/// Reads and checks a `/v1/messages` body (`max_tokens` required).
pub fn parse_messages(body: &[u8]) -> Result<MessagesRequest, ServerError> {
    parse(body, true)
}

/// Reads and checks a `/v1/messages/count_tokens` body: the fields of `/v1/messages`, without
/// `max_tokens`.
pub fn parse_count_tokens(body: &[u8]) -> Result<MessagesRequest, ServerError> {
    parse(body, false)
}

fn unsupported(field: impl Into<String>, message: impl Into<String>) -> ParamError {
    ParamError::Unsupported {
        field: field.into(),
        message: message.into(),
    }
}

fn parse(body: &[u8], needs_max_tokens: bool) -> Result<MessagesRequest, ServerError> {
    let v = parse_body(body)?;
    let f: MessagesFields = from_value(&v)?;
    let max_tokens = match f.max_tokens {
        Some(m) => Some((validate_max_tokens("max_tokens", m)?, "max_tokens")),
        None if needs_max_tokens => {
            return Err(ParamError::Missing {
                field: "max_tokens".into(),
            }
            .into());
        }
        None => None,
    };
    let stop = f.stop_sequences.clone().unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(ParamError::TooMany {
            field: "stop_sequences".into(),
            max: MAX_STOP,
            got: stop.len(),
        }
        .into());
    }
    if let Some(i) = stop.iter().position(String::is_empty) {
        return Err(ParamError::Empty {
            field: format!("stop_sequences[{i}]"),
        }
        .into());
    }
    let sampling = validate_sampling(
        &SamplingFields {
            temperature: f.temperature,
            top_p: f.top_p,
            top_k: f.top_k,
            seed: f.seed,
            stop: Some(stop),
            ..SamplingFields::default()
        },
        "",
        &OPENAI_DEFAULTS,
    )?;
    let job = Generation {
        model: f.model.clone(),
        sampling,
        max_tokens,
        n: 1,
        stream: f.stream,
        include_usage: false,
        priority: f.priority.clone(),
        spec: validate_spec(
            &SpecFields {
                spec: f.spec.clone(),
                spec_max: f.spec_max,
            },
            "",
        )?,
        lora: crate::lora::parse_refs(f.lora.as_ref(), "lora")?,
    };
    Ok(MessagesRequest {
        job,
        messages: conversation(&f)?,
        structured: tools(&f)?,
    })
}

/// The text of `content`: a string, or text blocks joined. `field` names it in errors.
fn text_of(content: &TextOrBlocks, field: &str) -> Result<String, ParamError> {
    match content {
        TextOrBlocks::Text(s) => Ok(s.clone()),
        TextOrBlocks::Blocks(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let at = format!("{field}[{j}]");
                match b.kind.as_str() {
                    "text" => parts.push(block_text(b, &at)?),
                    other => return Err(refused(other, &at)),
                }
            }
            Ok(parts.join(BLOCK_SEPARATOR))
        }
    }
}

fn block_text(b: &BlockIn, at: &str) -> Result<String, ParamError> {
    b.text.clone().ok_or_else(|| ParamError::Missing {
        field: format!("{at}.text"),
    })
}

/// The 400 for a block type the server does not take at `at`.
fn refused(kind: &str, at: &str) -> ParamError {
    let message = match kind {
        "image" | "document" => {
            format!("{kind} blocks are not supported: mica serves text-only models; send text")
        }
        _ => format!("content blocks of type {kind:?} are not supported here"),
    };
    unsupported(format!("{at}.type"), message)
}

/// A turn's text so far, as a message (or nothing when it is empty).
fn flush(out: &mut Vec<ChatMessage>, turn: &mut ChatMessage, parts: &mut Vec<String>) {
    turn.content = parts.join(BLOCK_SEPARATOR);
    parts.clear();
    if !turn.content.is_empty() || !turn.tool_calls.is_empty() {
        let role = turn.role.clone();
        out.push(std::mem::replace(turn, ChatMessage::new(role, "")));
    }
}

/// The system prompt and the messages, as the chat template reads them.
fn conversation(f: &MessagesFields) -> Result<Vec<ChatMessage>, ParamError> {
    let mut out = Vec::with_capacity(f.messages.len() + 1);
    if let Some(system) = &f.system {
        let text = text_of(system, "system")?;
        if !text.is_empty() {
            out.push(ChatMessage::new("system", text));
        }
    }
    if f.messages.is_empty() {
        return Err(ParamError::Empty {
            field: "messages".into(),
        });
    }
    // Tool names by call id, for the `tool` turns that answer them.
    let mut names: HashMap<String, String> = HashMap::new();
    for (i, m) in f.messages.iter().enumerate() {
        let role = validate_role(&m.role, format!("messages[{i}].role"), ANTHROPIC_ROLES)?;
        let blocks = match &m.content {
            TextOrBlocks::Text(s) => {
                out.push(ChatMessage::new(role, s.clone()));
                continue;
            }
            TextOrBlocks::Blocks(b) => b,
        };
        let before = out.len();
        let mut turn = ChatMessage::new(role.clone(), "");
        let mut parts = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("messages[{i}].content[{j}]");
            match (b.kind.as_str(), role.as_str()) {
                ("text", _) => parts.push(block_text(b, &at)?),
                ("tool_use", "assistant") => {
                    let id = b.id.clone().ok_or_else(|| ParamError::Missing {
                        field: format!("{at}.id"),
                    })?;
                    let name = b.name.clone().ok_or_else(|| ParamError::Missing {
                        field: format!("{at}.name"),
                    })?;
                    let input = match &b.input {
                        None => serde_json::Value::Object(Default::default()),
                        Some(v @ serde_json::Value::Object(_)) => v.clone(),
                        Some(_) => {
                            return Err(unsupported(
                                format!("{at}.input"),
                                "must be a JSON object (the tool's arguments)",
                            ));
                        }
                    };
                    names.insert(id.clone(), name.clone());
                    turn.tool_calls.push(ToolCall {
                        id: Some(id),
                        kind: "function".into(),
                        function: FunctionCall {
                            name,
                            arguments: input,
                        },
                    });
                }
                ("tool_result", "user") => {
                    flush(&mut out, &mut turn, &mut parts);
                    let id = b.tool_use_id.clone().ok_or_else(|| ParamError::Missing {
                        field: format!("{at}.tool_use_id"),
                    })?;
                    let content = match &b.content {
                        None => String::new(),
                        Some(c) => text_of(c, &format!("{at}.content"))?,
                    };
                    let mut msg = ChatMessage::new("tool", content);
                    msg.name = names.get(&id).cloned();
                    msg.tool_call_id = Some(id);
                    out.push(msg);
                }
                // Extended thinking is not produced; a client echoing such blocks back in
                // the history loses nothing by their absence.
                ("thinking" | "redacted_thinking", "assistant") => {}
                ("tool_use", _) | ("tool_result", _) => {
                    return Err(unsupported(
                        format!("{at}.type"),
                        format!(
                            "{} blocks belong in {} turns",
                            b.kind,
                            if b.kind == "tool_use" {
                                "assistant"
                            } else {
                                "user"
                            }
                        ),
                    ));
                }
                (other, _) => return Err(refused(other, &at)),
            }
        }
        flush(&mut out, &mut turn, &mut parts);
        if out.len() == before {
            // An empty turn stays a turn.
            out.push(ChatMessage::new(role, ""));
        }
    }
    Ok(out)
}

/// `output_config.format` as a constraint.
fn output_format(f: &MessagesFields) -> Result<Option<(Constraint, &'static str)>, ParamError> {
    let Some(format) = f.output_config.as_ref().and_then(|c| c.format.as_ref()) else {
        return Ok(None);
    };
    if format.kind != "json_schema" {
        return Err(unsupported(
            "output_config.format.type",
            format!("use json_schema, got {:?}", format.kind),
        ));
    }
    let schema = format.schema.clone().ok_or_else(|| ParamError::Missing {
        field: "output_config.format.schema".into(),
    })?;
    Ok(Some((
        Constraint::JsonSchema(schema),
        "output_config.format",
    )))
}

/// `tools`, `tool_choice` and `output_config.format` as the shared machinery takes them.
fn tools(f: &MessagesFields) -> Result<Structured, ParamError> {
    let mut tools = Vec::new();
    for (i, t) in f.tools.iter().flatten().enumerate() {
        if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
            return Err(unsupported(
                format!("tools[{i}].type"),
                format!("only client tools (type \"custom\" or none) are supported, got {kind:?}"),
            ));
        }
        if t.name.is_empty() {
            return Err(ParamError::Empty {
                field: format!("tools[{i}].name"),
            });
        }
        let schema = t.input_schema.as_ref().ok_or_else(|| ParamError::Missing {
            field: format!("tools[{i}].input_schema"),
        })?;
        if !schema.is_object() {
            return Err(unsupported(
                format!("tools[{i}].input_schema"),
                "must be a JSON Schema object",
            ));
        }
        tools.push(Tool {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: schema.clone(),
        });
    }
    Ok(Structured {
        constraint: output_format(f)?,
        tools,
        tool_choice: match &f.tool_choice {
            None => ToolChoice::Auto,
            Some(c) => tool_choice(c)?,
        },
        parallel_calls: false,
    })
}

fn tool_choice(c: &ToolChoiceIn) -> Result<ToolChoice, ParamError> {
    Ok(match c.kind.as_str() {
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        "none" => ToolChoice::None,
        "tool" => ToolChoice::Function(c.name.clone().ok_or_else(|| ParamError::Missing {
            field: "tool_choice.name".into(),
        })?),
        other => {
            return Err(unsupported(
                "tool_choice.type",
                format!("use auto, any, tool or none, got {other:?}"),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: &str) -> String {
        let e = parse_messages(body.as_bytes())
            .err()
            .unwrap_or_else(|| panic!("accepted: {body}"));
        e.param().unwrap_or("(none)").to_string()
    }

    fn with(extra: &str) -> String {
        format!(
            r#"{{"model": "m", "max_tokens": 5, "messages": [{{"role": "user", "content": "hi"}}]{extra}}}"#
        )
    }

    #[test]
    fn each_field_is_named() {
        assert_eq!(
            param(r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#),
            "max_tokens"
        );
        assert!(
            parse_count_tokens(
                br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#
            )
            .is_ok()
        );
        assert_eq!(param(&with(r#", "max_tokens": 0"#)), "max_tokens");
        assert_eq!(param(&with(r#", "temperature": 5"#)), "temperature");
        assert_eq!(
            param(&with(r#", "stop_sequences": ["a", ""]"#)),
            "stop_sequences[1]"
        );
        assert_eq!(
            param(
                r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}"#
            ),
            "messages[0].role"
        );
        assert_eq!(
            param(
                r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}"#
            ),
            "messages[0].content[1].type"
        );
        assert_eq!(
            param(
                r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]}"#
            ),
            "messages[0].content[0].content[0].type"
        );
        assert_eq!(
            param(&with(r#", "tool_choice": {"type": "tool"}"#)),
            "tool_choice.name"
        );
        assert_eq!(
            param(&with(r#", "tool_choice": {"type": "required"}"#)),
            "tool_choice.type"
        );
        assert_eq!(
            param(&with(r#", "output_config": {"format": {"type": "xml"}}"#)),
            "output_config.format.type"
        );
        assert_eq!(
            param(&with(
                r#", "output_config": {"format": {"type": "json_schema"}}"#
            )),
            "output_config.format.schema"
        );
        assert_eq!(
            param(&with(r#", "tools": [{"name": "f"}]"#)),
            "tools[0].input_schema"
        );
        assert_eq!(
            param(&with(
                r#", "tools": [{"type": "web_search_20250305", "name": "web_search"}]"#
            )),
            "tools[0].type"
        );
    }

    #[test]
    fn conversation_maps_to_template_messages() {
        let r = parse_messages(
            br#"{"model": "m", "max_tokens": 5, "metadata": {"user_id": "u"}, "unknown": 1,
                "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
                "stop_sequences": ["END"], "top_k": 3, "stream": true,
                "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any"},
                "messages": [
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                     {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "21 C"}]}, {"type": "text", "text": "Thanks"}]}]}"#,
        )
        .unwrap();
        let m = &r.messages;
        assert_eq!(m.len(), 5, "{m:?}");
        assert_eq!(
            (m[0].role.as_str(), m[0].content.as_str()),
            ("system", "Be brief.\n\nBe kind.")
        );
        assert_eq!(m[1].role, "user");
        assert_eq!(
            (m[2].role.as_str(), m[2].content.as_str()),
            ("assistant", "Checking.")
        );
        assert_eq!(m[2].tool_calls[0].function.name, "get_weather");
        assert_eq!(m[2].tool_calls[0].function.arguments["city"], "Paris");
        assert_eq!(m[3].role, "tool");
        assert_eq!(m[3].content, "21 C");
        assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(m[3].name.as_deref(), Some("get_weather"));
        assert_eq!(
            (m[4].role.as_str(), m[4].content.as_str()),
            ("user", "Thanks")
        );
        assert_eq!(r.structured.tool_choice, ToolChoice::Required);
        assert_eq!(r.structured.tools[0].name, "get_weather");
        assert_eq!(r.job.sampling.stop, vec!["END".to_string()]);
        assert_eq!(r.job.sampling.params.top_k, 3);
        assert_eq!(r.job.max_tokens, Some((5, "max_tokens")));
        assert!(r.job.stream);
    }
}
