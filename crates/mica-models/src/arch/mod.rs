//! The architecture registry: maps a file's architecture name to the function that turns its
//! tensors and metadata into a [`Model`]. One line per alias.

mod llama;

use crate::error::{ModelError, Result};
use crate::model::Model;
use mica_formats::GgufFile;
use std::sync::Arc;

type Loader = fn(Arc<GgufFile>, &str) -> Result<Model>;

/// `general.architecture` values mica can run.
const REGISTRY: &[(&str, Loader)] = &[
    ("llama", llama::load_llama),
    ("mistral", llama::load_llama),
    ("qwen2", llama::load_qwen2),
];

/// Names of the supported architectures.
pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|(n, _)| *n).collect()
}

/// Builds the model a GGUF file describes.
pub fn load_gguf(file: Arc<GgufFile>) -> Result<Model> {
    let arch = file
        .get_str("general.architecture")
        .ok_or_else(|| ModelError::Config {
            path: file.path().to_path_buf(),
            key: "general.architecture".into(),
            msg: "missing: the file does not say which architecture it holds".into(),
        })?
        .to_string();
    match REGISTRY.iter().find(|(n, _)| *n == arch) {
        Some((_, load)) => load(file, &arch),
        None => Err(ModelError::UnknownArchitecture {
            path: file.path().to_path_buf(),
            arch,
            supported: supported().join(", "),
        }),
    }
}
