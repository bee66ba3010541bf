//! Speculative decoding in `mica serve`: with a draft model (the test model's own first
//! layers) and n-gram lookup, concurrent greedy requests through both APIs — each asking
//! for n-gram lookup, the draft model, the server's default or none — give exactly what a
//! plain single-sequence session gives; drafted and accepted tokens are in each response's
//! usage and in `/metrics`; a request for a draft model the server lacks, and a bad
//! `spec_max`, get a 400 naming the field; a draft model with another vocabulary is refused
//! when the model loads.

mod common;

use common::*;
use mica::engine::spec::{DraftModelConfig, SpecConfig, SpecMethod};
use mica::engine::{GenerateParams, SamplingParams, SchedulerConfig, Session};
use mica::models::LoadedModel;
use mica::models::chat::ChatMessage;
use mica_server::{AppState, Observer, ServerEvent};
use serde_json::json;
use std::sync::{Arc, Mutex};

/// Plain greedy text of a chat question (or of a raw prompt).
fn plain(lm: &LoadedModel, text: &str, chat: bool, max_tokens: usize) -> String {
    let text = if chat {
        lm.template
            .render(&[ChatMessage::new("user", text)], true)
            .unwrap()
    } else {
        text.to_string()
    };
    let prompt = lm.tokenizer.encode(&text, true, true).unwrap();
    let params = GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    };
    Session::new(lm, 2048, 2)
        .generate(&prompt, &params, |_| true)
        .unwrap()
        .text
}

fn early_exit(path: &std::path::Path, n: usize) -> Arc<LoadedModel> {
    let mut lm = LoadedModel::open(path).unwrap();
    assert!(lm.model.truncate_layers(n));
    Arc::new(lm)
}

fn draft_config(draft: Arc<LoadedModel>) -> SpecConfig {
    SpecConfig {
        method: SpecMethod::Draft {
            model: draft,
            config: DraftModelConfig::default(),
        },
        ..SpecConfig::ngram(8)
    }
}

#[test]
fn speculative_requests_give_plain_greedy_output() {
    let lm = LoadedModel::open(model_path()).unwrap();
    let cfg = mica_server::ServerConfig {
        spec: draft_config(early_exit(&model_path(), 24)),
        ..config(SchedulerConfig::default(), vec![])
    };
    let srv = start(cfg);
    let a = srv.addr;
    let copy = "Repeat this list exactly: alpha, beta, gamma, delta, epsilon, zeta, eta, theta, \
                iota, kappa, lambda, mu, nu, xi, omicron, pi.";
    let questions = [
        copy,
        "What is the capital of France?",
        copy,
        "Name three colors.",
    ];
    let specs = [json!("ngram"), json!("draft"), json!(null), json!("off")];
    let n = 40;
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let (q, spec) = (questions[i % 4], specs[i % 4].clone());
            std::thread::spawn(move || {
                if i < 4 {
                    let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": q}],
                        "temperature": 0, "max_tokens": n, "spec_max": 6});
                    if !spec.is_null() {
                        body["spec"] = spec;
                    }
                    let r = post(a, "/v1/chat/completions", &body);
                    assert_eq!(r.status, 200, "{}", r.body);
                    let v = r.json();
                    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
                    (i, text.to_string(), v["usage"].clone())
                } else {
                    // Ollama's default repeat penalty is 1.1: plain greedy needs 1.
                    let mut options =
                        json!({"temperature": 0, "repeat_penalty": 1, "num_predict": n});
                    if !spec.is_null() {
                        options["spec"] = spec;
                    }
                    let body = json!({"model": MODEL, "prompt": q, "raw": true,
                        "stream": false, "options": options});
                    let r = post(a, "/api/generate", &body);
                    assert_eq!(r.status, 200, "{}", r.body);
                    let v = r.json();
                    (i, v["response"].as_str().unwrap().to_string(), v)
                }
            })
        })
        .collect();
    let mut accepted = 0;
    let mut plain_texts = std::collections::HashMap::new();
    for h in handles {
        let (i, text, usage) = h.join().unwrap();
        let (q, chat) = (questions[i % 4], i < 4);
        let want = plain_texts
            .entry((q, chat))
            .or_insert_with(|| plain(&lm, q, chat, n));
        assert_eq!(&text, want, "request {i} ({}) differs", specs[i % 4]);
        let (drafted, acc) = if i < 4 {
            let d = &usage["completion_tokens_details"];
            let acc = d["accepted_prediction_tokens"].as_u64().unwrap_or(0);
            (
                acc + d["rejected_prediction_tokens"].as_u64().unwrap_or(0),
                acc,
            )
        } else {
            (
                usage["draft_count"].as_u64().unwrap_or(0),
                usage["draft_accepted_count"].as_u64().unwrap_or(0),
            )
        };
        if i % 4 == 3 {
            assert_eq!(drafted, 0, "request {i} turned speculation off: {usage}");
        }
        accepted += acc;
    }
    assert!(accepted > 0, "drafts were accepted");
    let metrics = get(a, "/metrics").body;
    let total = metrics
        .lines()
        .find(|l| l.starts_with("mica_accepted_draft_tokens_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no accepted-draft counter in /metrics:\n{metrics}"));
    assert_eq!(total as u64, accepted);
}

