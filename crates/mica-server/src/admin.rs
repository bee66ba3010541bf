//! The live view of an operator (behind the API key like every route but `/health`):
//! `GET /admin/requests` lists the generations running — ID, route, model, lane, state
//! (`waiting` until the first token, then `generating`), prompt and generated tokens, age —
//! and `DELETE /admin/requests/{id}` cancels one: its completions end with the finish
//! reason `abort` and the engine frees its KV blocks at its next step.

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
