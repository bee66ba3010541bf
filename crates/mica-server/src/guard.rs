//! The layers every request passes, outermost first:
//!
//! 1. [`finish`] gives the request its ID (`X-Request-Id`, [`crate::reqlog`]), renders any
//!    error a lower layer returned in the shape of the route's API family
//!    ([`crate::error`]), including axum's own 405, and counts responses by status.
//! 2. [`access`] decides who may call:
//!    - **Host** (DNS-rebinding defence): a page on `evil.example` whose name an attacker
//!      re-points at 127.0.0.1 reaches a loopback-bound server with `Host: evil.example`.
//!      With no `--allowed-hosts`, a server bound to a loopback address accepts only
//!      loopback names and addresses (`localhost`, `*.localhost`, `127.0.0.0/8`, `::1`); one
//!      bound elsewhere accepts any host (it is reachable directly anyway).
//!    - **Origin**: a browser request carries `Origin`; one from an origin not on the
//!      allow-list is refused (403) before any work, and CORS headers are only ever sent
//!      for allowed origins (preflights included). Requests without `Origin` are not from
//!      a browser page and pass.
//!    - **API key**: with keys configured, every route but the liveness probe `/health`, the
//!      chat page's files ([`crate::web`], which hold no data) and the configured open
//!      routes needs one (401).
//! 3. [`lifecycle`] counts requests in flight for shutdown, answers 503 while draining,
//!    and ends a request still waiting (a model load, a non-streaming answer) when the
//!    grace period runs out.

use crate::config::Access;
use crate::error::{Flavor, Pending, ServerError};
use crate::reqlog;
use crate::state::{AppState, InFlight, ServerEvent, fired};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The liveness probe: always open, never drained.
pub const LIVENESS: &str = "/health";
/// The readiness probe: answers 503 itself while loading or draining.
pub const READINESS: &str = "/ready";

/// Gives the request its ID ([`reqlog`]), renders pending errors per API family, counts
/// responses, and records requests that failed before generating.
pub async fn finish(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let flavor = Flavor::for_path(req.uri().path());
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let client_id = req
        .headers()
        .get(reqlog::HEADER)
        .and_then(|v| v.to_str().ok());
    let ctx = reqlog::Context {
        id: reqlog::id_for(client_id),
        method: method.to_string(),
        path: path.clone(),
        state: st.clone(),
    };
    let (id, started) = (ctx.id.clone(), std::time::Instant::now());
    let mut resp = reqlog::scope(ctx, next.run(req)).await;
    let pending = resp.extensions_mut().remove::<Pending>();
    if let Some(Pending(e)) = &pending {
        st.emit(ServerEvent::Request(reqlog::RequestRecord {
            id: id.clone(),
            method: method.to_string(),
            path: path.clone(),
            model: String::new(),
            lane: String::new(),
            prompt_tokens: 0,
            cached_tokens: 0,
            generated_tokens: 0,
            ttft_ms: None,
            total_ms: started.elapsed().as_secs_f64() * 1e3,
            finish: String::new(),
            status: e.status().as_u16(),
            error: Some(e.to_string()),
            prompt: None,
            output: None,
        }));
    }
    if let Some(Pending(e)) = pending {
        let mut out = e.render(flavor);
        for (k, v) in resp.headers() {
            out.headers_mut().entry(k).or_insert(v.clone());
        }
        resp = out;
    } else if resp.status() == StatusCode::METHOD_NOT_ALLOWED {
        let allow = resp.headers().get(header::ALLOW).cloned();
        resp = ServerError::MethodNotAllowed { method, path }.render(flavor);
        if let Some(a) = allow {
            resp.headers_mut().insert(header::ALLOW, a);
        }
    }
    st.count_response(resp.status().as_u16());
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(reqlog::HEADER, v);
    }
    resp
}

/// The host part of a `Host` header value, lower-cased, without the port.
fn host_name(host: &str) -> String {
    let h = host.trim().to_ascii_lowercase();
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_string();
    }
    match h.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name.to_string(),
        _ => h,
    }
}

