//! OpenAI's server-sent events: engine events to `data: {chunk}` lines ending with
//! `data: [DONE]`, for chat ([`ChatStream`]) and legacy completions ([`CompletionStream`]),
//! and the log-probability objects both the streams and the whole answers use.

use super::types::{
    ChatChunk, ChatChunkChoice, ChatLogprobs, CompletionChunk, CompletionChunkChoice, Delta,
    FunctionOut, LegacyLogprobs, StreamError, StreamErrorDetail, TokenLogprob, ToolCallDelta,
    ToolCallOut, TopLogprob, TopMap, Usage,
};
use crate::bridge::{Running, StreamFormat, finish_reason};
use mica::engine::Event;
use mica::grammar::tools::{ToolCall, ToolSet, ToolStream};
use mica::models::LoadedModel;
use mica::models::tokenizer::{DecodeOptions, Tokenizer};
use serde::Serialize;
use std::sync::Arc;

/// A token's text and bytes (special tokens included).
fn piece(tok: &Tokenizer, t: u32) -> (String, Vec<u8>) {
    let bytes = tok
        .token_piece(
            t,
            DecodeOptions {
                skip_special: false,
            },
        )
        .unwrap_or_default()
        .to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// The chat API's log-probability of one generated token.
pub fn chat_logprob(tok: &Tokenizer, t: u32, lp: &mica::engine::TokenLogprob) -> TokenLogprob {
    let (token, bytes) = piece(tok, t);
    let top_logprobs = lp
        .top
        .iter()
        .map(|&(id, logprob)| {
            let (token, bytes) = piece(tok, id);
            TopLogprob {
                token,
                logprob,
                bytes,
            }
        })
        .collect();
    TokenLogprob {
        token,
        logprob: lp.logprob,
        bytes,
        top_logprobs,
    }
}

/// The legacy completions API's log-probabilities of `tokens`.
pub fn legacy_logprobs(
    tok: &Tokenizer,
    tokens: &[u32],
    lps: &[mica::engine::TokenLogprob],
) -> LegacyLogprobs {
    let mut out = LegacyLogprobs::default();
    let mut offset = 0;
    for (&t, l) in tokens.iter().zip(lps) {
        let (text, _) = piece(tok, t);
        out.text_offset.push(offset);
        offset += text.len();
        out.tokens.push(text);
        out.token_logprobs.push(l.logprob);
        out.top_logprobs.push(TopMap(
            l.top.iter().map(|&(id, v)| (piece(tok, id).0, v)).collect(),
        ));
    }
    out
}

/// Parsed calls as the chat API writes them, each with a fresh id.
pub fn calls_out(calls: &[ToolCall]) -> Vec<ToolCallOut> {
    calls
        .iter()
        .map(|c| ToolCallOut {
            id: crate::structured::call_id(),
            kind: "function",
            function: FunctionOut {
                name: c.name.clone(),
                arguments: serde_json::to_string(&c.arguments).unwrap_or_default(),
            },
        })
        .collect()
}

fn data(v: &impl Serialize) -> String {
    format!("data: {}\n\n", serde_json::to_string(v).unwrap_or_default())
}

fn error_event(message: String) -> String {
    data(&StreamError {
        error: StreamErrorDetail {
            message,
            kind: "server_error",
        },
    })
}

/// Chat completion chunks.
pub struct ChatStream {
    pub id: String,
    pub model: String,
    pub include_usage: bool,
    pub created: u64,
    /// Whether each choice's first chunk (carrying the role) went out.
    pub sent_role: Vec<bool>,
    pub tok: Arc<LoadedModel>,
    /// The request's tools: content is streamed as it comes, calls are held back and sent
    /// whole at the end (one delta per call, with its id, name and arguments).
    pub tools: Option<Arc<ToolSet>>,
    /// One parser per completion when there are tools.
    pub tool_streams: Vec<ToolStream>,
}

impl ChatStream {
    fn role(&mut self, index: usize) -> Option<&'static str> {
        if !self.sent_role.get(index).copied().unwrap_or(true) {
            self.sent_role[index] = true;
            Some("assistant")
        } else {
            None
        }
    }

    fn content_chunk(&mut self, index: usize, text: String) -> String {
        let role = self.role(index);
        self.chunk(
            vec![ChatChunkChoice {
                index,
                delta: Delta {
                    role,
                    content: Some(text),
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: None,
            }],
            None,
        )
    }

    /// The end of completion `index` with tools: held content, then the calls, then the
    /// finish reason (`tool_calls` when there are calls).
    fn finish_tools(
        &mut self,
        index: usize,
        text: &str,
        finish: mica::engine::FinishReason,
    ) -> String {
        let (Some(set), Some(ts)) = (self.tools.clone(), self.tool_streams.get_mut(index)) else {
            return String::new();
        };
        let mut ts = std::mem::replace(ts, set.stream());
        let mut content = ts.push(text);
        let end = ts.finish(&set);
        content.push_str(&end.content);
        let mut out = String::new();
        if !content.is_empty() {
            out += &self.content_chunk(index, content);
        }
        let calls = calls_out(&end.calls);
        let reason = if calls.is_empty() {
            finish_reason(Some(finish))
        } else {
            let role = self.role(index);
            let deltas = calls
                .into_iter()
                .enumerate()
                .map(|(i, call)| ToolCallDelta { index: i, call })
                .collect();
            out += &self.chunk(
                vec![ChatChunkChoice {
                    index,
                    delta: Delta {
                        role,
                        content: None,
                        tool_calls: Some(deltas),
                    },
                    logprobs: None,
                    finish_reason: None,
                }],
                None,
            );
            "tool_calls"
        };
        out += &self.chunk(
            vec![ChatChunkChoice {
                index,
                delta: Delta::default(),
                logprobs: None,
                finish_reason: Some(reason),
            }],
            None,
        );
        out
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        data(&ChatChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: "mica",
            choices,
            usage,
        })
    }
}

