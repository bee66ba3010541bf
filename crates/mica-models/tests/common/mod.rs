//! Shared by the tests that use the real test models: where they are and a model's path
//! (`models.rs`), and the tokenizer fixtures.
#![allow(dead_code)]

mod models;

pub use models::*;

use mica_formats::GgufFile;
use mica_models::tokenizer::Tokenizer;
use serde_json::Value;

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
