//! The chat page at `/`: static files built from `web/` (TypeScript bundled by esbuild, see
//! `web/build.sh`) and embedded in the binary, so the page works offline and needs nothing
//! but the server. The page holds no data: it is served without an API key
//! ([`crate::guard`] opens [`is_page`] paths) and asks the user for the key, which it sends
//! to the API routes like any other client; their auth and origin rules are unchanged.
//!
//! Every file carries a strong `ETag` (a SHA-256 of its bytes) and `Cache-Control:
//! no-cache`, so browsers revalidate on each load and get `304 Not Modified` until the
//! binary changes. The page gets a `Content-Security-Policy` that allows only its own script,
//! style and API calls: rendered model output that slipped past the sanitizer could still not
//! run script or load anything from elsewhere.

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// One embedded file.
struct Asset {
    path: &'static str,
    body: &'static [u8],
    content_type: &'static str,
}

const ASSETS: [Asset; 3] = [
    Asset {
        path: "/",
        body: include_bytes!("../web/dist/index.html"),
        content_type: "text/html; charset=utf-8",
    },
    Asset {
        path: "/app.js",
        body: include_bytes!("../web/dist/app.js"),
        content_type: "text/javascript; charset=utf-8",
    },
    Asset {
        path: "/app.css",
        body: include_bytes!("../web/dist/app.css"),
        content_type: "text/css; charset=utf-8",
    },
];

/// The page's policy: its own files and API only; `data:` for the empty favicon.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The quoted ETag of each of [`ASSETS`], in order.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = Sha256::digest(a.body);
            let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
            format!("\"{hex}\"")
        })
        .collect()
});

/// Whether `path` is one of the page's files (served without an API key).
pub fn is_page(path: &str) -> bool {
    ASSETS.iter().any(|a| a.path == path)
}

/// The page's routes (`GET` and `HEAD`).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS
        .iter()
        .fold(Router::new(), |r, a| r.route(a.path, get(serve)))
}

/// Whether an `If-None-Match` header value names `etag` (a list, weak tags, or `*`).
fn matches(if_none_match: &str, etag: &str) -> bool {
    if_none_match
        .split(',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == etag)
}

async fn serve(uri: Uri, req_headers: HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.path == uri.path()) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (asset, etag) = (&ASSETS[i], &ETAGS[i]);
    let fresh = req_headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches(v, etag));
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        asset.body.into_response()
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if !fresh {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
    }
    if asset.path == "/" {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_lists() {
        let tag = "\"abc\"";
        assert!(matches("\"abc\"", tag));
        assert!(matches("W/\"abc\"", tag));
        assert!(matches("\"x\", \"abc\"", tag));
        assert!(matches("*", tag));
        assert!(!matches("\"abd\"", tag));
        assert!(!matches("", tag));
    }

    #[test]
    fn pages_are_the_embedded_files() {
        assert!(is_page("/") && is_page("/app.js") && is_page("/app.css"));
        assert!(!is_page("/v1/models") && !is_page("/index.html") && !is_page("/app.js/"));
        // The page loads exactly the files served beside it.
        let html = std::str::from_utf8(ASSETS[0].body).unwrap();
        assert!(html.contains("src=\"app.js\"") && html.contains("href=\"app.css\""));
        assert_eq!(ETAGS.len(), ASSETS.len());
        assert_ne!(ETAGS[0], ETAGS[1]);
    }
}
