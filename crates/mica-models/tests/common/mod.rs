//! Shared by the tests that use the real test models: where they are (`$MICA_TEST_MODELS`,
//! default `<workspace>/models`; `scripts/fetch-test-models` fetches them), a model's path
//! (a missing model fails the test), and the tokenizer fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

use mica_formats::GgufFile;
use mica_models::tokenizer::Tokenizer;
use serde_json::Value;

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

/// Path of a test model; panics with instructions when it is missing.
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

/// `fixtures/tokenizer/FILE`, parsed.
pub fn tokenizer_fixture(file: &str) -> Value {
    let path = workspace().join("fixtures/tokenizer").join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// The tokenizer of test model `name`.
pub fn load_tokenizer(name: &str) -> Tokenizer {
    let gguf = GgufFile::open(model_path(name)).expect("open GGUF");
    Tokenizer::from_gguf(&gguf).expect("build tokenizer")
}
