//! The embedding routes over HTTP with the real model: OpenAI's `/v1/embeddings` (string,
//! list, token-id inputs; float and base64 encodings; `dimensions`), Ollama's `/api/embed`
//! and `/api/embeddings`, each against the engine's own [`Embedder`] on the same model.

mod common;

use base64::Engine as _;
use common::*;
use mica::engine::{Embedder, SchedulerConfig};
use mica::models::LoadedModel;
use serde_json::json;

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

#[test]
fn embedding_routes_match_the_engine() {
    let lm = LoadedModel::open(model_path()).unwrap();
    let mut e = Embedder::new(&lm, 2048, 2, None).unwrap();
    let text = "The quick brown fox";
    let ids = lm.tokenizer.encode(text, true, false).unwrap();
    let normed = e.embed(&ids, true).unwrap();
    let raw = e.embed(&ids, false).unwrap();
    let other = e
        .embed(&lm.tokenizer.encode("jumps", true, false).unwrap(), true)
        .unwrap();

    let srv = start(mica_server::ServerConfig {
        n_ctx: Some(256),
        ..config(SchedulerConfig::default(), vec![])
    });
    let a = srv.addr;
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": [text, "jumps"]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert_eq!(j["object"], "list");
    assert_eq!(j["data"][1]["index"], 1);
    assert_eq!(floats(&j["data"][0]["embedding"]), normed);
    assert_eq!(floats(&j["data"][1]["embedding"]), other);
    assert_eq!(
        j["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        ids.len() + 2
    );

    // Token ids, and base64: the same vector.
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": ids, "encoding_format": "base64"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let b64 = r.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(decoded, normed);

    // Refusals name the field, in OpenAI's shape.
    for (body, field) in [
        (
            json!({"model": MODEL, "input": text, "dimensions": 64}),
            "dimensions",
        ),
        (json!({"model": MODEL, "input": []}), "input"),
        (
            json!({"model": MODEL, "input": [[1], [99999999]]}),
            "input[1]",
        ),
        (
            json!({"model": MODEL, "input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (
            json!({"model": MODEL, "input": "word ".repeat(300)}),
            "input",
        ),
    ] {
        let r = post(a, "/v1/embeddings", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{}", r.body);
    }

    // Ollama: batch, normalized; the older route, one unnormalized vector.
    let r = post(
        a,
        "/api/embed",
        &json!({"model": MODEL, "input": [text, "jumps"]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert_eq!(floats(&j["embeddings"][0]), normed);
    assert_eq!(floats(&j["embeddings"][1]), other);
    assert!(j["prompt_eval_count"].as_u64().unwrap() > 0);
    // `truncate` (default true) cuts a long input to the context instead of failing.
    let long = "word ".repeat(300);
    let r = post(a, "/api/embed", &json!({"model": MODEL, "input": long}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["prompt_eval_count"], 256);
    let r = post(
        a,
        "/api/embed",
        &json!({"model": MODEL, "input": long, "truncate": false}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.json()["error"].is_string());
    let r = post(
        a,
        "/api/embeddings",
        &json!({"model": MODEL, "prompt": text}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(floats(&r.json()["embedding"]), raw);
}
