//! OpenAI-compatible routes: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`, `GET /v1/models/{id}`. Streaming is server-sent events, one
//! `data: {chunk}` per event, ending with `data: [DONE]`. Sampling follows OpenAI's meaning
//! of the fields (temperature 1 and top_p 1 by default, no top-k or min-p unless the
//! `top_k` / `min_p` extensions are given); validation is shared with the Ollama routes
//! ([`crate::params`]).

pub mod parse;
pub mod stream;
pub mod types;

pub use parse::{ChatRequest, CompletionRequest, Generation, parse_chat, parse_completion};

use crate::body::JsonBody;
use crate::bridge::{self, GenRequest, Running, finish_reason, unix_now};
use crate::error::{ParamError, ServerError};
use crate::models::Loaded;
use crate::params::completion_budget;
use crate::state::AppState;
use crate::structured;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mica::engine::{GenerateParams, Lane};
use std::sync::Arc;
use stream::{ChatStream, CompletionStream, chat_logprob, legacy_logprobs};
use types::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatLogprobs, Completion, CompletionChoice,
    ModelList, ModelObject, Prompt, Usage,
};

/// Checks `prompt` against the model's context (`field` names it in the error) and submits
/// the request: the part the chat and completion routes (and Anthropic's messages route)
/// share.
pub(crate) fn submit(
    st: &AppState,
    loaded: &Arc<Loaded>,
    job: &Generation,
    prompt: Vec<u32>,
    field: &str,
    lane: Lane,
    logprobs: Option<usize>,
    processors: Option<mica::engine::ProcessorFactory>,
) -> Result<Running, ServerError> {
    let max_tokens = completion_budget(prompt.len(), loaded.engine.n_ctx(), job.max_tokens, field)?;
    let params = GenerateParams {
        max_tokens,
        sampling: job.sampling.params.clone(),
        stop: job.sampling.stop.clone(),
        ignore_eos: false,
        logit_bias: job.sampling.logit_bias.clone(),
    };
    bridge::start(
        loaded.clone(),
        GenRequest {
            prompt,
            params,
            lane,
            n: job.n,
            logprobs,
            proposer: crate::spec::proposer(loaded, &job.spec, "")?,
            processors,
            lora: st.lora_selection(&job.model, &job.lora)?,
        },
    )
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::Instant::now())
}

/// A server-sent-events response.
pub(crate) fn sse(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req = parse_chat(&body)?;
    let lane = st.lane(&headers, req.job.priority.as_deref())?;
    let loaded = st.get(&req.job.model).await?;
    let prepared = structured::prepare_async(loaded.clone(), req.structured.clone()).await?;
    let tools = prepared.tools;
    let prompt = structured::chat_prompt(&loaded, &req.messages, tools.as_deref())?;
    let running = submit(
        &st,
        &loaded,
        &req.job,
        prompt,
        "messages",
        lane,
        req.logprobs,
        prepared.processors,
    )?;
    let id = format!("chatcmpl-{:x}", rand_id());
    let model = req.job.model.clone();
    if req.job.stream {
        let fmt = ChatStream {
            id,
            model,
            include_usage: req.job.include_usage,
            created: unix_now(),
            sent_role: vec![false; req.job.n],
            tok: loaded.model.clone(),
            tool_streams: tools
                .as_ref()
                .map(|t| (0..req.job.n).map(|_| t.stream()).collect())
                .unwrap_or_default(),
            tools,
        };
        return Ok(sse(bridge::stream_body(
            running,
            fmt,
            st.life.abort_signal(),
        )));
    }
    let out = bridge::collect(running).await?;
    let tok = &loaded.model.tokenizer;
    let choices = out
        .choices
        .iter()
        .enumerate()
        .map(|(index, ch)| {
            let (content, tool_calls) = match &tools {
                Some(set) => {
                    let parsed = set.parse(&ch.text);
                    (parsed.content, stream::calls_out(&parsed.calls))
                }
                None => (ch.text.clone(), Vec::new()),
            };
            ChatChoice {
                index,
                finish_reason: if tool_calls.is_empty() {
                    finish_reason(ch.finish)
                } else {
                    "tool_calls"
                },
                message: AssistantMessage {
                    role: "assistant",
                    content: if tool_calls.is_empty() || !content.is_empty() {
                        Some(content)
                    } else {
                        None
                    },
                    tool_calls,
                },
                logprobs: req.logprobs.map(|_| ChatLogprobs {
                    content: ch
                        .logprobs
                        .iter()
                        .zip(&ch.tokens)
                        .map(|(lp, &t)| chat_logprob(tok, t, lp))
                        .collect(),
                }),
            }
        })
        .collect();
    Ok(Json(ChatCompletion {
        id,
        object: "chat.completion",
        created: unix_now(),
        model,
        choices,
        usage: Usage::from(&out.usage),
        system_fingerprint: "mica",
    })
    .into_response())
}

pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req = parse_completion(&body)?;
    let lane = st.lane(&headers, req.job.priority.as_deref())?;
    let loaded = st.get(&req.job.model).await?;
    let tok = &loaded.model.tokenizer;
    let bad_prompt = |message: String| ParamError::Unsupported {
        field: "prompt".into(),
        message,
    };
    let prompt = match &req.prompt {
        Prompt::Text(s) => tok.encode(s, true, true),
        Prompt::Texts(v) => tok.encode(&v[0], true, true),
        Prompt::Tokens(t) => Ok(t.clone()),
    }
    .map_err(|e| bad_prompt(e.to_string()))?;
    if prompt.is_empty() {
        return Err(ParamError::Empty {
            field: "prompt".into(),
        }
        .into());
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= tok.vocab_size()) {
        return Err(bad_prompt(format!(
            "token {bad} is outside the vocabulary of {}",
            tok.vocab_size()
        ))
        .into());
    }
    let prepared = structured::prepare_async(loaded.clone(), req.structured.clone()).await?;
    let running = submit(
        &st,
        &loaded,
        &req.job,
        prompt,
        "prompt",
        lane,
        req.logprobs,
        prepared.processors,
    )?;
    let id = format!("cmpl-{:x}", rand_id());
    let model = req.job.model.clone();
    if req.job.stream {
        let fmt = CompletionStream {
            id,
            model,
            include_usage: req.job.include_usage,
            created: unix_now(),
            tok: loaded.model.clone(),
        };
        return Ok(sse(bridge::stream_body(
            running,
            fmt,
            st.life.abort_signal(),
        )));
    }
    let out = bridge::collect(running).await?;
    let choices = out
        .choices
        .iter()
        .enumerate()
        .map(|(index, ch)| CompletionChoice {
            index,
            text: ch.text.clone(),
            logprobs: req
                .logprobs
                .map(|_| legacy_logprobs(tok, &ch.tokens, &ch.logprobs)),
            finish_reason: finish_reason(ch.finish),
        })
        .collect();
    Ok(Json(Completion {
        id,
        object: "text_completion",
        created: unix_now(),
        model,
        choices,
        usage: Usage::from(&out.usage),
    })
    .into_response())
}

fn model_object(id: String) -> ModelObject {
    ModelObject {
        id,
        object: "model",
        created: unix_now(),
        owned_by: "mica",
    }
}

/// `GET /v1/models`: every model served.
pub async fn models(State(st): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: st
            .model_names()
            .into_iter()
            .chain(st.adapter_model_names())
            .map(model_object)
            .collect(),
    })
}

/// `GET /v1/models/{id}`: one model (what the `openai` SDK's `models.retrieve` calls).
pub async fn model(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>, ServerError> {
    if st.cfg.models.iter().any(|(n, _)| *n == id) || st.adapter_model_names().contains(&id) {
        Ok(Json(model_object(id)))
    } else {
        Err(ServerError::ModelNotFound(id))
    }
}
