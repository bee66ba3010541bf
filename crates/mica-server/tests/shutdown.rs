//! Graceful shutdown in-process (what SIGTERM and SIGINT start in `mica serve`; the signal
//! itself is tested on the binary in `mica-cli/tests/serve_signals.rs`): while draining,
//! new requests get 503 and `/ready` says so while `/health` stays up; streams that finish
//! within the grace period finish normally; at its end, every stream still running ends
//! with a final event carrying the finish reason `abort` (SSE `[DONE]`, NDJSON `done`),
//! a waiting non-streaming request gets 503, and `serve` returns.

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use serde_json::{Value, json};
use std::io::BufReader;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A stream in flight: its reader and whether it is NDJSON (Ollama) or SSE.
struct Open {
    r: BufReader<TcpStream>,
    ndjson: bool,
    raw: String,
}

/// The bodies of eight streams of every kind, each asking for `max_tokens` and none able to
/// stop early (see [`no_eog`]).
fn stream_bodies(max_tokens: usize) -> Vec<(&'static str, Value)> {
    let msgs = json!([{"role": "user", "content": "Tell me a long story about a lighthouse."}]);
    let bias = no_eog();
    let mut v = Vec::new();
    for i in 0..3 {
        v.push((
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": msgs, "max_tokens": max_tokens, "stream": true,
                   "seed": i, "stream_options": {"include_usage": true}, "logit_bias": bias}),
        ));
        v.push((
            "/v1/completions",
            json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens,
                   "stream": true, "seed": i, "n": 1 + i % 2, "logit_bias": bias}),
        ));
    }
    v.push((
        "/api/generate",
        json!({"model": MODEL, "prompt": "Why is the sky blue?",
               "options": {"num_predict": max_tokens, "logit_bias": bias}}),
    ));
    v.push((
        "/api/chat",
        json!({"model": MODEL, "messages": msgs,
               "options": {"num_predict": max_tokens, "logit_bias": bias}}),
    ));
    v
}

/// Starts every stream and reads its first piece.
fn open_streams(a: SocketAddr, bodies: &[(&'static str, Value)]) -> Vec<Open> {
    bodies
        .iter()
        .map(|(path, body)| {
            let s = send(a, "POST", path, &[], &body.to_string());
            let mut r = BufReader::new(s);
            let (status, _) = read_head(&mut r);
            assert_eq!(status, 200, "{path}");
            let first = read_chunk(&mut r).expect("a first chunk");
            Open {
                r,
                ndjson: path.starts_with("/api/"),
                raw: first,
            }
        })
        .collect()
}

/// Reads a stream to its end and returns the finish reasons of its completions (SSE) or
/// its `done_reason` (NDJSON), checking that it ended with its final event.
fn finish(mut o: Open) -> Vec<String> {
    while let Some(c) = read_chunk(&mut o.r) {
        o.raw.push_str(&c);
    }
    if o.ndjson {
        let last: Value = serde_json::from_str(o.raw.lines().last().unwrap()).unwrap();
        assert_eq!(last["done"], true, "NDJSON ends done: {}", o.raw);
        assert!(last["eval_count"].as_u64().is_some(), "{last}");
        return vec![last["done_reason"].as_str().unwrap().to_string()];
    }
    assert!(
        o.raw.ends_with("data: [DONE]\n\n"),
        "SSE ends with [DONE]: {:?}",
        o.raw
    );
    o.raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn at_the_end_of_the_grace_period_every_stream_gets_its_final_event() {
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.kv_mem = 256 << 20;
    cfg.limits.shutdown_grace = Duration::from_secs(2);
    let mut srv = start(cfg);
    let a = srv.addr;
    let bodies = stream_bodies(1500);
    let open = open_streams(a, &bodies);
    // One non-streaming request in flight too.
    let waiting = std::thread::spawn(move || {
        post(
            a,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "Once", "max_tokens": 1500, "logit_bias": no_eog()}),
        )
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    srv.shutdown();
    std::thread::sleep(Duration::from_millis(200));
    // Draining: new work refused, readiness down, liveness up.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Hi"}),
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "shutting_down");
    assert!(r.header("retry-after").is_some());
    let r = post(a, "/api/generate", &json!({"model": MODEL, "prompt": "Hi"}));
    assert_eq!(r.status, 503);
    assert!(r.json()["error"].is_string());
    let r = get(a, "/ready");
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (503, json!("draining"))
    );
    assert_eq!(get(a, "/health").status, 200);
    for (o, (path, body)) in open.into_iter().zip(&bodies) {
        let reasons = finish(o);
        let n = body["n"].as_u64().unwrap_or(1) as usize;
        assert_eq!(reasons, vec!["abort"; n], "{path}");
    }
    let r = waiting.join().unwrap();
    assert_eq!(r.status, 503, "{}", r.body);
    srv.wait(Duration::from_secs(15)).expect("serve returns Ok");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(10),
        "drain took {took:?} with a 2 s grace"
    );
}

#[test]
fn streams_that_finish_within_the_grace_period_finish_normally() {
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.limits.shutdown_grace = Duration::from_secs(60);
    let mut srv = start(cfg);
    let a = srv.addr;
    let bodies = stream_bodies(24);
    let open = open_streams(a, &bodies);
    let t = Instant::now();
    srv.shutdown();
    for (o, (path, _)) in open.into_iter().zip(&bodies) {
        for r in finish(o) {
            assert!(r == "length" || r == "stop", "{path}: {r}");
        }
    }
    srv.wait(Duration::from_secs(30)).expect("serve returns Ok");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "serve returned once the streams were done, not at the end of the grace period"
    );
}
