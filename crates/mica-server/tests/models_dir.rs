//! `--models-dir`: a folder holding the test GGUF, a `.mica` conversion of it (written here
//! with the library's writer) and a tiny Hugging Face folder (the `fixtures/hf/llama`
//! checkpoint with a byte-level tokenizer.json written here), each served by name, loaded
//! on first request; `max_loaded` unloads the least recently used model without dropping
//! the requests in flight on it; a load over the memory budget is refused with a 503.

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use mica::formats::{GgufFile, MicaWriter, TensorSink};
use mica_server::ServerConfig;
use serde_json::{Value, json};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const MICA: &str = "smollm2-converted";
const HF: &str = "tiny-llama";

/// The models folder, built once per test run.
fn models_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Cargo's scratch space for integration tests: rebuilt each run, not left in /tmp.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("models-dir");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let gguf = model_path();
        link_or_copy(&gguf, &dir.join(format!("{MODEL}.gguf")));
        write_mica(&gguf, &dir.join(format!("{MICA}.mica")));
        write_hf(&dir.join(HF));
        // Not models: ignored.
        std::fs::write(dir.join("notes.txt"), "not a model").unwrap();
        std::fs::create_dir_all(dir.join("empty-folder")).unwrap();
        dir
    })
}

fn link_or_copy(src: &Path, dst: &Path) {
    #[cfg(unix)]
    if std::os::unix::fs::symlink(src, dst).is_ok() {
        return;
    }
    std::fs::copy(src, dst).unwrap();
}

/// The GGUF's metadata and tensors, unchanged, as a `.mica` file.
fn write_mica(src: &Path, out: &Path) {
    let f = GgufFile::open(src).unwrap();
    let mut w = MicaWriter::create(out, f.metadata_entries(), &[]).unwrap();
    for t in f.tensors() {
        w.begin_tensor(&t.name, t.ggml_type, &t.shape).unwrap();
        w.write_data(f.tensor_data(t)).unwrap();
        w.end_tensor().unwrap();
    }
    Box::new(w).finish().unwrap();
}

/// `fixtures/hf/llama` (128-token vocabulary) with a byte-level BPE tokenizer.json of 128
/// tokens: the 94 printable ASCII characters, GPT-2's stand-ins for bytes 0-32 (space is
/// `Ġ`), and `<|endoftext|>`; no merges.
fn write_hf(dir: &Path) {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf/llama");
    std::fs::create_dir_all(dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    let mut vocab = serde_json::Map::new();
    let chars = (b'!'..=b'~')
        .map(char::from)
        .chain((0..=32u32).map(|n| char::from_u32(256 + n).unwrap()));
    for (id, c) in chars.enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    assert_eq!(vocab.len(), 127);
    let tok = json!({
        "version": "1.0",
        "added_tokens": [{"id": 127, "content": "<|endoftext|>", "special": true}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
}

fn dir_config(max_loaded: usize, kv_mem: usize, mem_limit: Option<u64>) -> ServerConfig {
    ServerConfig {
        models: ServerConfig::discover(models_dir()).unwrap(),
        kv_mem,
        max_loaded,
        mem_limit,
        ..config(SchedulerConfig::default(), vec![])
    }
}

fn complete(a: std::net::SocketAddr, model: &str, prompt: &str, max_tokens: usize) -> Resp {
    post(
        a,
        "/v1/completions",
        &json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}),
    )
}

/// Names of the models `/api/ps` reports loaded.
fn loaded(a: std::net::SocketAddr) -> Vec<String> {
    let ps = get(a, "/api/ps").json();
    let mut names: Vec<String> = ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn every_kind_is_served_by_name_and_the_lru_one_unloaded() {
    let srv = start_with(dir_config(1, 64 << 20, None), None);
    let a = srv.addr;
    let mut want = vec![HF.to_string(), MICA.to_string(), MODEL.to_string()];
    want.sort();
    let ids: Vec<String> = get(a, "/v1/models").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, want, "/v1/models");
    let tags = get(a, "/api/tags").json();
    let tags = tags["models"].as_array().unwrap();
    let names: Vec<&str> = tags.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, want, "/api/tags");
    let format = |n: &str| {
        let m = tags.iter().find(|m| m["name"] == n).unwrap();
        m["details"]["format"].as_str().unwrap().to_string()
    };
    assert_eq!(
        [format(MODEL), format(MICA), format(HF)],
        ["gguf", "mica", "safetensors"]
    );
    assert!(loaded(a).is_empty(), "nothing loaded before a request");

    let prompt = "The capital of France is";
    let g = complete(a, MODEL, prompt, 8);
    assert_eq!(g.status, 200, "{}", g.body);
    assert_eq!(loaded(a), [MODEL]);
    // The .mica file holds the same weights: the same greedy text.
    let m = complete(a, MICA, prompt, 8);
    assert_eq!(m.status, 200, "{}", m.body);
    assert_eq!(
        m.json()["choices"][0]["text"],
        g.json()["choices"][0]["text"]
    );
    assert_eq!(loaded(a), [MICA], "max_loaded 1: the GGUF was unloaded");
    let h = complete(a, HF, "hello world", 5);
    assert_eq!(h.status, 200, "{}", h.body);
    assert_eq!(h.json()["usage"]["prompt_tokens"], 11, "one token a byte");
    assert_eq!(loaded(a), [HF]);
    // Back to the GGUF: loaded again, same answer.
    let g2 = complete(a, MODEL, prompt, 8);
    assert_eq!(
        g2.json()["choices"][0]["text"],
        g.json()["choices"][0]["text"]
    );
    assert_eq!(loaded(a), [MODEL]);
}

/// Reads an SSE stream to its end: the content of its text deltas, and whether it ended
/// with `data: [DONE]`.
fn read_stream(
    r: &mut BufReader<std::net::TcpStream>,
    first: String,
) -> (String, Vec<Value>, bool) {
    let mut raw = first;
    while let Some(c) = read_chunk(r) {
        raw.push_str(&c);
    }
    let mut text = String::new();
    let mut events = Vec::new();
    let mut done = false;
    for line in raw.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if let Some(t) = v["choices"][0]["text"].as_str() {
            text.push_str(t);
        }
        events.push(v);
    }
    (text, events, done)
}

