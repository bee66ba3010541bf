//! What callers exchange with the serving engine: a [`Request`], the [`Event`]s that come
//! back through its [`EventSink`], and why a submission can be refused ([`SubmitError`]).

use crate::generate::{FinishReason, GenerateParams};
use crate::scheduler::Lane;

/// What to generate for one request.
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub lane: Lane,
    /// Completions of this prompt (sharing its KV blocks).
    pub n: usize,
    /// Report each token's log-probability, with this many alternatives.
    pub logprobs: Option<usize>,
    pub sink: Box<dyn EventSink>,
}

/// Log-probability of a generated token and of the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// `(token, logprob)`, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// What the engine tells a request.
#[derive(Clone, Debug)]
pub enum Event {
    /// A generated token of completion `index`; `text` is what became final with it (may be
    /// empty while a stop string might be starting, or mid-way through a UTF-8 character).
    Token {
        index: usize,
        token: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// Completion `index` ended; `text` is held-back text released at the end.
    Done {
        index: usize,
        finish: FinishReason,
        text: String,
    },
    /// Every completion ended.
    Finished { usage: Usage },
    /// The request failed.
    Error(String),
}

/// Where a request's events go. `send` returns false once the receiver is gone.
pub trait EventSink: Send {
    fn send(&mut self, event: Event) -> bool;
    /// Whether the receiver is gone (the client disconnected).
    fn is_closed(&self) -> bool;
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the {lane} queue is full ({limit} requests waiting); retry later", lane = .lane.as_str())]
    QueueFull { lane: Lane, limit: usize },
    #[error(
        "the prompt has {tokens} tokens but the context holds {n_ctx} (prompt and completion together); shorten the prompt"
    )]
    PromptTooLong { tokens: usize, n_ctx: usize },
    #[error("invalid parameters: {0}")]
    Params(String),
    #[error("the engine has stopped")]
    Stopped,
}
