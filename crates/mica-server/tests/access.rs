//! Who may call the server, and the shape of what it refuses: with a key set every route but
//! `/health` answers 401 without it (configured open routes excepted); a browser request
//! from a foreign `Origin` is refused before any work and gets no CORS headers, a foreign
//! `Host` (DNS rebinding) likewise; a body that is not JSON gets 415; every error status
//! (404, 405, 413 included) has the API family's shape; a 404 lists no models;
//! `GET /v1/models/{id}` answers.

mod common;

use common::*;
use mica::engine::{Lane, SchedulerConfig};
use mica_server::{Access, ApiKey, ServerConfig};
use serde_json::{Value, json};

const GETS: &[&str] = &[
    "/ready",
    "/metrics",
    "/v1/models",
    "/v1/models/x",
    "/api/tags",
    "/api/ps",
    "/api/version",
    "/nowhere",
    "/api/nowhere",
];
const POSTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/api/generate",
    "/api/chat",
    "/api/show",
];

fn keyed(open_routes: &[&str]) -> ServerConfig {
    let mut cfg = config(
        SchedulerConfig::default(),
        vec![ApiKey {
            key: "s3cret".into(),
            lane: Lane::Interactive,
        }],
    );
    cfg.access.open_routes = open_routes.iter().map(|s| s.to_string()).collect();
    cfg
}

/// Whether `v` is the error shape of the route `path`'s family.
fn assert_shape(path: &str, r: &Resp) {
    let v = r.json();
    if path.starts_with("/api/") {
        assert!(v["error"].is_string(), "{path}: Ollama shape: {}", r.body);
    } else {
        assert!(
            v["error"]["message"].is_string(),
            "{path}: OpenAI shape: {}",
            r.body
        );
        assert!(v["error"]["type"].is_string(), "{path}: {}", r.body);
    }
    assert_eq!(r.header("content-type"), Some("application/json"), "{path}");
}

#[test]
fn every_route_but_liveness_needs_the_key() {
    let srv = start(keyed(&[]));
    let a = srv.addr;
    let body =
        json!({"model": MODEL, "prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]})
            .to_string();
    for path in GETS {
        let r = get(a, path);
        assert_eq!(r.status, 401, "GET {path}: {}", r.body);
        assert_shape(path, &r);
        assert!(
            !r.body.contains(MODEL),
            "GET {path} leaks the model: {}",
            r.body
        );
    }
    for path in POSTS {
        let r = request(a, "POST", path, &[], &body);
        assert_eq!(r.status, 401, "POST {path}: {}", r.body);
        assert_shape(path, &r);
    }
    let r = get(a, "/v1/models");
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    // Liveness is open, and says nothing about the models.
    let r = get(a, "/health");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ok"}));
    // With the key, every listing answers (Bearer or X-Api-Key).
    for (k, v) in [("Authorization", "Bearer s3cret"), ("X-Api-Key", "s3cret")] {
        for path in ["/api/tags", "/api/ps", "/v1/models", "/metrics", "/ready"] {
            let r = request(a, "GET", path, &[(k, v)], "");
            assert_eq!(r.status, 200, "GET {path} with {k}: {}", r.body);
        }
    }
    let r = request(
        a,
        "GET",
        "/api/tags",
        &[("Authorization", "Bearer wrong")],
        "",
    );
    assert_eq!(r.status, 401);
}

#[test]
fn open_routes_are_configurable() {
    let srv = start(keyed(&["/metrics", "/ready"]));
    let a = srv.addr;
    assert_eq!(get(a, "/metrics").status, 200);
    assert_eq!(get(a, "/ready").status, 200);
    assert_eq!(get(a, "/api/tags").status, 401);
    assert_eq!(get(a, "/v1/models").status, 401);
}

fn complete_with(a: std::net::SocketAddr, headers: &[(&str, &str)], content_type: &str) -> Resp {
    let body =
        json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}).to_string();
    let mut hs = vec![("Content-Type", content_type)];
    hs.extend_from_slice(headers);
    request_raw(a, "POST", "/v1/completions", &hs, &body)
}

