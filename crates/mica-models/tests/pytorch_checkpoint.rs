//! A Hugging Face folder whose weights are a PyTorch `pytorch_model.bin` (the mistral
//! fixture's weights saved by torch: `fixtures/pytorch/make_fixtures.py`) loads and gives
//! its safetensors twin's logits bit for bit (the twin matches transformers:
//! `hf_fixtures.rs`).

use mica_kernels::ThreadPool;
use mica_models::hf::{HfFolder, is_hf_folder};
use mica_models::{Batch, KvCache, Model, Workspace};
use serde_json::Value;
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf/mistral")
}

fn load(dir: &std::path::Path) -> Model {
    let folder = HfFolder::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    mica_models::arch::load_hf(&folder).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn logits(model: &Model, seq: &[u32]) -> Vec<f32> {
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::new(&model.config, 64, 1);
    let mut ws = Workspace::default();
    model
        .forward(
            &pool,
            &Batch::for_sequence(seq, 0, 0, true),
            &mut kv,
            &mut ws,
        )
        .unwrap()
        .to_vec()
}

#[test]
fn pytorch_weights_give_the_safetensors_logits() {
    let pt_dir = fixture().join("pytorch");
    assert!(is_hf_folder(&pt_dir));
    let (st, pt) = (load(&fixture()), load(&pt_dir));
    let exp: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap())
            .unwrap();
    for seq in exp["sequences"].as_array().unwrap() {
        let seq: Vec<u32> = seq
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let (a, b) = (logits(&st, &seq), logits(&pt, &seq));
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
