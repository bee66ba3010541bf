//! mica-models

pub mod chat;
pub mod tokenizer;
