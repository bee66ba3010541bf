//! Anthropic's server-sent events: `message_start`, then per content block
//! `content_block_start`, its deltas (`text_delta`, or one `input_json_delta` holding a tool
//! call's whole input) and `content_block_stop`, then `message_delta` (the stop reason and
//! the usage) and `message_stop`. Text streams as it is generated; with tools, output that
//! may be a call is held back and sent as `tool_use` blocks at the end (as the OpenAI
//! route sends calls whole). An error after the 200 is an `error` event.

use super::types::{Block, BlockDelta, Message, MessageEnd, StreamEvent, Usage};
use super::{blocks_of, stop_of};
use crate::bridge::{Running, StreamFormat};
use crate::error::{Flavor, ServerError};
use mica::engine::Event;
use mica::grammar::tools::{ToolSet, ToolStream};
use mica::models::LoadedModel;
use std::sync::Arc;

/// The events of one `/v1/messages` stream.
pub struct MessagesStream {
    id: String,
    model: String,
    loaded: Arc<LoadedModel>,
    stops: Vec<String>,
    tools: Option<Arc<ToolSet>>,
    tool_stream: Option<ToolStream>,
    /// `message_start` went out.
    started: bool,
    /// The index of the open text block, if one is open.
    text_block: Option<usize>,
    /// Blocks started so far (the next block's index).
    blocks: usize,
    tokens: Vec<u32>,
    /// How the message ended, once its completion is done.
    end: Option<MessageEnd>,
    /// `message_stop` (or an `error` event) went out.
    closed: bool,
}

impl MessagesStream {
    pub fn new(
        id: String,
        model: String,
        loaded: Arc<LoadedModel>,
        stops: Vec<String>,
        tools: Option<Arc<ToolSet>>,
    ) -> MessagesStream {
        MessagesStream {
            id,
            model,
            loaded,
            stops,
            tool_stream: tools.as_ref().map(|t| t.stream()),
            tools,
            started: false,
            text_block: None,
            blocks: 0,
            tokens: Vec::new(),
            end: None,
            closed: false,
        }
    }

    /// `message_start` before the first event.
    fn start(&mut self, r: &Running) -> String {
        if self.started {
            return String::new();
        }
        self.started = true;
        StreamEvent::MessageStart {
            message: Message {
                id: self.id.clone(),
                kind: "message",
                role: "assistant",
                model: self.model.clone(),
                content: Vec::new(),
                stop_reason: None,
                stop_sequence: None,
                usage: Usage {
                    input_tokens: r.prompt_tokens,
                    output_tokens: 0,
                    cache_creation_input_tokens: 0,
                    cache_read_input_tokens: 0,
                },
            },
        }
        .sse()
    }

    /// A `text_delta`, opening the text block first when needed.
    fn text(&mut self, text: String) -> String {
        if text.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        let index = match self.text_block {
            Some(i) => i,
            None => {
                let i = self.open(
                    &mut out,
                    Block::Text {
                        text: String::new(),
                    },
                );
                self.text_block = Some(i);
                i
            }
        };
        out += &StreamEvent::ContentBlockDelta {
            index,
            delta: BlockDelta::TextDelta { text },
        }
        .sse();
        out
    }

    fn open(&mut self, out: &mut String, content_block: Block) -> usize {
        let index = self.blocks;
        self.blocks += 1;
        *out += &StreamEvent::ContentBlockStart {
            index,
            content_block,
        }
        .sse();
        index
    }

    /// The end of the completion: held text, the calls as `tool_use` blocks, the stop
    /// reason kept for `message_delta`.
    fn done(&mut self, text: &str, finish: mica::engine::FinishReason) -> String {
        let (content, calls) = match (&self.tools, self.tool_stream.take()) {
            (Some(set), Some(mut ts)) => {
                let mut content = ts.push(text);
                let end = ts.finish(set);
                content.push_str(&end.content);
                (content, end.calls)
            }
            _ => (text.to_string(), Vec::new()),
        };
        let mut out = self.text(content);
        if self.text_block.is_none() && calls.is_empty() {
            // A plain answer always has its text block, empty or not.
            let i = self.open(
                &mut out,
                Block::Text {
                    text: String::new(),
                },
            );
            self.text_block = Some(i);
        }
        if let Some(index) = self.text_block.take() {
            out += &StreamEvent::ContentBlockStop { index }.sse();
        }
        for block in blocks_of(String::new(), &calls) {
            let Block::ToolUse { id, name, input } = block else {
                continue;
            };
            let index = self.open(
                &mut out,
                Block::ToolUse {
                    id,
                    name,
                    input: serde_json::Value::Object(Default::default()),
                },
            );
            out += &StreamEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::InputJsonDelta {
                    partial_json: input.to_string(),
                },
            }
            .sse();
            out += &StreamEvent::ContentBlockStop { index }.sse();
        }
        let (stop_reason, stop_sequence) = stop_of(
            Some(finish),
            !calls.is_empty(),
            &self.tokens,
            &self.loaded,
            &self.stops,
        );
        self.end = Some(MessageEnd {
            stop_reason,
            stop_sequence,
        });
        out
    }

    fn error(&mut self, e: ServerError) -> String {
        self.closed = true;
        format!(
            "event: error\ndata: {}\n\n",
            String::from_utf8_lossy(&e.body(Flavor::Anthropic))
        )
    }
}

impl StreamFormat for MessagesStream {
    fn on_event(&mut self, r: &Running, ev: Event) -> String {
        let mut out = self.start(r);
        match ev {
            Event::Token { token, text, .. } => {
                self.tokens.push(token);
                let text = match &mut self.tool_stream {
                    Some(ts) => ts.push(&text),
                    None => text,
                };
                out += &self.text(text);
            }
            Event::Done { finish, text, .. } => out += &self.done(&text, finish),
            Event::Finished { usage } => {
                let delta = self.end.take().unwrap_or(MessageEnd {
                    stop_reason: "end_turn",
                    stop_sequence: None,
                });
                out += &StreamEvent::MessageDelta {
                    delta,
                    usage: Usage::from(&usage),
                }
                .sse();
                out += &StreamEvent::MessageStop.sse();
                self.closed = true;
            }
            Event::Error(e) => out += &self.error(ServerError::Generation(e.to_string())),
        }
        out
    }

    fn finish(&mut self, r: &Running) -> String {
        if self.closed {
            return String::new();
        }
        // The engine went away before the end.
        let mut out = self.start(r);
        out += &self.error(ServerError::EngineStopped);
        out
    }
}
