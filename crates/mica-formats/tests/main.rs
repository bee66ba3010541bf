//! The integration tests of `mica-formats`, compiled as one test binary (one link of the
//! crate and its dependencies instead of one per file): each file beside this one is a
//! module here; `cargo test -p mica-formats --test all MODULE::` runs one file's tests.

mod gguf_reader;
mod mica_format;
mod pytorch_reader;
mod safetensors_reader;

#[path = "../../../tests/every_test_file.rs"]
mod every_test_file;

#[test]
fn every_test_file_is_compiled() {
    every_test_file::check(env!("CARGO_MANIFEST_DIR"), include_str!("main.rs"));
}