impl StreamFormat for ChatStream {
    fn on_event(&mut self, _r: &Running, ev: Event) -> String {
        match ev {
            Event::Token {
                index,
                token,
                text,
                logprob,
            } => {
                let text = match self.tool_streams.get_mut(index) {
                    Some(ts) => ts.push(&text),
                    None => text,
                };
                if self.tools.is_some() && text.is_empty() {
                    return String::new();
                }
                let mut delta = Delta {
                    role: None,
                    content: Some(text),
                    tool_calls: None,
                };
                if !self.sent_role.get(index).copied().unwrap_or(true) {
                    self.sent_role[index] = true;
                    delta.role = Some("assistant");
                }
                let logprobs = logprob.map(|l| ChatLogprobs {
                    content: vec![chat_logprob(&self.tok.tokenizer, token, &l)],
                });
                self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta,
                        logprobs,
                        finish_reason: None,
                    }],
                    None,
                )
            }
            Event::Done {
                index,
                finish,
                text,
            } => {
                if self.tools.is_some() {
                    return self.finish_tools(index, &text, finish);
                }
                let mut out = String::new();
                if !text.is_empty() {
                    out += &self.chunk(
                        vec![ChatChunkChoice {
                            index,
                            delta: Delta {
                                role: None,
                                content: Some(text),
                                tool_calls: None,
                            },
                            logprobs: None,
                            finish_reason: None,
                        }],
                        None,
                    );
                }
                out += &self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta: Delta::default(),
                        logprobs: None,
                        finish_reason: Some(finish_reason(Some(finish))),
                    }],
                    None,
                );
                out
            }
            Event::Finished { usage } if self.include_usage => {
                self.chunk(vec![], Some(Usage::from(&usage)))
            }
            Event::Finished { .. } => String::new(),
            Event::Error(e) => error_event(e.to_string()),
        }
    }

    fn finish(&mut self, _r: &Running) -> String {
        "data: [DONE]\n\n".into()
    }
}

/// Legacy completion chunks.
pub struct CompletionStream {
    pub id: String,
    pub model: String,
    pub include_usage: bool,
    pub created: u64,
    pub tok: Arc<LoadedModel>,
}

impl CompletionStream {
    fn chunk(&self, choices: Vec<CompletionChunkChoice>, usage: Option<Usage>) -> String {
        data(&CompletionChunk {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model,
            choices,
            usage,
        })
    }
}

impl StreamFormat for CompletionStream {
    fn on_event(&mut self, _r: &Running, ev: Event) -> String {
        match ev {
            Event::Token {
                index,
                token,
                text,
                logprob,
            } => {
                let logprobs =
                    logprob.map(|l| legacy_logprobs(&self.tok.tokenizer, &[token], &[l]));
                self.chunk(
                    vec![CompletionChunkChoice {
                        index,
                        text,
                        logprobs,
                        finish_reason: None,
                    }],
                    None,
                )
            }
            Event::Done {
                index,
                finish,
                text,
            } => self.chunk(
                vec![CompletionChunkChoice {
                    index,
                    text,
                    logprobs: None,
                    finish_reason: Some(finish_reason(Some(finish))),
                }],
                None,
            ),
            Event::Finished { usage } if self.include_usage => {
                self.chunk(vec![], Some(Usage::from(&usage)))
            }
            Event::Finished { .. } => String::new(),
            Event::Error(e) => error_event(e.to_string()),
        }
    }

    fn finish(&mut self, _r: &Running) -> String {
        "data: [DONE]\n\n".into()
    }
}
