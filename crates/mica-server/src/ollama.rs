//! Ollama-compatible routes: `POST /api/generate`, `POST /api/chat` (NDJSON streaming by
//! default, one JSON object per line, the last with `"done": true` and the counts and
//! durations), `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`.
//! Sampling follows Ollama's `options` and its defaults (llama.cpp's chain: top-k 40,
//! top-p 0.9, temperature 0.8, repeat penalty 1.1 over the last 64 tokens).

use crate::bridge::{self, GenRequest, Running, StreamFormat, rfc3339};
use crate::error::{ApiError, Flavor, parse_json};
use crate::openai::StopField;
use crate::state::{AppState, Loaded};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mica_engine::{
    BudgetError, Event, FinishReason, GenerateParams, SamplingParams, Usage, completion_budget,
};
use mica_models::ChatPromptError;
use mica_models::chat::ChatMessage;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

#[derive(Deserialize, Default)]
struct Options {
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    num_predict: Option<i64>,
    num_ctx: Option<usize>,
    seed: Option<u64>,
    stop: Option<StopField>,
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<usize>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
}

#[derive(Deserialize)]
struct GenerateBody {
    model: String,
    #[serde(default)]
    prompt: String,
    system: Option<String>,
    #[serde(default)]
    raw: bool,
    stream: Option<bool>,
    #[serde(default)]
    options: Options,
    priority: Option<String>,
}

#[derive(Deserialize)]
struct ChatMsg {
    role: String,
    #[serde(default)]
    content: String,
}

#[derive(Deserialize)]
struct ChatBody {
    model: String,
    #[serde(default)]
    messages: Vec<ChatMsg>,
    stream: Option<bool>,
    #[serde(default)]
    options: Options,
    priority: Option<String>,
}

#[derive(Deserialize)]
struct ShowBody {
    model: Option<String>,
    name: Option<String>,
}

fn err(e: ApiError) -> ApiError {
    e.with_flavor(Flavor::Ollama)
}

/// Ollama's `num_predict`: unset, -1 (no limit) or -2 (fill the context) leave it to the
/// context; otherwise it must be positive.
fn num_predict(o: &Options) -> Result<Option<usize>, ApiError> {
    match o.num_predict {
        None | Some(-1) | Some(-2) => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::bad_request(
            Some("options.num_predict"),
            format!("num_predict must be positive, -1 or -2, got {n}"),
        )),
    }
}

fn params(o: &Options, max_tokens: usize) -> Result<GenerateParams, ApiError> {
    let seed = o.seed.unwrap_or_else(mica_engine::random_seed);
    let sampling = SamplingParams {
        temperature: o.temperature.unwrap_or(0.8),
        top_k: o.top_k.unwrap_or(40),
        top_p: o.top_p.unwrap_or(0.9),
        min_p: o.min_p.unwrap_or(0.0),
        repeat_penalty: o.repeat_penalty.unwrap_or(1.1),
        presence_penalty: o.presence_penalty.unwrap_or(0.0),
        frequency_penalty: o.frequency_penalty.unwrap_or(0.0),
        penalty_last_n: o.repeat_last_n.unwrap_or(64),
        seed,
    };
    sampling
        .validate()
        .map_err(|e| ApiError::bad_request(Some("options"), e.to_string()))?;
    Ok(GenerateParams {
        max_tokens,
        sampling,
        stop: o.stop.as_ref().map(StopField::to_vec).unwrap_or_default(),
        ignore_eos: false,
        logit_bias: Vec::new(),
    })
}

/// Checks the prompt length, builds the request and starts it.
fn submit(
    loaded: &Arc<Loaded>,
    prompt: Vec<u32>,
    o: &Options,
    lane: mica_engine::Lane,
) -> Result<Running, ApiError> {
    if let Some(c) = o.num_ctx
        && prompt.len() >= c
    {
        return Err(ApiError::bad_request(
            Some("options.num_ctx"),
            format!("the prompt has {} tokens but num_ctx is {c}", prompt.len()),
        ));
    }
    let max_tokens = completion_budget(prompt.len(), loaded.engine.n_ctx(), num_predict(o)?)
        .map_err(|e| match e {
            BudgetError::PromptTooLong { .. } => {
                ApiError::bad_request(Some("prompt"), e.to_string())
            }
            BudgetError::Zero => ApiError::bad_request(Some("options.num_predict"), e.to_string()),
        })?;
    let params = params(o, max_tokens)?;
    bridge::start(
        loaded.clone(),
        GenRequest {
            prompt,
            params,
            lane,
            n: 1,
            logprobs: None,
        },
    )
}

