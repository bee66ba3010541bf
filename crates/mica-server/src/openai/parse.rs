//! Reading and validating OpenAI request bodies, with no model and no socket involved:
//! [`parse_chat`] and [`parse_completion`] turn bytes into a checked request or a 400
//! naming the field (what the fuzz targets call). Checks that need the model — the prompt's
//! length against the context, token ids against the vocabulary — are the handlers'.

use super::types::{ChatFields, CommonFields, CompletionFields, Content, Prompt};
use crate::error::{ParamError, ServerError, from_value, parse_body};
use crate::params::{
    OPENAI_DEFAULTS, OPENAI_ROLES, Sampling, SamplingFields, validate_logprobs,
    validate_max_tokens, validate_n, validate_role, validate_sampling,
};
use crate::spec::{SpecFields, SpecRequest, validate_spec};
use crate::structured::{self, Structured};
use mica::models::chat::ChatMessage;

/// What both OpenAI routes resolve before the model is involved.
#[derive(Clone, Debug)]
pub struct Generation {
    pub model: String,
    pub sampling: Sampling,
    /// The completion length asked for, and the field that asked.
    pub max_tokens: Option<(usize, &'static str)>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub priority: Option<String>,
    pub spec: SpecRequest,
    /// The request's `lora` list ([`crate::lora`]).
    pub lora: Vec<crate::lora::LoraRef>,
}

/// A checked `/v1/chat/completions` request.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub job: Generation,
    /// Roles checked (`developer` rendered as `system`), text parts joined.
    pub messages: Vec<ChatMessage>,
    /// Alternatives per token when log-probabilities were asked for.
    pub logprobs: Option<usize>,
    /// `response_format`, the constraint extensions, `tools` and `tool_choice`.
    pub structured: Structured,
}

/// A checked `/v1/completions` request.
#[derive(Clone, Debug)]
pub struct CompletionRequest {
    pub job: Generation,
    pub prompt: Prompt,
    pub logprobs: Option<usize>,
    /// The constraint extensions (`grammar`, `regex`, `choice`); no tools.
    pub structured: Structured,
}

fn generation(c: &CommonFields) -> Result<Generation, ParamError> {
    let fields = SamplingFields {
        temperature: c.temperature,
        top_p: c.top_p,
        top_k: c.top_k,
        min_p: c.min_p,
        repeat_penalty: c.repeat_penalty,
        repeat_last_n: c.repeat_last_n,
        presence_penalty: c.presence_penalty,
        frequency_penalty: c.frequency_penalty,
        seed: c.seed,
        stop: c.stop.as_ref().map(|s| s.to_vec()),
        mirostat: c.mirostat,
        mirostat_tau: c.mirostat_tau,
        mirostat_eta: c.mirostat_eta,
        logit_bias: c.logit_bias.clone(),
        typical_p: c.typical_p,
        xtc_probability: c.xtc_probability,
        xtc_threshold: c.xtc_threshold,
        dry_multiplier: c.dry_multiplier,
        dry_base: c.dry_base,
        dry_allowed_length: c.dry_allowed_length,
        dry_penalty_last_n: c.dry_penalty_last_n,
        dry_sequence_breakers: c.dry_sequence_breakers.clone(),
    };
    let sampling = validate_sampling(&fields, "", &OPENAI_DEFAULTS)?;
    let max_tokens = match (c.max_completion_tokens, c.max_tokens) {
        (Some(v), _) => Some((
            validate_max_tokens("max_completion_tokens", v)?,
            "max_completion_tokens",
        )),
        (None, Some(v)) => Some((validate_max_tokens("max_tokens", v)?, "max_tokens")),
        (None, None) => None,
    };
    Ok(Generation {
        model: c.model.clone(),
        sampling,
        max_tokens,
        n: validate_n(c.n)?,
        stream: c.stream,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        priority: c.priority.clone(),
        spec: validate_spec(
            &SpecFields {
                spec: c.spec.clone(),
                spec_max: c.spec_max,
            },
            "",
        )?,
        lora: crate::lora::parse_refs(c.lora.as_ref(), "lora")?,
    })
}

