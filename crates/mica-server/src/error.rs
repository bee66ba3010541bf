//! HTTP errors: one type for every route, rendered in the API's own shape — OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` under `/v1`, Ollama's `{"error": "..."}`
//! under `/api` — with the status code the clients of each API expect.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mica_engine::SubmitError;
use serde_json::json;

/// Which API shape an error takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Ollama,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after: Option<u64>,
    pub flavor: Flavor,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
            flavor: Flavor::OpenAi,
        }
    }

    /// 400 naming the field at fault.
    pub fn bad_request(param: Option<&str>, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        e.param = param.map(str::to_string);
        e
    }

    pub fn unauthorized() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid or missing API key (send `Authorization: Bearer KEY`)",
        );
        e.code = Some("invalid_api_key");
        e
    }

    pub fn model_not_found(name: &str, available: &[String]) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "model '{name}' not found; available: {}",
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                }
            ),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> ApiError {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.retry_after = Some(retry_after);
        e
    }

    pub fn not_found_route() -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no such route",
        )
    }

    pub fn with_flavor(mut self, flavor: Flavor) -> ApiError {
        self.flavor = flavor;
        self
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        match &e {
            SubmitError::QueueFull { .. } => {
                let mut a = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    e.to_string(),
                );
                a.retry_after = Some(2);
                a.code = Some("queue_full");
                a
            }
            SubmitError::PromptTooLong { .. } => {
                let mut a = ApiError::bad_request(Some("messages"), e.to_string());
                a.code = Some("context_length_exceeded");
                a
            }
            SubmitError::Params(p) => {
                ApiError::bad_request(Some(p.param().as_str()), e.to_string())
            }
            SubmitError::Stopped => ApiError::unavailable(e.to_string(), 5),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.flavor {
            Flavor::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.kind,
                    "param": self.param,
                    "code": self.code,
                }
            }),
            Flavor::Ollama => json!({ "error": self.message }),
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// Parses a JSON body, naming the field at fault on error (`messages[0].role`).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    from_value(&parse_body(body)?)
}

/// Parses a request body as JSON (syntax only).
pub fn parse_body(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            None,
            "the request body is empty; send JSON",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(None, format!("malformed JSON: {e}")))
}

/// Reads a typed request out of parsed JSON, naming the field at fault.
pub fn from_value<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match (path != ".").then_some(path.as_str()) {
            Some(p) => ApiError::bad_request(Some(p), format!("invalid field '{p}': {inner}")),
            None => ApiError::bad_request(None, format!("invalid request: {inner}")),
        }
    })
}
