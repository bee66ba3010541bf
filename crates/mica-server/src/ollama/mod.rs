//! Ollama-compatible routes: `POST /api/generate`, `POST /api/chat` (NDJSON streaming by
//! default, one JSON object per line, the last with `"done": true` and the counts and
//! durations), `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`.
//! Sampling follows Ollama's `options` and its defaults (llama.cpp's chain: top-k 40,
//! top-p 0.9, temperature 0.8, repeat penalty 1.1 over the last 64 tokens), under the same
//! rules as the OpenAI routes ([`crate::params`]). `/api/show` and `/api/tags` read model
//! metadata without loading weights.

pub mod parse;
pub mod stream;
pub mod types;

pub use parse::{ChatRequest, GenerateRequest, OllamaGen, parse_chat, parse_generate};

use crate::body::JsonBody;
use crate::bridge::{self, GenRequest, rfc3339};
use crate::config::model_bytes;
use crate::error::{ParamError, ServerError, parse_json};
use crate::models::{Loaded, ModelMeta};
use crate::params::completion_budget;
use crate::state::AppState;
use crate::structured::{self, Prepared};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mica::engine::{GenerateParams, Lane};
use mica::models::chat::ChatMessage;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use stream::Ndjson;
use types::{Details, InfoValue, ModelEntry, Ps, PsEntry, Show, ShowBody, Tags, Version};

/// Checks the prompt against the context, starts the request and answers: NDJSON, or one
/// object when `stream` is false.
async fn run(
    st: &AppState,
    loaded: Arc<Loaded>,
    job: &OllamaGen,
    prompt: Vec<u32>,
    field: &str,
    lane: Lane,
    chat: bool,
    load: Duration,
    prepared: Prepared,
) -> Result<Response, ServerError> {
    let n_ctx = job
        .num_ctx
        .map_or(loaded.engine.n_ctx(), |c| c.min(loaded.engine.n_ctx()));
    let requested = job.num_predict.map(|n| (n, "options.num_predict"));
    let max_tokens = completion_budget(prompt.len(), n_ctx, requested, field)?;
    let params = GenerateParams {
        max_tokens,
        sampling: job.sampling.params.clone(),
        stop: job.sampling.stop.clone(),
        ignore_eos: false,
        logit_bias: job.sampling.logit_bias.clone(),
    };
    let proposer = crate::spec::proposer(&loaded, &job.spec, "options.")?;
    let running = bridge::start(
        loaded,
        GenRequest {
            prompt,
            params,
            lane,
            n: 1,
            logprobs: None,
            proposer,
            processors: prepared.processors,
            lora: st.lora_selection(&job.model, &job.lora)?,
        },
    )?;
    let mut fmt = Ndjson::new(job.model.clone(), chat, load).with_tools(prepared.tools);
    if job.stream {
        let body = bridge::stream_body(running, fmt, st.life.abort_signal());
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            body,
        )
            .into_response());
    }
    let started = running.started;
    let out = bridge::collect(running).await?;
    let ch = &out.choices[0];
    fmt.first = out.first_token;
    fmt.finish = ch.finish;
    let (content, calls) = fmt.split(ch.text.clone());
    let mut last = fmt.final_chunk(content, &out.usage, started);
    if let Some(m) = &mut last.message {
        m.tool_calls = calls;
    }
    Ok(Json(last).into_response())
}

/// Ollama answers a request with nothing to generate by loading the model.
fn loaded_reply(model: &str, chat: bool) -> Response {
    let mut c = Ndjson::new(model.to_string(), chat, Duration::ZERO).chunk(String::new(), true);
    c.done_reason = Some("load");
    Json(c).into_response()
}

pub async fn generate(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req = parse_generate(&body)?;
    let lane = st.lane(&headers, req.job.priority.as_deref())?;
    let t0 = Instant::now();
    let loaded = st.get(&req.job.model).await?;
    let load = t0.elapsed();
    if req.prompt.is_empty() {
        return Ok(loaded_reply(&req.job.model, false));
    }
    let prompt = if req.raw {
        loaded
            .model
            .tokenizer
            .encode(&req.prompt, true, true)
            .map_err(|e| e.to_string())
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &req.system {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        msgs.push(ChatMessage::new("user", req.prompt.clone()));
        loaded.model.chat_prompt(&msgs).map_err(|e| e.to_string())
    }
    .map_err(|message| ParamError::Unsupported {
        field: "prompt".into(),
        message,
    })?;
    let prepared = structured::prepare_async(loaded.clone(), req.structured.clone()).await?;
    run(
        &st, loaded, &req.job, prompt, "prompt", lane, false, load, prepared,
    )
    .await
}

pub async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req = parse_chat(&body)?;
    let lane = st.lane(&headers, req.job.priority.as_deref())?;
    let t0 = Instant::now();
    let loaded = st.get(&req.job.model).await?;
    let load = t0.elapsed();
    if req.messages.is_empty() {
        return Ok(loaded_reply(&req.job.model, true));
    }
    let prepared = structured::prepare_async(loaded.clone(), req.structured.clone()).await?;
    let prompt = structured::chat_prompt(&loaded, &req.messages, prepared.tools.as_deref())?;
    run(
        &st, loaded, &req.job, prompt, "messages", lane, true, load, prepared,
    )
    .await
}

