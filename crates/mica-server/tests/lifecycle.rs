//! The model lifecycle with `--max-loaded 1`: a request for a corrupt model file fails
//! (500, no absolute path in the message) and leaves the healthy model loaded; `/api/show`
//! of another model reads its metadata without loading it; `/metrics` counters stay
//! monotonic when a model is unloaded and loaded again, with one header per family;
//! `/ready` is 503 while the preload model loads, and a failed preload stops the server.

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use mica_server::{AppState, ServerConfig};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `healthy.gguf` and `other.gguf` (both the test model) and `broken.gguf` (a GGUF magic
/// followed by garbage).
/// (One folder per test: tests run in parallel.)
fn models_dir(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("lifecycle-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["healthy", "other"] {
        link(&model_path(), &dir.join(format!("{name}.gguf")));
    }
    let mut junk = b"GGUF\x03\x00\x00\x00".to_vec();
    junk.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    std::fs::write(dir.join("broken.gguf"), junk).unwrap();
    dir
}

fn link(src: &Path, dst: &Path) {
    #[cfg(unix)]
    if std::os::unix::fs::symlink(src, dst).is_ok() {
        return;
    }
    std::fs::copy(src, dst).unwrap();
}

fn dir_config(dir: &Path) -> ServerConfig {
    ServerConfig {
        models: ServerConfig::discover(dir).unwrap(),
        ..config(SchedulerConfig::default(), vec![])
    }
}

fn loaded(a: std::net::SocketAddr) -> Vec<String> {
    get(a, "/api/ps").json()["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

fn complete(a: std::net::SocketAddr, model: &str) -> Resp {
    post(
        a,
        "/v1/completions",
        &json!({"model": model, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}),
    )
}

#[test]
fn a_corrupt_model_or_a_show_never_unloads_the_healthy_one() {
    let dir = models_dir("corrupt");
    let srv = start_with(dir_config(&dir), None);
    let a = srv.addr;
    assert_eq!(complete(a, "healthy").status, 200);
    assert_eq!(loaded(a), ["healthy"]);
    let r = complete(a, "broken");
    assert_eq!(r.status, 500, "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.starts_with("cannot load model 'broken'"), "{msg}");
    assert!(msg.contains("broken.gguf"), "{msg}");
    assert!(
        !msg.contains(dir.to_str().unwrap()),
        "absolute path in: {msg}"
    );
    assert_eq!(loaded(a), ["healthy"], "the failed load unloaded nothing");
    let r = post(
        a,
        "/api/generate",
        &json!({"model": "broken", "prompt": "x"}),
    );
    assert_eq!(r.status, 500);
    assert!(
        !r.json()["error"]
            .as_str()
            .unwrap()
            .contains(dir.to_str().unwrap())
    );
    assert_eq!(loaded(a), ["healthy"]);
    // Metadata of a model that is not loaded, read without loading it.
    let r = post(a, "/api/show", &json!({"model": "other"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model_info"]["general.architecture"], "llama");
    assert_eq!(v["model_info"]["llama.block_count"], 30);
    assert_eq!(v["modelfile"], "FROM other.gguf");
    assert!(v["template"].as_str().unwrap().contains("im_start"));
    assert_eq!(loaded(a), ["healthy"], "/api/show loaded nothing");
    let tags = get(a, "/api/tags").json();
    assert_eq!(tags["models"].as_array().unwrap().len(), 3);
    assert_eq!(loaded(a), ["healthy"], "/api/tags loaded nothing");
    let r = post(a, "/api/show", &json!({"model": "broken"}));
    assert_eq!(r.status, 500);
    assert!(!r.body.contains(dir.to_str().unwrap()), "{}", r.body);
    // The healthy model still answers, and a real swap still works.
    assert_eq!(complete(a, "healthy").status, 200);
    assert_eq!(complete(a, "other").status, 200);
    assert_eq!(loaded(a), ["other"]);
    assert_eq!(
        metric(
            a,
            "mica_model_loads_total",
            "model=\"broken\",result=\"error\""
        ),
        2.0
    );
}

#[test]
fn metrics_stay_monotonic_across_reloads() {
    let dir = models_dir("metrics");
    let srv = start_with(dir_config(&dir), None);
    let a = srv.addr;
    let ok = |model: &str| {
        metric(
            a,
            "mica_requests_total",
            &format!("model=\"{model}\",lane=\"interactive\",status=\"ok\""),
        )
    };
    for _ in 0..2 {
        assert_eq!(complete(a, "healthy").status, 200);
    }
    assert_eq!(ok("healthy"), 2.0);
    let generated = metric(a, "mica_generated_tokens_total", "model=\"healthy\"");
    // Swap out, wait until the unloaded engine is gone, swap back in.
    assert_eq!(complete(a, "other").status, 200);
    let t = Instant::now();
    while get(a, "/metrics")
        .body
        .contains("mica_kv_blocks_used{model=\"healthy\"}")
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the unloaded engine never stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ok("healthy"), 2.0, "kept after the unload");
    assert_eq!(complete(a, "healthy").status, 200);
    assert_eq!(ok("healthy"), 3.0, "counted on from 2 after the reload");
    assert_eq!(ok("other"), 1.0);
    assert!(metric(a, "mica_generated_tokens_total", "model=\"healthy\"") > generated);
    let m = get(a, "/metrics").body;
    for family in [
        "mica_requests_total",
        "mica_kv_blocks_used",
        "mica_time_to_first_token_seconds",
    ] {
        assert_eq!(
            m.matches(&format!("# TYPE {family} ")).count(),
            1,
            "{family} declared once"
        );
    }
    assert!(
        m.contains("mica_model_unloads_total{model=\"healthy\"} 1"),
        "{m}"
    );
}

#[test]
fn ready_is_503_while_the_preload_loads_and_a_failed_preload_stops_the_server() {
    // A named pipe as the model file: opening it blocks until a writer comes, so the load
    // is held for as long as the test wants.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lifecycle-fifo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("slow.gguf");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(ok.success());
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.models = vec![("slow".into(), fifo.clone())];
    cfg.preload = Some("slow".into());
    let mut srv = serve_state(Arc::new(AppState::new(cfg)), || async {});
    let a = srv.addr;
    for _ in 0..3 {
        let r = get(a, "/ready");
        assert_eq!(r.status, 503, "{}", r.body);
        assert_eq!(r.json()["status"], "loading");
        assert_eq!(get(a, "/health").status, 200, "alive while loading");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The writer opens and closes at once: an empty file, the load fails, serve stops.
    drop(std::fs::OpenOptions::new().write(true).open(&fifo).unwrap());
    let err = srv.wait(Duration::from_secs(30)).unwrap_err();
    assert!(err.contains("cannot load model 'slow'"), "{err}");

    // A preload that succeeds makes the server ready.
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.preload = Some(MODEL.into());
    let srv = serve_state(Arc::new(AppState::new(cfg)), || async {});
    let t = Instant::now();
    loop {
        let r = get(srv.addr, "/ready");
        if r.status == 200 {
            assert_eq!(r.json()["status"], "ready");
            break;
        }
        assert_eq!(r.json()["status"], "loading");
        assert!(t.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(loaded(srv.addr), [MODEL]);
}
