//! LoRA adapters chosen per request, over HTTP, with a random PEFT adapter on the test
//! model: `mica serve --lora` adapters selected by llama-server's `lora` list (by id or
//! name, at a scale) or by a `MODEL:ADAPTER` model name; requests with the adapter at two
//! scales and with none, concurrent, each give what they give alone; the prefix cache does
//! not cross adapters; unknown adapters and bad scales are 400s naming them; adapters load
//! and unload at run time behind the API key.

mod common;

#[path = "../../mica-engine/tests/common/peft.rs"]
mod peft;

use common::*;
use mica::engine::{Lane, SchedulerConfig};
use mica_server::ApiKey;
use serde_json::{Value, json};
use std::path::PathBuf;

/// The random adapter for the test model (SmolLM2-135M: 30 layers, width 576, 3 key/value
/// heads of 64), written once per test process.
fn adapter_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mica-server-lora-{}", std::process::id()));
    peft::write_random_peft(&dir, 30, 576, 192, 7);
    dir
}

fn server(keys: Vec<ApiKey>) -> Server {
    let dir = adapter_dir();
    let cfg = mica_server::ServerConfig {
        lora: vec![
            format!("sql={}", dir.display()).parse().unwrap(),
            format!("half={}:0.5", dir.display()).parse().unwrap(),
        ],
        ..config(SchedulerConfig::default(), keys)
    };
    start(cfg)
}

