//! The architecture registry: one [`Family`] descriptor per family file, listed in
//! [`REGISTRY`]. A model's architecture name — GGUF `general.architecture` or a Hugging
//! Face `architectures` entry — is looked up there and the family's loader builds the
//! [`Model`]. Adding a family is one file declaring its descriptor plus one line here.

mod decoder;
mod experts;
pub mod family;
pub mod to_gguf;

pub use family::{Family, GgufHints, GgufKeys, GgufWarning};

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

/// Declares each family module (`arch/<family>.rs`, which defines `FAMILY`) and lists its
/// descriptor in [`REGISTRY`], in this order.
macro_rules! registry {
    ($($family:ident),* $(,)?) => {
        $(pub(crate) mod $family;)*

        /// Every family mica runs.
        pub static REGISTRY: &[&Family] = &[$(&$family::FAMILY),*];
    };
}

registry![
    llama, qwen2, qwen3, gemma3, phi3, qwen2moe, qwen3moe, mixtral, gpt2, gptneox, gemma2, smollm3,
    gemma4, qwen35, qwen35moe, starcoder, opt, codegen, deepseek2, gptoss,
];

/// The family whose GGUF files name themselves `arch` (`general.architecture`).
pub fn by_gguf(arch: &str) -> Option<&'static Family> {
    REGISTRY
        .iter()
        .copied()
        .find(|f| f.gguf_archs.contains(&arch))
}

/// The family of the transformers class `class` (`architectures[0]` of config.json).
pub fn by_hf(class: &str) -> Option<&'static Family> {
    REGISTRY
        .iter()
        .copied()
        .find(|f| f.hf_classes.contains(&class))
}

/// Names of the supported architectures: GGUF names first, then transformers class names.
pub fn supported() -> Vec<&'static str> {
    let gguf = REGISTRY.iter().flat_map(|f| f.gguf_archs.iter().copied());
    let hf = REGISTRY.iter().flat_map(|f| f.hf_classes.iter().copied());
    gguf.chain(hf).collect()
}

fn dispatch(
    family: Option<&Family>,
    src: &Source,
    path: &std::path::Path,
    arch: &str,
) -> Result<Model> {
    let Some(family) = family else {
        return Err(ModelError::UnknownArchitecture {
            path: path.to_path_buf(),
            arch: arch.to_string(),
            supported: supported().join(", "),
        });
    };
    let mut model = (family.load)(src, arch)?;
    // A float32 checkpoint is run in float32 throughout (its reference is float32);
    // anything stored narrower keeps llama.cpp's rounding.
    if model.float32_weights() {
        model.config.numerics = Numerics::F32;
    }
    Ok(model)
}

/// Builds the model a GGUF file describes. A file without tensors (vocabulary only) is
/// refused with [`ModelError::VocabOnly`].
pub fn load_gguf(file: Arc<GgufFile>) -> Result<Model> {
    if file.tensors().is_empty() {
        return Err(ModelError::VocabOnly {
            path: file.path().to_path_buf(),
        });
    }
    let arch = file
        .get_str("general.architecture")
        .ok_or_else(|| ModelError::Config {
            path: file.path().to_path_buf(),
            key: "general.architecture".into(),
            msg: "missing: the file does not say which architecture it holds".into(),
        })?
        .to_string();
    dispatch(by_gguf(&arch), &Source::Gguf(&file), file.path(), &arch)
}

/// Builds the model a Hugging Face folder describes (`architectures[0]` of config.json).
pub fn load_hf(folder: &HfFolder) -> Result<Model> {
    let arch = folder.architecture()?.to_string();
    dispatch(
        by_hf(&arch),
        &Source::Hf(folder),
        &folder.config_path(),
        &arch,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name belongs to one family, and the lookups find it.
    #[test]
    fn names_are_unique_and_found() {
        let names = supported();
        for (i, n) in names.iter().enumerate() {
            assert!(!names[..i].contains(n), "'{n}' registered twice");
        }
        for f in REGISTRY {
            for a in f.gguf_archs {
                assert!(std::ptr::eq(by_gguf(a).unwrap(), *f), "{a}");
            }
            for c in f.hf_classes {
                assert!(std::ptr::eq(by_hf(c).unwrap(), *f), "{c}");
            }
            // The families llama.cpp has no architecture for are read from Hugging Face
            // folders only and written as no GGUF; every other one names the one it writes.
            const HF_ONLY: &[&str] = &["opt", "codegen"];
            assert_eq!(
                f.gguf.arch.is_empty(),
                HF_ONLY.contains(&f.name),
                "{}: GGUF architecture",
                f.name
            );
            if HF_ONLY.contains(&f.name) {
                assert!(f.gguf_archs.is_empty(), "{}", f.name);
            }
        }
        assert!(by_gguf("LlamaForCausalLM").is_none());
        assert!(by_hf("llama").is_none());
    }
}
