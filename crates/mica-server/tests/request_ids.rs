//! Request IDs and per-request records (`mica_server::reqlog`): the `X-Request-Id` response
//! header carries the client's ID or a new one, and the record the server reports when the
//! request ends has that ID, the model, lane, token counts, timings, finish reason and
//! status — for plain and streamed generations, and for a request that fails before
//! generating (with its error).

mod common;

use common::*;
use mica_server::reqlog::RequestRecord;
use mica_server::{AppState, ServerEvent};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn start_recording() -> (Server, Arc<Mutex<Vec<RequestRecord>>>) {
    start_recording_with(false)
}

fn start_recording_with(log_prompts: bool) -> (Server, Arc<Mutex<Vec<RequestRecord>>>) {
    let seen: Arc<Mutex<Vec<RequestRecord>>> = Arc::default();
    let s = seen.clone();
    let observer: mica_server::Observer = Arc::new(move |ev: &ServerEvent| {
        if let ServerEvent::Request(r) = ev {
            s.lock().unwrap().push(r.clone());
        }
    });
    let cfg = mica_server::ServerConfig {
        log_prompts,
        ..config(Default::default(), Vec::new())
    };
    let state = Arc::new(AppState::with_observer(cfg, Some(observer)));
    let st = state.clone();
    let server = serve_state(state, move || async move {
        st.preload(MODEL).await.expect("model loads");
    });
    (server, seen)
}

