//! The integration tests of `mica-cli`, compiled as one test binary (one link of the
//! crate and its dependencies instead of one per file): each file beside this one is a
//! module here; `cargo test -p mica-cli --test all MODULE::` runs one file's tests.
//! Test targets of their own (Cargo.toml), each in its own process:
//! `download_home` (it changes the environment).

mod common;

mod bench_cli;
mod browse_tui;
mod cache_types_cli;
mod chat_pty;
mod cli_errors;
mod convert_cli;
mod convert_hf;
mod convert_hf_families;
mod convert_quality;
mod inspect_kernels;
mod lora_cli;
mod mem_budget;
mod perplexity_kl;
mod serve_logs;
mod serve_signals;
mod serve_stream;
mod spec_cli;
mod store_http;
mod stream_cli;
mod tokenize_cli;
mod trace_cli;

#[path = "../../../tests/every_test_file.rs"]
mod every_test_file;

#[test]
fn every_test_file_is_compiled() {
    every_test_file::check(env!("CARGO_MANIFEST_DIR"), include_str!("main.rs"));
}
