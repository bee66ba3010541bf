//! Reading and validating Ollama request bodies with no model and no socket involved:
//! [`parse_generate`] and [`parse_chat`] turn bytes into a checked request or a 400 naming
//! the field (`options.temperature`, `messages[1].role`). The sampling rules are the OpenAI
//! routes' ([`crate::params::validate_sampling`]); only the defaults differ.

use super::types::{ChatBody, GenerateBody, Options};
use crate::error::{ParamError, ServerError, from_value, parse_body};
use crate::params::{
    OLLAMA_DEFAULTS, OLLAMA_ROLES, Sampling, SamplingFields, validate_role, validate_sampling,
};
use crate::spec::{SpecFields, SpecRequest, validate_spec};
use crate::structured::{self, Structured};
use mica::models::chat::ChatMessage;

/// What both generating routes resolve before the model is involved.
#[derive(Clone, Debug)]
pub struct OllamaGen {
    pub model: String,
    pub sampling: Sampling,
    /// `num_predict` when it sets a limit (unset, -1 and -2 leave it to the context).
    pub num_predict: Option<usize>,
    /// `num_ctx`: the request's context, at most the server's.
    pub num_ctx: Option<usize>,
    pub stream: bool,
    pub priority: Option<String>,
    pub spec: SpecRequest,
    /// The request's `lora` list ([`crate::lora`]).
    pub lora: Vec<crate::lora::LoraRef>,
}

/// A checked `/api/generate` request.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub job: OllamaGen,
    pub prompt: String,
    pub system: Option<String>,
    pub raw: bool,
    /// `format` and the constraint extensions.
    pub structured: Structured,
}

/// A checked `/api/chat` request.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub job: OllamaGen,
    pub messages: Vec<ChatMessage>,
    /// `format`, the constraint extensions and `tools`.
    pub structured: Structured,
}

fn job(
    model: &str,
    o: Option<&Options>,
    stream: Option<bool>,
    priority: Option<&String>,
    lora: Option<&serde_json::Value>,
) -> Result<OllamaGen, ParamError> {
    let default = Options::default();
    let o = o.unwrap_or(&default);
    let fields = SamplingFields {
        temperature: o.temperature,
        top_p: o.top_p,
        top_k: o.top_k,
        min_p: o.min_p,
        repeat_penalty: o.repeat_penalty,
        repeat_last_n: o.repeat_last_n,
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
        seed: o.seed,
        stop: o.stop.as_ref().map(|s| s.to_vec()),
        mirostat: o.mirostat,
        mirostat_tau: o.mirostat_tau,
        mirostat_eta: o.mirostat_eta,
        logit_bias: o.logit_bias.clone(),
        typical_p: o.typical_p,
        xtc_probability: o.xtc_probability,
        xtc_threshold: o.xtc_threshold,
        dry_multiplier: o.dry_multiplier,
        dry_base: o.dry_base,
        dry_allowed_length: o.dry_allowed_length,
        dry_penalty_last_n: o.dry_penalty_last_n,
        dry_sequence_breakers: o.dry_sequence_breakers.clone(),
    };
    let sampling = validate_sampling(&fields, "options.", &OLLAMA_DEFAULTS)?;
    let num_predict = match o.num_predict {
        None | Some(-1) | Some(-2) => None,
        Some(n) if n > 0 => Some(n as usize),
        Some(n) => {
            return Err(ParamError::Invalid {
                field: "options.num_predict".into(),
                rule: "positive, -1 (no limit) or -2 (fill the context)",
                got: n.to_string(),
            });
        }
    };
    let num_ctx = match o.num_ctx {
        None => None,
        Some(n) if n > 0 => Some(n as usize),
        Some(n) => {
            return Err(ParamError::Invalid {
                field: "options.num_ctx".into(),
                rule: "at least 1",
                got: n.to_string(),
            });
        }
    };
    Ok(OllamaGen {
        model: model.to_string(),
        sampling,
        num_predict,
        num_ctx,
        stream: stream.unwrap_or(true),
        priority: priority.cloned(),
        spec: validate_spec(
            &SpecFields {
                spec: o.spec.clone(),
                spec_max: o.spec_max,
            },
            "options.",
        )?,
        lora: crate::lora::parse_refs(lora, "lora")?,
    })
}

/// Reads and checks an `/api/generate` body.
pub fn parse_generate(body: &[u8]) -> Result<GenerateRequest, ServerError> {
    let v = parse_body(body)?;
    let b: GenerateBody = from_value(&v)?;
    let structured = structured::ollama(&v)?;
    if !structured.tools.is_empty() {
        return Err(ParamError::Unsupported {
            field: "tools".into(),
            message: "tools are for /api/chat".into(),
        }
        .into());
    }
    Ok(GenerateRequest {
        job: job(
            &b.model,
            b.options.as_ref(),
            b.stream,
            b.priority.as_ref(),
            b.lora.as_ref(),
        )?,
        prompt: b.prompt,
        system: b.system,
        raw: b.raw,
        structured,
    })
}

/// Reads and checks an `/api/chat` body.
pub fn parse_chat(body: &[u8]) -> Result<ChatRequest, ServerError> {
    let v = parse_body(body)?;
    let b: ChatBody = from_value(&v)?;
    let job = job(
        &b.model,
        b.options.as_ref(),
        b.stream,
        b.priority.as_ref(),
        b.lora.as_ref(),
    )?;
    let mut messages = Vec::with_capacity(b.messages.len());
    for (i, m) in b.messages.iter().enumerate() {
        let role = validate_role(&m.role, format!("messages[{i}].role"), OLLAMA_ROLES)?;
        let mut msg = ChatMessage::new(role, m.content.clone());
        for (j, c) in m.tool_calls.iter().flatten().enumerate() {
            msg.tool_calls.push(structured::history_call(
                c,
                &format!("messages[{i}].tool_calls[{j}]"),
            )?);
        }
        msg.name = m.tool_name.clone();
        messages.push(msg);
    }
    Ok(ChatRequest {
        job,
        messages,
        structured: structured::ollama(&v)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_named() {
        let field = |body: &str| {
            parse_chat(body.as_bytes())
                .err()
                .and_then(|e| e.param().map(str::to_string))
        };
        let with = |opts: &str| {
            format!(
                r#"{{"model": "m", "messages": [{{"role": "user", "content": "x"}}], "options": {{{opts}}}}}"#
            )
        };
        assert_eq!(
            field(&with(r#""temperature": -5"#)).as_deref(),
            Some("options.temperature")
        );
        assert_eq!(
            field(&with(r#""num_predict": 0"#)).as_deref(),
            Some("options.num_predict")
        );
        assert_eq!(
            field(&with(r#""num_ctx": -3"#)).as_deref(),
            Some("options.num_ctx")
        );
        assert_eq!(
            field(&with(r#""top_k": "many""#)).as_deref(),
            Some("options.top_k")
        );
        assert_eq!(
            field(r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}"#).as_deref(),
            Some("messages[0].role")
        );
        let ok =
            parse_generate(br#"{"model": "m", "prompt": "hi", "options": {"num_predict": -1}}"#)
                .unwrap();
        assert_eq!(ok.job.num_predict, None);
        assert!(ok.job.stream);
        assert_eq!(ok.job.sampling.params.top_k, 40);
    }
}