pub async fn generate(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    generate_inner(st, headers, body).await.map_err(err)
}

async fn generate_inner(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    st.authorize(&headers)?;
    let b: GenerateBody = parse_json(&body)?;
    let lane = st.lane(&headers, b.priority.as_deref())?;
    let t0 = Instant::now();
    let loaded = st.get(&b.model).await?;
    let load = t0.elapsed();
    if b.prompt.is_empty() {
        // Ollama answers an empty prompt by loading the model.
        return Ok(axum::Json(json!({
            "model": b.model, "created_at": rfc3339(SystemTime::now()),
            "response": "", "done": true, "done_reason": "load",
        }))
        .into_response());
    }
    let prompt = if b.raw {
        (loaded.model.tokenizer.encode(&b.prompt, true, true)).map_err(ChatPromptError::from)
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &b.system {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        msgs.push(ChatMessage::new("user", b.prompt.clone()));
        loaded.model.chat_prompt(&msgs)
    }
    .map_err(|e| ApiError::bad_request(Some("prompt"), e.to_string()))?;
    let running = submit(&loaded, prompt, &b.options, lane)?;
    respond(running, b.model, b.stream.unwrap_or(true), false, load).await
}

pub async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    chat_inner(st, headers, body).await.map_err(err)
}

async fn chat_inner(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    st.authorize(&headers)?;
    let b: ChatBody = parse_json(&body)?;
    let lane = st.lane(&headers, b.priority.as_deref())?;
    let t0 = Instant::now();
    let loaded = st.get(&b.model).await?;
    let load = t0.elapsed();
    if b.messages.is_empty() {
        return Ok(axum::Json(json!({
            "model": b.model, "created_at": rfc3339(SystemTime::now()),
            "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "load",
        }))
        .into_response());
    }
    let msgs: Vec<ChatMessage> = b
        .messages
        .iter()
        .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
        .collect();
    let prompt = loaded
        .model
        .chat_prompt(&msgs)
        .map_err(|e| ApiError::bad_request(Some("messages"), e.to_string()))?;
    let running = submit(&loaded, prompt, &b.options, lane)?;
    respond(running, b.model, b.stream.unwrap_or(true), true, load).await
}

/// Streams NDJSON or answers with one object.
async fn respond(
    running: Running,
    model: String,
    stream: bool,
    chat: bool,
    load: std::time::Duration,
) -> Result<Response, ApiError> {
    let fmt = Ndjson {
        model,
        chat,
        text: String::new(),
        first: None,
        load,
    };
    if stream {
        let body = bridge::stream_body(running, fmt);
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            body,
        )
            .into_response());
    }
    let started = running.started;
    let out = bridge::collect(running, 1).await?;
    let ch = &out.choices[0];
    let mut fmt = fmt;
    fmt.first = out.first_token;
    let mut v = fmt.final_object(&out.usage, ch.finish, started);
    if chat {
        v["message"] = json!({"role": "assistant", "content": ch.text});
    } else {
        v["response"] = json!(ch.text);
    }
    Ok(axum::Json(v).into_response())
}

struct Ndjson {
    model: String,
    chat: bool,
    text: String,
    first: Option<Instant>,
    load: std::time::Duration,
}

impl Ndjson {
    fn object(&self, text: &str, done: bool) -> Value {
        let mut v =
            json!({"model": self.model, "created_at": rfc3339(SystemTime::now()), "done": done});
        if self.chat {
            v["message"] = json!({"role": "assistant", "content": text});
        } else {
            v["response"] = json!(text);
        }
        v
    }

    fn final_object(&self, u: &Usage, finish: Option<FinishReason>, started: Instant) -> Value {
        let mut v = self.object("", true);
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        let reason = match finish {
            Some(FinishReason::Length | FinishReason::Context) => "length",
            _ => "stop",
        };
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        v["done_reason"] = json!(reason);
        v["total_duration"] = json!(ns(now.duration_since(started) + self.load));
        v["load_duration"] = json!(ns(self.load));
        v["prompt_eval_count"] = json!(u.prompt_tokens);
        v["prompt_eval_duration"] = json!(ns(first.duration_since(started)));
        v["eval_count"] = json!(u.completion_tokens);
        v["eval_duration"] = json!(ns(now.duration_since(first)));
        v
    }
}

