//! The architecture registry: maps a model's architecture name — GGUF
//! `general.architecture` or a Hugging Face `architectures` entry — to the function that
//! turns its tensors and hyper-parameters into a [`Model`]. One line per alias.

mod decoder;
mod experts;
mod gemma3;
mod gpt2;
mod gptneox;
mod llama;
mod mixtral;
mod phi3;
mod qwen2moe;
mod qwen3moe;

use crate::config::Numerics;
use crate::error::{ModelError, Result};
use crate::hf::HfFolder;
use crate::model::Model;
use mica_formats::GgufFile;
use std::sync::Arc;

/// Where a model's tensors and hyper-parameters come from.
pub enum Source<'a> {
    Gguf(&'a Arc<GgufFile>),
    Hf(&'a HfFolder),
}

type Loader = fn(&Source, &str) -> Result<Model>;

/// Architecture names mica can run: GGUF names first, then transformers class names.
const REGISTRY: &[(&str, Loader)] = &[
    ("llama", llama::load_llama),
    ("mistral", llama::load_llama),
    ("qwen2", llama::load_qwen2),
    ("qwen3", llama::load_qwen3),
    ("gemma3", gemma3::load),
    ("phi3", phi3::load),
    ("qwen2moe", qwen2moe::load),
    ("qwen3moe", qwen3moe::load),
    ("gpt2", gpt2::load),
    ("gptneox", gptneox::load),
    ("LlamaForCausalLM", llama::load_llama),
    ("MistralForCausalLM", llama::load_llama),
    ("Qwen2ForCausalLM", llama::load_qwen2),
    ("Qwen3ForCausalLM", llama::load_qwen3),
    ("Gemma3ForCausalLM", gemma3::load),
    ("Phi3ForCausalLM", phi3::load),
    ("Qwen2MoeForCausalLM", qwen2moe::load),
    ("Qwen3MoeForCausalLM", qwen3moe::load),
    ("MixtralForCausalLM", mixtral::load),
    ("GPT2LMHeadModel", gpt2::load),
    ("GPTNeoXForCausalLM", gptneox::load),
];

/// Names of the supported architectures.
pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|(n, _)| *n).collect()
}

fn dispatch(src: &Source, path: &std::path::Path, arch: &str) -> Result<Model> {
    match REGISTRY.iter().find(|(n, _)| *n == arch) {
        Some((_, load)) => {
            let mut model = load(src, arch)?;
            // A float32 checkpoint is run in float32 throughout (its reference is float32);
            // anything stored narrower keeps llama.cpp's rounding.
            if model.float32_weights() {
                model.config.numerics = Numerics::F32;
            }
            Ok(model)
        }
        None => Err(ModelError::UnknownArchitecture {
            path: path.to_path_buf(),
            arch: arch.to_string(),
            supported: supported().join(", "),
        }),
    }
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
    dispatch(&Source::Gguf(&file), file.path(), &arch)
}

/// Builds the model a Hugging Face folder describes (`architectures[0]` of config.json).
pub fn load_hf(folder: &HfFolder) -> Result<Model> {
    let arch = folder.architecture()?.to_string();
    dispatch(&Source::Hf(folder), &folder.config_path(), &arch)
}
