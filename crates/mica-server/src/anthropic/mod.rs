//! Anthropic's Messages API: `POST /v1/messages` (whole answers, or server-sent events with
//! `event:` lines) and `POST /v1/messages/count_tokens` — what coding agents built on the
//! `anthropic` SDK speak. Errors under `/v1/messages` take Anthropic's shape
//! ([`crate::error::Flavor::Anthropic`]); keys are read from `x-api-key` as well as
//! `Authorization: Bearer` ([`crate::AppState::authorized`]).
//!
//! The route is the OpenAI chat route in other clothes: the conversation is converted to
//! the chat template's messages ([`parse`]), tools go through the same machinery
//! ([`crate::structured`]: the template's `tools` variable, the family's call format parsed
//! back, a grammar forcing the call for `tool_choice` `any` or `tool`), and the request is
//! submitted as the OpenAI route submits it ([`crate::openai::submit`]).
//!
//! `max_tokens` is a ceiling: when the prompt leaves less room in the context, the answer
//! gets what is left and stops with `max_tokens` (coding agents ask for tens of thousands
//! of tokens whatever the model's context).

pub mod parse;
pub mod stream;
pub mod types;

pub use parse::{MessagesRequest, parse_count_tokens, parse_messages};

use crate::body::JsonBody;
use crate::bridge;
use crate::error::{ParamError, ServerError};
use crate::openai::{sse, submit};
use crate::state::AppState;
use crate::structured;
use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use mica::engine::FinishReason;
use mica::grammar::tools::{ToolCall, ToolChoice, ToolSet};
use mica::models::LoadedModel;
use std::sync::Arc;
use stream::MessagesStream;
use types::{Block, Message, TokenCount, Usage};

/// 24 random hex digits (the part of a tool-call id after its prefix).
fn random_hex() -> String {
    structured::call_id()
        .trim_start_matches("call_")
        .to_string()
}

/// A fresh `tool_use` id (`toolu_` and 24 hex digits).
pub fn tool_use_id() -> String {
    format!("toolu_{}", random_hex())
}

/// The content blocks of an answer: its text (when there is any, or when there are no
/// calls), then one `tool_use` block per call.
pub fn blocks_of(text: String, calls: &[ToolCall]) -> Vec<Block> {
    let mut out = Vec::with_capacity(calls.len() + 1);
    if !text.is_empty() || calls.is_empty() {
        out.push(Block::Text { text });
    }
    out.extend(calls.iter().map(|c| Block::ToolUse {
        id: tool_use_id(),
        name: c.name.clone(),
        input: c.arguments.clone(),
    }));
    out
}

/// The stop reason and stop sequence of an answer: `tool_use` when it made calls,
/// `stop_sequence` (with the one that matched) for a stop string, `max_tokens` for the
/// token limit or a full context, `end_turn` otherwise (the end of text, a completed
/// constraint, or a request the server ended at shutdown).
pub fn stop_of(
    finish: Option<FinishReason>,
    calls: bool,
    tokens: &[u32],
    model: &LoadedModel,
    stops: &[String],
) -> (&'static str, Option<String>) {
    if calls {
        return ("tool_use", None);
    }
    match finish {
        Some(FinishReason::Stop) => ("stop_sequence", matched_stop(tokens, model, stops)),
        Some(FinishReason::Length | FinishReason::Context) => ("max_tokens", None),
        _ => ("end_turn", None),
    }
}

/// Which stop string ended the output: the one found first in the decoded tokens (the
/// engine cuts the text at the first match, and its tokens include the match).
fn matched_stop(tokens: &[u32], model: &LoadedModel, stops: &[String]) -> Option<String> {
    if stops.len() == 1 {
        return stops.first().cloned();
    }
    let full = model.tokenizer.decode(tokens).ok()?;
    stops
        .iter()
        .filter_map(|s| {
            full.find(s.as_str())
                .map(|at| (at, std::cmp::Reverse(s.len()), s))
        })
        .min()
        .map(|(_, _, s)| s.clone())
}

/// The tool set a request shows the model (none for no tools or `tool_choice: none`),
/// without compiling a grammar: what `count_tokens` renders.
fn shown_tools(
    loaded: &crate::models::Loaded,
    s: &structured::Structured,
) -> Result<Option<ToolSet>, ParamError> {
    if s.tools.is_empty() || s.tool_choice == ToolChoice::None {
        return Ok(None);
    }
    ToolSet::new(s.tools.clone(), structured::tool_format(loaded))
        .map(Some)
        .map_err(|e| ParamError::Unsupported {
            field: "tools".into(),
            message: e.to_string(),
        })
}

/// `POST /v1/messages`.
pub async fn messages(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let mut req = parse_messages(&body)?;
    let lane = st.lane(&headers, req.job.priority.as_deref())?;
    let loaded = st.get(&req.job.model).await?;
    let prepared = structured::prepare_async(loaded.clone(), req.structured.clone()).await?;
    let tools = prepared.tools;
    let prompt = structured::chat_prompt(&loaded, &req.messages, tools.as_deref())?;
    // `max_tokens` as a ceiling (module docs); a prompt that fills the context is still a
    // 400.
    let room = loaded.engine.n_ctx().saturating_sub(prompt.len()).max(1);
    if let Some((m, _)) = &mut req.job.max_tokens {
        *m = (*m).min(room);
    }
    let running = submit(
        &st,
        &loaded,
        &req.job,
        prompt,
        "messages",
        lane,
        None,
        prepared.processors,
    )?;
    let id = format!("msg_{}", random_hex());
    let model = req.job.model.clone();
    let stops = req.job.sampling.stop.clone();
    if req.job.stream {
        let fmt = MessagesStream::new(id, model, loaded.model.clone(), stops, tools);
        return Ok(sse(bridge::stream_body(
            running,
            fmt,
            st.life.abort_signal(),
        )));
    }
    let out = bridge::collect(running).await?;
    let ch = out.choices.into_iter().next().unwrap_or_default();
    let (text, calls) = match &tools {
        Some(set) => {
            let parsed = set.parse(&ch.text);
            (parsed.content, parsed.calls)
        }
        None => (ch.text, Vec::new()),
    };
    let (stop_reason, stop_sequence) = stop_of(
        ch.finish,
        !calls.is_empty(),
        &ch.tokens,
        &loaded.model,
        &stops,
    );
    Ok(Json(Message {
        id,
        kind: "message",
        role: "assistant",
        model,
        content: blocks_of(text, &calls),
        stop_reason: Some(stop_reason),
        stop_sequence,
        usage: Usage::from(&out.usage),
    })
    .into_response())
}

/// `POST /v1/messages/count_tokens`: the tokens of the prompt `/v1/messages` would render
/// for the same body (system prompt and tools included).
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<TokenCount>, ServerError> {
    let req = parse_count_tokens(&body)?;
    let loaded = st.get(&req.job.model).await?;
    let tools = shown_tools(&loaded, &req.structured)?;
    let prompt = structured::chat_prompt(&loaded, &req.messages, tools.as_ref())?;
    Ok(Json(TokenCount {
        input_tokens: prompt.len(),
    }))
}
