//! `mica serve` over HTTP with the real model: OpenAI and Ollama routes, raw SSE / NDJSON
//! framing, greedy equality with a single-sequence `Session`, errors in each API's shape,
//! prefix-cache hits in `usage`, and a disconnect returning KV blocks to the pool.

mod common;

use common::*;
use mica::engine::{GenerateParams, SamplingParams, SchedulerConfig, Session};
use mica::models::LoadedModel;
use mica::models::chat::ChatMessage;
use serde_json::json;
use std::io::BufReader;
use std::time::{Duration, Instant};

fn session_greedy(prompt_text: &str, max_tokens: usize) -> String {
    let lm = LoadedModel::open(model_path()).unwrap();
    let text = lm
        .template
        .render(&[ChatMessage::new("user", prompt_text)], true)
        .unwrap();
    let prompt = lm.tokenizer.encode(&text, true, true).unwrap();
    let mut s = Session::new(&lm, 2048, 2);
    let params = GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        ignore_eos: false,
        logit_bias: vec![],
    };
    s.generate(&prompt, &params, |_| true).unwrap().text
}

/// `data: ...` payloads of an SSE body, checking the framing on the way.
fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("data: [DONE]\n\n"),
        "ends with [DONE]: {body:?}"
    );
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without data: {e:?}"))
                .to_string()
        })
        .collect()
}

#[test]
fn openai_routes() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    let models = get(a, "/v1/models").json();
    assert_eq!(models["data"][0]["id"], MODEL);

    // Non-streaming greedy chat equals the single-sequence session.
    let question = "What is the capital of France?";
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": question}],
                "temperature": 0, "max_tokens": 16}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(text, session_greedy(question, 16));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    // Streaming: raw SSE framing, deltas add up to the same text, usage chunk at the end.
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": question}],
                "temperature": 0, "max_tokens": 16, "stream": true,
                "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&r.body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 16);
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "length")
    );

    // Completions with logprobs, n = 2, a stop string.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "1, 2, 3, 4,", "max_tokens": 6, "temperature": 0.7,
                "seed": 3, "n": 2, "logprobs": 2, "stop": ["9"]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(
        lp["tokens"].as_array().unwrap().len(),
        lp["token_logprobs"].as_array().unwrap().len()
    );
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    assert!(lp["top_logprobs"][0].as_object().unwrap().len() <= 2);
    // Chat logprobs.
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                "temperature": 0, "logprobs": true, "top_logprobs": 3}),
    );
    let c = &r.json()["choices"][0]["logprobs"]["content"];
    assert_eq!(c.as_array().unwrap().len(), 3);
    assert_eq!(c[0]["top_logprobs"].as_array().unwrap().len(), 3);

    // Errors, in OpenAI's shape, and the server keeps serving.
    let r = request(a, "POST", "/v1/chat/completions", &[], "{\"model\": ");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("malformed JSON")
    );
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [], "temperature": "hot"}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "temperature", "{}", r.body);
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let long = "word ".repeat(3000);
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": long}),
    );
    assert_eq!(r.status, 400);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("3001 tokens") && msg.contains("2048"), "{msg}");
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x", "priority": "urgent"}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(get(a, "/nowhere").status, 404);
    assert_eq!(get(a, "/health").json()["status"], "ok");
}

#[test]
fn ollama_routes() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    assert!(get(a, "/api/version").json()["version"].is_string());
    let tags = get(a, "/api/tags").json();
    assert_eq!(tags["models"][0]["name"], MODEL);
    assert_eq!(get(a, "/api/ps").json()["models"][0]["name"], MODEL);
    let show = post(a, "/api/show", &json!({"model": MODEL})).json();
    assert_eq!(show["model_info"]["general.architecture"], "llama");

    // Streaming generate: NDJSON, one object per line, the last one done with counts.
    let r = post(
        a,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "Why is the sky blue?",
                "options": {"temperature": 0, "num_predict": 12, "seed": 1, "repeat_penalty": 1.0}}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<serde_json::Value> = r
        .body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true);
    assert_eq!(last["eval_count"], 12);
    assert_eq!(last["done_reason"], "length");
    assert!(lines[..lines.len() - 1].iter().all(|l| l["done"] == false));
    let streamed: String = lines
        .iter()
        .filter_map(|l| l["response"].as_str())
        .collect();
    assert_eq!(streamed, session_greedy("Why is the sky blue?", 12));

    // Non-streaming chat.
    let r = post(
        a,
        "/api/chat",
        &json!({"model": MODEL, "stream": false,
                "messages": [{"role": "user", "content": "Say hello."}],
                "options": {"temperature": 0, "num_predict": 5}}),
    );
    let v = r.json();
    assert_eq!(v["done"], true);
    assert_eq!(v["message"]["role"], "assistant");
    assert!(!v["message"]["content"].as_str().unwrap().is_empty());
    // Errors in Ollama's shape.
    let r = post(a, "/api/generate", &json!({"model": "nope", "prompt": "x"}));
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].is_string());
    let r = post(a, "/api/chat", &json!({"model": MODEL, "messages": "hi"}));
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().contains("messages"));
}

