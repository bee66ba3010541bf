//! mica-engine: running models. The per-sequence decoder (logits processors, sampler, stop
//! strings, finish rules); generation for one session (prompt processing, decoding,
//! streaming, speculative verification through a proposer); the proposers of speculative
//! decoding ([`spec`]: n-gram lookup, draft models, adaptive draft length); and the serving engine — the
//! paged KV block manager with prefix caching, the step scheduler with priority lanes and
//! multi-token steps, and the continuous batching loop that runs many requests through one
//! forward pass per step; embeddings pooled from the final hidden states; and what the host
//! offers a model ([`host`]: available memory, resident set, slow settings).

pub mod bench;
pub mod checkpoints;
pub mod decoder;
pub mod dry;
pub mod embed;
pub mod engine;
pub mod error;
pub mod generate;
pub mod host;
pub mod kv_manager;
pub mod metrics;
pub mod mirostat;
pub mod processor;
pub mod proposer;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod spec;
mod step_gate;
pub mod typical;
pub mod xtc;

pub use decoder::{Commit, MAX_DRAFT, SequenceDecoder};
pub use dry::Dry;
pub use embed::{DEFAULT_POOLING, EmbedError, Embedder, Pooling};
pub use engine::{
    EngineConfig, EngineHandle, Event, EventSink, ProcessorFactory, Request, RequestError,
    SubmitError, TokenLogprob, Usage,
};
pub use error::{ConfigError, EngineError, Param, ParamError, Result, SpecError};
pub use generate::{
    BudgetError, FinishReason, GenerateParams, Generation, Hooks, Session, Timings,
    completion_budget,
};
pub use kv_manager::{BlockManager, SeqBlocks};
pub use metrics::{EngineMetrics, RequestStatus};
pub use mirostat::Mirostat;
pub use processor::{LogitBias, LogitsProcessor, Penalties};
pub use proposer::{Draft, Proposer, StepLoad};
pub use sampler::{Sampler, SamplingParams, random_seed};
pub use scheduler::{Lane, SchedulePolicy, Scheduler, SchedulerConfig};
