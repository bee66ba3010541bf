//! The live view of an operator (behind the API key like every route but `/health`):
//! `GET /admin/requests` lists the generations running — ID, route, model, lane, state
//! (`waiting` until the first token, then `generating`), prompt and generated tokens, age —
//! and `DELETE /admin/requests/{id}` cancels one: its completions end with the finish
//! reason `abort` and the engine frees its KV blocks at its next step.
//!
//! LoRA adapters ([`crate::lora`]): `GET /admin/lora-adapters` lists those requests may
//! select, `POST /admin/lora-adapters` loads one, `DELETE /admin/lora-adapters/{name}`
//! unloads one.

use crate::reqlog::LiveRow;
use crate::state::AppState;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::sync::Arc;

#[derive(Serialize)]
struct Listing {
    requests: Vec<LiveRow>,
}

/// `GET /admin/requests`, oldest first.
pub async fn list(State(st): State<Arc<AppState>>) -> Json<impl Serialize> {
    let mut requests: Vec<LiveRow> = st.live().iter().map(|(id, l)| l.row(id)).collect();
    requests.sort_by(|a, b| b.age_ms.total_cmp(&a.age_ms));
    Json(Listing { requests })
}

#[derive(Serialize)]
struct Cancelled {
    id: String,
    cancelled: bool,
}

/// `DELETE /admin/requests/{id}`: 200 when the request was running, 404 otherwise.
pub async fn cancel(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let found = st.live().get(&id).map(|l| l.cancel.send(true).is_ok());
    match found {
        Some(_) => Json(Cancelled {
            id,
            cancelled: true,
        })
        .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({
                "error": {"message": format!("no running request with id '{id}'"), "type": "not_found"}
            })),
        )
            .into_response(),
    }
}

/// An error answer of the adapter routes.
fn refuse(status: StatusCode, kind: &str, message: String) -> Response {
    (
        status,
        Json(serde_json::json!({"error": {"message": message, "type": kind}})),
    )
        .into_response()
}

/// The model an adapter route means: `model` when given (a configured model), else the
/// server's only model.
fn adapter_model(st: &AppState, model: Option<&str>) -> Result<String, Box<Response>> {
    match model {
        Some(m) if st.cfg.models.iter().any(|(n, _)| n == m) => Ok(m.to_string()),
        Some(m) => Err(Box::new(refuse(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("model '{m}' not found (GET /v1/models lists the models served)"),
        ))),
        None if st.cfg.models.len() == 1 => Ok(st.cfg.models[0].0.clone()),
        None => Err(Box::new(refuse(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the server has several models: name one in \"model\"".into(),
        ))),
    }
}

#[derive(Serialize)]
struct AdapterListing {
    adapters: Vec<crate::lora::AdapterInfo>,
}

/// `GET /admin/lora-adapters`: every adapter requests may select, by model and id.
pub async fn list_adapters(State(st): State<Arc<AppState>>) -> Json<impl Serialize> {
    let mut adapters: Vec<_> = st
        .model_names()
        .iter()
        .flat_map(|m| st.adapters().of(m))
        .map(|a| a.info())
        .collect();
    adapters.sort_by(|a, b| (&a.model, a.id).cmp(&(&b.model, b.id)));
    Json(AdapterListing { adapters })
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadAdapter {
    name: String,
    path: String,
    scale: Option<serde_json::Value>,
    model: Option<String>,
}

/// `POST /admin/lora-adapters` `{"name", "path", "scale"?, "model"?}`: opens the adapter
/// at `path` (on the server) for the model (loading the model if needed); 400 when it
/// cannot be read or does not fit the model, 409 when the model has an adapter of that
/// name.
pub async fn load_adapter(
    State(st): State<Arc<AppState>>,
    crate::body::JsonBody(body): crate::body::JsonBody,
) -> Result<Response, crate::error::ServerError> {
    let bad = |m: String| refuse(StatusCode::BAD_REQUEST, "invalid_request_error", m);
    let req: LoadAdapter = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return Ok(bad(format!("invalid adapter request: {e}"))),
    };
    if !mica::models::lora::valid_adapter_name(&req.name) {
        return Ok(bad(format!(
            "name '{}' is not a valid adapter name (1 to 64 letters, digits, '.', '_', '-')",
            req.name
        )));
    }
    let scale = match &req.scale {
        None => 1.0,
        Some(v) => crate::lora::parse_scale(v, "scale")?,
    };
    let model = match adapter_model(&st, req.model.as_deref()) {
        Ok(m) => m,
        Err(resp) => return Ok(*resp),
    };
    let spec = mica::models::LoraSpec {
        name: Some(req.name),
        path: req.path.into(),
        scale,
    };
    let loaded = st.get(&model).await?;
    let s = spec.clone();
    let opened = tokio::task::spawn_blocking(move || crate::lora::open(&s, &loaded.model))
        .await
        .unwrap_or_else(|e| Err(format!("the loader panicked: {e}")));
    let adapter = match opened {
        Ok(a) => a,
        Err(e) => return Ok(bad(e)),
    };
    match st.add_adapter(&model, &spec, adapter) {
        Ok(a) => Ok(Json(a.info()).into_response()),
        Err(e) => Ok(refuse(StatusCode::CONFLICT, "conflict", e)),
    }
}

#[derive(serde::Deserialize)]
pub struct ModelQuery {
    model: Option<String>,
}

#[derive(Serialize)]
struct Unloaded {
    name: String,
    model: String,
    unloaded: bool,
    /// Requests still running with it (they finish with it).
    in_use: usize,
}

/// `DELETE /admin/lora-adapters/{name}[?model=M]`: new requests can no longer select the
/// adapter; requests running with it finish with it (its memory is freed after the last).
/// 404 when the model has no such adapter.
pub async fn unload_adapter(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    axum::extract::Query(q): axum::extract::Query<ModelQuery>,
) -> Response {
    let model = match adapter_model(&st, q.model.as_deref()) {
        Ok(m) => m,
        Err(resp) => return *resp,
    };
    match st.remove_adapter(&model, &name) {
        Some(a) => Json(Unloaded {
            in_use: std::sync::Arc::strong_count(&a.adapter) - 1,
            name,
            model,
            unloaded: true,
        })
        .into_response(),
        None => refuse(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("model '{model}' has no LoRA adapter named '{name}'"),
        ),
    }
}
