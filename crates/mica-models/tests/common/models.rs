//! Where the real test models are (`$MICA_TEST_MODELS`, default `<workspace>/models`;
//! `scripts/fetch-test-models` fetches them) and a model's path: a missing model fails the
//! test, never skips it. Shared by the mica-models tests and, through `#[path]`, the
//! mica-engine tests.
#![allow(dead_code)]

use std::path::PathBuf;

pub const SMOLLM: &str = "smollm2-135m-instruct-q4_1";
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m";
pub const GEMMA: &str = "gemma3-270m-q4_k_m";

pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The folder of the test models: `$MICA_TEST_MODELS`, default `<workspace>/models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("MICA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models"))
}

/// The path of a test model. Fails loudly (never skips) when it is missing.
pub fn model_path(name: &str) -> PathBuf {
    let path = models_dir().join(format!("{name}.gguf"));
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/fetch-test-models, or set MICA_TEST_MODELS to the \
         directory holding the test models",
        path.display()
    );
    path
}