fn completion(a: std::net::SocketAddr, body: Value) -> Value {
    let mut body = body;
    let o = body.as_object_mut().unwrap();
    o.entry("model").or_insert(json!(MODEL));
    o.insert("max_tokens".into(), json!(16));
    o.insert("temperature".into(), json!(0));
    let r = post(a, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn text(v: &Value) -> String {
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

const PROMPT: &str = "The capital of France is";

#[test]
fn requests_select_adapters_by_id_name_and_model_name() {
    let srv = server(vec![]);
    let a = srv.addr;
    let t = |extra: Value| {
        let mut body = json!({"prompt": PROMPT});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        text(&completion(a, body))
    };
    let base = t(json!({}));
    let full = t(json!({"lora": [{"id": 0}]}));
    let half = t(json!({"lora": [{"id": 1}]}));
    assert_ne!(base, full, "the adapter changes the output");
    assert_ne!(full, half, "so does its scale");
    assert_eq!(t(json!({"lora": [{"name": "sql", "scale": 1.0}]})), full);
    assert_eq!(t(json!({"model": format!("{MODEL}:sql")})), full);
    assert_eq!(t(json!({"lora": [{"id": 0, "scale": 0.5}]})), half);
    assert_eq!(t(json!({"model": format!("{MODEL}:half")})), half);
    assert_eq!(t(json!({"lora": []})), base);
    // Two halves add up to the whole.
    assert_eq!(t(json!({"lora": [{"id": 1}, {"name": "half"}]})), full);

    // Chat and the Ollama routes take the same field.
    let chat = |extra: Value| {
        let mut body = json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Name a colour."}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(a, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["model"], body["model"], "the model as asked");
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let chat_full = chat(json!({"lora": [{"id": 0}]}));
    assert_ne!(chat(json!({})), chat_full);
    assert_eq!(chat(json!({"model": format!("{MODEL}:sql")})), chat_full);
    let ollama = |extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": PROMPT, "raw": true, "stream": false,
            "options": {"temperature": 0, "num_predict": 12}});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(a, "/api/generate", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["response"].as_str().unwrap().to_string()
    };
    let o_full = ollama(json!({"lora": [{"name": "sql"}]}));
    assert_ne!(ollama(json!({})), o_full);
    assert_eq!(ollama(json!({"model": format!("{MODEL}:sql")})), o_full);

    // `/v1/models` lists each adapter as a model.
    let ids: Vec<String> = get(a, "/v1/models").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    for want in [
        MODEL.to_string(),
        format!("{MODEL}:sql"),
        format!("{MODEL}:half"),
    ] {
        assert!(ids.contains(&want), "{want} in {ids:?}");
    }
    assert_eq!(get(a, &format!("/v1/models/{MODEL}:sql")).status, 200);
}

#[test]
fn mixed_concurrent_requests_each_give_what_they_give_alone() {
    let srv = server(vec![]);
    let a = srv.addr;
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
    ];
    let selections = [
        json!({"lora": [{"id": 0}]}),
        json!({}),
        json!({"lora": [{"id": 0, "scale": 0.5}]}),
        json!({"model": format!("{MODEL}:half")}),
    ];
    let cases: Vec<Value> = prompts
        .iter()
        .flat_map(|p| {
            selections.iter().map(move |s| {
                let mut b = s.clone();
                b["prompt"] = json!(p);
                b
            })
        })
        .collect();
    let alone: Vec<String> = cases
        .iter()
        .map(|c| text(&completion(a, c.clone())))
        .collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = cases
            .iter()
            .map(|c| s.spawn(move || text(&completion(a, c.clone()))))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
    // The third and fourth selections are the same adapter at the same scale.
    for p in 0..prompts.len() {
        assert_eq!(alone[4 * p + 2], alone[4 * p + 3]);
    }
}

#[test]
fn the_prefix_cache_does_not_cross_adapters() {
    let srv = server(vec![]);
    let a = srv.addr;
    let prompt = "A long shared prefix of many words. ".repeat(8);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let with = completion(a, json!({"prompt": prompt, "lora": [{"id": 0}]}));
    assert_eq!(cached(&with), Some(0));
    let again = completion(a, json!({"prompt": prompt, "lora": [{"id": 0}]}));
    assert!(cached(&again).unwrap() > 0, "the same adapter reuses it");
    assert_eq!(text(&again), text(&with));
    for other in [
        json!({"prompt": prompt}),
        json!({"prompt": prompt, "lora": [{"id": 1}]}),
    ] {
        assert_eq!(cached(&completion(a, other.clone())), Some(0), "{other}");
    }
}

#[test]
fn unknown_adapters_and_bad_scales_are_400s_naming_them() {
    let srv = server(vec![]);
    let a = srv.addr;
    let err = |body: Value| {
        let r = post(a, "/v1/completions", &body);
        (
            r.status,
            r.json()["error"]["message"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    };
    let (s, m) = err(json!({"model": MODEL, "prompt": "x", "lora": [{"id": 7}]}));
    assert_eq!(s, 400);
    assert!(
        m.contains("lora[0].id") && m.contains("id 7") && m.contains("0 (sql)"),
        "{m}"
    );
    let (s, m) = err(json!({"model": MODEL, "prompt": "x", "lora": [{"name": "nope"}]}));
    assert_eq!(s, 400);
    assert!(m.contains("'nope'"), "{m}");
    let (s, m) = err(json!({"model": format!("{MODEL}:nope"), "prompt": "x"}));
    assert_eq!(s, 400);
    assert!(m.contains("no LoRA adapter named 'nope'"), "{m}");
    let (s, m) = err(json!({"model": MODEL, "prompt": "x", "lora": [{"id": 0, "scale": 1e39}]}));
    assert_eq!(s, 400);
    assert!(m.contains("lora[0].scale") && m.contains("finite"), "{m}");
    let (s, m) = err(json!({"model": MODEL, "prompt": "x", "lora": {"id": 0}}));
    assert_eq!(s, 400);
    assert!(m.contains("lora must be a list"), "{m}");
    let (s, _) = err(json!({"model": "other:sql", "prompt": "x"}));
    assert_eq!(s, 404, "an unknown base model is not found");
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"model": format!("{MODEL}:sql"), "input": "x"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("generation only"), "{}", r.body);
}

#[test]
fn adapters_load_and_unload_at_run_time_behind_the_api_key() {
    let key = "s3cret";
    let srv = server(vec![ApiKey {
        key: key.into(),
        lane: Lane::Interactive,
    }]);
    let a = srv.addr;
    let auth = format!("Bearer {key}");
    let with_key = [("Authorization", auth.as_str())];
    let call = |method: &str, path: &str, body: Value| {
        let b = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        request(a, method, path, &with_key, &b)
    };
    // Without the key: 401 for every adapter route.
    assert_eq!(
        request(a, "GET", "/admin/lora-adapters", &[], "").status,
        401
    );
    let load = json!({"name": "extra", "path": adapter_dir(), "scale": 0.5});
    assert_eq!(
        request(a, "POST", "/admin/lora-adapters", &[], &load.to_string()).status,
        401
    );
    assert_eq!(
        request(a, "DELETE", "/admin/lora-adapters/sql", &[], "").status,
        401
    );

    let list = call("GET", "/admin/lora-adapters", Value::Null);
    assert_eq!(list.status, 200, "{}", list.body);
    let names: Vec<_> = list.json()["adapters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["id"].as_u64().unwrap(),
                x["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(names, [(0, "sql".to_string()), (1, "half".to_string())]);

    let r = call("POST", "/admin/lora-adapters", load.clone());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["id"], 2);
    assert_eq!(r.json()["rank"], 4);
    let generate = |model: String| {
        let body = json!({"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0});
        call("POST", "/v1/completions", body)
    };
    let extra = generate(format!("{MODEL}:extra"));
    assert_eq!(extra.status, 200, "{}", extra.body);
    assert_eq!(
        text(&extra.json()),
        text(&generate(format!("{MODEL}:half")).json())
    );

    // The same name again: 409; an adapter for another model's shapes, a missing path, a
    // bad name: 400 saying why.
    let r = call("POST", "/admin/lora-adapters", load);
    assert_eq!(r.status, 409, "{}", r.body);
    let other = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/lora/llama/adapter-f32.gguf");
    let r = call(
        "POST",
        "/admin/lora-adapters",
        json!({"name": "other", "path": other}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("shape"), "{}", r.body);
    let r = call(
        "POST",
        "/admin/lora-adapters",
        json!({"name": "gone", "path": "/nonexistent/adapter"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("no such adapter"), "{}", r.body);
    let r = call(
        "POST",
        "/admin/lora-adapters",
        json!({"name": "a:b", "path": adapter_dir()}),
    );
    assert_eq!(r.status, 400, "{}", r.body);

    // Unloaded: requests can no longer select it; a second unload is a 404.
    let r = call("DELETE", "/admin/lora-adapters/extra", Value::Null);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["unloaded"], true);
    assert_eq!(generate(format!("{MODEL}:extra")).status, 400);
    assert_eq!(
        call("DELETE", "/admin/lora-adapters/extra", Value::Null).status,
        404
    );
    let list = call("GET", "/admin/lora-adapters", Value::Null).json();
    assert_eq!(list["adapters"].as_array().unwrap().len(), 2);
}