#[test]
fn speculation_fields_are_checked() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    let chat = |extra: serde_json::Value| {
        let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        post(a, "/v1/chat/completions", &body)
    };
    let r = chat(json!({"spec": "draft"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "spec");
    assert!(r.body.contains("draft model"), "{}", r.body);
    let r = chat(json!({"spec_max": 0}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "spec_max");
    let r = post(
        a,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "hi", "stream": false,
                "options": {"spec": "lookahead", "num_predict": 2}}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("options.spec"), "{}", r.body);
    assert_eq!(chat(json!({"spec": "ngram", "spec_max": 3})).status, 200);
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused_at_load() {
    let dir = std::path::Path::new(&model_path())
        .parent()
        .unwrap()
        .to_path_buf();
    let other = dir.join("qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf");
    let draft = early_exit(&other, 1);
    let cfg = mica_server::ServerConfig {
        spec: draft_config(draft),
        ..config(SchedulerConfig::default(), vec![])
    };
    let failures = Arc::new(Mutex::new(Vec::new()));
    let seen = failures.clone();
    let observer: Observer = Arc::new(move |e: &ServerEvent| {
        if let ServerEvent::ModelLoadFailed { error, .. } = e {
            seen.lock().unwrap().push(error.clone());
        }
    });
    let state = Arc::new(AppState::with_observer(cfg, Some(observer)));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(state.preload(MODEL))
        .expect_err("a draft model with another vocabulary");
    let failures = failures.lock().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].contains("draft model") && failures[0].contains("vocabulary"),
        "{}",
        failures[0]
    );
}

/// A hybrid model (the tiny Qwen3.5 fixture: its recurrent state cannot drop rejected
/// drafts) served with n-gram speculation on: requests that leave `spec` to the server run
/// without drafts; one that asks for n-gram lookup gets a 400 naming `spec`.
#[test]
fn a_hybrid_model_runs_without_drafts_by_default() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/converted/qwen35/model.q8_0.gguf");
    let cfg = mica_server::ServerConfig {
        models: vec![("qwen35".to_string(), path)],
        spec: SpecConfig::ngram(8),
        ..config(SchedulerConfig::default(), vec![])
    };
    let srv = start_with(cfg, Some("qwen35"));
    let body = |spec: Option<&str>| {
        let mut b = json!({"model": "qwen35", "prompt": "<t5><t6><t7>", "max_tokens": 4,
                           "temperature": 0});
        if let Some(s) = spec {
            b["spec"] = s.into();
        }
        b
    };
    let r = post(srv.addr, "/v1/completions", &body(None));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 4, "{}", r.body);
    let r = post(srv.addr, "/v1/completions", &body(Some("ngram")));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "spec", "{}", r.body);
}
