//! Helpers shared by the integration tests: the test models, loaded once per test binary.
#![allow(dead_code)]

use mica_grammar::GrammarCompiler;
use mica_models::LoadedModel;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub const SMOLLM: &str = "smollm2-135m-instruct-q4_1";
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m";

/// The path of a test model. Fails loudly (never skips) when it is missing.
pub fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    let path = dir.join(format!("{name}.gguf"));
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/fetch-test-models, or set MICA_TEST_MODELS to \
         the directory holding the test models",
        path.display()
    );
    path
}

/// Loaded test models by name, with their grammar compilers.
type Cache = std::sync::Mutex<Vec<(String, Arc<LoadedModel>, GrammarCompiler)>>;

/// A test model and its grammar compiler, loaded once.
pub fn model(name: &str) -> (Arc<LoadedModel>, GrammarCompiler) {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m, g)) = c.iter().find(|(n, ..)| n == name) {
        return (m.clone(), g.clone());
    }
    let m = Arc::new(LoadedModel::open(model_path(name)).expect("load model"));
    let g = GrammarCompiler::for_model(&m).expect("grammar compiler");
    c.push((name.to_string(), m.clone(), g.clone()));
    (m, g)
}

pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
