//! The kernels on a real GPU (device 0), through the same cases as the emulator
//! (`common/cases.rs`). Compiled only with the `device-tests` feature: `scripts/test-gpu`
//! runs it on a machine with an NVIDIA GPU, driver and NVRTC; CI has no GPU.
#![cfg(feature = "device-tests")]

mod common;
use common::cases;
use mica_cuda::{Cuda, Runner};
use std::sync::OnceLock;

fn gpu() -> &'static Cuda {
    static GPU: OnceLock<Cuda> = OnceLock::new();
    GPU.get_or_init(|| {
        let g = Cuda::open(0).unwrap_or_else(|e| panic!("no GPU for the device tests: {e}"));
        let (free, total) = g.memory().unwrap();
        eprintln!(
            "device: {} (compute {}.{}), {} of {} MiB free",
            g.name(),
            g.capability().0,
            g.capability().1,
            free >> 20,
            total >> 20
        );
        g
    })
}

#[test]
fn matvec() {
    cases::matvec(gpu());
}

#[test]
fn get_rows() {
    cases::get_rows(gpu());
}

#[test]
fn rms_norm() {
    cases::rms_norm(gpu());
}

#[test]
fn rope() {
    cases::rope(gpu());
}

#[test]
fn glu() {
    cases::glu(gpu());
}

#[test]
fn axpy_and_scale() {
    cases::axpy_and_scale(gpu());
}

#[test]
fn attention() {
    cases::attention(gpu());
}

#[test]
fn copy() {
    cases::copy(gpu());
}

#[test]
fn refusals() {
    cases::refusals(gpu());
}

/// The decoder on the GPU against transformers on the Hugging Face fixtures (as
/// `decoder_emulated.rs` does on the emulator).
#[test]
fn decoder_matches_transformers() {
    for family in [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "phi3",
        "gemma2",
        "gemma3",
        "gemma3_swa6",
        "smollm3",
    ] {
        common::hf::check(gpu(), family);
    }
}

/// The host's forward pass with its last layers on the GPU (as `decoder_emulated.rs` does
/// on the emulator).
#[test]
fn offloaded_layers_match_transformers() {
    for (family, first) in [("llama", 1), ("qwen2", 0), ("gemma3", 2), ("smollm3", 4)] {
        common::hf::check_offloaded(gpu(), family, first);
    }
}
