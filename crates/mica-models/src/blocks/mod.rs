//! Building blocks shared by every architecture.

pub mod attention;
mod attention_blocks;
pub mod deltanet;
pub mod ffn;
pub mod mla;
pub mod moe;
pub mod ple;
pub mod sinks;
