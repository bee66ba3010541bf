//! `mica serve --log-format json`: every line the server writes to stderr is one JSON object;
//! each request's completion line carries the ID that its response returned in the
//! `X-Request-Id` header (the client's own, or one the server made), with its model, lane,
//! token counts, times, finish reason and status. Prompt text stays out of the log unless
//! `--log-prompts` asks for it.

mod common;

use common::serve;
use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";
const PROMPT: &str = "The quick brown fox jumps over the lazy dog. Then the fox";

/// Sends a completion request (with `id` as `X-Request-Id` when given) and returns the
/// response's `X-Request-Id` header and its JSON body.
fn complete(a: std::net::SocketAddr, id: Option<&str>) -> (String, Value) {
    let body = json!({"model": SMOLLM, "prompt": PROMPT, "max_tokens": 6, "temperature": 0});
    let extra = id.map_or(String::new(), |id| format!("X-Request-Id: {id}\r\n"));
    let s = serve::send_post_with(a, "/v1/completions", &body, &extra);
    let mut r = BufReader::new(s);
    let mut header_id = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("x-request-id")
        {
            header_id = v.trim().to_string();
        }
    }
    let mut rest = String::new();
    r.read_to_string(&mut rest).unwrap();
    (header_id, serde_json::from_str(&rest).expect("a JSON body"))
}

#[test]
fn json_log_lines_carry_the_response_request_id() {
    let model = model_path(SMOLLM);
    let (mut child, addr, log) =
        serve::start_logged(&model, &["-t", "2", "-c", "1024", "--log-format", "json"]);
    serve::wait_ready(addr);
    let (given, body_given) = complete(addr, Some("client-7f3a"));
    assert_eq!(given, "client-7f3a", "the client's ID comes back");
    let (made, body_made) = complete(addr, None);
    assert!(
        !made.is_empty() && made != given,
        "the server makes an ID: {made:?}"
    );
    serve::signal(&child, libc::SIGTERM);
    assert!(serve::wait_exit(&mut child, Duration::from_secs(60)).success());
    let lines = log.lines();

    let records: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        records
            .iter()
            .all(|r| r["event"].is_string() && r["ts"].is_f64())
    );
    assert!(records.iter().any(|r| r["event"] == "stopped"), "{lines:?}");
    for (id, body) in [(&given, &body_given), (&made, &body_made)] {
        let rec = records
            .iter()
            .find(|r| r["event"] == "request" && r["id"] == id.as_str())
            .unwrap_or_else(|| panic!("no request line with id {id}: {lines:?}"));
        assert_eq!(rec["status"], 200);
        assert_eq!(rec["path"], "/v1/completions");
        assert_eq!(rec["model"], SMOLLM);
        assert_eq!(rec["lane"], "interactive");
        assert_eq!(rec["finish"], body["choices"][0]["finish_reason"]);
        assert_eq!(rec["generated_tokens"], body["usage"]["completion_tokens"]);
        assert_eq!(rec["prompt_tokens"], body["usage"]["prompt_tokens"]);
        assert!(rec["ttft_ms"].as_f64().unwrap() <= rec["total_ms"].as_f64().unwrap());
        assert!(
            rec.get("prompt").is_none(),
            "prompt logged without --log-prompts"
        );
    }
    assert!(
        !lines.iter().any(|l| l.contains("lazy dog")),
        "prompt text in the log"
    );
}
