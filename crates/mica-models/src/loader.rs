//! Opening a model — a GGUF file or a Hugging Face folder: the model, its tokenizer and its
//! chat template, validated together.

use crate::chat::{ChatMessage, ChatTemplate, ChatTemplateError};
use crate::error::{ModelError, Result};
use crate::hf::{HfFolder, read_json};
use crate::model::Model;
use crate::tokenizer::hf_json::spec_from_hf;
use crate::tokenizer::{Tokenizer, TokenizerError, TokenizerSpec};
use mica_formats::GgufFile;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How to prepare a model for running.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Repack the weights into this CPU's packed layouts ([`Model::repack`]): faster
    /// products with the same results, at the cost of reading the whole file at load.
    pub repack: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { repack: true }
    }
}

impl LoadOptions {
    /// Only reading the model (inspecting, converting): the file's layout, nothing repacked.
    pub const READ_ONLY: LoadOptions = LoadOptions { repack: false };
}

/// A stage of opening a model, reported with its duration by
/// [`LoadedModel::open_observed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadStage {
    /// The file mapped and its header and tensor directory parsed (a folder: its config
    /// read and checkpoint files mapped).
    Parsed,
    /// The tokenizer built.
    Tokenizer,
    /// The model's weight views built and their shapes checked (no weight byte read).
    Model,
    /// The weights repacked ([`LoadOptions::repack`]).
    Repacked,
}

impl LoadStage {
    /// What the stage did, in a few words.
    pub fn describe(self) -> &'static str {
        match self {
            LoadStage::Parsed => "file mapped, header parsed",
            LoadStage::Tokenizer => "tokenizer built",
            LoadStage::Model => "weights mapped and checked",
            LoadStage::Repacked => "weights repacked",
        }
    }
}

/// Why a conversation could not be turned into prompt tokens ([`LoadedModel::chat_prompt`]).
#[derive(Debug, thiserror::Error)]
pub enum ChatPromptError {
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error(transparent)]
    Tokenize(#[from] TokenizerError),
}

