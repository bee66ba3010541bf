//! mica-server: the HTTP front of `mica serve` (axum on hyper and tokio). OpenAI-compatible
//! routes under `/v1`, Anthropic's Messages API at `/v1/messages` ([`anthropic`]),
//! Ollama-compatible ones under `/api`, the probes `/health`
//! (liveness) and `/ready` (readiness), Prometheus `/metrics`, and the chat page at `/`
//! ([`web`]).
//!
//! The server knows nothing of tensors: handlers parse and validate requests
//! ([`openai::parse_chat`], [`ollama::parse_generate`]… callable without a socket), render
//! chat templates and tokenize, then hand the tokens to the model's engine
//! ([`mica::engine::EngineHandle`]), which runs on its own thread; tokens come back through a
//! channel and are streamed as SSE (OpenAI) or NDJSON (Ollama). Dropping a response — the
//! client went away — cancels the request in the engine.
//!
//! Around the routes: [`guard`] (host, origin, API key, CORS, error shapes, draining),
//! [`body`] (content type, size and time limits of request bodies), [`serve`] (connection
//! timeouts and graceful shutdown), [`models`] (loading and unloading under a memory
//! budget; a failed load unloads nothing), [`streaming`] (layer streaming of the models
//! loaded, under `--mem-budget`).

pub mod admin;
pub mod anthropic;
pub mod body;
pub mod bridge;
pub mod config;
pub mod embeddings;
pub mod error;
pub mod guard;
pub mod lora;
pub mod metrics;
pub mod models;
pub mod ollama;
pub mod openai;
pub mod params;
pub mod reqlog;
pub mod serve;
pub mod spec;
pub mod state;
pub mod streaming;
pub mod structured;
pub mod web;

use crate::error::ServerError;
use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use std::sync::Arc;

pub use config::{Access, ApiKey, Limits, OffloadFn, Offloader, ServerConfig};
pub use error::{Flavor, ParamError};
pub use serve::{ServeError, serve};
pub use state::{AppState, Observer, ServerEvent};
pub use streaming::StreamConfig;

/// The routes of `mica serve`, behind the layers of [`guard`].
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(guard::LIVENESS, get(health))
        .route(guard::READINESS, get(ready))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(embeddings::openai))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/embed", post(embeddings::ollama))
        .route("/api/embeddings", post(embeddings::ollama_legacy))
        .route("/api/generate", post(ollama::generate))
        .route("/api/chat", post(ollama::chat))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/admin/requests", get(admin::list))
        .route("/admin/requests/{id}", axum::routing::delete(admin::cancel))
        .route(
            "/admin/lora-adapters",
            get(admin::list_adapters).post(admin::load_adapter),
        )
        .route(
            "/admin/lora-adapters/{name}",
            axum::routing::delete(admin::unload_adapter),
        )
        .merge(web::routes())
        .fallback(|method: Method, uri: Uri| async move {
            ServerError::NoRoute {
                method,
                path: uri.path().to_string(),
            }
        })
        .layer(from_fn_with_state(state.clone(), guard::lifecycle))
        .layer(from_fn_with_state(state.clone(), guard::access))
        .layer(from_fn_with_state(state.clone(), guard::finish))
        .with_state(state)
}

/// The body of the probes.
#[derive(Serialize)]
struct Probe {
    status: &'static str,
}

/// Liveness: the process answers. Open without a key, answered while draining.
async fn health() -> axum::Json<Probe> {
    axum::Json(Probe { status: "ok" })
}

/// Readiness: 200 once the preload model is loaded, 503 while it loads or the server
/// drains.
async fn ready(State(st): State<Arc<AppState>>) -> Response {
    let status = if st.life.is_draining() {
        "draining"
    } else if st.life.is_loading() {
        "loading"
    } else {
        "ready"
    };
    let code = if status == "ready" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(Probe { status })).into_response()
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&st),
    )
        .into_response()
}
