//! The GPU decoder against transformers' float32 logits on the tiny random Hugging Face
//! fixtures (fixtures/hf, written by fixtures/hf/make_fixtures.py), on any [`Runner`]:
//! every position's logits within [`MAX_ABS`], and the first [`GREEDY`] tokens of the greedy
//! continuation token for token.

pub use super::hf_common::load;
use super::hf_common::{argmax, ids};
use mica_cuda::{GpuDecoder, Runner};

pub const MAX_ABS: f32 = 1e-4;
pub const GREEDY: usize = 12;

pub fn check<R: Runner>(r: &R, family: &str) {
    let (model, exp, want) = load(family);
    let v = model.config.n_vocab;
    let mut dec = GpuDecoder::new(r, &model, 2, 64).unwrap_or_else(|e| panic!("{family}: {e}"));
    // Every sequence in one step, each in its own slot (two at a time).
    let seqs: Vec<Vec<u32>> = exp["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let mut offset = 0;
    let mut worst = 0f32;
    for pair in seqs.chunks(2) {
        let (mut toks, mut pos, mut slot) = (Vec::new(), Vec::new(), Vec::new());
        for (s, seq) in pair.iter().enumerate() {
            dec.clear(s);
            toks.extend_from_slice(seq);
            pos.extend(0..seq.len() as u32);
            slot.extend(std::iter::repeat_n(s as u32, seq.len()));
        }
        let flags = vec![true; toks.len()];
        let got = dec
            .forward(&toks, &pos, &slot, &flags)
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        let w = &want[offset..offset + toks.len() * v];
        offset += toks.len() * v;
        for (p, (g, e)) in got.chunks_exact(v).zip(w.chunks_exact(v)).enumerate() {
            let d = g
                .iter()
                .zip(e)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            worst = worst.max(d);
            assert!(
                d <= MAX_ABS,
                "{family}: token {p}: max |Δlogit| {d:.2e} > {MAX_ABS:.0e}"
            );
        }
    }
    assert_eq!(offset, want.len(), "{family}: logits file size");

    // Greedy continuation: the prompt in one step, then one token per step.
    let prompt = ids(&exp["greedy_prompt"]);
    // The first GREEDY tokens of transformers' continuation (each is a whole step on the
    // emulator; past the fixtures' sliding windows of 5).
    let want_ids: Vec<u32> = ids(&exp["greedy_ids"]).into_iter().take(GREEDY).collect();
    dec.clear(0);
    let n = prompt.len();
    let mut flags = vec![false; n];
    flags[n - 1] = true;
    let pos: Vec<u32> = (0..n as u32).collect();
    let mut logits = dec.forward(&prompt, &pos, &vec![0; n], &flags).unwrap();
    let mut got_ids = Vec::new();
    for step in 0..want_ids.len() {
        let t = argmax(&logits);
        got_ids.push(t);
        logits = dec
            .forward(&[t], &[(n + step) as u32], &[0], &[true])
            .unwrap();
    }
    assert_eq!(got_ids, want_ids, "{family}: greedy continuation");
    println!(
        "{family}: max |Δlogit| {worst:.2e}; greedy {} tokens identical",
        want_ids.len()
    );
}
