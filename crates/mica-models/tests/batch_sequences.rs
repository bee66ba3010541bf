//! The forward pass over a batch of several sequences (docs/architecture.md, decision 1): tokens of
//! different sequences interleaved in one batch give exactly the logits each sequence gets
//! on its own, and the cache keeps the sequences apart.

mod common;

use common::model_path;
use mica_kernels::ThreadPool;
use mica_models::{Batch, KvCache, LoadedModel, Workspace};

/// Logits of every token of `tokens` run alone as sequence 0.
fn alone(lm: &LoadedModel, pool: &ThreadPool, tokens: &[u32]) -> Vec<f32> {
    let mut kv = KvCache::new(&lm.model.config, 64, 1);
    let mut ws = Workspace::default();
    let b = Batch::for_sequence(tokens, 0, 0, true);
    lm.model
        .forward(pool, &b, &mut kv, &mut ws)
        .unwrap()
        .to_vec()
}

#[test]
fn interleaved_sequences_match_separate_runs() {
    let lm = LoadedModel::open(model_path("smollm2-135m-instruct-q4_1")).unwrap();
    let pool = ThreadPool::new(2);
    let v = lm.model.config.n_vocab;
    let a = lm
        .tokenizer
        .encode("The capital of France is", true, true)
        .unwrap();
    let b = lm
        .tokenizer
        .encode("def fibonacci(n):", true, true)
        .unwrap();
    let (ra, rb) = (alone(&lm, &pool, &a), alone(&lm, &pool, &b));

    // Both prompts in one batch, interleaved, as sequences 3 and 1 of a 4-sequence cache.
    let mut kv = KvCache::new(&lm.model.config, 64, 4);
    let mut ws = Workspace::default();
    let mut batch = Batch::new();
    let mut order = Vec::new();
    for i in 0..a.len().max(b.len()) {
        if i < a.len() {
            batch.push(a[i], i, 3, true);
            order.push(('a', i));
        }
        if i < b.len() {
            batch.push(b[i], i, 1, true);
            order.push(('b', i));
        }
    }
    let logits = lm
        .model
        .forward(&pool, &batch, &mut kv, &mut ws)
        .unwrap()
        .to_vec();
    for (row, (which, i)) in order.iter().enumerate() {
        let want = match which {
            'a' => &ra[i * v..(i + 1) * v],
            _ => &rb[i * v..(i + 1) * v],
        };
        assert_eq!(&logits[row * v..(row + 1) * v], want, "{which}{i}");
    }
    assert_eq!(kv.seq_len(3), a.len());
    assert_eq!(kv.seq_len(1), b.len());
    assert_eq!(kv.seq_len(0), 0);

    // Continue only sequence 1 by one token: same as extending it alone.
    let next = 42;
    let step = Batch::for_sequence(&[next], b.len(), 1, false);
    let l1 = lm
        .model
        .forward(&pool, &step, &mut kv, &mut ws)
        .unwrap()
        .to_vec();
    let mut b2 = b.clone();
    b2.push(next);
    let rb2 = alone(&lm, &pool, &b2);
    assert_eq!(&l1[..], &rb2[b.len() * v..]);
}

#[test]
fn bad_batches_are_errors() {
    let lm = LoadedModel::open(model_path("smollm2-135m-instruct-q4_1")).unwrap();
    let pool = ThreadPool::new(1);
    let mut kv = KvCache::new(&lm.model.config, 8, 2);
    let mut ws = Workspace::default();
    let err = |b: &Batch, kv: &mut KvCache, ws: &mut Workspace| {
        lm.model.forward(&pool, b, kv, ws).unwrap_err().to_string()
    };
    // Positions must continue the sequence.
    let b = Batch::for_sequence(&[1, 2], 5, 0, false);
    assert!(err(&b, &mut kv, &mut ws).contains("continues at 0"));
    // Token ids must be in the vocabulary.
    let b = Batch::for_sequence(&[1_000_000], 0, 0, false);
    assert!(err(&b, &mut kv, &mut ws).contains("outside the vocabulary"));
    // Sequence ids must exist; context must not overflow.
    let b = Batch::for_sequence(&[1], 0, 7, false);
    assert!(err(&b, &mut kv, &mut ws).contains("out of range"));
    let b = Batch::for_sequence(&[1; 9], 0, 0, false);
    assert!(err(&b, &mut kv, &mut ws).contains("do not fit in the context of 8"));
    assert!(err(&Batch::new(), &mut kv, &mut ws).contains("empty"));
    // A failed batch changed nothing: the cache is still empty and usable.
    assert_eq!(kv.seq_len(0), 0);
    let b = Batch::for_sequence(&[1, 2, 3], 0, 0, false);
    assert!(lm.model.forward(&pool, &b, &mut kv, &mut ws).is_ok());
}

/// Long prompts run the feed-forward in token chunks (to bound its buffers); every token
/// must take the path it takes in one whole-batch call, so the logits are bit-identical.
/// Qwen2.5's file mixes Q4_K (repacked groups of four), Q6_K (tiled) and Q5_0/Q8_0 rows.
#[test]
fn chunked_feed_forward_is_bit_identical_to_whole_batches() {
    let lm = LoadedModel::open(model_path("qwen2.5-coder-0.5b-instruct-awq-q4_k_m")).unwrap();
    let pool = ThreadPool::new(2);
    let text = "fn main() { let v: Vec<u32> = (0..100).map(|i| i * i).collect(); } ".repeat(12);
    let all = lm.tokenizer.encode(&text, true, true).unwrap();
    assert!(all.len() > 300, "prompt of {} tokens", all.len());
    // 301: chunks 128, 128, 45 with a leftover Q4_K group; 262: a 6-token tail folded in.
    for n in [301, 262] {
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
