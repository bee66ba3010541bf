//! `mica serve` and the signals that stop it (what Kubernetes, systemd and Docker send):
//! SIGTERM with eight streams in flight ends every stream with its final event (finish
//! reason `abort` after `--shutdown-grace`, then `[DONE]` / `done: true`) and exits 0;
//! SIGINT drains the same way, letting streams that finish in time finish normally.

mod common;

use common::model_path;
use common::serve::{send_post, signal, wait_exit};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::time::Duration;

const MODEL: &str = "smollm2-135m-instruct-q4_1";

/// Starts `mica serve` on a free port and waits until it is ready; returns the child and
/// its address.
fn serve(grace: &str) -> (Child, SocketAddr) {
    let (child, addr) = common::serve::start(
        &model_path(MODEL),
        &[
            "-t",
            "2",
            "-c",
            "2048",
            "--kv-mem",
            "256M",
            "--shutdown-grace",
            grace,
        ],
    );
    common::serve::wait_ready(addr);
    (child, addr)
}

/// A streaming request: reads the head and the first chunk.
struct Stream {
    r: BufReader<TcpStream>,
    raw: String,
    ndjson: bool,
}

fn read_chunk(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut size = String::new();
    r.read_line(&mut size).ok()?;
    let n = usize::from_str_radix(size.trim(), 16).ok()?;
    if n == 0 {
        return None;
    }
    let mut buf = vec![0u8; n + 2];
    r.read_exact(&mut buf).ok()?;
    buf.truncate(n);
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn open(a: SocketAddr, path: &str, body: &Value) -> Stream {
    let mut r = BufReader::new(send_post(a, path, body));
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains(" 200 "), "{path}: {line}");
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
    }
    let first = read_chunk(&mut r).expect("a first chunk");
    Stream {
        r,
        raw: first,
        ndjson: path.starts_with("/api/"),
    }
}

/// Reads a stream to its end; returns its finish reasons, checking its final event.
fn finish(mut s: Stream) -> Vec<String> {
    while let Some(c) = read_chunk(&mut s.r) {
        s.raw.push_str(&c);
    }
    if s.ndjson {
        let last: Value = serde_json::from_str(s.raw.lines().last().unwrap()).unwrap();
        assert_eq!(last["done"], true, "{}", s.raw);
        return vec![last["done_reason"].as_str().unwrap().to_string()];
    }
    assert!(s.raw.ends_with("data: [DONE]\n\n"), "{:?}", s.raw);
    s.raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// Streams of every kind, each asking for `max_tokens`; a `logit_bias` bans SmolLM2's
/// end-of-generation tokens (0, 2 and 4), so no sampled stream can end on its own before
/// the grace period does, whatever the SIMD tier's rounding makes of the seed.
fn streams(a: SocketAddr, max_tokens: usize, count: usize) -> Vec<Stream> {
    let msgs = json!([{"role": "user", "content": "Tell me a long story."}]);
    let bias = json!({"0": -100, "2": -100, "4": -100});
    (0..count)
        .map(|i| match i % 4 {
            0 => open(
                a,
                "/v1/chat/completions",
                &json!({"model": MODEL, "messages": msgs, "max_tokens": max_tokens, "stream": true, "seed": i, "logit_bias": bias}),
            ),
            1 => open(
                a,
                "/v1/completions",
                &json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": true, "seed": i, "logit_bias": bias}),
            ),
            2 => open(
                a,
                "/api/generate",
                &json!({"model": MODEL, "prompt": "Why is the sky blue?", "options": {"num_predict": max_tokens, "seed": i, "logit_bias": bias}}),
            ),
            _ => open(
                a,
                "/api/chat",
                &json!({"model": MODEL, "messages": msgs, "options": {"num_predict": max_tokens, "seed": i, "logit_bias": bias}}),
            ),
        })
        .collect()
}

#[test]
fn sigterm_with_eight_streams_in_flight_ends_each_with_its_final_event_and_exits_0() {
    let (mut child, a) = serve("2s");
    let open = streams(a, 1500, 8);
    signal(&child, libc::SIGTERM);
    for s in open {
        let reasons = finish(s);
        assert_eq!(reasons, ["abort"], "every stream ends with its final event");
    }
    let status = wait_exit(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn sigint_lets_streams_that_finish_in_time_finish() {
    // A grace far longer than 4 × 16 tokens take even on a loaded machine (debug build).
    let (mut child, a) = serve("600s");
    let open = streams(a, 16, 4);
    signal(&child, libc::SIGINT);
    for s in open {
        for r in finish(s) {
            assert!(r == "length" || r == "stop", "{r}");
        }
    }
    let status = wait_exit(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status:?}");
}
