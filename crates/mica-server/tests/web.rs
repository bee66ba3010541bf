//! The chat page at `/` ([`mica_server::web`]): its three files are served without the API
//! key when the server has one (the API routes still need it), with their content types, a
//! strong `ETag` that turns a revalidation into `304 Not Modified`, `Cache-Control:
//! no-cache`, and the page's `Content-Security-Policy`; the origin rule still applies.

mod common;

use common::*;
use mica::engine::{Lane, SchedulerConfig};
use mica_server::ApiKey;

fn keyed() -> Server {
    start(config(
        SchedulerConfig::default(),
        vec![ApiKey {
            key: "s3cret".into(),
            lane: Lane::Interactive,
        }],
    ))
}

#[test]
fn page_files_are_served_without_the_key() {
    let srv = keyed();
    let a = srv.addr;
    for (path, ctype, needle) in [
        ("/", "text/html; charset=utf-8", "<title>mica chat</title>"),
        (
            "/app.js",
            "text/javascript; charset=utf-8",
            "v1/chat/completions",
        ),
        ("/app.css", "text/css; charset=utf-8", "#composer"),
    ] {
        let r = get(a, path);
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        assert_eq!(r.header("content-type"), Some(ctype), "{path}");
        assert_eq!(r.header("cache-control"), Some("no-cache"), "{path}");
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert!(r.body.contains(needle), "{path} lacks {needle:?}");
        let etag = r.header("etag").expect("an ETag").to_string();
        assert!(etag.starts_with('"') && etag.len() == 34, "{path}: {etag}");
        let again = request(a, "GET", path, &[("If-None-Match", &etag)], "");
        assert_eq!(again.status, 304, "{path} revalidated");
        assert!(again.body.is_empty());
        assert_eq!(again.header("etag"), Some(etag.as_str()));
        let stale = request(a, "GET", path, &[("If-None-Match", "\"0\"")], "");
        assert_eq!(stale.status, 200, "{path} with another ETag");
    }
    let csp = get(a, "/")
        .header("content-security-policy")
        .map(str::to_string);
    let csp = csp.expect("the page has a CSP");
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    // The API and every other path still need the key.
    for path in ["/v1/models", "/index.html", "/app.js.map", "/metrics"] {
        assert_eq!(get(a, path).status, 401, "GET {path}");
    }
    let auth = [("Authorization", "Bearer s3cret")];
    assert_eq!(request(a, "GET", "/v1/models", &auth, "").status, 200);
    assert_eq!(request(a, "POST", "/", &[], "{}").status, 405);
}

#[test]
fn page_keeps_the_origin_rule() {
    let srv = keyed();
    let a = srv.addr;
    let r = request(a, "GET", "/", &[("Origin", "http://evil.example")], "");
    assert_eq!(r.status, 403, "{}", r.body);
    let own = format!("http://{a}");
    let r = request(a, "GET", "/", &[("Origin", own.as_str())], "");
    assert_eq!(r.status, 200);
}
