//! The KV cache types of llama.cpp's `-ctk/-ctv` (`ModelConfig::set_cache_types`): greedy
//! tokens equal llama.cpp's with the same cache types (fixtures/golden/kv-cache-types.json,
//! made by fixtures/golden/kv_cache_ref.py), the pool's bytes are the blocks' bytes, blocks
//! copied for copy-on-write carry the same keys and values, and a type the model's heads
//! cannot hold is refused by name.
//!
//! Models are found in `$MICA_TEST_MODELS` (default `<workspace>/models`); a missing one
//! fails the test.

mod common;

use common::model_path;
use mica_kernels::ThreadPool;
use mica_models::kv_cache::{BLOCK_SIZE, CacheTypes, KvType};
use mica_models::{Batch, KvCache, LoadedModel, Workspace};
use std::path::PathBuf;

fn greedy(lm: &LoadedModel, pool: &ThreadPool, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut kv = KvCache::new(&lm.model.config, prompt.len() + n + 1, 1);
    let mut ws = Workspace::default();
    let argmax = |l: &[f32]| {
        l.iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &x)| if x > b.1 { (i, x) } else { b },
            )
            .0 as u32
    };
    let b = Batch::for_sequence(prompt, 0, 0, false);
    let mut out = vec![argmax(
        lm.model.forward(pool, &b, &mut kv, &mut ws).unwrap(),
    )];
    while out.len() < n {
        let pos = prompt.len() + out.len() - 1;
        let b = Batch::for_sequence(&out[out.len() - 1..], pos, 0, false);
        out.push(argmax(
            lm.model.forward(pool, &b, &mut kv, &mut ws).unwrap(),
        ));
    }
    out
}

/// Tokens compared per run.
const N_TOKENS: usize = 12;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn greedy_tokens_equal_llama_cpp_with_each_cache_type() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/kv-cache-types.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let runs: Vec<&serde_json::Value> = doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["prompt"] != "code")
        .collect();
    assert!(runs.len() >= 24, "{} runs", runs.len());
    let pool = ThreadPool::new(2);
    let mut failures = Vec::new();
    let mut current: Option<(String, LoadedModel)> = None;
    for r in runs {
        let name = r["model"].as_str().unwrap();
        if current.as_ref().is_none_or(|c| c.0 != name) {
            current = Some((
                name.to_string(),
                LoadedModel::open(model_path(name)).unwrap(),
            ));
        }
        let lm = &mut current.as_mut().unwrap().1;
        let t = CacheTypes {
            k: KvType::from_name(r["type_k"].as_str().unwrap()).unwrap(),
            v: KvType::from_name(r["type_v"].as_str().unwrap()).unwrap(),
        };
        lm.model.config.set_cache_types(t).unwrap();
        // The first tokens of each run keep the test short (the fixture holds more).
        let want = &ids(&r["output_ids"])[..N_TOKENS];
        let got = greedy(lm, &pool, &ids(&r["prompt_ids"]), want.len());
        if got != want {
            let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
            failures.push(format!(
                "{name} {t} '{}': first difference at token {at}",
                r["prompt"].as_str().unwrap()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn the_pool_holds_the_blocks_bytes() {
    let mut lm = LoadedModel::open(model_path("smollm2-135m-instruct-q4_1")).unwrap();
    let cfg = &mut lm.model.config;
    let width: usize = (0..cfg.n_layer).map(|l| cfg.kv_dim_of(l)).sum();
    let per_block = |cfg: &mica_models::ModelConfig| KvCache::bytes_per_block(cfg);
    assert_eq!(per_block(cfg), BLOCK_SIZE * width * 2 * 2, "f16");
    for (t, num, den) in [
        (KvType::Q8_0, 34, 32),
        (KvType::Q4_0, 18, 32),
        (KvType::Q5_1, 24, 32),
    ] {
        cfg.set_cache_types(CacheTypes::both(t)).unwrap();
        assert_eq!(per_block(cfg), BLOCK_SIZE * width * num / den * 2, "{t}");
        let kv = KvCache::paged(cfg, 4, 1, 64);
        assert_eq!(kv.cache_types(), CacheTypes::both(t));
        assert_eq!(kv.bytes_per_seq(), 64 * width * num / den * 2);
    }
    cfg.set_cache_types(CacheTypes {
        k: KvType::Q8_0,
        v: KvType::F16,
    })
    .unwrap();
    assert_eq!(per_block(cfg), BLOCK_SIZE * (width * 34 / 32 + width * 2));
}

/// A block copied for copy-on-write (what the engine's prefix cache does) holds the same
/// quantized keys and values: a sequence reading the copies computes the same logits.
#[test]
fn copied_blocks_give_the_same_logits() {
    let mut lm = LoadedModel::open(model_path("qwen2.5-coder-0.5b-instruct-awq-q4_k_m")).unwrap();
    lm.model
        .config
        .set_cache_types(CacheTypes::both(KvType::Q4_0))
        .unwrap();
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::paged(&lm.model.config, 8, 2, 64);
    let mut ws = Workspace::default();
    let prompt: Vec<u32> = (0..20).map(|i| 300 + 11 * i).collect();
    kv.set_table(0, &[0, 1], 0).unwrap();
    let b = Batch::for_sequence(&prompt, 0, 0, false);
    lm.model.forward(&pool, &b, &mut kv, &mut ws).unwrap();
    kv.copy_block(0, 5);
    kv.copy_block(1, 6);
    kv.set_table(1, &[5, 6], prompt.len()).unwrap();
    let step = |kv: &mut KvCache, ws: &mut Workspace, seq| {
        let b = Batch::for_sequence(&[42], prompt.len(), seq, false);
        let l = lm.model.forward(&pool, &b, kv, ws).unwrap();
        l.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    };
    let a = step(&mut kv, &mut ws, 0);
    let c = step(&mut kv, &mut ws, 1);
    assert_eq!(a, c);
}

#[test]
fn types_the_heads_cannot_hold_and_unknown_names_are_refused() {
    let mut lm = LoadedModel::open(model_path("smollm2-135m-instruct-q4_1")).unwrap();
    let cfg = &mut lm.model.config;
    let mut odd = cfg.clone();
    odd.layer_head_dim.iter_mut().for_each(|d| *d = 48);
    let e = odd
        .set_cache_types(CacheTypes::both(KvType::Q8_0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("q8_0") && e.contains("blocks of 32") && e.contains("48"),
        "{e}"
    );
    // A float type has no blocks to split: any head size takes it.
    odd.set_cache_types(CacheTypes::both(KvType::F32)).unwrap();
    let e = KvType::from_name("q3_k").unwrap_err().to_string();
    assert!(
        e.contains("unknown cache type 'q3_k'") && e.contains("q4_0"),
        "{e}"
    );
    assert_eq!(KvType::from_name("Q8_0").unwrap(), KvType::Q8_0);
}
