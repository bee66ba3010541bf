//! Reading a request body: [`JsonBody`] checks the `Content-Type` (JSON only, so a browser
//! cannot smuggle a request in as a "simple" `text/plain` or form post), refuses bodies over
//! the configured limit (413, before reading when `Content-Length` says so) and bodies that
//! do not arrive in time (408: a client that sends half a body is not held).

use crate::error::ServerError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::sync::Arc;

/// A request's raw JSON body, read under the server's limits.
pub struct JsonBody(pub Bytes);

/// Whether a `Content-Type` value is JSON (`application/json`, or `application/*+json`),
/// parameters such as `charset` allowed.
pub fn is_json(content_type: &str) -> bool {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// Checks the `Content-Type` header of a request with a body.
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ServerError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    match ct {
        Some(ct) if is_json(&ct) => Ok(()),
        Some(ct) => Err(ServerError::UnsupportedMediaType(ct)),
        None => Err(ServerError::UnsupportedMediaType("(none)".into())),
    }
}

impl FromRequest<Arc<AppState>> for JsonBody {
    type Rejection = ServerError;

    async fn from_request(req: Request, st: &Arc<AppState>) -> Result<Self, ServerError> {
        check_content_type(req.headers())?;
        let limits = &st.cfg.limits;
        let limit = limits.max_body;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(ServerError::BodyTooLarge { limit });
        }
        let read = Limited::new(req.into_body(), limit).collect();
        match tokio::time::timeout(limits.body_timeout, read).await {
            Err(_) => Err(ServerError::BodyTimeout {
                secs: limits.body_timeout.as_secs_f64(),
            }),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                Err(ServerError::BodyTooLarge { limit })
            }
            Ok(Err(e)) => Err(ServerError::InvalidRequest(format!(
                "cannot read the request body: {e}"
            ))),
            Ok(Ok(c)) => Ok(JsonBody(c.to_bytes())),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/vnd.api+json",
        ] {
            assert!(super::is_json(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
        ] {
            assert!(!super::is_json(bad), "{bad}");
        }
    }
}
