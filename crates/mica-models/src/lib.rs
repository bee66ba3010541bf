//! mica-models: what a model is. Typed configuration, weights as views into the file, the
//! tokenizer and chat templates, the architecture registry, and the forward pass over a
//! batch of tokens from many sequences with a sequence-addressed KV cache.

pub mod arch;
pub mod batch;
pub mod blocks;
pub mod chat;
pub mod config;
pub mod conversation;
pub mod error;
pub mod hf;
pub mod kv_cache;
pub mod loader;
pub mod lora;
pub mod memory;
pub mod model;
pub mod names;
pub mod offload;
mod packed_buf;
mod par;
pub mod stream;
pub mod tokenizer;
pub mod weights;

pub use batch::Batch;
pub use config::ModelConfig;
pub use conversation::{Conversation, ConversationError};
pub use error::{ModelError, Result};
pub use kv_cache::{KvCache, SeqId};
pub use loader::{ChatPromptError, LoadOptions, LoadStage, LoadedModel, open_tokenizer};
pub use lora::{LoraAdapter, LoraSpec};
pub use memory::WeightFootprint;
pub use memory::{EstimateParams, KvSizing, MemoryEstimate};
pub use model::{Model, Output, Workspace};
pub use offload::LayerOffload;
pub use stream::{StreamMode, StreamPlan};