/// Reads and checks a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<ChatRequest, ServerError> {
    let v = parse_body(body)?;
    let common: CommonFields = from_value(&v)?;
    let chat: ChatFields = from_value(&v)?;
    let job = generation(&common)?;
    if chat.messages.is_empty() {
        return Err(ParamError::Empty {
            field: "messages".into(),
        }
        .into());
    }
    let mut messages = Vec::with_capacity(chat.messages.len());
    for (i, m) in chat.messages.iter().enumerate() {
        let role = validate_role(&m.role, format!("messages[{i}].role"), OPENAI_ROLES)?;
        let text = match &m.content {
            None => String::new(),
            Some(Content::Text(s)) => s.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    if p.kind != "text" {
                        return Err(ParamError::Unsupported {
                            field: format!("messages[{i}].content[{j}].type"),
                            message: format!("only text parts are supported, got '{}'", p.kind),
                        }
                        .into());
                    }
                    let Some(t) = &p.text else {
                        return Err(ParamError::Missing {
                            field: format!("messages[{i}].content[{j}].text"),
                        }
                        .into());
                    };
                    text.push_str(t);
                }
                text
            }
        };
        let mut msg = ChatMessage::new(role, text);
        for (j, c) in m.tool_calls.iter().flatten().enumerate() {
            msg.tool_calls.push(structured::history_call(
                c,
                &format!("messages[{i}].tool_calls[{j}]"),
            )?);
        }
        msg.tool_call_id = m.tool_call_id.clone();
        msg.name = m.name.clone();
        messages.push(msg);
    }
    let top = chat
        .top_logprobs
        .map(|t| validate_logprobs("top_logprobs", t))
        .transpose()?;
    let logprobs = match (chat.logprobs.unwrap_or(false), top) {
        (true, t) => Some(t.unwrap_or(0)),
        (false, Some(_)) => {
            return Err(ParamError::Requires {
                field: "top_logprobs".into(),
                requires: "logprobs is true",
            }
            .into());
        }
        (false, None) => None,
    };
    Ok(ChatRequest {
        job,
        messages,
        logprobs,
        structured: structured::openai(&v)?,
    })
}

/// Reads and checks a `/v1/completions` body.
pub fn parse_completion(body: &[u8]) -> Result<CompletionRequest, ServerError> {
    let v = parse_body(body)?;
    let common: CommonFields = from_value(&v)?;
    let fields: CompletionFields = from_value(&v)?;
    let job = generation(&common)?;
    let empty = || ParamError::Empty {
        field: "prompt".into(),
    };
    match &fields.prompt {
        Prompt::Text(s) if s.is_empty() => return Err(empty().into()),
        Prompt::Tokens(t) if t.is_empty() => return Err(empty().into()),
        Prompt::Texts(v) if v.len() != 1 => {
            return Err(ParamError::Unsupported {
                field: "prompt".into(),
                message: "send one prompt per request (a list must hold exactly one string)".into(),
            }
            .into());
        }
        Prompt::Texts(v) if v[0].is_empty() => return Err(empty().into()),
        _ => {}
    }
    let logprobs = fields
        .logprobs
        .map(|k| validate_logprobs("logprobs", k))
        .transpose()?;
    let structured = structured::openai(&v)?;
    if !structured.tools.is_empty() {
        return Err(ParamError::Unsupported {
            field: "tools".into(),
            message: "tools are for /v1/chat/completions".into(),
        }
        .into());
    }
    Ok(CompletionRequest {
        job,
        prompt: fields.prompt,
        logprobs,
        structured,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field named by the 400 for `body` (a chat body if it has `messages`).
    fn param(body: &str) -> String {
        let e = if body.contains("\"messages\"") {
            parse_chat(body.as_bytes()).err()
        } else {
            parse_completion(body.as_bytes()).err()
        };
        let e = e.unwrap_or_else(|| panic!("accepted: {body}"));
        e.param().unwrap_or("(none)").to_string()
    }

    #[test]
    fn each_field_is_named() {
        let chat = |extra: &str| {
            format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]{extra}}}"#)
        };
        assert_eq!(param(&chat(r#", "temperature": -5"#)), "temperature");
        assert_eq!(
            param(&chat(r#", "logprobs": true, "top_logprobs": 21"#)),
            "top_logprobs"
        );
        assert_eq!(param(&chat(r#", "top_logprobs": 2"#)), "top_logprobs");
        assert_eq!(param(&chat(r#", "n": 0"#)), "n");
        assert_eq!(param(&chat(r#", "max_tokens": 0"#)), "max_tokens");
        assert_eq!(param(&chat(r#", "stop": ["", "x"]"#)), "stop[0]");
        assert_eq!(
            param(r#"{"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}"#),
            "messages[0].role"
        );
        assert_eq!(
            param(
                r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            param(r#"{"model": "m", "prompt": "x", "logprobs": 1000}"#),
            "logprobs"
        );
        assert_eq!(param(r#"{"model": "m", "prompt": ""}"#), "prompt");
        assert_eq!(param(&chat(r#", "spec": "medusa""#)), "spec");
        assert_eq!(param(&chat(r#", "spec_max": 0"#)), "spec_max");
    }

    #[test]
    fn valid_requests_resolve() {
        let r = parse_chat(
            br#"{"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 "logprobs": true, "top_logprobs": 3, "max_completion_tokens": 5, "seed": 1, "stream": true,
                 "stream_options": {"include_usage": true}}"#,
        )
        .unwrap();
        assert_eq!(r.messages[0].role, "system");
        assert_eq!(r.messages[0].content, "ab");
        assert_eq!(r.logprobs, Some(3));
        assert_eq!(r.job.max_tokens, Some((5, "max_completion_tokens")));
        assert!(r.job.stream && r.job.include_usage);
        assert_eq!(r.job.sampling.params.temperature, 1.0);
    }
}
