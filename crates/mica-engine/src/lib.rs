//! mica-engine: running models. The sampler; generation for one session (prompt processing,
//! decoding, stop conditions, streaming); and the serving engine — the paged KV block
//! manager with prefix caching, the step scheduler with priority lanes, and the continuous
//! batching loop that runs many requests through one forward pass per step.

pub mod engine;
pub mod error;
pub mod generate;
pub mod kv_manager;
pub mod metrics;
pub mod request;
pub mod sampler;
pub mod scheduler;
mod step_gate;

pub use engine::{
    EngineConfig, EngineHandle, Event, EventSink, Request, SubmitError, TokenLogprob, Usage,
};
pub use error::{EngineError, Result};
pub use generate::{
    BudgetError, FinishReason, GenerateParams, Generation, Session, Timings, completion_budget,
};
pub use kv_manager::{BlockManager, SeqBlocks};
pub use metrics::{EngineMetrics, RequestStatus};
pub use sampler::{Sampler, SamplingParams, random_seed};
pub use scheduler::{Lane, SchedulePolicy, Scheduler, SchedulerConfig};