/// The record with `id`, waiting a little for it (a stream's is reported as it ends).
fn record(seen: &Mutex<Vec<RequestRecord>>, id: &str) -> RequestRecord {
    let t0 = Instant::now();
    loop {
        if let Some(r) = seen.lock().unwrap().iter().find(|r| r.id == id) {
            return r.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no record for {id}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn chat(stream: bool) -> String {
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello"}],
        "max_tokens": 5,
        "temperature": 0,
        "stream": stream,
    })
    .to_string()
}

#[test]
fn ids_reach_the_header_and_the_record() {
    let (server, seen) = start_recording();
    let json = [("Content-Type", "application/json")];

    // The client's ID is kept.
    let mut h = json.to_vec();
    h.push(("X-Request-Id", "client-abc-123"));
    let r = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &h,
        &chat(false),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-request-id"), Some("client-abc-123"));
    let rec = record(&seen, "client-abc-123");
    assert_eq!((rec.status, rec.model.as_str()), (200, MODEL));
    assert_eq!(rec.path, "/v1/chat/completions");
    assert_eq!(rec.lane, "interactive");
    assert_eq!(
        rec.generated_tokens,
        r.json()["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );
    assert_eq!(
        rec.prompt_tokens,
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap() as usize
    );
    assert!(rec.ttft_ms.is_some() && rec.total_ms >= rec.ttft_ms.unwrap());
    assert!(
        rec.finish == "length" || rec.finish == "stop",
        "{}",
        rec.finish
    );
    assert!(rec.error.is_none());
    // No text unless the server is configured to log it.
    assert!(rec.prompt.is_none() && rec.output.is_none());

    // Without one (or with an unusable one), the server makes one; a stream's record
    // comes when it ends.
    for hdr in [None, Some("has space")] {
        let mut h = json.to_vec();
        if let Some(v) = hdr {
            h.push(("X-Request-Id", v));
        }
        let r = request(server.addr, "POST", "/v1/chat/completions", &h, &chat(true));
        assert_eq!(r.status, 200);
        let id = r.header("x-request-id").expect("an id").to_string();
        assert!(id.starts_with("req-") && id.len() == 20, "{id}");
        let rec = record(&seen, &id);
        assert_eq!(rec.status, 200);
        assert!(rec.generated_tokens > 0);
    }

    // A request refused before generating: its record has the status and the cause.
    let bad = serde_json::json!({"model": MODEL, "messages": [], "max_tokens": -3}).to_string();
    let r = request(server.addr, "POST", "/v1/chat/completions", &json, &bad);
    assert_eq!(r.status, 400);
    let id = r.header("x-request-id").expect("an id").to_string();
    let rec = record(&seen, &id);
    assert_eq!(rec.status, 400);
    assert!(rec.error.as_deref().is_some_and(|e| !e.is_empty()));
    assert_eq!(rec.generated_tokens, 0);
    // Two IDs the server made differ.
    let ids: Vec<String> = seen.lock().unwrap().iter().map(|r| r.id.clone()).collect();
    let mut uniq = ids.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), ids.len(), "{ids:?}");
}

/// With `log_prompts`, a generation's record carries its prompt as the model saw it and
/// each completion's text, for plain and streamed requests.
#[test]
fn records_carry_text_when_asked() {
    let (server, seen) = start_recording_with(true);
    let json = [("Content-Type", "application/json")];
    for stream in [false, true] {
        let body = serde_json::json!({"model": MODEL, "prompt": "The capital of France is",
            "max_tokens": 6, "temperature": 0, "n": 2, "stream": stream})
        .to_string();
        let r = request(server.addr, "POST", "/v1/completions", &json, &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let id = r.header("x-request-id").expect("an id").to_string();
        let rec = record(&seen, &id);
        let prompt = rec.prompt.expect("the prompt's text");
        assert!(prompt.ends_with("The capital of France is"), "{prompt:?}");
        let out = rec.output.expect("the completions' text");
        assert_eq!(out.len(), 2);
        if !stream {
            assert_eq!(out[0], r.json()["choices"][0]["text"].as_str().unwrap());
        }
        assert!(!out[0].is_empty() && out[0] == out[1], "{out:?}");
    }
}

/// The live view lists a running stream under its ID; cancelling it ends the stream with
/// `abort`, frees its KV blocks and leaves its record; an unknown ID is a 404.
#[test]
fn live_view_lists_and_cancels_a_stream() {
    use std::io::BufReader;
    let (server, seen) = start_recording();
    let a = server.addr;
    let body = serde_json::json!({"model": MODEL, "prompt": "Once upon a time",
        "max_tokens": 1500, "temperature": 0.8, "seed": 1, "stream": true,
        "logit_bias": no_eog()});
    let s = send(
        a,
        "POST",
        "/v1/completions",
        &[
            ("X-Request-Id", "long-1"),
            ("Content-Type", "application/json"),
        ],
        &body.to_string(),
    );
    let mut r = BufReader::new(s);
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    for _ in 0..3 {
        read_chunk(&mut r).unwrap();
    }
    let list = get(a, "/admin/requests").json();
    let row = list["requests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == "long-1")
        .unwrap_or_else(|| panic!("not listed: {list}"))
        .clone();
    assert_eq!(row["state"], "generating");
    assert_eq!(row["model"], MODEL);
    assert_eq!(row["lane"], "interactive");
    assert!(row["generated_tokens"].as_u64().unwrap() >= 1);
    assert!(metric(a, "mica_kv_blocks_used", MODEL) > 0.0);

    let del = request(a, "DELETE", "/admin/requests/long-1", &[], "");
    assert_eq!(del.status, 200, "{}", del.body);
    let mut rest = String::new();
    while let Some(c) = read_chunk(&mut r) {
        rest.push_str(&c);
    }
    assert!(rest.contains("\"finish_reason\":\"abort\""), "{rest}");
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    let rec = record(&seen, "long-1");
    assert_eq!(rec.finish, "abort");
    let t = Instant::now();
    while metric(a, "mica_kv_blocks_used", MODEL) > 0.0 {
        assert!(t.elapsed() < Duration::from_secs(20), "blocks not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let list = get(a, "/admin/requests").json();
    assert_eq!(list["requests"].as_array().unwrap().len(), 0, "{list}");
    assert_eq!(
        request(a, "DELETE", "/admin/requests/long-1", &[], "").status,
        404
    );
}

/// A non-streaming request cancelled while it runs answers with what it generated and the
/// finish reason `abort`.
#[test]
fn a_cancelled_plain_request_answers_with_abort() {
    let (server, seen) = start_recording();
    let a = server.addr;
    let body = serde_json::json!({"model": MODEL, "prompt": "Once upon a time",
        "max_tokens": 1500, "temperature": 0.8, "seed": 2, "logit_bias": no_eog()})
    .to_string();
    let waiter = std::thread::spawn(move || {
        request(
            a,
            "POST",
            "/v1/completions",
            &[
                ("X-Request-Id", "long-2"),
                ("Content-Type", "application/json"),
            ],
            &body,
        )
    });
    let t = Instant::now();
    loop {
        let list = get(a, "/admin/requests").json();
        let row = list["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == "long-2")
            .cloned();
        if row.is_some_and(|r| r["generated_tokens"].as_u64().unwrap_or(0) > 2) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "never listed: {list}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        request(a, "DELETE", "/admin/requests/long-2", &[], "").status,
        200
    );
    let r = waiter.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "abort", "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 2);
    assert_eq!(record(&seen, "long-2").finish, "abort");
}
