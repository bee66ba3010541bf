//! Errors at the server's API boundary: [`ParamError`] for a request field that fails
//! validation (named in the API's own naming, e.g. `top_logprobs` or `options.temperature`)
//! and [`ServerError`] for everything a route can answer with an error status.
//!
//! A handler, extractor or middleware returns a [`ServerError`]; its response carries the
//! error in its extensions with an empty body, and the outermost layer
//! ([`crate::guard::finish`]) renders it in the shape of the route's API family — OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` everywhere except under `/api`, where
//! it is Ollama's `{"error": "..."}`, and under `/v1/messages` Anthropic's
//! `{"type": "error", "error": {"type", "message"}}` — so every status (404, 405, 413
//! included) has one shape per family, whichever layer produced it.

use axum::body::Body;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mica::engine::SubmitError;
use serde::Serialize;
use std::sync::Arc;

/// Which API family a route belongs to, and so which error shape it answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Ollama,
    Anthropic,
}

impl Flavor {
    /// Ollama's shape under `/api`, Anthropic's under `/v1/messages`, OpenAI's everywhere
    /// else.
    pub fn for_path(path: &str) -> Flavor {
        let under = |prefix: &str| {
            path.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        };
        if under("/api") {
            Flavor::Ollama
        } else if under("/v1/messages") {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        }
    }
}

/// A request field that failed validation. `field` is the field's path in the API's own
/// naming (`messages[2].role`, `options.top_p`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ParamError {
    /// Wrong JSON type, or a value serde could not read.
    #[error("invalid field '{field}': {message}")]
    Type { field: String, message: String },
    #[error("missing field '{field}'")]
    Missing { field: String },
    #[error("{field} must be between {min} and {max}, got {got}")]
    OutOfRange {
        field: String,
        min: f64,
        max: f64,
        got: f64,
    },
    #[error("{field} must be {rule}, got {got}")]
    Invalid {
        field: String,
        rule: &'static str,
        got: String,
    },
    #[error("{field} must not be empty")]
    Empty { field: String },
    #[error("{field} has {got} entries; at most {max} are allowed")]
    TooMany {
        field: String,
        max: usize,
        got: usize,
    },
    #[error("{field}: unknown role '{role}'; use one of {allowed}")]
    UnknownRole {
        field: String,
        role: String,
        allowed: String,
    },
    #[error("{field} is only allowed when {requires}")]
    Requires {
        field: String,
        requires: &'static str,
    },
    #[error("{field}: {message}")]
    Unsupported { field: String, message: String },
    /// The prompt and the completion asked for do not fit in the context.
    #[error(
        "this model's context holds {n_ctx} tokens, but the request needs {} ({prompt} in the {field} + {requested} from {budget_field}); shorten the {field} or lower {budget_field}",
        prompt + requested
    )]
    ContextLength {
        field: String,
        budget_field: String,
        prompt: usize,
        requested: usize,
        n_ctx: usize,
    },
    /// The prompt leaves no room for even one generated token.
    #[error(
        "the {field} has {prompt} tokens but this model's context holds {n_ctx} (prompt and completion together); shorten the {field}"
    )]
    PromptTooLong {
        field: String,
        prompt: usize,
        n_ctx: usize,
    },
}

impl ParamError {
    /// The field at fault, in the API's naming.
    pub fn field(&self) -> &str {
        match self {
            ParamError::Type { field, .. }
            | ParamError::Missing { field }
            | ParamError::OutOfRange { field, .. }
            | ParamError::Invalid { field, .. }
            | ParamError::Empty { field }
            | ParamError::TooMany { field, .. }
            | ParamError::UnknownRole { field, .. }
            | ParamError::Requires { field, .. }
            | ParamError::Unsupported { field, .. }
            | ParamError::ContextLength { field, .. }
            | ParamError::PromptTooLong { field, .. } => field,
        }
    }

