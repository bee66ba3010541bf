//! Ollama's NDJSON: engine events to one JSON object per line, the last one `done: true`
//! with the finish reason, counts and durations ([`Ndjson`]); the same final object answers
//! a non-streaming request.

use super::types::{Chunk, FunctionOut, MessageOut, Stats, StreamError, ToolCallOut};
use crate::bridge::{Running, StreamFormat, finish_reason, rfc3339};
use mica::engine::{Event, FinishReason, Usage};
use mica::grammar::tools::{ToolSet, ToolStream};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub struct Ndjson {
    pub model: String,
    /// `/api/chat` (`message`) rather than `/api/generate` (`response`).
    pub chat: bool,
    pub finish: Option<FinishReason>,
    pub first: Option<Instant>,
    pub load: Duration,
    /// The request's tools (`/api/chat`): content streams as it comes, calls are sent whole
    /// in the message's `tool_calls` once the completion ends.
    pub tools: Option<(Arc<ToolSet>, ToolStream)>,
}

impl Ndjson {
    pub fn new(model: String, chat: bool, load: Duration) -> Ndjson {
        Ndjson {
            model,
            chat,
            finish: None,
            first: None,
            load,
            tools: None,
        }
    }

    /// With tools: calls are parsed out of the output.
    pub fn with_tools(mut self, tools: Option<Arc<ToolSet>>) -> Ndjson {
        self.tools = tools.map(|t| {
            let s = t.stream();
            (t, s)
        });
        self
    }

    /// A whole output split into content and calls (non-streaming answers).
    pub fn split(&self, text: String) -> (String, Vec<ToolCallOut>) {
        match &self.tools {
            Some((set, _)) => {
                let p = set.parse(&text);
                (p.content, calls_out(&p.calls))
            }
            None => (text, Vec::new()),
        }
    }

    /// An object carrying `text`.
    pub fn chunk(&self, text: String, done: bool) -> Chunk {
        let (response, message) = if self.chat {
            (
                None,
                Some(MessageOut {
                    role: "assistant",
                    content: text,
                    tool_calls: Vec::new(),
                }),
            )
        } else {
            (Some(text), None)
        };
        Chunk {
            model: self.model.clone(),
            created_at: rfc3339(SystemTime::now()),
            response,
            message,
            done,
            done_reason: None,
            stats: None,
        }
    }

    /// The last object: `text` (empty when streaming), the reason and the counts.
    pub fn final_chunk(&self, text: String, u: &Usage, started: Instant) -> Chunk {
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        let ns = |d: Duration| d.as_nanos() as u64;
        let mut c = self.chunk(text, true);
        c.done_reason = Some(finish_reason(self.finish));
        c.stats = Some(Stats {
            total_duration: ns(now.duration_since(started) + self.load),
            load_duration: ns(self.load),
            prompt_eval_count: u.prompt_tokens,
            prompt_eval_duration: ns(first.duration_since(started)),
            eval_count: u.completion_tokens,
            eval_duration: ns(now.duration_since(first)),
            draft_count: (u.draft_tokens > 0).then_some(u.draft_tokens),
            draft_accepted_count: (u.draft_tokens > 0).then_some(u.accepted_draft_tokens),
        });
        c
    }
}

fn calls_out(calls: &[mica::grammar::tools::ToolCall]) -> Vec<ToolCallOut> {
    calls
        .iter()
        .map(|c| ToolCallOut {
            function: FunctionOut {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        })
        .collect()
}

fn line(v: &impl serde::Serialize) -> String {
    format!("{}\n", serde_json::to_string(v).unwrap_or_default())
}

impl StreamFormat for Ndjson {
    fn on_event(&mut self, r: &Running, ev: Event) -> String {
        match ev {
            Event::Token { text, .. } => {
                self.first.get_or_insert_with(Instant::now);
                let text = match &mut self.tools {
                    Some((_, ts)) => ts.push(&text),
                    None => text,
                };
                if text.is_empty() {
                    return String::new();
                }
                line(&self.chunk(text, false))
            }
            Event::Done { text, finish, .. } => {
                self.finish = Some(finish);
                if let Some((set, ts)) = self.tools.take() {
                    let mut ts = ts;
                    let mut content = ts.push(&text);
                    let end = ts.finish(&set);
                    content.push_str(&end.content);
                    let mut c = self.chunk(content, false);
                    if let Some(m) = &mut c.message {
                        m.tool_calls = calls_out(&end.calls);
                    }
                    let empty = c
                        .message
                        .as_ref()
                        .is_some_and(|m| m.content.is_empty() && m.tool_calls.is_empty());
                    return if empty { String::new() } else { line(&c) };
                }
                if text.is_empty() {
                    String::new()
                } else {
                    line(&self.chunk(text, false))
                }
            }
            Event::Finished { usage } => line(&self.final_chunk(String::new(), &usage, r.started)),
            Event::Error(e) => line(&StreamError {
                error: e.to_string(),
            }),
        }
    }

    fn finish(&mut self, _r: &Running) -> String {
        String::new()
    }
}
