//! `mica serve` with layer streaming: a server given a `--mem-budget` far below the model's
//! size streams its last layers (its log and `/metrics` say so) and answers greedy
//! completions (and embeddings) exactly as the same server fully resident — one at a time
//! and two batched together, in both stream modes, and when it streams on its own (over
//! `--mem-limit`) or loads on demand (`--models-dir`); a client gone mid-generation leaves
//! the stream in step for the next request; bad values and a budget too small are refused
//! before listening.

mod common;

use common::serve;
use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GEMMA: &str = "gemma3-270m-q4_k_m";
/// The model's resident estimate with the settings of [`ARGS`] is over 300 MiB: under
/// this budget it streams its last layers (under 200 MiB, its output head instead).
const BUDGET: &str = "240M";
/// A small KV cache, context and step, so that the estimate is mostly weights.
const ARGS: &[&str] = &[
    "-t",
    "2",
    "-c",
    "512",
    "--kv-mem",
    "16M",
    "--parallel",
    "4",
    "--batch-tokens",
    "160",
];
const PROMPTS: [&str; 2] = ["The capital of France is", "def fibonacci(n):"];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = ARGS.to_vec();
    v.extend_from_slice(extra);
    v
}

/// The whole response to `POST path` with `body`: (status, JSON body).
fn post(a: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let mut s = serve::send_post(a, path, body);
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A greedy completion's text.
fn complete(a: SocketAddr, prompt: &str) -> String {
    let body = json!({"model": GEMMA, "prompt": prompt, "max_tokens": 12, "temperature": 0});
    let (status, v) = post(a, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// The embedding of `text` (the embedding route's passes run beside the engine's).
fn embed(a: SocketAddr, text: &str) -> Vec<f64> {
    let (status, v) = post(a, "/v1/embeddings", &json!({"model": GEMMA, "input": text}));
    assert_eq!(status, 200, "{v}");
    let e = v["data"][0]["embedding"].as_array().unwrap();
    e.iter().map(|x| x.as_f64().unwrap()).collect()
}

/// [`complete`] for every prompt, one after the other, then all at once.
fn alone_and_together(a: SocketAddr) -> (Vec<String>, Vec<String>) {
    let alone = PROMPTS.iter().map(|p| complete(a, p)).collect();
    let together = std::thread::scope(|s| {
        let hs: Vec<_> = PROMPTS
            .iter()
            .map(|p| s.spawn(move || complete(a, p)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (alone, together)
}

/// The text of `GET /metrics`.
fn metrics(a: SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(a).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of a series in a `/metrics` text.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// A server killed when dropped, so that a failed assertion leaves none running.
struct Server(Option<Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// [`serve::start_logged`] (or, given `dir`, [`serve::start_dir_logged`]) as a [`Server`].
fn start(model: &std::path::Path, dir: bool, args: &[&str]) -> (Server, SocketAddr, serve::Log) {
    let (child, addr, log) = match dir {
        false => serve::start_logged(model, args),
        true => serve::start_dir_logged(model, args),
    };
    (Server(Some(child)), addr, log)
}

/// Stops the server with SIGTERM; it must exit cleanly.
fn stop(mut server: Server) {
    let mut child = server.0.take().unwrap();
    serve::signal(&child, libc::SIGTERM);
    assert!(serve::wait_exit(&mut child, Duration::from_secs(60)).success());
}

#[test]
fn streamed_greedy_completions_are_the_resident_servers() {
    let model = model_path(GEMMA);
    let (child, addr, log) = start(&model, false, ARGS);
    serve::wait_ready(addr);
    let (want, together) = alone_and_together(addr);
    assert!(want.iter().all(|t| !t.is_empty()), "{want:?}");
    let want_embedding = embed(addr, PROMPTS[1]);
    assert_eq!(together, want, "resident: batched differs from alone");
    assert!(
        !log.lines().iter().any(|l| l.contains("streaming")),
        "{:?}",
        log.lines()
    );
    assert_eq!(
        series(
            &metrics(addr),
            "mica_stream_layers{model=\"gemma3-270m-q4_k_m\"}"
        ),
        None
    );
    stop(child);

    // Overlapped: the last layers stream; sync, under a smaller budget: the output head (in
    // chunks of rows).
    for (mode, budget, what, head) in [
        ("overlapped", BUDGET, "layers ", 0.0),
        ("sync", "200M", "no layer and the output head", 1.0),
    ] {
        let extra = args(&["--mem-budget", budget, "--stream-mode", mode]);
        let (child, addr, log) = start(&model, false, &extra);
        serve::wait_ready(addr);
        let lines = log.lines();
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("streaming {GEMMA}: {what}")))
            .unwrap_or_else(|| panic!("{mode}: no streaming line: {lines:?}"));
        let budget = format!(
            "within a memory budget of {}.0 MiB",
            budget.trim_end_matches('M')
        );
        assert!(
            line.contains(&format!("({mode})"))
                && line.contains("read per forward pass")
                && line.contains(&budget),
            "{line}"
        );
        let (alone, together) = alone_and_together(addr);
        assert_eq!(alone, want, "{mode}: streamed output differs");
        assert_eq!(together, want, "{mode}: streamed batched output differs");
        // An embedding's passes (which stop before the head) beside a generation's.
        let (text, embedding) = std::thread::scope(|s| {
            let t = s.spawn(|| complete(addr, PROMPTS[0]));
            let e = embed(addr, PROMPTS[1]);
            (t.join().unwrap(), e)
        });
        assert_eq!(text, want[0], "{mode}: beside an embedding");
        assert_eq!(
            embedding, want_embedding,
            "{mode}: streamed embedding differs"
        );
        let m = metrics(addr);
        let layers = series(&m, "mica_stream_layers{model=\"gemma3-270m-q4_k_m\"}");
        assert!(layers.is_some_and(|n| (n >= 1.0) == (head == 0.0)), "{m}");
        let streams_head = series(&m, "mica_stream_head{model=\"gemma3-270m-q4_k_m\"}");
        assert_eq!(streams_head, Some(head), "{m}");
        let per_pass = series(
            &m,
            "mica_stream_bytes_per_pass{model=\"gemma3-270m-q4_k_m\"}",
        );
        let read = series(&m, "mica_stream_read_bytes{model=\"gemma3-270m-q4_k_m\"}");
        assert!(
            per_pass.is_some_and(|p| p > 1e6) && read >= per_pass,
            "{mode}: {m}"
        );
        stop(child);
    }

    // Without --mem-budget, a model over --mem-limit streams instead of being refused.
    let (child, addr, log) = start(&model, false, &args(&["--mem-limit", BUDGET]));
    serve::wait_ready(addr);
    assert!(
        log.lines()
            .iter()
            .any(|l| l.starts_with(&format!("streaming {GEMMA}: "))),
        "{:?}",
        log.lines()
    );
    assert_eq!(alone_and_together(addr), (want.clone(), want.clone()));
    stop(child);

    // Under --models-dir, a model loaded on its first request streams within the budget.
    let dir = scratch("stream-models");
    let link = dir.join(format!("{GEMMA}.gguf"));
    if !link.exists() {
        std::os::unix::fs::symlink(&model, &link).unwrap();
    }
    let (child, addr, log) = start(
        &dir,
        true,
        &args(&["--mem-budget", BUDGET, "--stream-mode", "sync"]),
    );
    assert_eq!(complete(addr, PROMPTS[0]), want[0]);
    assert!(
        log.lines()
            .iter()
            .any(|l| l.starts_with(&format!("streaming {GEMMA}: layers ")) && l.contains("(sync)")),
        "{:?}",
        log.lines()
    );
    stop(child);
}

/// Sends `body` as request `id`, reads its streaming response until `n` events arrived,
/// then drops the connection.
fn read_events_then_hang_up(a: SocketAddr, body: &Value, id: &str, n: usize) {
    let extra = format!("X-Request-Id: {id}\r\n");
    let s = serve::send_post_with(a, "/v1/completions", body, &extra);
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let mut events = 0;
    while events < n {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
        if line.starts_with("data: {") {
            events += 1;
        }
    }
    r.get_ref().shutdown(std::net::Shutdown::Both).unwrap();
}

#[test]
fn a_client_gone_mid_generation_leaves_the_stream_in_step() {
    let model = model_path(GEMMA);
    let (child, addr, log) = start(&model, false, &args(&["--mem-budget", BUDGET]));
    serve::wait_ready(addr);
    assert!(
        log.lines().iter().any(|l| l.contains("streaming ")),
        "{:?}",
        log.lines()
    );
    let want = complete(addr, PROMPTS[0]);
    let long = json!({
        "model": GEMMA, "prompt": "Once upon a time, in a small village,",
        "max_tokens": 200, "temperature": 0, "stream": true
    });
    // Gone after a few tokens, twice in a row (the second while the first may still be
    // winding down), then a request that must complete as before.
    read_events_then_hang_up(addr, &long, "gone-1", 3);
    read_events_then_hang_up(addr, &long, "gone-2", 2);
    assert_eq!(complete(addr, PROMPTS[0]), want);
    assert!(!complete(addr, PROMPTS[1]).is_empty());
    // Both disconnected requests were ended early, not generated to the end.
    let t = Instant::now();
    for id in ["gone-1", "gone-2"] {
        let line = loop {
            let found = log
                .lines()
                .into_iter()
                .find(|l| l.starts_with(&format!("request {id} ")));
            if let Some(l) = found {
                break l;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "{:?}", log.lines());
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!line.contains(" generated=200 "), "{line}");
    }
    stop(child);
}

/// `mica serve -m MODEL --port 0 ARGS`, which must exit (within a minute) with an error;
/// returns its stderr.
fn serve_refused(model: &str, extra: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mica"))
        .args(["serve", "-m", model, "--port", "0"])
        .args(extra)
        .env("MICA_HOME", scratch("home"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = serve::wait_exit(&mut child, Duration::from_secs(60));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{extra:?} started:\n{err}");
    assert!(
        !err.contains("panicked") && !err.contains("listening"),
        "{err}"
    );
    err
}

#[test]
fn bad_budgets_and_self_speculation_are_refused_clearly() {
    let m = model_path(GEMMA);
    let m = m.to_str().unwrap();
    for (extra, want) in [
        (
            &["--mem-budget", "lots"][..],
            "--mem-budget: cannot read size 'lots'",
        ),
        (
            &["--mem-budget", "0"],
            "--mem-budget: size '0' must be positive",
        ),
        (
            &["--mem-budget", "1G", "--stream-mode", "fast"],
            "--stream-mode: unknown stream mode \"fast\" (expected \"overlapped\" or \"sync\")",
        ),
        (
            &["--mem-budget", "40M"],
            "error: layer streaming: a memory budget of 40.0 MiB is too small even with every \
             layer and the output head streamed",
        ),
        (
            &[
                "--mem-budget",
                BUDGET,
                "--draft-model",
                m,
                "--draft-layers",
                "4",
            ],
            "--draft-layers: self-speculation runs a truncated copy",
        ),
    ] {
        let err = serve_refused(m, &args(extra));
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}