    /// OpenAI's `code` for this error, when it has one.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            ParamError::ContextLength { .. } | ParamError::PromptTooLong { .. } => {
                Some("context_length_exceeded")
            }
            _ => None,
        }
    }
}

/// What a route answers with an error status. Messages name what to change; none carries a
/// file path or the list of models (the load failure's full text goes to the operator
/// through [`crate::ServerEvent::ModelLoadFailed`]).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("the request body is empty; send JSON")]
    EmptyBody,
    #[error("malformed JSON: {0}")]
    MalformedJson(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error("invalid or missing API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`)")]
    Unauthorized,
    #[error("origin '{0}' is not allowed (the server's --allowed-origins)")]
    OriginNotAllowed(String),
    #[error("host '{0}' is not allowed (the server's --allowed-hosts)")]
    HostNotAllowed(String),
    #[error("Content-Type must be application/json, got '{0}'")]
    UnsupportedMediaType(String),
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the request body did not arrive within {secs} s")]
    BodyTimeout { secs: f64 },
    #[error("Invalid URL ({method} {path})")]
    NoRoute { method: Method, path: String },
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: Method, path: String },
    #[error("model '{0}' not found (GET /v1/models lists the models served)")]
    ModelNotFound(String),
    #[error("cannot load model '{name}': {reason}")]
    ModelLoad { name: String, reason: String },
    #[error(
        "cannot load model '{name}': it needs {need_mib} MiB (weights {weights_mib} MiB + KV cache {kv_mib} MiB) but {limit} leaves {left_mib} MiB{}; lower --kv-mem, raise --mem-limit or free memory",
        if *draining_mib > 0 { format!(" ({draining_mib} MiB held by unloaded models finishing requests)") } else { String::new() }
    )]
    OutOfMemory {
        name: String,
        need_mib: u64,
        weights_mib: u64,
        kv_mib: u64,
        limit: &'static str,
        left_mib: u64,
        draining_mib: u64,
    },
    #[error("the {lane} queue is full ({limit} requests waiting); retry later")]
    QueueFull { lane: &'static str, limit: usize },
    #[error("invalid parameters: {0}")]
    EngineParams(String),
    #[error("the server is shutting down; retry on another instance")]
    ShuttingDown,
    #[error("the engine stopped before the answer was complete")]
    EngineStopped,
    #[error("generation failed: {0}")]
    Generation(String),
    #[error("{0}")]
    Internal(String),
}

