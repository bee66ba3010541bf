//! Typical-p, XTC and DRY on both APIs over HTTP with the real model: the fields reach the
//! sampler (seeded runs differ from plain ones and repeat exactly, with n-gram drafts too),
//! DRY stops a repetitive greedy continuation from repeating, and bad values are 400s
//! naming the field.

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use serde_json::{Value, json};

const LOOP: &str = "I like apples. I like apples. I like apples. I like apples. I like";

fn completion(a: std::net::SocketAddr, extra: Value) -> String {
    let mut body = json!({"model": MODEL, "prompt": LOOP, "max_tokens": 24});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = post(a, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

fn generate(a: std::net::SocketAddr, options: Value) -> String {
    let mut o = json!({"num_predict": 24, "repeat_penalty": 1.0});
    for (k, v) in options.as_object().unwrap() {
        o[k] = v.clone();
    }
    let r = post(
        a,
        "/api/generate",
        &json!({"model": MODEL, "prompt": LOOP, "raw": true, "stream": false, "options": o}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["response"].as_str().unwrap().to_string()
}

#[test]
fn typical_xtc_and_dry_on_both_apis() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;

    // DRY: greedy SmolLM2 goes on repeating the sentence; with DRY it stops.
    let plain = completion(a, json!({"temperature": 0}));
    println!("plain: {plain:?}");
    assert!(plain.matches("apples").count() >= 3, "{plain:?}");
    let dry = completion(a, json!({"temperature": 0, "dry_multiplier": 0.8}));
    println!("dry: {dry:?}");
    assert!(dry.matches("I like apples").count() == 0, "{dry:?}");
    assert_eq!(
        generate(a, json!({"temperature": 0, "dry_multiplier": 0.8})),
        dry,
        "Ollama's options reach the same sampler"
    );
    // With n-gram drafts (the sentence is all repeats): the same tokens, DRY reading each
    // drafted position's history.
    assert_eq!(
        completion(
            a,
            json!({"temperature": 0, "dry_multiplier": 0.8, "spec": "ngram"})
        ),
        dry
    );
    // The window and the breakers are the sampler's: DRY with a window too short to see
    // the sentence again, or with "." breaking every sentence, leaves greedy output alone.
    assert_eq!(
        completion(
            a,
            json!({"temperature": 0, "dry_multiplier": 0.8, "dry_penalty_last_n": 3})
        ),
        plain
    );
    assert_eq!(
        completion(
            a,
            json!({"temperature": 0, "dry_multiplier": 0.8, "dry_sequence_breakers": ["."]})
        ),
        plain
    );

    // Typical-p and XTC: seeded runs repeat exactly and differ from plain sampling.
    for extra in [
        json!({"typical_p": 0.2}),
        json!({"xtc_probability": 1.0, "xtc_threshold": 0.05}),
    ] {
        let mut with = json!({"temperature": 1.0, "seed": 7});
        for (k, v) in extra.as_object().unwrap() {
            with[k] = v.clone();
        }
        let plain = completion(a, json!({"temperature": 1.0, "seed": 7}));
        let one = completion(a, with.clone());
        assert_eq!(one, completion(a, with.clone()), "{extra}");
        let mut spec = with.clone();
        spec["spec"] = json!("ngram");
        assert_eq!(one, completion(a, spec), "{extra} with n-gram drafts");
        assert_ne!(one, plain, "{extra}");
        let plain = generate(a, json!({"temperature": 1.0, "seed": 7}));
        let one = generate(a, with.clone());
        assert_eq!(one, generate(a, with), "options {extra}");
        assert_ne!(one, plain, "options {extra}");
    }

    for (extra, field) in [
        (json!({"typical_p": 1.5}), "typical_p"),
        (json!({"xtc_probability": -0.5}), "xtc_probability"),
        (json!({"xtc_threshold": 2}), "xtc_threshold"),
        (json!({"dry_multiplier": -1}), "dry_multiplier"),
        (json!({"dry_base": 0.5}), "dry_base"),
        (json!({"dry_allowed_length": -1}), "dry_allowed_length"),
        (json!({"dry_penalty_last_n": -2}), "dry_penalty_last_n"),
        (
            json!({"dry_sequence_breakers": []}),
            "dry_sequence_breakers",
        ),
        (
            json!({"dry_sequence_breakers": ["a", ""]}),
            "dry_sequence_breakers[1]",
        ),
    ] {
        let mut body = json!({"model": MODEL, "prompt": "x"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(a, "/v1/completions", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{}", r.body);
        let r = post(
            a,
            "/api/generate",
            &json!({"model": MODEL, "prompt": "x", "options": extra}),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains(&format!("options.{field}")), "{msg}");
    }
}
