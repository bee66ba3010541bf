//! [`Model`]: an opened model — weights, tokenizer and chat template — shared cheaply
//! (clones share one copy) by the sessions and engines made from it.

use crate::engine_api::{Engine, EngineOptions};
use crate::error::Result;
use crate::session::{Session, SessionOptions};
use mica_grammar::tools::ToolFormat;
use mica_grammar::{CompiledGrammar, Constraint, GrammarCompiler};
use mica_hub::{Hub, Progress, Store};
use mica_models::chat::ChatMessage;
use mica_models::kv_cache::KvType;
use mica_models::{LoadOptions, LoadedModel, LoraSpec};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The context a session or engine gets when none is asked for: the model's training
/// context, at most this many positions (llama.cpp's default is 4096 as well).
pub const DEFAULT_MAX_CTX: usize = 4096;

/// How to open a model.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Repack the weights into this CPU's packed layouts at load: faster matrix products
    /// with bit-identical results, at the cost of reading the whole file up front. Turn it
    /// off to only inspect a model.
    pub repack: bool,
    /// LoRA adapters applied unmerged (PEFT folders or GGUF LoRA files, each at a scale;
    /// see [`mica_models::lora`]). An adapter that does not fit the model is an error.
    pub lora: Vec<LoraSpec>,
    /// The KV cache's key and value types (llama.cpp's `--cache-type-k/-v`: f16, f32,
    /// bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1); `None`: the model's own (f16, or f32
    /// for float32 checkpoints). A type whose blocks do not divide the head size is an
    /// error.
    pub cache_type_k: Option<KvType>,
    pub cache_type_v: Option<KvType>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            repack: true,
            lora: Vec::new(),
            cache_type_k: None,
            cache_type_v: None,
        }
    }
}

/// An opened model. Cloning is cheap and shares the weights.
#[derive(Clone)]
pub struct Model {
    lm: Arc<LoadedModel>,
    path: PathBuf,
    /// Built on first use (indexing the vocabulary takes a moment) and shared by clones.
    grammar: Arc<OnceLock<GrammarCompiler>>,
}

impl Model {
    /// Opens a GGUF or `.mica` file, or a Hugging Face folder (config.json + safetensors +
    /// tokenizer.json), ready to run.
    pub fn open(path: impl AsRef<Path>) -> Result<Model> {
        Self::open_with(path, ModelOptions::default())
    }

    /// [`Model::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, opts: ModelOptions) -> Result<Model> {
        let path = path.as_ref();
        let mut lm = LoadedModel::open_with(
            path,
            LoadOptions {
                repack: opts.repack,
            },
        )?;
        for spec in &opts.lora {
            lm.attach_lora(spec)?;
        }
        lm.model
            .config
            .choose_cache_types(opts.cache_type_k, opts.cache_type_v)?;
        Ok(Model {
            lm: Arc::new(lm),
            path: path.to_path_buf(),
            grammar: Arc::default(),
        })
    }

    /// Opens what a user named, as every `-m` of the `mica` binary takes it: an existing
    /// path, a model in `store`, or a catalog / `hf:ORG/REPO[:FILE]` name that is pulled
    /// into `store` through `hub` first (reporting to `progress`).
    pub fn from_store(
        store: &Store,
        hub: &Hub,
        name_or_path: &str,
        progress: Option<&dyn Progress>,
        opts: ModelOptions,
    ) -> Result<Model> {
        let path = store.resolve(name_or_path, hub, progress)?;
        Self::open_with(path, opts)
    }

    /// Wraps a model loaded through the lower layers.
    pub fn from_loaded(lm: Arc<LoadedModel>, path: impl Into<PathBuf>) -> Model {
        Model {
            lm,
            path: path.into(),
            grammar: Arc::default(),
        }
    }

    /// The file or folder the model came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The model, tokenizer and chat template of the layer beneath.
    pub fn loaded(&self) -> &Arc<LoadedModel> {
        &self.lm
    }

    /// Rows of the output layer (the logits' length).
    pub fn n_vocab(&self) -> usize {
        self.lm.model.config.n_vocab
    }

    /// The context the model was trained with.
    pub fn n_ctx_train(&self) -> usize {
        self.lm.model.config.n_ctx_train
    }

    /// The context sessions and engines get by default: the training context, at most
    /// [`DEFAULT_MAX_CTX`].
    pub fn default_n_ctx(&self) -> usize {
        self.n_ctx_train().min(DEFAULT_MAX_CTX)
    }

    /// Text to token ids as llama.cpp tokenizes a prompt: BOS (or EOS) added where the model
    /// asks for it, special tokens written in the text (`<|im_start|>`) parsed as such.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenize_with(text, true, true)
    }

    /// Text to token ids; `add_special` adds BOS/EOS where the model wants them,
    /// `parse_special` turns special tokens written in the text into those tokens.
    pub fn tokenize_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        Ok(self.lm.tokenizer.encode(text, add_special, parse_special)?)
    }

    /// Token ids to text (special tokens included as their text).
    pub fn detokenize(&self, ids: &[u32]) -> Result<String> {
        Ok(self.lm.tokenizer.decode(ids)?)
    }

    /// The prompt tokens of a conversation, ready for the assistant's answer: rendered with
    /// the model's chat template (ChatML when the file has none, as llama.cpp does) and
    /// tokenized.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        Ok(self.lm.chat_prompt(messages)?)
    }

    /// [`Model::chat_prompt`] with tool definitions (OpenAI's `{"type": "function",
    /// "function": {...}}` objects, e.g. from
    /// [`ToolSet::template_tools`](mica_grammar::tools::ToolSet::template_tools)) given to
    /// the chat template's `tools` variable.
    pub fn chat_prompt_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<Vec<u32>> {
        Ok(self.lm.chat_prompt_with_tools(messages, Some(tools))?)
    }

    /// How this model writes tool calls (from its chat template).
    pub fn tool_format(&self) -> ToolFormat {
        ToolFormat::detect(self.lm.tokenizer.chat_template().unwrap_or_default())
    }

    /// The model's grammar compiler (its vocabulary indexed for constrained decoding; built
    /// on first use and kept).
    pub fn grammar_compiler(&self) -> Result<GrammarCompiler> {
        if let Some(c) = self.grammar.get() {
            return Ok(c.clone());
        }
        let c = GrammarCompiler::for_model(&self.lm)?;
        Ok(self.grammar.get_or_init(|| c).clone())
    }

    /// Checks and compiles an output constraint for this model: an invalid or unsupported
    /// one is an error here, before anything is generated. Use it through
    /// [`CompiledGrammar::processor`] (a [`Session`]'s hooks) or
    /// [`Request::constrained`](crate::Request::constrained) (an [`Engine`]).
    pub fn compile(&self, constraint: &Constraint) -> Result<CompiledGrammar> {
        Ok(self.grammar_compiler()?.compile(constraint)?)
    }

    /// A single-sequence session (its own threads and KV cache).
    pub fn session(&self, opts: SessionOptions) -> Session {
        Session::new(self, opts)
    }

    /// A serving engine for concurrent requests, on its own thread.
    pub fn engine(&self, opts: EngineOptions) -> Result<Engine> {
        Engine::start(self, opts)
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("n_vocab", &self.n_vocab())
            .finish_non_exhaustive()
    }
}