impl ServerError {
    pub fn status(&self) -> StatusCode {
        use ServerError::*;
        match self {
            EmptyBody | MalformedJson(_) | InvalidRequest(_) | Param(_) | EngineParams(_) => {
                StatusCode::BAD_REQUEST
            }
            Unauthorized => StatusCode::UNAUTHORIZED,
            OriginNotAllowed(_) | HostNotAllowed(_) => StatusCode::FORBIDDEN,
            UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            NoRoute { .. } | ModelNotFound(_) => StatusCode::NOT_FOUND,
            MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            OutOfMemory { .. } | ShuttingDown | EngineStopped => StatusCode::SERVICE_UNAVAILABLE,
            ModelLoad { .. } | Generation(_) | Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's error `type`.
    pub fn openai_type(&self) -> &'static str {
        use ServerError::*;
        match self {
            Unauthorized => "authentication_error",
            OriginNotAllowed(_) | HostNotAllowed(_) => "permission_error",
            QueueFull { .. } => "rate_limit_error",
            OutOfMemory { .. }
            | ShuttingDown
            | EngineStopped
            | ModelLoad { .. }
            | Generation(_)
            | Internal(_) => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// Anthropic's error `type`, which follows the status.
    pub fn anthropic_type(&self) -> &'static str {
        match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// OpenAI's error `code`.
    pub fn code(&self) -> Option<&'static str> {
        use ServerError::*;
        match self {
            Param(p) => p.code(),
            Unauthorized => Some("invalid_api_key"),
            ModelNotFound(_) => Some("model_not_found"),
            QueueFull { .. } => Some("queue_full"),
            BodyTooLarge { .. } => Some("request_too_large"),
            BodyTimeout { .. } => Some("request_timeout"),
            OriginNotAllowed(_) => Some("origin_not_allowed"),
            HostNotAllowed(_) => Some("host_not_allowed"),
            UnsupportedMediaType(_) => Some("unsupported_media_type"),
            ShuttingDown => Some("shutting_down"),
            _ => None,
        }
    }

    /// The request field at fault.
    pub fn param(&self) -> Option<&str> {
        match self {
            ServerError::Param(p) => Some(p.field()),
            ServerError::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    /// Seconds a client should wait before retrying (`Retry-After`).
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ServerError::QueueFull { .. } => Some(2),
            ServerError::OutOfMemory { .. } => Some(30),
            ServerError::ShuttingDown | ServerError::EngineStopped => Some(5),
            _ => None,
        }
    }

    /// Whether the connection should close after this answer (the request body may be
    /// partly unread).
    fn closes_connection(&self) -> bool {
        matches!(
            self,
            ServerError::BodyTooLarge { .. }
                | ServerError::BodyTimeout { .. }
                | ServerError::ShuttingDown
        )
    }

    /// The response body in `flavor`'s shape.
    pub fn body(&self, flavor: Flavor) -> Vec<u8> {
        #[derive(Serialize)]
        struct OpenAiBody<'a> {
            error: OpenAiDetail<'a>,
        }
        #[derive(Serialize)]
        struct OpenAiDetail<'a> {
            message: String,
            #[serde(rename = "type")]
            kind: &'static str,
            param: Option<&'a str>,
            code: Option<&'static str>,
        }
        #[derive(Serialize)]
        struct OllamaBody {
            error: String,
        }
        #[derive(Serialize)]
        struct AnthropicBody {
            #[serde(rename = "type")]
            kind: &'static str,
            error: AnthropicDetail,
        }
        #[derive(Serialize)]
        struct AnthropicDetail {
            #[serde(rename = "type")]
            kind: &'static str,
            message: String,
        }
        let out = match flavor {
            Flavor::OpenAi => serde_json::to_vec(&OpenAiBody {
                error: OpenAiDetail {
                    message: self.to_string(),
                    kind: self.openai_type(),
                    param: self.param(),
                    code: self.code(),
                },
            }),
            Flavor::Ollama => serde_json::to_vec(&OllamaBody {
                error: self.to_string(),
            }),
            Flavor::Anthropic => serde_json::to_vec(&AnthropicBody {
                kind: "error",
                error: AnthropicDetail {
                    kind: self.anthropic_type(),
                    message: self.to_string(),
                },
            }),
        };
        out.unwrap_or_default()
    }

    /// The full response in `flavor`'s shape.
    pub fn render(&self, flavor: Flavor) -> Response {
        let mut resp = Response::new(Body::from(self.body(flavor)));
        *resp.status_mut() = self.status();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(s) = self.retry_after() {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.closes_connection() {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

impl From<SubmitError> for ServerError {
    fn from(e: SubmitError) -> ServerError {
        match e {
            SubmitError::QueueFull { lane, limit } => ServerError::QueueFull {
                lane: lane.as_str(),
                limit,
            },
            // The server checks the context before submitting; this is the engine's own
            // guard, answered the same way.
            SubmitError::PromptTooLong { tokens, n_ctx } => {
                ServerError::Param(ParamError::PromptTooLong {
                    field: "prompt".into(),
                    prompt: tokens,
                    n_ctx,
                })
            }
            SubmitError::Params(p) => ServerError::EngineParams(p.to_string()),
            SubmitError::Stopped => ServerError::EngineStopped,
        }
    }
}

/// The error a response carries to the layer that renders it ([`crate::guard::finish`]).
#[derive(Clone, Debug)]
pub struct Pending(pub Arc<ServerError>);

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let mut resp = Response::new(Body::empty());
        *resp.status_mut() = self.status();
        resp.extensions_mut().insert(Pending(Arc::new(self)));
        resp
    }
}

/// Reads a typed request out of a JSON body, naming the field at fault.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ServerError> {
    from_value(&parse_body(body)?)
}

/// Parses a request body as JSON (syntax only).
pub fn parse_body(body: &[u8]) -> Result<serde_json::Value, ServerError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ServerError::EmptyBody);
    }
    serde_json::from_slice(body).map_err(|e| ServerError::MalformedJson(e.to_string()))
}

