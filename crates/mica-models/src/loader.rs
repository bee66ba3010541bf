//! Opening a model file: the model, its tokenizer and its chat template, validated together.

use crate::chat::ChatTemplate;
use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use mica_formats::GgufFile;
use std::path::Path;
use std::sync::Arc;

/// Everything needed to run a model file.
pub struct LoadedModel {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

impl LoadedModel {
    /// Opens a GGUF file: maps it, validates it, and builds the model, tokenizer and template.
    pub fn open(path: impl AsRef<Path>) -> Result<LoadedModel> {
        let path = path.as_ref();
        let file = Arc::new(GgufFile::open(path)?);
        let model = crate::arch::load_gguf(file.clone())?;
        let tokenizer = Tokenizer::from_gguf(&file).map_err(|cause| ModelError::Tokenizer {
            path: path.to_path_buf(),
            cause,
        })?;
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