#[test]
fn prefix_cache_and_disconnect() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    let doc = "The committee met on Tuesday to review the annual budget. ".repeat(40);
    let ask = |q: &str| {
        post(
            a,
            "/v1/chat/completions",
            &json!({"model": MODEL, "temperature": 0, "max_tokens": 4,
                    "messages": [{"role": "system", "content": doc},
                                 {"role": "user", "content": q}]}),
        )
        .json()
    };
    let first = ask("Summarize.");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = ask("List the dates.");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= 400 && cached < prompt,
        "cached {cached} of {prompt}"
    );
    assert!(metric(a, "mica_prefix_cache_hit_rate", MODEL) > 0.0);

    // Start a long stream, read a little, hang up: the blocks come back.
    let s = send(
        a,
        "POST",
        "/v1/completions",
        &[],
        &json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1500,
                "temperature": 0.8, "stream": true, "logit_bias": no_eog()})
        .to_string(),
    );
    let mut r = BufReader::new(s);
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    for _ in 0..3 {
        read_chunk(&mut r).unwrap();
    }
    assert!(metric(a, "mica_kv_blocks_used", MODEL) > 0.0);
    drop(r);
    let t = Instant::now();
    while metric(a, "mica_kv_blocks_used", MODEL) > 0.0 {
        assert!(t.elapsed() < Duration::from_secs(20), "blocks not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        metric(
            a,
            "mica_requests_total",
            "lane=\"interactive\",status=\"cancelled\""
        ),
        1.0
    );
    // Still serving.
    assert_eq!(ask("Again?")["choices"][0]["finish_reason"], "length");
}

#[test]
fn api_keys_and_lanes() {
    let keys = vec![
        mica_server::ApiKey {
            key: "secret".into(),
            lane: mica::engine::Lane::Interactive,
        },
        mica_server::ApiKey {
            key: "batch".into(),
            lane: mica::engine::Lane::Bulk,
        },
    ];
    let srv = start(config(SchedulerConfig::default(), keys));
    let a = srv.addr;
    let body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2}).to_string();
    let r = request(a, "POST", "/v1/completions", &[], &body);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = request(
        a,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer secret")],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // The bulk key's request runs in the bulk lane even when it asks for interactive.
    let r = request(
        a,
        "POST",
        "/v1/completions",
        &[
            ("Authorization", "Bearer batch"),
            ("X-Mica-Priority", "interactive"),
        ],
        &body,
    );
    assert_eq!(r.status, 200);
    let key = [("Authorization", "Bearer secret")];
    assert_eq!(
        metric_with(
            a,
            &key,
            "mica_requests_total",
            "lane=\"bulk\",status=\"ok\""
        ),
        1.0
    );
    assert_eq!(
        metric_with(
            a,
            &key,
            "mica_requests_total",
            "lane=\"interactive\",status=\"ok\""
        ),
        1.0
    );
}

#[test]
fn full_queue_is_429_with_retry_after() {
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.max_waiting_per_lane = 0;
    let srv = start(cfg);
    let r = post(
        srv.addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "queue_full");
    assert!(r.header("retry-after").is_some());
    let r = post(
        srv.addr,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "Hi", "options": {"num_predict": 2}}),
    );
    assert_eq!(r.status, 429);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("queue is full")
    );
    assert_eq!(
        metric(
            srv.addr,
            "mica_requests_total",
            "lane=\"interactive\",status=\"rejected\""
        ),
        2.0
    );
}