/// Reads a typed request out of parsed JSON, naming the field at fault: the path serde was
/// at (`messages[0].role`), or for a missing field, the field itself.
pub fn from_value<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<T, ServerError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        let at = |name: &str| {
            if path == "." {
                name.to_string()
            } else {
                format!("{path}.{name}")
            }
        };
        if let Some(name) = message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'))
        {
            return ParamError::Missing { field: at(name) }.into();
        }
        if path == "." {
            ServerError::InvalidRequest(message)
        } else {
            ParamError::Type {
                field: path,
                message,
            }
            .into()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        role: String,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Outer {
        model: String,
        messages: Vec<Inner>,
    }

    #[test]
    fn fields_are_named_by_path() {
        let e = parse_json::<Outer>(br#"{"model": "m", "messages": [{"role": 3}]}"#).unwrap_err();
        assert_eq!(e.param(), Some("messages[0].role"));
        let e = parse_json::<Outer>(br#"{"messages": []}"#).unwrap_err();
        assert_eq!(e.param(), Some("model"));
        assert_eq!(e.to_string(), "missing field 'model'");
        let e = parse_json::<Outer>(br#"{"model": "m", "messages": [{}]}"#).unwrap_err();
        assert_eq!(e.param(), Some("messages[0].role"));
        assert!(matches!(
            parse_json::<Outer>(b"  "),
            Err(ServerError::EmptyBody)
        ));
        assert!(matches!(
            parse_json::<Outer>(b"{"),
            Err(ServerError::MalformedJson(_))
        ));
    }

    #[test]
    fn shapes_per_family() {
        let e = ServerError::Param(ParamError::OutOfRange {
            field: "temperature".into(),
            min: 0.0,
            max: 2.0,
            got: -5.0,
        });
        let v: serde_json::Value = serde_json::from_slice(&e.body(Flavor::OpenAi)).unwrap();
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(
            v["error"]["message"],
            "temperature must be between 0 and 2, got -5"
        );
        let v: serde_json::Value = serde_json::from_slice(&e.body(Flavor::Ollama)).unwrap();
        assert_eq!(v["error"], "temperature must be between 0 and 2, got -5");
        assert_eq!(Flavor::for_path("/api/tags"), Flavor::Ollama);
        assert_eq!(Flavor::for_path("/apixyz"), Flavor::OpenAi);
        assert_eq!(Flavor::for_path("/v1/models"), Flavor::OpenAi);
        assert_eq!(Flavor::for_path("/v1/messages"), Flavor::Anthropic);
        assert_eq!(
            Flavor::for_path("/v1/messages/count_tokens"),
            Flavor::Anthropic
        );
        assert_eq!(Flavor::for_path("/v1/messagesx"), Flavor::OpenAi);
        let v: serde_json::Value = serde_json::from_slice(&e.body(Flavor::Anthropic)).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(
            v["error"]["message"],
            "temperature must be between 0 and 2, got -5"
        );
        let v: serde_json::Value =
            serde_json::from_slice(&ServerError::ModelNotFound("x".into()).body(Flavor::Anthropic))
                .unwrap();
        assert_eq!(v["error"]["type"], "not_found_error");
        let overloaded = ServerError::ShuttingDown.body(Flavor::Anthropic);
        let v: serde_json::Value = serde_json::from_slice(&overloaded).unwrap();
        assert_eq!(v["error"]["type"], "overloaded_error");
    }
}
