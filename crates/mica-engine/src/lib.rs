//! mica-engine: running models. The sampler, and generation for a session (prompt
//! processing, decoding, stop conditions, streaming); later the scheduler, paged KV cache
//! and speculative decoding.

pub mod error;
pub mod generate;
pub mod sampler;

pub use error::{EngineError, Result};
pub use generate::{FinishReason, GenerateParams, Generation, Session, Timings};
pub use sampler::{Sampler, SamplingParams};
