//! The GPU decoder against transformers' float32 logits on the tiny random Hugging Face
//! fixtures (fixtures/hf, written by fixtures/hf/make_fixtures.py), on any [`Runner`]:
//! every position's logits within [`MAX_ABS`], and the first [`GREEDY`] tokens of the greedy
//! continuation token for token. Run either by the decoder alone ([`check`]) or through the
//! host's forward pass with the last layers offloaded to it ([`check_offloaded`]).

pub use super::hf_common::load;
use super::hf_common::{AttentionPolicy, Batch, KvCache, Model, ThreadPool, Value, Workspace};
use super::hf_common::{argmax, ids};
use mica_cuda::ops::BLOCK_SIZE;
use mica_cuda::{GpuDecoder, Runner};

pub const MAX_ABS: f32 = 1e-4;
pub const GREEDY: usize = 12;
/// Positions each sequence may reach.
const N_CTX: usize = 64;

/// Steps of up to two sequences' tokens: `(token, position, sequence)` each, and which
/// rows give logits.
trait Steps {
    fn clear(&mut self, seq: usize);
    fn step(&mut self, toks: &[u32], pos: &[u32], seq: &[u32], flags: &[bool]) -> Vec<f32>;
}

/// The decoder alone, with fixed block tables: sequence `s` owns the `s`-th run of
/// `N_CTX / BLOCK_SIZE` blocks.
struct Alone<R: Runner>(GpuDecoder<R>);

impl<R: Runner> Steps for Alone<R> {
    fn clear(&mut self, _: usize) {}

    fn step(&mut self, toks: &[u32], pos: &[u32], seq: &[u32], flags: &[bool]) -> Vec<f32> {
        let per = (N_CTX / BLOCK_SIZE) as u32;
        let tables: Vec<Vec<u32>> = (0..2).map(|s| (s * per..(s + 1) * per).collect()).collect();
        let tables: Vec<&[u32]> = tables.iter().map(|t| &t[..]).collect();
        self.0.forward(toks, pos, seq, &tables, flags).unwrap()
    }
}

/// The host's forward pass, layers `first..` and the head offloaded to the decoder.
struct Offloaded<'a, R: Runner> {
    model: &'a Model,
    dec: GpuDecoder<R>,
    kv: KvCache,
    ws: Workspace,
    pool: ThreadPool,
}

impl<R: Runner> Steps for Offloaded<'_, R> {
    fn clear(&mut self, seq: usize) {
        self.kv.clear(seq);
    }

    fn step(&mut self, toks: &[u32], pos: &[u32], seq: &[u32], flags: &[bool]) -> Vec<f32> {
        let batch = Batch {
            tokens: toks.to_vec(),
            pos: pos.iter().map(|&p| p as usize).collect(),
            seq: seq.iter().map(|&s| s as usize).collect(),
            logits: flags.to_vec(),
        };
        let (kv, ws) = (&mut self.kv, &mut self.ws);
        self.model
            .forward_offloaded(&self.pool, &batch, kv, ws, &mut || false, &mut self.dec)
            .unwrap()
            .unwrap()
            .to_vec()
    }
}

pub fn check<R: Runner>(r: &R, family: &str) {
    let (model, exp, want) = load(family);
    let n_blocks = 2 * N_CTX / BLOCK_SIZE;
    let dec = GpuDecoder::new(r, &model, n_blocks).unwrap_or_else(|e| panic!("{family}: {e}"));
    run(&mut Alone(dec), &model, &exp, &want, family);
}

/// [`check`] through [`Model::forward_offloaded`]: the embedding and layers `..first` on
/// the host (with its KV cache), layers `first..` and the head on `r`.
pub fn check_offloaded<R: Runner>(r: &R, family: &str, first: usize) {
    let (model, exp, want) = load(family);
    let kv = KvCache::new_offloaded(&model.config, N_CTX, 2, first);
    let dec = GpuDecoder::layers(r, &model, first, kv.n_blocks())
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    let mut ws = Workspace::default();
    ws.attention = AttentionPolicy::Vector;
    let mut s = Offloaded {
        model: &model,
        dec,
        kv,
        ws,
        pool: ThreadPool::new(2),
    };
    let what = format!("{family} from layer {first}");
    run(&mut s, &model, &exp, &want, &what);
}

fn run(s: &mut dyn Steps, model: &Model, exp: &Value, want: &[f32], what: &str) {
    let v = model.config.n_vocab;
    // Every sequence in one step, two at a time.
    let seqs: Vec<Vec<u32>> = exp["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let mut offset = 0;
    let mut worst = 0f32;
    for pair in seqs.chunks(2) {
        let (mut toks, mut pos, mut seq) = (Vec::new(), Vec::new(), Vec::new());
        for (i, one) in pair.iter().enumerate() {
            s.clear(i);
            toks.extend_from_slice(one);
            pos.extend(0..one.len() as u32);
            seq.extend(std::iter::repeat_n(i as u32, one.len()));
        }
        let flags = vec![true; toks.len()];
        let got = s.step(&toks, &pos, &seq, &flags);
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
                "{what}: token {p}: max |Δlogit| {d:.2e} > {MAX_ABS:.0e}"
            );
        }
    }
    assert_eq!(offset, want.len(), "{what}: logits file size");

    // Greedy continuation: the prompt in one step (logits of its last token only), then one
    // token per step.
    let prompt = ids(&exp["greedy_prompt"]);
    // The first GREEDY tokens of transformers' continuation (each is a whole step on the
    // emulator; past the fixtures' sliding windows of 5).
    let want_ids: Vec<u32> = ids(&exp["greedy_ids"]).into_iter().take(GREEDY).collect();
    s.clear(0);
    let n = prompt.len();
    let mut flags = vec![false; n];
    flags[n - 1] = true;
    let pos: Vec<u32> = (0..n as u32).collect();
    let mut logits = s.step(&prompt, &pos, &vec![0; n], &flags);
    let mut got_ids = Vec::new();
    for step in 0..want_ids.len() {
        let t = argmax(&logits);
        got_ids.push(t);
        logits = s.step(&[t], &[(n + step) as u32], &[0], &[true]);
    }
    assert_eq!(got_ids, want_ids, "{what}: greedy continuation");
    println!(
        "{what}: max |Δlogit| {worst:.2e}; greedy {} tokens identical",
        want_ids.len()
    );
}
