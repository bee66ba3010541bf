//! Validation parity: every sampling field follows one rule on both APIs, and each bad value
//! is a 400 naming the field in the API's own naming (`param` under `/v1`, the message
//! under `/api`); out-of-range `top_logprobs` / `logprobs` are refused rather than clamped;
//! roles are checked; a prompt plus the requested tokens beyond the context is a 400 with
//! the numbers, while a request without a length gets the room its prompt leaves.

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use serde_json::{Value, json};

/// (field, bad value) for every sampling field both APIs share.
fn sampling_cases() -> Vec<(&'static str, Value)> {
    vec![
        ("temperature", json!(-5)),
        ("temperature", json!(2.5)),
        ("top_p", json!(1.5)),
        ("top_k", json!(-1)),
        ("min_p", json!(2)),
        ("repeat_penalty", json!(0)),
        ("repeat_last_n", json!(-2)),
        ("presence_penalty", json!(3)),
        ("frequency_penalty", json!(-3)),
        ("seed", json!("lucky")),
        ("stop", json!(vec!["x"; 17])),
    ]
}

fn openai_param(a: std::net::SocketAddr, path: &str, body: Value) -> (String, String) {
    let r = post(a, path, &body);
    assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{}", r.body);
    (
        v["error"]["param"].as_str().unwrap_or("").to_string(),
        v["error"]["message"].as_str().unwrap().to_string(),
    )
}

fn ollama_message(a: std::net::SocketAddr, path: &str, body: Value) -> String {
    let r = post(a, path, &body);
    assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
    r.json()["error"]
        .as_str()
        .unwrap_or_else(|| panic!("Ollama shape: {}", r.body))
        .to_string()
}

fn with(mut v: Value, key: &str, val: Value) -> Value {
    v[key] = val;
    v
}

#[test]
fn each_bad_value_is_a_400_naming_the_field_on_both_apis() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    let chat =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let completion = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2});
    let ogen = json!({"model": MODEL, "prompt": "Hi", "stream": false});
    let ochat =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": false});
    for (field, bad) in sampling_cases() {
        for (path, base) in [
            ("/v1/chat/completions", &chat),
            ("/v1/completions", &completion),
        ] {
            let (param, msg) = openai_param(a, path, with(base.clone(), field, bad.clone()));
            assert_eq!(param, field, "{path} {field}={bad}: {msg}");
        }
        for (path, base) in [("/api/generate", &ogen), ("/api/chat", &ochat)] {
            let body = with(base.clone(), "options", json!({ field: bad }));
            let msg = ollama_message(a, path, body);
            assert!(
                msg.contains(&format!("options.{field}")),
                "{path} {field}={bad}: {msg}"
            );
        }
    }
    // One value, one message: the same text on both APIs but for the field's prefix.
    let (_, o) = openai_param(
        a,
        "/v1/completions",
        with(completion.clone(), "temperature", json!(-5)),
    );
    let l = ollama_message(
        a,
        "/api/generate",
        with(ogen.clone(), "options", json!({"temperature": -5})),
    );
    assert_eq!(format!("options.{o}"), l);

    // OpenAI-only fields.
    for (path, base, field, bad) in [
        ("/v1/chat/completions", &chat, "n", json!(0)),
        ("/v1/chat/completions", &chat, "n", json!(17)),
        ("/v1/chat/completions", &chat, "max_tokens", json!(0)),
        (
            "/v1/chat/completions",
            &chat,
            "max_completion_tokens",
            json!(-1),
        ),
        ("/v1/completions", &completion, "logprobs", json!(1000)),
        ("/v1/completions", &completion, "logprobs", json!(-1)),
        ("/v1/completions", &completion, "prompt", json!("")),
        ("/v1/chat/completions", &chat, "messages", json!([])),
        ("/v1/chat/completions", &chat, "priority", json!("urgent")),
    ] {
        let (param, msg) = openai_param(a, path, with(base.clone(), field, bad.clone()));
        assert_eq!(param, field, "{path} {field}={bad}: {msg}");
    }
    let (param, _) = openai_param(
        a,
        "/v1/chat/completions",
        with(
            with(chat.clone(), "logprobs", json!(true)),
            "top_logprobs",
            json!(21),
        ),
    );
    assert_eq!(param, "top_logprobs");
    let (param, _) = openai_param(
        a,
        "/v1/chat/completions",
        with(chat.clone(), "top_logprobs", json!(3)),
    );
    assert_eq!(param, "top_logprobs", "top_logprobs needs logprobs: true");
    // Roles.
    let (param, msg) = openai_param(
        a,
        "/v1/chat/completions",
        with(
            chat.clone(),
            "messages",
            json!([{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]),
        ),
    );
    assert_eq!(param, "messages[1].role");
    assert!(msg.contains("wizard"), "{msg}");
    let (param, _) = openai_param(
        a,
        "/v1/chat/completions",
        with(
            chat.clone(),
            "messages",
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        ),
    );
    assert_eq!(param, "messages[0].content[0].type");
    let msg = ollama_message(
        a,
        "/api/chat",
        with(
            ochat.clone(),
            "messages",
            json!([{"role": "wizard", "content": "b"}]),
        ),
    );
    assert!(
        msg.contains("messages[0].role") && msg.contains("wizard"),
        "{msg}"
    );
    // Ollama-only fields.
    for (field, bad) in [
        ("num_predict", json!(0)),
        ("num_predict", json!(-3)),
        ("num_ctx", json!(0)),
    ] {
        let msg = ollama_message(
            a,
            "/api/generate",
            with(ogen.clone(), "options", json!({ field: bad })),
        );
        assert!(
            msg.contains(&format!("options.{field}")),
            "{field}={bad}: {msg}"
        );
    }
    // Valid edge values pass on both.
    let ok = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 2, "top_p": 0,
                "logprobs": 20, "presence_penalty": -2, "repeat_last_n": -1}),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    let ok = post(
        a,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "Hi", "stream": false,
                "options": {"temperature": 2, "top_p": 0, "num_predict": 2, "presence_penalty": -2, "repeat_last_n": -1}}),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[test]
