//! The bodies of OpenAI's API as typed serde structs: requests as clients send them (every
//! numeric field read wide — `f64`, `i64` — so an out-of-range value reaches validation and
//! gets a 400 naming it, rather than a type error), and the responses and stream chunks the
//! server writes.

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

/// `stop`: one string or a list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s.clone()],
            StopField::Many(v) => v.clone(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields both `/v1/chat/completions` and `/v1/completions` take.
#[derive(Clone, Debug, Deserialize)]
pub struct CommonFields {
    pub model: String,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Extensions (llama.cpp's server has them too).
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Extensions (llama.cpp's server names): mirostat 0 / 1 / 2, its tau and eta.
    pub mirostat: Option<i64>,
    pub mirostat_tau: Option<f64>,
    pub mirostat_eta: Option<f64>,
    /// Extensions (llama.cpp's server names): typical-p, XTC and DRY.
    pub typical_p: Option<f64>,
    pub xtc_probability: Option<f64>,
    pub xtc_threshold: Option<f64>,
    pub dry_multiplier: Option<f64>,
    pub dry_base: Option<f64>,
    pub dry_allowed_length: Option<i64>,
    pub dry_penalty_last_n: Option<i64>,
    pub dry_sequence_breakers: Option<Vec<String>>,
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub priority: Option<String>,
    /// Extensions: speculative decoding (`off`, `ngram`, `draft`) and the longest draft.
    pub spec: Option<String>,
    pub spec_max: Option<i64>,
    /// Extension (llama-server's): LoRA adapters for this request, `[{"id" or "name",
    /// "scale"}]` ([`crate::lora`]).
    pub lora: Option<serde_json::Value>,
}

/// Message content: a string, or a list of parts.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Clone, Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant turn's calls (`{"id", "type": "function", "function": {"name",
    /// "arguments": "<JSON text>"}}`).
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` turn: the call this is the result of.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// The fields only `/v1/chat/completions` takes.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatFields {
    pub messages: Vec<MessageIn>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
}

/// `prompt`: a string, a list of one string, or token ids.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// The fields only `/v1/completions` takes.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionFields {
    pub prompt: Prompt,
    /// Legacy: alternatives per token.
    pub logprobs: Option<i64>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

/// Speculative decoding's drafted tokens, named as OpenAI names the tokens of a predicted
/// output: accepted drafts, and rejected ones (verified and thrown away).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Present when tokens were drafted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

impl From<&mica::engine::Usage> for Usage {
    fn from(u: &mica::engine::Usage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            completion_tokens_details: (u.draft_tokens > 0).then(|| CompletionTokensDetails {
                accepted_prediction_tokens: u.accepted_draft_tokens,
                rejected_prediction_tokens: u.draft_tokens - u.accepted_draft_tokens,
            }),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the turn is only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A call the model made: `arguments` is the JSON text of the arguments object.
#[derive(Clone, Debug, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionOut,
}

#[derive(Clone, Debug, Serialize)]
pub struct FunctionOut {
    pub name: String,
    pub arguments: String,
}

/// A call in a stream chunk (`index` tells the client which call the delta extends).
#[derive(Clone, Debug, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(flatten)]
    pub call: ToolCallOut,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub system_fingerprint: &'static str,
}

/// Alternatives of one token, most likely first, as a JSON object (`{"token": logprob}`).
#[derive(Clone, Debug, Default)]
pub struct TopMap(pub Vec<(String, f32)>);

impl Serialize for TopMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// The legacy completions API's log-probabilities.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LegacyLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<TopMap>,
    pub text_offset: Vec<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<LegacyLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionChunkChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<LegacyLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<CompletionChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// An error inside a stream (after the 200 was sent).
#[derive(Clone, Debug, Serialize)]
pub struct StreamError {
    pub error: StreamErrorDetail,
}

#[derive(Clone, Debug, Serialize)]
pub struct StreamErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelObject {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelObject>,
}