fn details(meta: &ModelMeta) -> Details {
    Details {
        format: meta.format,
        family: meta.arch.clone(),
        families: vec![meta.arch.clone()],
        parameter_size: meta.size_label.clone(),
        quantization_level: meta
            .file_type
            .map_or(String::new(), |t| format!("file_type {t}")),
        parent_model: "",
    }
}

fn model_entry(name: &str, path: &Path, meta: &ModelMeta) -> ModelEntry {
    let size = model_bytes(path);
    let modified = std::fs::metadata(path)
        .ok()
        .and_then(|m| m.modified().ok())
        .map_or_else(|| rfc3339(SystemTime::now()), rfc3339);
    ModelEntry {
        name: name.to_string(),
        model: name.to_string(),
        modified_at: modified,
        size,
        digest: format!("{:016x}", size ^ name.len() as u64),
        details: details(meta),
    }
}

/// Metadata for a listing: a model whose file cannot be read is listed with empty details.
async fn meta_or_empty(st: &AppState, name: &str) -> Arc<ModelMeta> {
    st.meta(name).await.unwrap_or_default()
}

pub async fn tags(State(st): State<Arc<AppState>>) -> Json<Tags> {
    let mut models = Vec::new();
    for (name, path) in &st.cfg.models {
        let meta = meta_or_empty(&st, name).await;
        models.push(model_entry(name, path, &meta));
    }
    Json(Tags { models })
}

pub async fn ps(State(st): State<Arc<AppState>>) -> Json<Ps> {
    let mut models = Vec::new();
    for l in st.loaded() {
        let meta = meta_or_empty(&st, &l.name).await;
        let mut entry = model_entry(&l.name, &l.path, &meta);
        entry.size = l.bytes;
        models.push(PsEntry {
            entry,
            size_vram: 0,
            expires_at: "0001-01-01T00:00:00Z",
            context_length: l.engine.n_ctx(),
        });
    }
    Json(Ps { models })
}

/// `POST /api/show`: a model's details from its metadata; the weights are not loaded.
pub async fn show(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Show>, ServerError> {
    let b: ShowBody = parse_json(&body)?;
    let Some(name) = b.model.or(b.name) else {
        return Err(ParamError::Missing {
            field: "model".into(),
        }
        .into());
    };
    let meta = st.meta(&name).await?;
    let path = st
        .cfg
        .models
        .iter()
        .find(|m| m.0 == name)
        .map(|m| m.1.clone())
        .ok_or_else(|| ServerError::ModelNotFound(name.clone()))?;
    let arch = meta.arch.clone();
    let mut info = BTreeMap::new();
    info.insert(
        "general.architecture".to_string(),
        InfoValue::Text(arch.clone()),
    );
    for (key, v) in [
        ("context_length", meta.context_length),
        ("embedding_length", meta.embedding_length),
        ("block_count", meta.block_count),
        ("attention.head_count", meta.head_count),
        ("attention.head_count_kv", meta.head_count_kv),
        ("feed_forward_length", meta.feed_forward_length),
    ] {
        if let Some(v) = v {
            info.insert(format!("{arch}.{key}"), InfoValue::Number(v));
        }
    }
    if let Some(v) = meta.vocab_size {
        info.insert("tokenizer.vocab_size".into(), InfoValue::Number(v));
    }
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or(&name)
        .to_string();
    let entry = model_entry(&name, &path, &meta);
    Ok(Json(Show {
        modelfile: format!("FROM {file}"),
        parameters: "",
        template: meta.chat_template.clone().unwrap_or_default(),
        details: entry.details,
        model_info: info,
        capabilities: vec!["completion"],
        modified_at: entry.modified_at,
    }))
}

pub async fn version() -> Json<Version> {
    Json(Version {
        version: env!("CARGO_PKG_VERSION"),
    })
}