impl LoadedModel {
    /// The prompt tokens of a conversation, ready for the assistant's next answer: the
    /// messages rendered with the model's chat template (its generation prompt appended),
    /// then tokenized as llama.cpp tokenizes chat prompts (BOS when the model asks for it,
    /// special tokens written in the text parsed as special). Every front end — `mica run
    /// --chat`, `mica chat`, the server's chat routes — builds its prompts here.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ChatPromptError> {
        self.chat_prompt_with_tools(messages, None)
    }

    /// [`LoadedModel::chat_prompt`] with tool definitions rendered through the template's
    /// `tools` variable (see [`ChatTemplate::render_with_tools`]).
    pub fn chat_prompt_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
    ) -> Result<Vec<u32>, ChatPromptError> {
        let text = self.template.render_with_tools(messages, tools, true)?;
        Ok(self.tokenizer.encode(&text, true, true)?)
    }

    /// Opens a GGUF file, or a Hugging Face folder (any directory), ready to run
    /// ([`LoadOptions::default`]).
    pub fn open(path: impl AsRef<Path>) -> Result<LoadedModel> {
        Self::open_with(path, LoadOptions::default())
    }

    /// Opens a GGUF file, or a Hugging Face folder (any directory): maps and validates it,
    /// and builds the model, tokenizer and template.
    pub fn open_with(path: impl AsRef<Path>, opts: LoadOptions) -> Result<LoadedModel> {
        Self::open_observed(path, opts, &mut |_, _| {})
    }

    /// [`LoadedModel::open_with`], telling `observe` each [`LoadStage`] as it ends, with
    /// its duration.
    pub fn open_observed(
        path: impl AsRef<Path>,
        opts: LoadOptions,
        observe: &mut dyn FnMut(LoadStage, Duration),
    ) -> Result<LoadedModel> {
        let _span = tracing::trace_span!("load_model", repack = opts.repack).entered();
        let mut lm = Self::open_unprepared(path.as_ref(), observe)?;
        if opts.repack {
            let t = Instant::now();
            lm.model.repack();
            observe(LoadStage::Repacked, t.elapsed());
        }
        Ok(lm)
    }

    fn open_unprepared(
        path: &Path,
        observe: &mut dyn FnMut(LoadStage, Duration),
    ) -> Result<LoadedModel> {
        if path.is_dir() {
            return Self::open_hf(path, observe);
        }
        let t = Instant::now();
        let mut file = tracing::trace_span!("open_file").in_scope(|| GgufFile::open(path))?;
        observe(LoadStage::Parsed, t.elapsed());
        // The vocabulary and merges move into the spec rather than being copied; the spec is
        // dropped once the tokenizer holds what it needs (compactly), and the remaining
        // arrays too: they would otherwise live as long as the model maps the file.
        let t = Instant::now();
        let span = tracing::trace_span!("build_tokenizer").entered();
        let tokenizer =
            TokenizerSpec::take_from_gguf(&mut file).and_then(|spec| Tokenizer::from_spec(&spec));
        file.drop_metadata(&TOKENIZER_ARRAYS);
        drop(span);
        observe(LoadStage::Tokenizer, t.elapsed());
        let t = Instant::now();
        let model = tracing::trace_span!("build_model")
            .in_scope(|| crate::arch::load_gguf(Arc::new(file)))?;
        observe(LoadStage::Model, t.elapsed());
        let tokenizer = tokenizer.map_err(|cause| ModelError::Tokenizer {
            path: path.to_path_buf(),
            cause,
        })?;
        Self::assemble(path, model, tokenizer)
    }

    /// A Hugging Face folder: config.json, the safetensors checkpoint, tokenizer.json and
    /// tokenizer_config.json (chat template, special tokens; or chat_template.jinja).
    fn open_hf(dir: &Path, observe: &mut dyn FnMut(LoadStage, Duration)) -> Result<LoadedModel> {
        let t = Instant::now();
        let folder = tracing::trace_span!("open_file").in_scope(|| HfFolder::open(dir))?;
        observe(LoadStage::Parsed, t.elapsed());
        let t = Instant::now();
        let model =
            tracing::trace_span!("build_model").in_scope(|| crate::arch::load_hf(&folder))?;
        observe(LoadStage::Model, t.elapsed());
        let t = Instant::now();
        let tokenizer = tracing::trace_span!("build_tokenizer").in_scope(|| hf_tokenizer(dir))?;
        observe(LoadStage::Tokenizer, t.elapsed());
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

/// Opens only the tokenizer of a model: a GGUF or `.mica` file (a vocabulary-only GGUF
/// included; no tensor data is read) or a Hugging Face folder (its tokenizer.json and
/// tokenizer_config.json; the weights are not opened).
pub fn open_tokenizer(path: impl AsRef<Path>) -> Result<Tokenizer> {
    let path = path.as_ref();
    if path.is_dir() {
        return hf_tokenizer(path);
    }
    let mut file = GgufFile::open(path)?;
    TokenizerSpec::take_from_gguf(&mut file)
        .and_then(|spec| Tokenizer::from_spec(&spec))
        .map_err(|cause| ModelError::Tokenizer {
            path: path.to_path_buf(),
            cause,
        })
}

/// The tokenizer of a Hugging Face folder.
fn hf_tokenizer(dir: &Path) -> Result<Tokenizer> {
    let tok_path = dir.join("tokenizer.json");
    let tok_json = read_json(&tok_path)?.ok_or_else(|| ModelError::Config {
        path: tok_path.clone(),
        key: "tokenizer.json".into(),
        msg: "missing from the folder (mica needs the tokenizer to run the model)".into(),
    })?;
    let config = read_json(&dir.join("tokenizer_config.json"))?;
    let jinja = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
    spec_from_hf(&tok_json, config.as_ref(), jinja)
        .and_then(|spec| Tokenizer::from_spec(&spec))
        .map_err(|cause| ModelError::Tokenizer {
            path: tok_path,
            cause,
        })
}
