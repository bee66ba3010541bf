//! A hybrid model's recurrent state in the cache (Qwen3.5's Gated DeltaNet layers, on the
//! tiny `qwen35` fixture quantized to Q8_0 by llama.cpp): sequences interleaved in one batch
//! and prompts split over several batches give the logits of one whole run each; a state
//! cannot be rewound (an error), clearing it starts the sequence afresh; DeltaNet layers
//! store no keys or values.

use mica_kernels::ThreadPool;
use mica_models::{Batch, KvCache, Model, Workspace};
use std::path::PathBuf;
use std::sync::Arc;

fn model() -> Model {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/converted/qwen35/model.q8_0.gguf");
    let file = mica_formats::GgufFile::open(&path).unwrap();
    mica_models::arch::load_gguf(Arc::new(file)).unwrap()
}

const A: [u32; 9] = [1, 17, 33, 5, 98, 64, 12, 77, 3];
const B: [u32; 6] = [1, 100, 7, 7, 56, 23];

/// Logits of every token of `tokens` run alone, in one batch.
fn alone(m: &Model, pool: &ThreadPool, tokens: &[u32]) -> Vec<f32> {
    let mut kv = KvCache::new(&m.config, 64, 1);
    let mut ws = Workspace::default();
    let b = Batch::for_sequence(tokens, 0, 0, true);
    m.forward(pool, &b, &mut kv, &mut ws).unwrap().to_vec()
}

#[test]
fn interleaved_and_split_sequences_match_whole_runs() {
    let m = model();
    let pool = ThreadPool::new(2);
    let v = m.config.n_vocab;
    let (ra, rb) = (alone(&m, &pool, &A), alone(&m, &pool, &B));

    // Both in one batch, interleaved, as sequences 2 and 0 of a 3-sequence cache; A's first
    // four tokens in a first batch, the rest in a second.
    let mut kv = KvCache::new(&m.config, 64, 3);
    let mut ws = Workspace::default();
    let first = Batch::for_sequence(&A[..4], 0, 2, true);
    let got = m.forward(&pool, &first, &mut kv, &mut ws).unwrap().to_vec();
    assert_eq!(got[..], ra[..4 * v], "A's first chunk");
    let mut batch = Batch::new();
    let mut order = Vec::new();
    for i in 0..B.len().max(A.len() - 4) {
        if 4 + i < A.len() {
            batch.push(A[4 + i], 4 + i, 2, true);
            order.push((&ra, 4 + i));
        }
        if i < B.len() {
            batch.push(B[i], i, 0, true);
            order.push((&rb, i));
        }
    }
    let got = m.forward(&pool, &batch, &mut kv, &mut ws).unwrap();
    for (row, (want, p)) in got.chunks_exact(v).zip(&order) {
        assert_eq!(row, &want[p * v..(p + 1) * v], "position {p}");
    }
}

#[test]
fn a_state_cannot_be_rewound_and_clearing_starts_afresh() {
    let m = model();
    let pool = ThreadPool::new(2);
    let want = alone(&m, &pool, &A);
    let mut kv = KvCache::new(&m.config, 64, 1);
    let mut ws = Workspace::default();
    m.forward(
        &pool,
        &Batch::for_sequence(&A, 0, 0, true),
        &mut kv,
        &mut ws,
    )
    .unwrap();
    kv.truncate(0, 3);
    let err = m
        .forward(
            &pool,
            &Batch::for_sequence(&A[3..], 3, 0, true),
            &mut kv,
            &mut ws,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("recurrent state"), "{err}");
    kv.clear(0);
    let got = m
        .forward(
            &pool,
            &Batch::for_sequence(&A, 0, 0, true),
            &mut kv,
            &mut ws,
        )
        .unwrap();
    assert_eq!(got, &want[..]);
}

#[test]
fn deltanet_layers_store_no_keys_or_values() {
    let m = model();
    let c = &m.config;
    assert!(c.has_recurrent_state());
    // Only layer 3 attends.
    let per_block = 2 * mica_models::kv_cache::BLOCK_SIZE * c.kv_dim_of(3) * 2;
    assert_eq!(KvCache::bytes_per_block(c), per_block);
    let d = c.delta_net.as_ref().unwrap();
    assert_eq!(
        KvCache::state_bytes_per_seq(c),
        3 * 4 * (d.conv_state_len() + d.ssm_state_len())
    );
    assert_eq!(KvCache::state_bytes_per_seq(&model_without_state()), 0);
}

