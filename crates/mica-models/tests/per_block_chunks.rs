//! With mica's opt-in `PerBlock` prompt path for the legacy formats switched on
//! (`mica_kernels::simd::set_llama_exact(false)`; a process-wide switch, hence its own test
//! binary), long prompts' feed-forward token chunks still give the logits of one
//! whole-batch call bit for bit: no chunk or tail drops under the path's 16-token threshold.
//! SmolLM2's file is Q4_1 and Q8_0 throughout.

mod common;

use common::model_path;
use mica_kernels::simd::{DotPath, kernels, set_llama_exact};
use mica_kernels::{DType, ThreadPool};
use mica_models::{Batch, KvCache, LoadedModel, Workspace};

#[test]
fn chunked_feed_forward_keeps_the_per_block_path() {
    set_llama_exact(false);
    let on = kernels().has_matmul(DotPath::PerBlock, DType::Q4_1);
    println!(
        "{}: PerBlock {}",
        kernels().isa(),
        if on {
            "taken"
        } else {
            "not in this table (vec_dot throughout)"
        }
    );
    let lm = LoadedModel::open(model_path("smollm2-135m-instruct-q4_1")).unwrap();
    let pool = ThreadPool::new(2);
    let text = "fn main() { let v: Vec<u32> = (0..100).map(|i| i * i).collect(); } ".repeat(12);
    let all = lm.tokenizer.encode(&text, true, true).unwrap();
    assert!(all.len() > 300, "prompt of {} tokens", all.len());
    // 268: a 12-token tail (over the tiled path's 8, under PerBlock's 16) folded in; 301:
    // chunks 128, 128, 45.
    for n in [268, 301] {
        let tokens = &all[..n];
        let run = |chunk: Option<usize>| {
            let mut kv = KvCache::new(&lm.model.config, 512, 1);
            let mut ws = Workspace::default();
            ws.ffn_chunk = chunk;
            let b = Batch::for_sequence(tokens, 0, 0, false);
            let logits = lm.model.forward(&pool, &b, &mut kv, &mut ws).unwrap();
            logits.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
        };
        let chunked = run(None);
        assert!(chunked.iter().all(|&b| f32::from_bits(b).is_finite()));
        assert!(
            chunked == run(Some(usize::MAX)),
            "{n} tokens: logits differ"
        );
    }
}
