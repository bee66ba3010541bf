//! Ollama's NDJSON: engine events to one JSON object per line, the last one `done: true`
//! with the finish reason, counts and durations ([`Ndjson`]); the same final object answers
//! a non-streaming request.

use super::types::{Chunk, MessageOut, Stats, StreamError};
use crate::bridge::{Running, StreamFormat, finish_reason, rfc3339};
use mica_engine::{Event, FinishReason, Usage};
use std::time::{Duration, Instant, SystemTime};

pub struct Ndjson {
    pub model: String,
    /// `/api/chat` (`message`) rather than `/api/generate` (`response`).
    pub chat: bool,
    pub finish: Option<FinishReason>,
    pub first: Option<Instant>,
    pub load: Duration,
}

impl Ndjson {
    pub fn new(model: String, chat: bool, load: Duration) -> Ndjson {
        Ndjson {
            model,
            chat,
            finish: None,
            first: None,
            load,
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
        });
        c
    }
}

fn line(v: &impl serde::Serialize) -> String {
    format!("{}\n", serde_json::to_string(v).unwrap_or_default())
}

impl StreamFormat for Ndjson {
    fn on_event(&mut self, r: &Running, ev: Event) -> String {
        match ev {
            Event::Token { text, .. } => {
                self.first.get_or_insert_with(Instant::now);
                if text.is_empty() {
                    return String::new();
                }
                line(&self.chunk(text, false))
            }
            Event::Done { text, finish, .. } => {
                self.finish = Some(finish);
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
