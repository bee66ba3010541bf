//! Load-time repacking ([`LoadOptions::repack`]) changes where the kernels read the weights,
//! never what they compute: a Q4_K model's logits are bit-identical with and without it, for
//! a prompt (llama.cpp's repacked-Q4_K gemm and gemv paths) and for one-token decode steps
//! (the gemv path, which the AVX-512 tier runs over its packed Q4_K layout).

mod common;

use common::model_path;
use mica_kernels::{DType, ThreadPool};
use mica_models::{Batch, KvCache, LoadOptions, LoadedModel, Workspace};

/// The logits (as bits) of a 10-token prompt, then of four single-token decode steps.
fn run(lm: &LoadedModel, pool: &ThreadPool) -> Vec<Vec<u32>> {
    let tokens = lm
        .tokenizer
        .encode(
            "fn main() { let v: Vec<u32> = (0..100).map(|i| i * i).collect(); }",
            true,
            true,
        )
        .unwrap();
    assert!(tokens.len() >= 14, "{} prompt tokens", tokens.len());
    let mut kv = KvCache::new(&lm.model.config, 64, 1);
    let mut ws = Workspace::default();
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut out = Vec::new();
    let prompt = &tokens[..10];
    let b = Batch::for_sequence(prompt, 0, 0, true);
    out.push(bits(lm.model.forward(pool, &b, &mut kv, &mut ws).unwrap()));
    for (i, &t) in tokens[10..14].iter().enumerate() {
        let b = Batch::for_sequence(&[t], 10 + i, 0, true);
        out.push(bits(lm.model.forward(pool, &b, &mut kv, &mut ws).unwrap()));
    }
    out
}

#[test]
fn q4k_logits_are_bit_identical_with_and_without_repacking() {
    let path = model_path("qwen2.5-coder-0.5b-instruct-awq-q4_k_m");
    let plain = LoadedModel::open_with(&path, LoadOptions::READ_ONLY).unwrap();
    let mut packed = LoadedModel::open_with(&path, LoadOptions::READ_ONLY).unwrap();
    assert!(packed.model.repack() > 0, "nothing repacked");
    if mica_kernels::simd::kernels().isa() == "avx512" {
        // The layout under test is in use on this CPU.
        assert_eq!(mica_kernels::simd::kernels().pack_group(DType::Q4_K), 16);
    }
    let pool = ThreadPool::new(2);
    let (a, b) = (run(&plain, &pool), run(&packed, &pool));
    assert!(a[0].iter().all(|&x| f32::from_bits(x).is_finite()));
    for (step, (a, b)) in a.iter().zip(&b).enumerate() {
        assert!(a == b, "step {step}: logits differ with repacking");
    }
}