fn model_without_state() -> mica_models::ModelConfig {
    let mut c = model().config;
    c.delta_net = None;
    c
}

/// llama.cpp's converter counts a multi-token-prediction layer in `block_count`
/// (`nextn_predict_layers`, its flag in `recurrent_layers` false): the same file with one
/// more such layer runs the same model.
#[test]
fn multi_token_prediction_layers_are_not_run() {
    use mica_formats::{GgufFile, GgufWriter, MetaArray, MetaValue};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/converted/qwen35/model.q8_0.gguf");
    let src = GgufFile::open(&path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata_entries() {
        let v = match (k.as_str(), v) {
            ("qwen35.block_count", _) => MetaValue::U32(5),
            ("qwen35.attention.recurrent_layers", MetaValue::Array(MetaArray::Bool(b))) => {
                MetaValue::Array(MetaArray::Bool([&b[..], &[false]].concat()))
            }
            _ => v.clone(),
        };
        w.meta(k, v);
    }
    w.meta("qwen35.nextn_predict_layers", MetaValue::U32(1));
    for t in src.tensors() {
        w.tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t));
    }
    let norm = vec![0u8; 4 * 32];
    let f32_type = src
        .tensors()
        .iter()
        .find(|t| t.shape.len() == 1)
        .unwrap()
        .ggml_type;
    w.tensor("blk.4.nextn.enorm.weight", f32_type, &[32], &norm);
    let out = std::env::temp_dir().join(format!("mica-qwen35-mtp-{}.gguf", std::process::id()));
    w.write_to(&mut std::fs::File::create(&out).unwrap())
        .unwrap();
    let with_mtp = mica_models::arch::load_gguf(Arc::new(GgufFile::open(&out).unwrap()));
    std::fs::remove_file(&out).unwrap();
    let with_mtp = with_mtp.unwrap();
    assert_eq!(with_mtp.config.n_layer, 4);
    let pool = ThreadPool::new(2);
    assert_eq!(alone(&with_mtp, &pool, &A), alone(&model(), &pool, &A));
}

/// A checkpoint taken in the middle of a batch (position 32 of a 44-token prompt, another
/// sequence interleaved) and restored into a second sequence that shares the first's blocks
/// up to there: the second computes only the rest, with the logits of a whole run bit for
/// bit. A pass that starts past a capture's position drops it; an empty checkpoint cannot
/// be restored.
#[test]
fn a_checkpoint_restores_the_state_mid_prompt() {
    let m = model();
    let pool = ThreadPool::new(2);
    let v = m.config.n_vocab;
    let long: Vec<u32> = (0..44u32).map(|i| 3 + (i * 29 + i * i) % 120).collect();
    let mut follow = long.clone();
    follow.extend_from_slice(&[9, 8, 7]);
    let want = alone(&m, &pool, &follow);

    let mut kv = KvCache::paged(&m.config, 8, 3, 64);
    kv.set_checkpoints(2);
    let mut ws = Workspace::default();
    assert!(kv.restore_state(0, 1, 32).is_err(), "nothing captured yet");
    kv.set_table(0, &[0, 1, 2], 0).unwrap();
    kv.set_table(2, &[5], 0).unwrap();
    kv.capture_state(0, 32, 0).unwrap();
    let mut batch = Batch::new();
    for (p, &t) in long.iter().enumerate() {
        batch.push(t, p, 0, false);
        if p < B.len() {
            batch.push(B[p], p, 2, false);
        }
    }
    m.forward(&pool, &batch, &mut kv, &mut ws).unwrap();
    assert_eq!(kv.checkpoint_len(0), Some(32));

    // Sequence 1: blocks 0 and 1 shared (positions 0..32), its own block 3 after them.
    kv.set_table(1, &[0, 1, 3], 32).unwrap();
    assert!(kv.restore_state(0, 1, 16).is_err(), "another position");
    kv.restore_state(0, 1, 32).unwrap();
    let rest = Batch::for_sequence(&follow[32..], 32, 1, true);
    let got = m.forward(&pool, &rest, &mut kv, &mut ws).unwrap();
    assert_eq!(got, &want[32 * v..], "logits after the restored state");

    // A capture the next pass starts past is dropped, and the checkpoint stays empty.
    kv.capture_state(1, 40, 1).unwrap();
    let more = Batch::for_sequence(&[5], follow.len(), 1, true);
    m.forward(&pool, &more, &mut kv, &mut ws).unwrap();
    assert_eq!(kv.checkpoint_len(1), None);
    assert!(kv.restore_state(1, 0, 40).is_err());
}
