//! The integration tests of `mica-server`, compiled as one test binary (one link of the
//! crate and its dependencies instead of one per file): each file beside this one is a
//! module here; `cargo test -p mica-server --test all MODULE::` runs one file's tests.

mod common;

mod access;
mod anthropic;
mod embeddings;
mod http;
mod hybrid;
mod kv_cache_types;
mod lifecycle;
mod limits;
mod lora;
mod models_dir;
mod priority;
mod request_ids;
mod samplers;
mod sampling;
mod shutdown;
mod speculative;
mod structured;
mod validation;
mod web;

#[path = "../../../tests/every_test_file.rs"]
mod every_test_file;

#[test]
fn every_test_file_is_compiled() {
    every_test_file::check(env!("CARGO_MANIFEST_DIR"), include_str!("main.rs"));
}
