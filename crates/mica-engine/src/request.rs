//! What callers exchange with the serving engine: a [`Request`], the [`Event`]s that come
//! back through its [`EventSink`], why a submission can be refused ([`SubmitError`]) and why
//! an accepted request can fail ([`RequestError`]).

use crate::error::{EngineError, ParamError};
use crate::generate::{FinishReason, GenerateParams};
use crate::processor::LogitsProcessor;
use crate::proposer::Proposer;
use crate::scheduler::{AddError, Lane};
use mica_models::lora::LoraSelection;
use std::sync::Arc;

/// Builds the extra logits processors of completion `index` of a request (each of its `n`
/// completions gets its own, since processors may keep per-sequence state).
pub type ProcessorFactory = Box<dyn Fn(usize) -> Vec<Box<dyn LogitsProcessor>> + Send>;

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
    /// Logits processors run after the logit bias and the penalties.
    pub processors: Option<ProcessorFactory>,
    /// Drafts tokens for the engine to verify several per step (greedy: the tokens are the
    /// same as without it; sampled: the distribution is). Asked for each completion's
    /// history.
    pub proposer: Option<Box<dyn Proposer>>,
    /// LoRA adapters for this request only, each at its scale (adapters attached to the
    /// model apply to every request as well). Requests with different adapters, and none,
    /// run in the same steps; prefix-cache entries are keyed by the selection.
    pub lora: Option<Arc<LoraSelection>>,
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
    /// Drafted tokens verified for the request (speculative decoding).
    pub draft_tokens: usize,
    /// Of those, tokens accepted.
    pub accepted_draft_tokens: usize,
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
    Error(RequestError),
}

/// Why an accepted request failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RequestError {
    /// The scheduler could not take the request (e.g. it needs more KV blocks than the pool
    /// has).
    #[error(transparent)]
    Admission(#[from] AddError),
    /// A forward pass carrying the request failed.
    #[error(transparent)]
    Step(Arc<EngineError>),
    #[error("the server is shutting down")]
    ShuttingDown,
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
    Params(#[from] ParamError),
    #[error("the engine has stopped")]
    Stopped,
}