#[test]
fn a_stream_in_flight_survives_another_model_loading() {
    let srv = start_with(dir_config(1, 64 << 20, None), Some(MODEL));
    let a = srv.addr;
    let prompt = "Once upon a time";
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0,
                      "stream": true, "stream_options": {"include_usage": true}});
    let s = send(a, "POST", "/v1/completions", &[], &body.to_string());
    let mut r = BufReader::new(s);
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    let first = read_chunk(&mut r).expect("a first chunk");
    // Model B loads (max_loaded 1: A leaves the list) and answers while A streams on.
    let b = complete(a, MICA, "The capital of France is", 4);
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(loaded(a), [MICA]);
    let (text, events, done) = read_stream(&mut r, first);
    assert!(done, "the stream on the unloaded model ended normally");
    assert!(
        events.iter().all(|e| e.get("error").is_none()),
        "{events:?}"
    );
    let usage = &events.last().unwrap()["usage"];
    let n = usage["completion_tokens"].as_u64().unwrap();
    assert!(n > 0);
    // The same request alone (the model loads again) gives the same text.
    let alone = complete(a, MODEL, prompt, 40);
    assert_eq!(alone.json()["choices"][0]["text"].as_str().unwrap(), text);
    assert_eq!(alone.json()["usage"]["completion_tokens"].as_u64(), Some(n));
}

#[test]
fn a_load_over_the_memory_budget_is_refused() {
    // 20 MiB for everything, 4 MiB of KV a model: the tiny folder fits, the ~94 MiB GGUF
    // never can.
    let srv = start_with(dir_config(2, 4 << 20, Some(20 << 20)), None);
    let a = srv.addr;
    assert_eq!(complete(a, HF, "hi", 2).status, 200);
    let r = complete(a, MODEL, "hi", 2);
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.header("retry-after").is_some());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    for part in [
        &format!("cannot load model '{MODEL}'"),
        "weights",
        "KV cache 4 MiB",
        "--mem-limit leaves",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert_eq!(loaded(a), [HF], "the refused load unloaded nothing");
    // Ollama's shape for the same refusal.
    let r = post(
        a,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "hi", "stream": false}),
    );
    assert_eq!(r.status, 503);
    assert!(r.json()["error"].as_str().unwrap().contains("--mem-limit"));
    // And the server keeps serving.
    assert_eq!(complete(a, HF, "hello", 2).status, 200);
}
