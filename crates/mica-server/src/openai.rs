//! OpenAI-compatible routes: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`. Streaming is server-sent events, one `data: {chunk}` per event, ending
//! with `data: [DONE]`. Sampling follows OpenAI's meaning of the fields (temperature 1 and
//! top_p 1 by default, no top-k or min-p unless the `top_k` / `min_p` extensions are given).

use crate::bridge::{self, GenRequest, Running, StreamFormat, openai_finish, unix_now};
use crate::error::{ApiError, from_value, parse_body};
use crate::state::{AppState, Loaded};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mica_engine::{
    BudgetError, Event, GenerateParams, Lane, SamplingParams, TokenLogprob, Usage,
    completion_budget,
};
use mica_models::chat::ChatMessage;
use mica_models::tokenizer::{DecodeOptions, Tokenizer};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s.clone()],
            StopField::Many(v) => v.clone(),
        }
    }
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Fields both endpoints share.
#[derive(Deserialize)]
struct Common {
    model: String,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// Extensions (llama.cpp's server has them too).
    top_k: Option<usize>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    n: Option<usize>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    stop: Option<StopField>,
    seed: Option<u64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    priority: Option<String>,
}

/// Message content: a string, or a list of parts of which the text parts are used.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Prompt,
    /// Legacy: number of alternatives per token.
    logprobs: Option<usize>,
}

fn params(c: &Common, max_tokens: usize) -> Result<GenerateParams, ApiError> {
    let seed = c.seed.unwrap_or_else(mica_engine::random_seed);
    if let Some(t) = c.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(ApiError::bad_request(
            Some("temperature"),
            format!("temperature must be between 0 and 2, got {t}"),
        ));
    }
    for (name, v) in [
        ("presence_penalty", c.presence_penalty),
        ("frequency_penalty", c.frequency_penalty),
    ] {
        if let Some(v) = v
            && !(-2.0..=2.0).contains(&v)
        {
            return Err(ApiError::bad_request(
                Some(name),
                format!("{name} must be between -2 and 2, got {v}"),
            ));
        }
    }
    Ok(GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: c.temperature.unwrap_or(1.0),
            top_k: c.top_k.unwrap_or(0),
            top_p: c.top_p.unwrap_or(1.0),
            min_p: c.min_p.unwrap_or(0.0),
            repeat_penalty: c.repeat_penalty.unwrap_or(1.0),
            presence_penalty: c.presence_penalty.unwrap_or(0.0),
            frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
            penalty_last_n: 64,
            seed,
        },
        stop: c.stop.as_ref().map(StopField::to_vec).unwrap_or_default(),
        ignore_eos: false,
        logit_bias: Vec::new(),
    })
}

fn check_n(c: &Common) -> Result<usize, ApiError> {
    let n = c.n.unwrap_or(1);
    if n == 0 || n > 16 {
        return Err(ApiError::bad_request(
            Some("n"),
            format!("n must be between 1 and 16, got {n}"),
        ));
    }
    Ok(n)
}

/// Checks `prompt` against the model's context (`field` names it in the error), resolves
/// the sampling parameters and submits the request: the part the chat and completion routes
/// share.
fn submit(
    loaded: &Arc<Loaded>,
    c: &Common,
    prompt: Vec<u32>,
    field: &str,
    lane: Lane,
    n: usize,
    logprobs: Option<usize>,
) -> Result<Running, ApiError> {
    let requested = c.max_completion_tokens.or(c.max_tokens);
    let max_tokens =
        completion_budget(prompt.len(), loaded.engine.n_ctx(), requested).map_err(|e| match e {
            BudgetError::PromptTooLong { .. } => too_long(&e, field),
            BudgetError::Zero => {
                ApiError::bad_request(Some("max_tokens"), "max_tokens must be at least 1")
            }
        })?;
    let params = params(c, max_tokens)?;
    let req = GenRequest {
        prompt,
        params,
        lane,
        n,
        logprobs,
    };
    bridge::start(loaded.clone(), req)
}

fn too_long(e: &BudgetError, param: &str) -> ApiError {
    let mut e = ApiError::bad_request(Some(param), e.to_string());
    e.code = Some("context_length_exceeded");
    e
}