fn prompt_plus_requested_tokens_beyond_the_context_is_a_400_with_the_numbers() {
    // The test context is 2048 tokens (the case: 4,091 + 100 in 4,096).
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    let tokens = vec![28u32; 2000];
    let (param, msg) = openai_param(
        a,
        "/v1/completions",
        json!({"model": MODEL, "prompt": tokens, "max_tokens": 100}),
    );
    assert_eq!(param, "prompt");
    for n in ["2048", "2100", "2000", "100", "max_tokens"] {
        assert!(msg.contains(n), "{n} missing: {msg}");
    }
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": tokens, "max_tokens": 100}),
    );
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // Chat: the rendered messages count.
    let long = "word ".repeat(1990);
    let (param, msg) = openai_param(
        a,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": long}], "max_completion_tokens": 100}),
    );
    assert_eq!(param, "messages");
    assert!(
        msg.contains("2048") && msg.contains("max_completion_tokens"),
        "{msg}"
    );
    // Ollama, with num_predict.
    let msg = ollama_message(
        a,
        "/api/generate",
        json!({"model": MODEL, "prompt": long, "raw": true, "stream": false, "options": {"num_predict": 100}}),
    );
    assert!(
        msg.contains("2048") && msg.contains("options.num_predict"),
        "{msg}"
    );
    // num_ctx narrows the context of one request.
    let msg = ollama_message(
        a,
        "/api/generate",
        json!({"model": MODEL, "prompt": "word ".repeat(100), "raw": true, "stream": false,
               "options": {"num_ctx": 64}}),
    );
    assert!(msg.contains("64"), "{msg}");
    // Without a length, a request may use the room its prompt leaves: 2040 + 8.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": vec![28u32; 2040], "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let u = &r.json()["usage"];
    assert_eq!(u["prompt_tokens"], 2040);
    assert!(u["completion_tokens"].as_u64().unwrap() <= 8, "{u}");
    // A prompt that fills the context is refused even without a length.
    let (param, msg) = openai_param(
        a,
        "/v1/completions",
        json!({"model": MODEL, "prompt": vec![28u32; 2048]}),
    );
    assert_eq!(param, "prompt");
    assert!(msg.contains("2048 tokens"), "{msg}");
}
