//! OpenAI's server-sent events: engine events to `data: {chunk}` lines ending with
//! `data: [DONE]`, for chat ([`ChatStream`]) and legacy completions ([`CompletionStream`]),
//! and the log-probability objects both the streams and the whole answers use.

use super::types::{
    ChatChunk, ChatChunkChoice, ChatLogprobs, CompletionChunk, CompletionChunkChoice, Delta,
    LegacyLogprobs, StreamError, StreamErrorDetail, TokenLogprob, TopLogprob, TopMap, Usage,
};
use crate::bridge::{Running, StreamFormat, finish_reason};
use mica_engine::Event;
use mica_models::LoadedModel;
use mica_models::tokenizer::{DecodeOptions, Tokenizer};
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
pub fn chat_logprob(tok: &Tokenizer, t: u32, lp: &mica_engine::TokenLogprob) -> TokenLogprob {
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
    lps: &[mica_engine::TokenLogprob],
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
}

impl ChatStream {
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
                let mut delta = Delta {
                    role: None,
                    content: Some(text),
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
                let mut out = String::new();
                if !text.is_empty() {
                    out += &self.chunk(
                        vec![ChatChunkChoice {
                            index,
                            delta: Delta {
                                role: None,
                                content: Some(text),
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