pub async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    st.authorize(&headers)?;
    let json = parse_body(&body)?;
    let common: Common = from_value(&json)?;
    let body: ChatBody = from_value(&json)?;
    let c = &common;
    let lane = st.lane(&headers, c.priority.as_deref())?;
    let n = check_n(c)?;
    if body.messages.is_empty() {
        return Err(ApiError::bad_request(
            Some("messages"),
            "messages must not be empty",
        ));
    }
    let loaded = st.get(&c.model).await?;
    let lm = &loaded.model;
    let msgs: Vec<ChatMessage> = body
        .messages
        .iter()
        .map(|m| {
            let text = match &m.content {
                None => String::new(),
                Some(Content::Text(s)) => s.clone(),
                Some(Content::Parts(p)) => p
                    .iter()
                    .filter(|p| p.kind == "text")
                    .filter_map(|p| p.text.clone())
                    .collect::<Vec<_>>()
                    .join(""),
            };
            ChatMessage::new(m.role.clone(), text)
        })
        .collect();
    let prompt = lm
        .chat_prompt(&msgs)
        .map_err(|e| ApiError::bad_request(Some("messages"), e.to_string()))?;
    let logprobs = body
        .logprobs
        .then_some(body.top_logprobs.unwrap_or(0).min(20));
    let running = submit(&loaded, c, prompt, "messages", lane, n, logprobs)?;
    let id = format!("chatcmpl-{:x}", rand_id());
    let model = c.model.clone();
    if c.stream {
        let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let fmt = ChatStream {
            id,
            model,
            include_usage,
            created: unix_now(),
            sent_role: vec![false; n],
            tok: loaded.model.clone(),
        };
        return Ok(sse(bridge::stream_body(running, fmt)));
    }
    let out = bridge::collect(running, n).await?;
    let tok = &loaded.model.tokenizer;
    let choices: Vec<Value> = out
        .choices
        .iter()
        .enumerate()
        .map(|(i, ch)| {
            json!({
                "index": i,
                "message": {"role": "assistant", "content": ch.text},
                "logprobs": logprobs.map(|_| json!({
                    "content": ch.logprobs.iter().zip(&ch.tokens)
                        .map(|(lp, &t)| chat_logprob(tok, t, lp)).collect::<Vec<_>>()
                })),
                "finish_reason": openai_finish(ch.finish),
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": unix_now(),
        "model": model,
        "choices": choices,
        "usage": usage_json(&out.usage),
        "system_fingerprint": "mica",
    }))
    .into_response())
}

pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    st.authorize(&headers)?;
    let json = parse_body(&body)?;
    let common: Common = from_value(&json)?;
    let body: CompletionBody = from_value(&json)?;
    let c = &common;
    let lane = st.lane(&headers, c.priority.as_deref())?;
    let n = check_n(c)?;
    let loaded = st.get(&c.model).await?;
    let tok = &loaded.model.tokenizer;
    let prompt = match &body.prompt {
        Prompt::Text(s) => tok.encode(s, true, true),
        Prompt::Texts(v) if v.len() == 1 => tok.encode(&v[0], true, true),
        Prompt::Texts(_) => {
            return Err(ApiError::bad_request(
                Some("prompt"),
                "a list of several prompts is not supported; send one request per prompt",
            ));
        }
        Prompt::Tokens(t) => Ok(t.clone()),
    }
    .map_err(|e| ApiError::bad_request(Some("prompt"), e.to_string()))?;
    if prompt.is_empty() {
        return Err(ApiError::bad_request(Some("prompt"), "the prompt is empty"));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= tok.vocab_size()) {
        return Err(ApiError::bad_request(
            Some("prompt"),
            format!(
                "token {bad} is outside the vocabulary of {}",
                tok.vocab_size()
            ),
        ));
    }
    let logprobs = body.logprobs.map(|k| k.min(20));
    let running = submit(&loaded, c, prompt, "prompt", lane, n, logprobs)?;
    let id = format!("cmpl-{:x}", rand_id());
    let model = c.model.clone();
    if c.stream {
        let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let fmt = CompletionStream {
            id,
            model,
            include_usage,
            created: unix_now(),
            tok: loaded.model.clone(),
        };
        return Ok(sse(bridge::stream_body(running, fmt)));
    }
    let out = bridge::collect(running, n).await?;
    let choices: Vec<Value> = out
        .choices
        .iter()
        .enumerate()
        .map(|(i, ch)| {
            json!({
                "index": i,
                "text": ch.text,
                "logprobs": logprobs.map(|_| legacy_logprobs(tok, &ch.tokens, &ch.logprobs)),
                "finish_reason": openai_finish(ch.finish),
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "id": id,
        "object": "text_completion",
        "created": unix_now(),
        "model": model,
        "choices": choices,
        "usage": usage_json(&out.usage),
    }))
    .into_response())
}

pub async fn models(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers)?;
    let created = unix_now();
    let data: Vec<Value> = st
        .model_names()
        .into_iter()
        .map(|name| json!({"id": name, "object": "model", "created": created, "owned_by": "mica"}))
        .collect();
    Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
}

fn sse(body: Body) -> Response {
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

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::Instant::now())
}