#[test]
fn foreign_origins_and_hosts_are_refused() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    // The attack the issue reproduced: a text/plain "simple" POST from a foreign page.
    let evil = [("Origin", "http://evil.example")];
    for ct in ["text/plain", "application/json"] {
        let r = complete_with(a, &evil, ct);
        assert_eq!(r.status, 403, "{ct}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "origin_not_allowed");
        assert!(r.header("access-control-allow-origin").is_none());
    }
    assert_eq!(
        metric(a, "mica_generated_tokens_total", MODEL),
        0.0,
        "a refused request generated nothing"
    );
    // Not JSON, without an Origin: 415.
    let r = complete_with(a, &[], "text/plain");
    assert_eq!(r.status, 415, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "unsupported_media_type");
    let r = request_raw(
        a,
        "POST",
        "/api/generate",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        "{}",
    );
    assert_eq!(r.status, 415);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("application/json")
    );
    // A page on a loopback origin may call, and gets CORS headers.
    let local = [("Origin", "http://localhost:5173")];
    let r = complete_with(a, &local, "application/json");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:5173")
    );
    // Preflights: allowed for loopback origins, refused for others.
    let pre = |origin: &str| {
        request_raw(
            a,
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "content-type, authorization",
                ),
            ],
            "",
        )
    };
    let r = pre("http://127.0.0.1:3000");
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://127.0.0.1:3000")
    );
    assert!(
        r.header("access-control-allow-methods")
            .unwrap()
            .contains("POST")
    );
    assert!(
        r.header("access-control-allow-headers")
            .unwrap()
            .contains("authorization")
    );
    let r = pre("http://evil.example");
    assert_eq!(r.status, 403);
    assert!(r.header("access-control-allow-origin").is_none());
    // DNS rebinding: a foreign name pointing at 127.0.0.1 arrives with its own Host.
    let r = request_raw(a, "GET", "/v1/models", &[("Host", "evil.example:8080")], "");
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "host_not_allowed");
    let r = request_raw(a, "GET", "/api/tags", &[("Host", "evil.example")], "");
    assert_eq!(r.status, 403);
    assert!(r.json()["error"].is_string());
    let r = request_raw(a, "GET", "/v1/models", &[("Host", "localhost:1234")], "");
    assert_eq!(r.status, 200);
}

#[test]
fn a_configured_origin_list_replaces_the_loopback_default() {
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.access = Access {
        allowed_origins: vec!["https://app.example".into()],
        allowed_hosts: Some(vec!["127.0.0.1".into()]),
        ..Access::default()
    };
    let srv = start(cfg);
    let a = srv.addr;
    let r = complete_with(a, &[("Origin", "https://app.example")], "application/json");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let r = complete_with(
        a,
        &[("Origin", "http://localhost:3000")],
        "application/json",
    );
    assert_eq!(r.status, 403);
    let r = request_raw(a, "GET", "/v1/models", &[("Host", "localhost:1")], "");
    assert_eq!(r.status, 403, "only the listed host");
}

#[test]
fn every_error_status_has_its_family_shape() {
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.limits.max_body = 1024;
    let srv = start(cfg);
    let a = srv.addr;
    // 404 routes.
    let r = get(a, "/v1/nope");
    assert_eq!(r.status, 404);
    assert_shape("/v1/nope", &r);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Invalid URL")
    );
    let r = get(a, "/api/nope");
    assert_eq!(r.status, 404);
    assert_shape("/api/nope", &r);
    // 405 with Allow.
    for path in ["/v1/chat/completions", "/api/generate"] {
        let r = get(a, path);
        assert_eq!(r.status, 405, "{path}");
        assert_shape(path, &r);
        assert!(r.header("allow").unwrap().contains("POST"), "{path}");
    }
    // 413, declared and chunked.
    let big = json!({"model": MODEL, "prompt": "x".repeat(2000)}).to_string();
    for path in ["/v1/completions", "/api/generate"] {
        let r = post(a, path, &serde_json::from_str::<Value>(&big).unwrap());
        assert_eq!(r.status, 413, "{path}: {}", r.body);
        assert_shape(path, &r);
    }
    let r = post_chunked(a, "/v1/completions", &big);
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "request_too_large");
    // 404 for a model names the model asked for, not the ones served.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": "nope", "prompt": "x"}),
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    assert_eq!(r.json()["error"]["param"], "model");
    assert!(!r.body.contains(MODEL), "{}", r.body);
    let r = post(a, "/api/generate", &json!({"model": "nope", "prompt": "x"}));
    assert_eq!(r.status, 404);
    assert!(!r.body.contains(MODEL), "{}", r.body);
    // GET /v1/models/{id}.
    let r = get(a, &format!("/v1/models/{MODEL}"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["id"], MODEL);
    assert_eq!(r.json()["object"], "model");
    let r = get(a, "/v1/models/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    // Malformed JSON and an empty body.
    let r = request(a, "POST", "/api/chat", &[], "{");
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("malformed JSON")
    );
}
