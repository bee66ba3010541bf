//! A server whose models store a quantized KV cache (`ServerConfig::cache_type_k/v`, `mica
//! serve --cache-type-k/-v`): greedy completions batched together with other requests give
//! exactly what they give alone (the block tables of concurrent sequences interleave in the
//! pool).

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use mica::models::kv_cache::KvType;
use serde_json::json;

#[test]
fn quantized_cache_results_do_not_depend_on_the_batch() {
    let cfg = mica_server::ServerConfig {
        cache_type_k: Some(KvType::Q8_0),
        cache_type_v: Some(KvType::Q4_0),
        ..config(SchedulerConfig::default(), vec![])
    };
    let srv = start(cfg);
    let a = srv.addr;
    let complete = |prompt: &str| {
        let r = post(
            a,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
    ];
    let alone: Vec<String> = prompts.iter().map(|p| complete(p)).collect();
    assert!(alone.iter().all(|t| !t.is_empty()), "{alone:?}");
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || complete(p)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
}