fn piece(tok: &Tokenizer, t: u32) -> (String, Vec<u8>) {
    let bytes = tok
        .token_piece(
            t,
            DecodeOptions {
                skip_special: false,
            },
        )
        .unwrap_or_default()
        .to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

fn chat_logprob(tok: &Tokenizer, t: u32, lp: &TokenLogprob) -> Value {
    let (text, bytes) = piece(tok, t);
    let top: Vec<Value> = lp
        .top
        .iter()
        .map(|&(id, l)| {
            let (text, bytes) = piece(tok, id);
            json!({"token": text, "logprob": l, "bytes": bytes})
        })
        .collect();
    json!({"token": text, "logprob": lp.logprob, "bytes": bytes, "top_logprobs": top})
}

fn legacy_logprobs(tok: &Tokenizer, tokens: &[u32], lps: &[TokenLogprob]) -> Value {
    let mut offset = 0;
    let (mut texts, mut lp, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for (&t, l) in tokens.iter().zip(lps) {
        let (text, _) = piece(tok, t);
        offsets.push(offset);
        offset += text.len();
        texts.push(text);
        lp.push(l.logprob);
        let m: serde_json::Map<String, Value> = l
            .top
            .iter()
            .map(|&(id, v)| (piece(tok, id).0, json!(v)))
            .collect();
        tops.push(Value::Object(m));
    }
    json!({"tokens": texts, "token_logprobs": lp, "top_logprobs": tops, "text_offset": offsets})
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

struct ChatStream {
    id: String,
    model: String,
    include_usage: bool,
    created: u64,
    sent_role: Vec<bool>,
    tok: Arc<mica_models::LoadedModel>,
}

impl ChatStream {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> String {
        let mut v = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "system_fingerprint": "mica", "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        data(&v)
    }
}

impl StreamFormat for ChatStream {
    fn on_event(&mut self, _r: &Running, ev: Event) -> String {
        match ev {
            Event::Token {
                index,
                token,
                text,
                logprob,
            } => {
                let mut delta = json!({"content": text});
                if !self.sent_role.get(index).copied().unwrap_or(true) {
                    self.sent_role[index] = true;
                    delta["role"] = json!("assistant");
                }
                let lp = logprob
                    .map(|l| json!({"content": [chat_logprob(&self.tok.tokenizer, token, &l)]}));
                self.chunk(
                    json!([{"index": index, "delta": delta, "logprobs": lp, "finish_reason": null}]),
                    None,
                )
            }
            Event::Done {
                index,
                finish,
                text,
            } => {
                let mut out = String::new();
                if !text.is_empty() {
                    out += &self.chunk(
                        json!([{"index": index, "delta": {"content": text}, "logprobs": null, "finish_reason": null}]),
                        None,
                    );
                }
                out += &self.chunk(
                    json!([{"index": index, "delta": {}, "logprobs": null, "finish_reason": openai_finish(Some(finish))}]),
                    None,
                );
                out
            }
            Event::Finished { usage } if self.include_usage => {
                self.chunk(json!([]), Some(usage_json(&usage)))
            }
            Event::Finished { .. } => String::new(),
            Event::Error(e) => {
                data(&json!({"error": {"message": e.to_string(), "type": "server_error"}}))
            }
        }
    }
    fn finish(&mut self, _r: &Running) -> String {
        "data: [DONE]\n\n".into()
    }
}

struct CompletionStream {
    id: String,
    model: String,
    include_usage: bool,
    created: u64,
    tok: Arc<mica_models::LoadedModel>,
}

impl CompletionStream {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> String {
        let mut v = json!({
            "id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model, "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        data(&v)
    }
}

impl StreamFormat for CompletionStream {
    fn on_event(&mut self, _r: &Running, ev: Event) -> String {
        match ev {
            Event::Token {
                index,
                token,
                text,
                logprob,
            } => {
                let lp = logprob.map(|l| legacy_logprobs(&self.tok.tokenizer, &[token], &[l]));
                self.chunk(
                    json!([{"index": index, "text": text, "logprobs": lp, "finish_reason": null}]),
                    None,
                )
            }
            Event::Done {
                index,
                finish,
                text,
            } => self.chunk(
                json!([{"index": index, "text": text, "logprobs": null, "finish_reason": openai_finish(Some(finish))}]),
                None,
            ),
            Event::Finished { usage } if self.include_usage => {
                self.chunk(json!([]), Some(usage_json(&usage)))
            }
            Event::Finished { .. } => String::new(),
            Event::Error(e) => data(&json!({"error": {"message": e.to_string(), "type": "server_error"}})),
        }
    }
    fn finish(&mut self, _r: &Running) -> String {
        "data: [DONE]\n\n".into()
    }
}
