//! Helpers shared by the integration tests: locating test models and fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

pub const SMOLLM: &str = "smollm2-135m-instruct-q4_1";
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m";
pub const GEMMA: &str = "gemma3-270m-q4_k_m";

pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The path of a test model. Fails loudly (never skips) when it is missing.
pub fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models"));
    let path = dir.join(format!("{name}.gguf"));
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/fetch-test-models, or set MICA_TEST_MODELS to \
         the directory holding the test models",
        path.display()
    );
    path
}

/// A fixture under `<workspace>/fixtures`, parsed as JSON.
pub fn fixture(rel: &str) -> serde_json::Value {
    let path = workspace().join("fixtures").join(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// Threads for model tests: all cores (the machine running tests has at least 2).
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
