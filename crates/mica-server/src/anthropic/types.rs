//! The bodies of Anthropic's Messages API as typed serde structs: requests as clients send
//! them (numbers read wide, as on the other APIs, so an out-of-range value reaches
//! validation and gets a 400 naming it), and the messages and stream events the server
//! writes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A `/v1/messages` (or `/v1/messages/count_tokens`) body. Fields not listed here —
/// `metadata`, `thinking`, `service_tier`... — are accepted and ignored.
#[derive(Clone, Debug, Deserialize)]
pub struct MessagesFields {
    pub model: String,
    pub messages: Vec<MessageIn>,
    pub system: Option<TextOrBlocks>,
    /// Required on `/v1/messages` (as Anthropic requires it); not read by `count_tokens`.
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: bool,
    pub tools: Option<Vec<ToolIn>>,
    pub tool_choice: Option<ToolChoiceIn>,
    /// Structured output: `{"format": {"type": "json_schema", "schema": {...}}}` (`effort`
    /// is ignored).
    pub output_config: Option<OutputConfigIn>,
    /// Extensions, as on the OpenAI routes: a sampling seed, the lane, speculative decoding.
    pub seed: Option<u64>,
    pub priority: Option<String>,
    pub spec: Option<String>,
    pub spec_max: Option<i64>,
    /// Extension (llama-server's): LoRA adapters for this request ([`crate::lora`]).
    pub lora: Option<serde_json::Value>,
}

/// Content given as a string or as a list of blocks (`system`, a message's `content`, a
/// `tool_result`'s `content`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum TextOrBlocks {
    Text(String),
    Blocks(Vec<BlockIn>),
}

#[derive(Clone, Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    pub content: TextOrBlocks,
}

/// One content block of a request: the fields of every block type the server reads, told
/// apart by `kind` (`text`, `tool_use`, `tool_result`; `image` and others are refused).
#[derive(Clone, Debug, Deserialize)]
pub struct BlockIn {
    #[serde(rename = "type")]
    pub kind: String,
    /// `text`.
    pub text: Option<String>,
    /// `tool_use`: the call's id, the tool's name and the arguments object.
    pub id: Option<String>,
    pub name: Option<String>,
    pub input: Option<Value>,
    /// `tool_result`: the call answered, and its result.
    pub tool_use_id: Option<String>,
    pub content: Option<Box<TextOrBlocks>>,
    pub is_error: Option<bool>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct OutputConfigIn {
    pub format: Option<OutputFormatIn>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct OutputFormatIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub schema: Option<Value>,
}

/// A tool the model may call.
#[derive(Clone, Debug, Deserialize)]
pub struct ToolIn {
    /// Absent or `custom` for a client tool; Anthropic's server tools are refused.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub description: Option<String>,
    /// Required for client tools (read as optional so a server tool is refused by its type).
    pub input_schema: Option<Value>,
}

/// `tool_choice`: `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name"}`.
#[derive(Clone, Debug, Deserialize)]
pub struct ToolChoiceIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
}

/// A block of the assistant's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// Token counts. `input_tokens` are the prompt's tokens not read from the prefix cache,
/// `cache_read_input_tokens` those that were, so the prompt is their sum (as Anthropic
/// counts); mica writes no cache, so `cache_creation_input_tokens` is 0.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Usage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
}

impl From<&mica::engine::Usage> for Usage {
    fn from(u: &mica::engine::Usage) -> Usage {
        let cached = u.cached_tokens.min(u.prompt_tokens);
        Usage {
            input_tokens: u.prompt_tokens - cached,
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }
}

/// A whole answer (and, empty, the `message` of a stream's `message_start`).
#[derive(Clone, Debug, Serialize)]
pub struct Message {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<Block>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`; `null` in `message_start`.
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// `/v1/messages/count_tokens`' answer.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct TokenCount {
    pub input_tokens: usize,
}

/// A change to the content block being streamed.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
}

/// `message_delta`'s `delta`: how the message ended.
#[derive(Clone, Debug, Serialize)]
pub struct MessageEnd {
    pub stop_reason: &'static str,
    pub stop_sequence: Option<String>,
}

/// One server-sent event; its `type` is also the SSE `event:` name.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart { message: Message },
    ContentBlockStart { index: usize, content_block: Block },
    ContentBlockDelta { index: usize, delta: BlockDelta },
    ContentBlockStop { index: usize },
    MessageDelta { delta: MessageEnd, usage: Usage },
    MessageStop,
}

impl StreamEvent {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
        }
    }

    /// `event: NAME` and `data: JSON` lines.
    pub fn sse(&self) -> String {
        format!(
            "event: {}\ndata: {}\n\n",
            self.name(),
            serde_json::to_string(self).unwrap_or_default()
        )
    }
}
