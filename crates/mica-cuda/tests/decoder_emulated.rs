//! The GPU decoder, run on the CPU emulator of the CUDA kernels (`tests/emu`), against
//! transformers' float32 logits on the tiny random Hugging Face fixtures (fixtures/hf,
//! written by fixtures/hf/make_fixtures.py): every position's logits within 1e-4, and the
//! greedy continuation token for token (its first 12 tokens): the whole device path
//! (uploads, every kernel, the per-layer caches, the step's shapes) checked without a GPU.
//! Models with features the decoder does not run are refused by name.

mod common;
use common::emu::emu;
use common::hf::{check, load};
use mica_cuda::{GpuDecoder, GpuError};

#[test]
fn llama() {
    check(emu(), "llama");
}

#[test]
fn mistral() {
    check(emu(), "mistral");
}

#[test]
fn qwen2() {
    check(emu(), "qwen2");
}

#[test]
fn qwen3() {
    check(emu(), "qwen3");
}

#[test]
fn phi3() {
    check(emu(), "phi3");
}

#[test]
fn gemma2() {
    check(emu(), "gemma2");
}

#[test]
fn gemma3() {
    check(emu(), "gemma3");
}

#[test]
fn gemma3_swa6() {
    check(emu(), "gemma3_swa6");
}

#[test]
fn smollm3() {
    check(emu(), "smollm3");
}

#[test]
fn what_the_decoder_does_not_run_is_refused_by_name() {
    for (family, what) in [
        ("gpt2", "LayerNorm"),
        ("mixtral", "feed-forward blocks other than gated dense ones"),
        ("deepseek2", "multi-head latent attention"),
        ("qwen35", "DeltaNet"),
    ] {
        let (model, _, _) = load(family);
        match GpuDecoder::new(emu(), &model, 1, 8) {
            Err(e @ GpuError::UnsupportedModel(_)) => {
                assert!(e.to_string().contains(what), "{family}: {e}")
            }
            Err(e) => panic!("{family}: {e}"),
            Ok(_) => panic!("{family}: accepted"),
        }
    }
}

#[test]
fn steps_that_do_not_continue_their_slot_are_refused() {
    let (model, _, _) = load("llama");
    let mut dec = GpuDecoder::new(emu(), &model, 1, 4).unwrap();
    let e = dec.forward(&[1], &[1], &[0], &[true]).unwrap_err();
    assert!(e.to_string().contains("continues at 0"), "{e}");
    let e = dec.forward(&[1], &[0], &[1], &[true]).unwrap_err();
    assert!(e.to_string().contains("slot 1 of 1"), "{e}");
    let e = dec.forward(&[100_000], &[0], &[0], &[true]).unwrap_err();
    assert!(e.to_string().contains("vocabulary"), "{e}");
    dec.forward(&[1, 2, 3, 4], &[0, 1, 2, 3], &[0; 4], &[false; 4])
        .unwrap();
    let e = dec.forward(&[1], &[4], &[0], &[true]).unwrap_err();
    assert!(e.to_string().contains("full"), "{e}");
    assert_eq!(dec.len(0), 4);
}
