//! The integration tests of `mica-models`, compiled as one test binary (one link of the
//! crate and its dependencies instead of one per file): each file beside this one is a
//! module here; `cargo test -p mica-models --test all MODULE::` runs one file's tests.
//! Test targets of their own (Cargo.toml), each in its own process:
//! `per_block_chunks` (it switches the process's arithmetic (`set_llama_exact`)).

mod common;
mod hf_common;

mod batch_sequences;
mod chat_templates;
mod hf_errors;
mod hf_fixtures;
mod hf_fixtures_deepseek;
mod hf_fixtures_gemma4_qwen35;
mod hf_fixtures_gptoss;
mod hf_real;
mod hf_tokenizer_spm;
mod hybrid_state;
mod kv_cache_types;
mod layer_streaming;
mod lora;
mod memory_estimate;
mod pytorch_checkpoint;
mod repacked_logits;
mod tokenizer_golden;
mod tokenizer_kinds;
mod tokenizer_spec;
mod tokenizer_suite;

#[path = "../../../tests/every_test_file.rs"]
mod every_test_file;

#[test]
fn every_test_file_is_compiled() {
    every_test_file::check(env!("CARGO_MANIFEST_DIR"), include_str!("main.rs"));
}