fn is_loopback_name(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether a `Host` header passes (see the module docs).
pub fn host_allowed(access: &Access, bound: Option<SocketAddr>, host: &str) -> bool {
    let name = host_name(host);
    match &access.allowed_hosts {
        Some(list) => list.iter().any(|h| {
            let h = h.to_ascii_lowercase();
            h == "*"
                || h == name
                || h.strip_prefix("*.")
                    .is_some_and(|d| name.ends_with(&format!(".{d}")))
        }),
        None => match bound {
            Some(a) if a.ip().is_loopback() => is_loopback_name(&name),
            _ => true,
        },
    }
}

/// Whether an `Origin` passes the allow-list: an exact origin, `scheme://host:*` for any
/// port, or `*`.
pub fn origin_allowed(access: &Access, origin: &str) -> bool {
    let origin = origin.trim().to_ascii_lowercase();
    access.allowed_origins.iter().any(|rule| {
        let rule = rule.trim().trim_end_matches('/').to_ascii_lowercase();
        if rule == "*" || rule == origin {
            return true;
        }
        let Some(base) = rule.strip_suffix(":*") else {
            return false;
        };
        origin == base
            || origin
                .strip_prefix(base)
                .and_then(|p| p.strip_prefix(':'))
                .is_some_and(|port| !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()))
    })
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"))
}

fn cors_headers(h: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Retry-After, X-Request-Id"),
    );
}

/// Host, origin and API-key checks, CORS preflights and headers.
pub async fn access(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let access = &st.cfg.access;
    let headers = req.headers();
    if let Some(host) = header_str(headers, header::HOST)
        && !host_allowed(access, st.bound(), host)
    {
        return ServerError::HostNotAllowed(host_name(host)).into_response();
    }
    let origin = header_str(headers, header::ORIGIN).map(str::to_string);
    if let Some(o) = &origin
        && !origin_allowed(access, o)
    {
        return ServerError::OriginNotAllowed(o.clone()).into_response();
    }
    let preflight = req.method() == Method::OPTIONS
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if let (true, Some(o)) = (preflight, &origin) {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        cors_headers(h, o);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type, x-api-key, x-mica-priority"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        return resp;
    }
    let path = req.uri().path();
    let open = path == LIVENESS
        || crate::web::is_page(path)
        || access.open_routes.iter().any(|r| r == path);
    let mut resp = if open || st.authorized(headers) {
        next.run(req).await
    } else {
        ServerError::Unauthorized.into_response()
    };
    if let Some(o) = &origin {
        cors_headers(resp.headers_mut(), o);
    }
    resp
}

/// A response body that keeps its request counted in flight until it is done.
struct Counted {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// In-flight accounting, 503 while draining, and the end of waiting requests at the end of
/// the grace period.
pub async fn lifecycle(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == LIVENESS || path == READINESS {
        return next.run(req).await;
    }
    let Some(guard) = st.enter() else {
        return ServerError::ShuttingDown.into_response();
    };
    let mut abort = st.life.abort_signal();
    let mut resp = tokio::select! {
        r = next.run(req) => r,
        () = fired(&mut abort) => ServerError::ShuttingDown.into_response(),
    };
    if st.life.is_draining() {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp.map(|inner| {
        Body::new(Counted {
            inner,
            _guard: guard,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let a = Access::default();
        let lo: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "app.localhost:3",
            "[::1]:80",
            "127.3.4.5",
        ] {
            assert!(host_allowed(&a, Some(lo), ok), "{ok}");
        }
        for bad in ["evil.example:8080", "192.168.1.2", "localhost.evil.example"] {
            assert!(!host_allowed(&a, Some(lo), bad), "{bad}");
            assert!(host_allowed(&a, Some(any), bad), "{bad}");
        }
        let a = Access {
            allowed_hosts: Some(vec!["mica.internal".into(), "*.svc.local".into()]),
            ..Access::default()
        };
        assert!(host_allowed(&a, Some(any), "mica.internal:8080"));
        assert!(host_allowed(&a, Some(any), "x.ns.svc.local"));
        assert!(!host_allowed(&a, Some(any), "localhost"));
    }

    #[test]
    fn origins() {
        let a = Access::default();
        for ok in [
            "http://localhost:3000",
            "http://127.0.0.1",
            "https://[::1]:8443",
        ] {
            assert!(origin_allowed(&a, ok), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://localhost:80x",
            "null",
            "file://",
        ] {
            assert!(!origin_allowed(&a, bad), "{bad}");
        }
        let a = Access {
            allowed_origins: vec!["https://app.example".into()],
            ..Access::default()
        };
        assert!(origin_allowed(&a, "https://app.example"));
        assert!(!origin_allowed(&a, "https://app.example:444"));
        assert!(!origin_allowed(&a, "http://localhost:3000"));
    }
}
