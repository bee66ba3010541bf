//! The integration tests of `mica-engine`, compiled as one test binary (one link of the
//! crate and its dependencies instead of one per file): each file beside this one is a
//! module here; `cargo test -p mica-engine --test all MODULE::` runs one file's tests.

mod common;

mod engine;
mod golden_llama_cpp;
mod hybrid;
mod lora;
mod samplers_llama_cpp;
mod scheduler;
mod session;
mod spec_sampling;
mod speculative;

#[path = "../../../tests/every_test_file.rs"]
mod every_test_file;

#[test]
fn every_test_file_is_compiled() {
    every_test_file::check(env!("CARGO_MANIFEST_DIR"), include_str!("main.rs"));
}