impl StreamFormat for Ndjson {
    fn on_event(&mut self, r: &Running, ev: Event) -> String {
        match ev {
            Event::Token { text, .. } => {
                self.first.get_or_insert_with(Instant::now);
                if text.is_empty() {
                    return String::new();
                }
                format!("{}\n", self.object(&text, false))
            }
            Event::Done { text, finish, .. } => {
                let mut out = String::new();
                if !text.is_empty() {
                    out = format!("{}\n", self.object(&text, false));
                }
                self.text = finish_str(finish).into();
                out
            }
            Event::Finished { usage } => {
                let finish = if self.text == "length" {
                    Some(FinishReason::Length)
                } else {
                    Some(FinishReason::Stop)
                };
                format!("{}\n", self.final_object(&usage, finish, r.started))
            }
            Event::Error(e) => format!("{}\n", json!({ "error": e.to_string() })),
        }
    }
    fn finish(&mut self, _r: &Running) -> String {
        String::new()
    }
}

fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length | FinishReason::Context => "length",
        _ => "stop",
    }
}

fn details(l: Option<&Loaded>, path: &std::path::Path) -> Value {
    let (family, params, quant) = match l {
        Some(l) => {
            // A Hugging Face folder has no GGUF metadata to report.
            let f = l.model.model.file.as_deref();
            (
                l.model.model.config.arch.clone(),
                f.and_then(|f| f.get_str("general.size_label"))
                    .unwrap_or("")
                    .to_string(),
                f.and_then(|f| f.get_u32("general.file_type"))
                    .map_or(String::new(), |t| format!("file_type {t}")),
            )
        }
        None => (String::new(), String::new(), String::new()),
    };
    let format = if path.is_dir() {
        "safetensors"
    } else if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("mica"))
    {
        "mica"
    } else {
        "gguf"
    };
    json!({"format": format, "family": family, "families": [family], "parameter_size": params, "quantization_level": quant, "parent_model": ""})
}

fn model_entry(name: &str, path: &std::path::Path, l: Option<&Loaded>) -> Value {
    let meta = std::fs::metadata(path).ok();
    let size = crate::state::model_bytes(path);
    let modified = meta
        .and_then(|m| m.modified().ok())
        .map_or_else(|| rfc3339(SystemTime::now()), rfc3339);
    json!({
        "name": name, "model": name, "modified_at": modified, "size": size,
        "digest": format!("{:016x}", size ^ name.len() as u64), "details": details(l, path),
    })
}

pub async fn tags(State(st): State<Arc<AppState>>) -> Response {
    let loaded = st.loaded();
    let models: Vec<Value> = st
        .cfg
        .models
        .iter()
        .map(|(name, path)| {
            let l = loaded.iter().find(|l| &l.name == name);
            model_entry(name, path, l.map(|a| a.as_ref()))
        })
        .collect();
    axum::Json(json!({ "models": models })).into_response()
}

pub async fn ps(State(st): State<Arc<AppState>>) -> Response {
    let models: Vec<Value> = st
        .loaded()
        .iter()
        .map(|l| {
            let mut v = model_entry(&l.name, &l.path, Some(l));
            v["size"] = json!(l.bytes);
            v["size_vram"] = json!(0);
            v["expires_at"] = json!("0001-01-01T00:00:00Z");
            v["context_length"] = json!(l.engine.n_ctx());
            v
        })
        .collect();
    axum::Json(json!({ "models": models })).into_response()
}

pub async fn show(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    st.authorize(&headers).map_err(err)?;
    let b: ShowBody = parse_json(&body).map_err(err)?;
    let Some(name) = b.model.or(b.name) else {
        return Err(err(ApiError::bad_request(
            Some("model"),
            "model is required",
        )));
    };
    let l = st.get(&name).await.map_err(err)?;
    let c = &l.model.model.config;
    let arch = c.arch.clone();
    let info = json!({
        "general.architecture": arch,
        format!("{arch}.context_length"): c.n_ctx_train,
        format!("{arch}.embedding_length"): c.n_embd,
        format!("{arch}.block_count"): c.n_layer,
        format!("{arch}.attention.head_count"): c.n_head,
        format!("{arch}.attention.head_count_kv"): c.n_head_kv,
        format!("{arch}.feed_forward_length"): c.n_ff,
        "tokenizer.vocab_size": c.n_vocab,
    });
    Ok(axum::Json(json!({
        "modelfile": format!("FROM {}", l.path.display()),
        "parameters": "",
        "template": l.model.tokenizer.chat_template().unwrap_or(""),
        "details": details(Some(&l), &l.path),
        "model_info": info,
        "capabilities": ["completion"],
        "modified_at": rfc3339(l.loaded_at),
    }))
    .into_response())
}

pub async fn version() -> Response {
    axum::Json(json!({ "version": env!("CARGO_PKG_VERSION") })).into_response()
}
