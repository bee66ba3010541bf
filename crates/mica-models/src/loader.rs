//! Opening a model — a GGUF file or a Hugging Face folder: the model, its tokenizer and its
//! chat template, validated together.

use crate::chat::ChatTemplate;
use crate::error::{ModelError, Result};
use crate::hf::{HfFolder, read_json};
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::hf_json::spec_from_hf;
use mica_formats::GgufFile;
use std::path::Path;
use std::sync::Arc;

/// Everything needed to run a model file.
pub struct LoadedModel {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

/// The tokenizer's large metadata arrays, dropped from the file once the tokenizer is built.
const TOKENIZER_ARRAYS: [&str; 4] = [
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
];

impl LoadedModel {
    /// Opens a GGUF file, or a Hugging Face folder (any directory): maps and validates it,
    /// and builds the model, tokenizer and template.
    pub fn open(path: impl AsRef<Path>) -> Result<LoadedModel> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::open_hf(path);
        }
        let mut file = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&file);
        // The tokenizer keeps what it needs; the parsed vocabulary arrays would otherwise live
        // (~15 MB for a 150k vocabulary) as long as the model maps the file.
        file.drop_metadata(&TOKENIZER_ARRAYS);
        let model = crate::arch::load_gguf(Arc::new(file))?;
        let tokenizer = tokenizer.map_err(|cause| ModelError::Tokenizer {
            path: path.to_path_buf(),
            cause,
        })?;
        Self::assemble(path, model, tokenizer)
    }

    /// A Hugging Face folder: config.json, the safetensors checkpoint, tokenizer.json and
    /// tokenizer_config.json (chat template, special tokens; or chat_template.jinja).
    fn open_hf(dir: &Path) -> Result<LoadedModel> {
        let folder = HfFolder::open(dir)?;
        let model = crate::arch::load_hf(&folder)?;
        let tok_path = dir.join("tokenizer.json");
        let tok_json = read_json(&tok_path)?.ok_or_else(|| ModelError::Config {
            path: tok_path.clone(),
            key: "tokenizer.json".into(),
            msg: "missing from the folder (mica needs the tokenizer to run the model)".into(),
        })?;
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let jinja = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
        let tokenizer = spec_from_hf(&tok_json, config.as_ref(), jinja)
            .and_then(|spec| Tokenizer::from_spec(&spec))
            .map_err(|cause| ModelError::Tokenizer {
                path: tok_path,
                cause,
            })?;
        Self::assemble(dir, model, tokenizer)
    }

    fn assemble(path: &Path, model: Model, tokenizer: Tokenizer) -> Result<LoadedModel> {
        if tokenizer.vocab_size() > model.config.n_vocab {
            return Err(ModelError::Config {
                path: path.to_path_buf(),
                key: "tokenizer.ggml.tokens".into(),
                msg: format!(
                    "the vocabulary has {} tokens but the model only {} embedding rows",
                    tokenizer.vocab_size(),
                    model.config.n_vocab
                ),
            });
        }
        let template = ChatTemplate::for_tokenizer(&tokenizer)?;
        Ok(LoadedModel {
            model,
            tokenizer,
            template,
        })
    }
}
