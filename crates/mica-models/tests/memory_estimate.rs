//! The memory estimate ([`mica_models::memory`]) on the three test models, checked against
//! what does not come from it: the file's tensor directory, the KV formula from the models'
//! published shapes, the bytes repacking really makes and the buffers a forward pass grows.

mod common;

use common::model_path;
use mica_kernels::ThreadPool;
use mica_models::{
    Batch, EstimateParams, KvCache, KvSizing, LoadOptions, LoadedModel, MemoryEstimate, Workspace,
};

/// A test model and its attention shape from its model card: (layers, KV heads, head size).
const MODELS: [(&str, (usize, usize, usize)); 3] = [
    ("smollm2-135m-instruct-q4_1", (30, 3, 64)),
    ("gemma3-270m-q4_k_m", (18, 1, 256)),
    ("qwen2.5-coder-0.5b-instruct-awq-q4_k_m", (24, 2, 64)),
];

const N_CTX: usize = 256;
const BATCH: usize = 64;

fn params(repack: bool) -> EstimateParams {
    EstimateParams {
        repack,
        kv: KvSizing::Context {
            n_ctx: N_CTX,
            n_seq: 1,
        },
        n_ctx: N_CTX,
        batch_tokens: BATCH,
        n_outputs: 1,
        runtime: 0,
    }
}

#[test]
fn weights_match_the_files_tensor_directory() {
    for (name, _) in MODELS {
        let path = model_path(name);
        let lm = LoadedModel::open_with(&path, LoadOptions::READ_ONLY).unwrap();
        let file = lm.model.file.as_ref().unwrap();
        // Matrices are the tensors of two or more dimensions.
        let matrix_bytes: u64 = file
            .tensors()
            .iter()
            .filter(|t| t.shape.len() >= 2)
            .map(|t| t.n_bytes)
            .sum();
        let tied = file.tensor("output.weight").is_none();
        let embd = file.tensor("token_embd.weight").unwrap().n_bytes;
        let plain = MemoryEstimate::new(&lm.model, &params(false));
        assert_eq!(plain.weights.repacked, 0, "{name}");
        assert_eq!(plain.weights.on_demand as u64, embd, "{name}");
        // Without repacking every matrix is read in place: the products' matrices (a tied
        // head is the token embedding again) plus the embedding table.
        assert_eq!(
            (plain.weights.mapped + plain.weights.on_demand) as u64,
            matrix_bytes + if tied { embd } else { 0 },
            "{name}"
        );
        // The rest of the file is its header and the norm vectors.
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(
            matrix_bytes <= size && matrix_bytes * 100 >= size * 95,
            "{name}: {matrix_bytes} bytes of matrices in a {size}-byte file"
        );
        // Counted: every matrix but an untied embedding table.
        assert_eq!(
            plain.weight_bytes() as u64,
            matrix_bytes - if tied { 0 } else { embd },
            "{name}"
        );
    }
}

#[test]
fn repacked_bytes_are_what_repacking_makes() {
    for (name, _) in MODELS {
        let mut lm = LoadedModel::open_with(model_path(name), LoadOptions::READ_ONLY).unwrap();
        let plain = MemoryEstimate::new(&lm.model, &params(false));
        let est = MemoryEstimate::new(&lm.model, &params(true));
        let made = lm.model.repack();
        assert_eq!(est.weights.repacked, made, "{name}");
        // Packing rounds rows up to whole groups; nothing else changes.
        assert!(est.weight_bytes() >= plain.weight_bytes(), "{name}");
        assert!(
            est.weight_bytes() <= plain.weight_bytes() + plain.weight_bytes() / 50,
            "{name}: {} vs {}",
            est.weight_bytes(),
            plain.weight_bytes()
        );
        // A repacked model counts its copies whatever the parameters say.
        assert_eq!(
            MemoryEstimate::new(&lm.model, &params(false)),
            est,
            "{name}"
        );
    }
}

#[test]
fn kv_cache_follows_the_attention_shape() {
    for (name, (layers, kv_heads, head)) in MODELS {
        let lm = LoadedModel::open_with(model_path(name), LoadOptions::READ_ONLY).unwrap();
        let est = MemoryEstimate::new(&lm.model, &params(true));
        // Keys and values, f16, every position of every layer.
        let expected = 2 * N_CTX * layers * kv_heads * head * 2;
        assert_eq!(est.kv_cache, expected, "{name}");
        assert_eq!(
            est.kv_cache,
            N_CTX / 16 * KvCache::bytes_per_block(&lm.model.config),
            "{name}"
        );
        assert_eq!(est.recurrent_state, 0, "{name}");
        let pool = MemoryEstimate::new(
            &lm.model,
            &EstimateParams {
                kv: KvSizing::Pool {
                    blocks: 10,
                    states: 4,
                },
                ..params(true)
            },
        );
        assert_eq!(
            pool.kv_cache,
            10 * KvCache::bytes_per_block(&lm.model.config)
        );
        assert_eq!(
            pool.total() - pool.kv_cache,
            est.total() - est.kv_cache,
            "{name}"
        );
    }
}

#[test]
fn compute_covers_the_buffers_a_forward_pass_grows() {
    let pool = ThreadPool::new(2);
    for (name, _) in MODELS {
        let lm = LoadedModel::open_with(model_path(name), LoadOptions::READ_ONLY).unwrap();
        let est = MemoryEstimate::new(&lm.model, &params(false));
        let mut kv = KvCache::new(&lm.model.config, N_CTX, 1);
        let mut ws = Workspace::default();
        let tokens: Vec<u32> = (0..BATCH as u32).map(|i| 100 + i).collect();
        let b = Batch::for_sequence(&tokens, 0, 0, false);
        lm.model.forward(&pool, &b, &mut kv, &mut ws).unwrap();
        let grown = ws.buffer_bytes();
        assert!(
            grown <= est.compute && est.compute <= 4 * grown,
            "{name}: buffers {grown}, estimate {}",
            est.compute
        );
    }
}

#[test]
fn display_names_every_part_in_mib() {
    let lm = LoadedModel::open_with(
        model_path("smollm2-135m-instruct-q4_1"),
        LoadOptions::READ_ONLY,
    )
    .unwrap();
    let est = MemoryEstimate::new(
        &lm.model,
        &EstimateParams {
            runtime: 20 << 20,
            ..params(true)
        },
    );
    let s = est.to_string();
    for part in [
        "weights",
        "repacked",
        "KV cache 5.6 MiB",
        "recurrent state 0.0 MiB",
        "compute",
        "runtime 20.0 MiB",
        "embedding tables",
    ] {
        assert!(s.contains(part), "{part} missing: {s}");
    }
    assert_eq!(
        est.total(),
        est.weight_bytes() + est.kv_cache + est.recurrent_state + est.compute + est.runtime
    );
    assert_eq!(
        est.expected_resident(0, 0),
        est.total() - est.kv_cache - est.compute
    );
    assert_eq!(
        est.expected_resident(usize::MAX, usize::MAX),
        est.total(),
        "parts in use are capped at the estimate's"
    );
}
