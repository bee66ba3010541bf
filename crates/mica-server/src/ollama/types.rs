//! The bodies of Ollama's API as typed serde structs: requests (numeric options read wide
//! so an out-of-range value reaches validation and gets a 400 naming it) and the NDJSON
//! objects, model lists and model details the server writes.

pub use crate::openai::types::StopField;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `options`: the sampling and length settings of a request.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Options {
    pub temperature: Option<f64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub num_predict: Option<i64>,
    pub num_ctx: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// Extensions: speculative decoding (`off`, `ngram`, `draft`) and the longest draft.
    pub spec: Option<String>,
    pub spec_max: Option<i64>,
    pub mirostat: Option<i64>,
    pub mirostat_tau: Option<f64>,
    pub mirostat_eta: Option<f64>,
    /// Ollama's `typical_p`; extensions (llama.cpp's server names): XTC and DRY.
    pub typical_p: Option<f64>,
    pub xtc_probability: Option<f64>,
    pub xtc_threshold: Option<f64>,
    pub dry_multiplier: Option<f64>,
    pub dry_base: Option<f64>,
    pub dry_allowed_length: Option<i64>,
    pub dry_penalty_last_n: Option<i64>,
    pub dry_sequence_breakers: Option<Vec<String>>,
    /// Extension (OpenAI's shape): token id → bias.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct GenerateBody {
    pub model: String,
    #[serde(default)]
    pub prompt: String,
    pub system: Option<String>,
    #[serde(default)]
    pub raw: bool,
    pub stream: Option<bool>,
    pub options: Option<Options>,
    pub priority: Option<String>,
    /// Extension (llama-server's): LoRA adapters for this request ([`crate::lora`]).
    pub lora: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatMsg {
    pub role: String,
    #[serde(default)]
    pub content: String,
    /// An assistant turn's calls (`{"function": {"name", "arguments": {...}}}`).
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` turn: the function whose result this is.
    pub tool_name: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatBody {
    pub model: String,
    #[serde(default)]
    pub messages: Vec<ChatMsg>,
    pub stream: Option<bool>,
    pub options: Option<Options>,
    pub priority: Option<String>,
    /// Extension (llama-server's): LoRA adapters for this request ([`crate::lora`]).
    pub lora: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ShowBody {
    pub model: Option<String>,
    pub name: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MessageOut {
    pub role: &'static str,
    pub content: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A call the model made (Ollama's shape: the arguments as an object).
#[derive(Clone, Debug, Serialize)]
pub struct ToolCallOut {
    pub function: FunctionOut,
}

#[derive(Clone, Debug, Serialize)]
pub struct FunctionOut {
    pub name: String,
    pub arguments: serde_json::Value,
}

/// Counts and durations (nanoseconds) of a finished request.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Stats {
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
    pub prompt_eval_duration: u64,
    pub eval_count: usize,
    pub eval_duration: u64,
    /// Extensions, present when tokens were drafted (speculative decoding): drafted tokens
    /// verified, and those accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_accepted_count: Option<usize>,
}

/// One object of `/api/generate` (`response`) or `/api/chat` (`message`): a piece of text,
/// or the last one (`done`, with the reason and the counts).
#[derive(Clone, Debug, Serialize)]
pub struct Chunk {
    pub model: String,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<MessageOut>,
    pub done: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<&'static str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

/// An error inside a stream (after the 200 was sent).
#[derive(Clone, Debug, Serialize)]
pub struct StreamError {
    pub error: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Details {
    pub format: &'static str,
    pub family: String,
    pub families: Vec<String>,
    pub parameter_size: String,
    pub quantization_level: String,
    pub parent_model: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelEntry {
    pub name: String,
    pub model: String,
    pub modified_at: String,
    pub size: u64,
    pub digest: String,
    pub details: Details,
}

#[derive(Clone, Debug, Serialize)]
pub struct Tags {
    pub models: Vec<ModelEntry>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PsEntry {
    #[serde(flatten)]
    pub entry: ModelEntry,
    pub size_vram: u64,
    pub expires_at: &'static str,
    pub context_length: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Ps {
    pub models: Vec<PsEntry>,
}

/// A `model_info` value.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum InfoValue {
    Text(String),
    Number(u64),
}

#[derive(Clone, Debug, Serialize)]
pub struct Show {
    pub modelfile: String,
    pub parameters: &'static str,
    pub template: String,
    pub details: Details,
    pub model_info: BTreeMap<String, InfoValue>,
    pub capabilities: Vec<&'static str>,
    pub modified_at: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Version {
    pub version: &'static str,
}
