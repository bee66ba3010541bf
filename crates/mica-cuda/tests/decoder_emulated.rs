//! The GPU decoder, run on the CPU emulator of the CUDA kernels (`tests/emu`), against
//! transformers' float32 logits on the tiny random Hugging Face fixtures (fixtures/hf,
//! written by fixtures/hf/make_fixtures.py): every position's logits within 1e-4, and the
//! greedy continuation token for token (its first 12 tokens): the whole device path
//! (uploads, every kernel, the per-layer caches, the step's shapes) checked without a GPU.
//! Models with features the decoder does not run are refused by name.

mod common;
use common::emu::emu;
use common::hf::{check, check_offloaded, load};
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
        match GpuDecoder::new(emu(), &model, 8) {
            Err(e @ GpuError::UnsupportedModel(_)) => {
                assert!(e.to_string().contains(what), "{family}: {e}")
            }
            Err(e) => panic!("{family}: {e}"),
            Ok(_) => panic!("{family}: accepted"),
        }
    }
}

// The host's forward pass with its last layers offloaded (`Model::forward_offloaded`):
// layers and KV cache split between the host and the device at several points, a separate
// head (llama) and tied ones, the head alone on the device (smollm3 from its last layer).

#[test]
fn llama_offloaded_from_layer_1() {
    check_offloaded(emu(), "llama", 1);
}

#[test]
fn qwen2_offloaded_whole() {
    check_offloaded(emu(), "qwen2", 0);
}

#[test]
fn gemma3_offloaded_from_layer_2() {
    check_offloaded(emu(), "gemma3", 2);
}

#[test]
fn smollm3_head_offloaded() {
    check_offloaded(emu(), "smollm3", 4);
}

#[test]
fn bad_steps_are_refused() {
    let (model, _, _) = load("llama");
    let mut dec = GpuDecoder::new(emu(), &model, 2).unwrap();
    let t0: &[u32] = &[1];
    let e = dec.forward(&[1], &[16], &[0], &[t0], &[true]).unwrap_err();
    assert!(e.to_string().contains("past the 16 positions"), "{e}");
    let e = dec.forward(&[1], &[0], &[1], &[t0], &[true]).unwrap_err();
    assert!(e.to_string().contains("1 block tables were given"), "{e}");
    let e = dec
        .forward(&[100_000], &[0], &[0], &[t0], &[true])
        .unwrap_err();
    assert!(e.to_string().contains("vocabulary"), "{e}");
    let far: &[u32] = &[2];
    let e = dec.forward(&[1], &[0], &[0], &[far], &[true]).unwrap_err();
    assert!(e.to_string().contains("block 2 of a 2-block cache"), "{e}");
    let e = dec
        .forward(&[1], &[0, 1], &[0], &[t0], &[true])
        .unwrap_err();
    assert!(e.to_string().contains("differ in length"), "{e}");
    let out = dec
        .forward(
            &[1, 2, 3, 4],
            &[0, 1, 2, 3],
            &[0; 4],
            &[t0],
            &[false, true, false, true],
        )
        .unwrap();
    assert_eq!(out.len(), 2 * model.config.n_vocab);
    // Layers from 1: no embedding to run a whole step with.
    let mut part = GpuDecoder::layers(emu(), &model, 1, 2).unwrap();
    let e = part.forward(&[1], &[0], &[0], &[t0], &[true]).unwrap_err();
    assert!(e.to_string().contains("layers 1.. only"), "{e}");
    assert!(GpuDecoder::layers(emu(), &model, 3, 2).is_err());
}

/// The host's pass refuses an offload whose layers its KV cache also holds.
#[test]
fn offload_needs_a_cache_without_its_layers() {
    use mica_models::{Batch, KvCache, Workspace};
    let (model, _, _) = load("llama");
    let mut dec = GpuDecoder::layers(emu(), &model, 1, 8).unwrap();
    let mut kv = KvCache::new(&model.config, 64, 2);
    let pool = mica_kernels::ThreadPool::new(1);
    let mut ws = Workspace::default();
    let b = Batch::for_sequence(&[1, 2], 0, 0, false);
    let e = model
        .forward_offloaded(&pool, &b, &mut kv, &mut ws, &mut || false, &mut dec)
        .unwrap_err();
    assert!(e.to_string().contains("holds layer 1"), "{e}");
}
