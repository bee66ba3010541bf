//! The integration tests of `mica-kernels`, compiled as one test binary (one link of the
//! crate and its dependencies instead of one per file): each file beside this one is a
//! module here; `cargo test -p mica-kernels --test all MODULE::` runs one file's tests.
//! Test targets of their own (Cargo.toml), each in its own process:
//! `per_block_switch` (it switches the process's arithmetic (`set_llama_exact`)).

mod quant_common;

mod iquant_exact;
mod kernel_coverage;
mod llama_exact;
mod mat_kernels;
mod quant_bench;
mod quant_fixtures;
mod quant_ref;
mod quant_simd;
mod weighted_fixtures;

#[path = "../../../tests/every_test_file.rs"]
mod every_test_file;

#[test]
fn every_test_file_is_compiled() {
    every_test_file::check(env!("CARGO_MANIFEST_DIR"), include_str!("main.rs"));
}
