//! `logit_bias` and mirostat on both APIs over HTTP with the real model: a strong bias
//! decides greedy output, mirostat runs are reproducible per seed, bad values are 400s
//! naming the field.

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use mica::models::LoadedModel;
use serde_json::json;

#[test]
fn logit_bias_and_mirostat_on_both_apis() {
    let lm = LoadedModel::open(model_path()).unwrap();
    let tok = lm.tokenizer.encode(" banana", false, false).unwrap()[0];
    let piece = lm.tokenizer.decode(&[tok]).unwrap();
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    let bias = json!({ tok.to_string(): 100 });

    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "I like", "max_tokens": 3, "temperature": 0,
                "logit_bias": bias}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], piece.repeat(3));
    let r = post(
        a,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "I like", "raw": true, "stream": false,
                "options": {"num_predict": 3, "temperature": 0, "logit_bias": bias}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["response"], piece.repeat(3));

    let miro = |seed: u64| {
        let r = post(
            a,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 16,
                    "mirostat": 2, "mirostat_tau": 4.0, "seed": seed}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(miro(11), miro(11));

    for (body, path, field) in [
        (
            json!({"model": MODEL, "prompt": "x", "mirostat": 3}),
            "/v1/completions",
            "mirostat",
        ),
        (
            json!({"model": MODEL, "prompt": "x", "mirostat": 1, "mirostat_tau": -1}),
            "/v1/completions",
            "mirostat_tau",
        ),
        (
            json!({"model": MODEL, "prompt": "x", "logit_bias": {"abc": 1}}),
            "/v1/completions",
            "logit_bias.abc",
        ),
        (
            json!({"model": MODEL, "prompt": "x", "logit_bias": {"5": 101}}),
            "/v1/completions",
            "logit_bias.5",
        ),
    ] {
        let r = post(a, path, &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{}", r.body);
    }
    let r = post(
        a,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "x", "options": {"mirostat": 7}}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("options.mirostat")
    );
}
