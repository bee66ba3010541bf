//! mica-server: the HTTP front of `mica serve` (axum on tokio). OpenAI-compatible routes
//! under `/v1`, Ollama-compatible ones under `/api`, `/health` and Prometheus `/metrics`.
//!
//! The server knows nothing of tensors: handlers parse and validate requests, render chat
//! templates and tokenize, then hand the tokens to the model's engine
//! ([`mica_engine::EngineHandle`]), which runs on its own thread; tokens come back through a
//! channel and are streamed as SSE (OpenAI) or NDJSON (Ollama). Dropping a response — the
//! client went away — cancels the request in the engine.

pub mod bridge;
pub mod error;
pub mod ollama;
pub mod openai;
pub mod state;

use crate::error::ApiError;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;

pub use state::{ApiKey, AppState, ServerConfig};

/// The routes of `mica serve`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/api/generate", post(ollama::generate))
        .route("/api/chat", post(ollama::chat))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .fallback(|| async { ApiError::not_found_route() })
        .with_state(state)
}

/// Serves on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let loaded: Vec<String> = st.loaded().iter().map(|l| l.name.clone()).collect();
    axum::Json(serde_json::json!({"status": "ok", "loaded": loaded})).into_response()
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let mut out = String::new();
    out.push_str("# HELP mica_models_loaded Models loaded.\n# TYPE mica_models_loaded gauge\n");
    let loaded = st.loaded();
    out.push_str(&format!("mica_models_loaded {}\n", loaded.len()));
    for l in &loaded {
        l.engine.metrics().render(&l.name, &mut out);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}
