//! Layer streaming ([`mica_models::stream`]) changes where a layer's weights are read from,
//! never what the model computes: logits are bit-identical to the fully resident (repacked)
//! model for a prompt and for decode steps, in both modes, on the three test models — also
//! after a pass that stopped between layers and a prompt chunk that asks for no logits. A
//! budget far below the model's size is planned and run; one too small is refused with the
//! numbers; streamed weights cannot be read outside their layer's turn.

mod common;

use common::{GEMMA, QWEN, SMOLLM, model_path};
use mica_kernels::ThreadPool;
use mica_models::stream::{self, StreamMode, layer_costs, plan};
use mica_models::{
    Batch, EstimateParams, KvCache, KvSizing, LoadOptions, LoadedModel, MemoryEstimate, Workspace,
};

const PROMPT: &str = "fn main() { let v: Vec<u32> = (0..100).map(|i| i * i).collect(); }";

/// Logits (as bits) of a 10-token prompt, then greedy decoding for 6 steps: every step's
/// logits and the tokens chosen. The prompt runs as a first chunk without logits then a
/// second one with, and (when `interrupt`) a pass is first given up after a few layers.
fn run(lm: &LoadedModel, pool: &ThreadPool, interrupt: bool) -> (Vec<Vec<u32>>, Vec<u32>) {
    let tokens = lm.tokenizer.encode(PROMPT, true, true).unwrap();
    let mut kv = KvCache::new(&lm.model.config, 64, 1);
    let mut ws = Workspace::default();
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    if interrupt {
        let b = Batch::for_sequence(&tokens[..4], 0, 0, true);
        let mut asked = 0;
        let mut stop = || {
            asked += 1;
            asked > 3
        };
        let r = lm
            .model
            .forward_interruptible(pool, &b, &mut kv, &mut ws, &mut stop)
            .unwrap();
        assert!(r.is_none(), "the pass was not interrupted");
        kv.clear(0);
    }
    let mut first = Batch::for_sequence(&tokens[..4], 0, 0, false);
    first.logits.fill(false);
    let none = lm.model.forward(pool, &first, &mut kv, &mut ws).unwrap();
    assert!(none.is_empty());
    let rest = Batch::for_sequence(&tokens[4..10], 4, 0, false);
    assert_eq!(rest.logits.iter().filter(|&&l| l).count(), 1);
    let mut logits = vec![bits(
        lm.model.forward(pool, &rest, &mut kv, &mut ws).unwrap(),
    )];
    let mut chosen = Vec::new();
    for step in 0..6 {
        let last = logits.last().unwrap();
        let next = (0..last.len())
            .max_by(|&a, &b| f32::from_bits(last[a]).total_cmp(&f32::from_bits(last[b])))
            .unwrap() as u32;
        chosen.push(next);
        let b = Batch::for_sequence(&[next], 10 + step, 0, true);
        logits.push(bits(lm.model.forward(pool, &b, &mut kv, &mut ws).unwrap()));
    }
    (logits, chosen)
}

/// The model opened, `layers` (and the output head when `head`) streamed in `mode`, then
/// repacked as a run would.
fn streamed(name: &str, layers: &[usize], head: bool, mode: StreamMode) -> LoadedModel {
    let mut lm = LoadedModel::open_with(model_path(name), LoadOptions::READ_ONLY).unwrap();
    stream::start(&mut lm.model, layers, head, mode).unwrap();
    lm.model.repack();
    lm
}

#[test]
fn streamed_logits_are_bit_identical_to_resident_ones() {
    let pool = ThreadPool::new(2);
    for name in [SMOLLM, GEMMA, QWEN] {
        let resident = LoadedModel::open(model_path(name)).unwrap();
        let n = resident.model.layers.len();
        let (want, want_tokens) = run(&resident, &pool, false);
        assert!(want[0].iter().all(|&x| f32::from_bits(x).is_finite()));
        drop(resident);
        // Every layer, the last few (a ring shorter than the layers), one layer; with the
        // output head in chunks or without; the head alone.
        let all: Vec<usize> = (0..n).collect();
        let last: Vec<usize> = (n - 5..n).collect();
        let (o, s) = (StreamMode::Overlapped, StreamMode::Sync);
        for (layers, head, mode) in [
            (&all[..], false, o),
            (&all[..], false, s),
            (&last[..], false, o),
            (&last[..], false, s),
            (&all[n / 2..n / 2 + 1], false, o),
            (&all[..], true, o),
            (&all[..], true, s),
            (&last[..], true, o),
            (&all[..0], true, s),
        ] {
            let lm = streamed(name, layers, head, mode);
            let s = lm.model.stream.as_ref().unwrap();
            assert_eq!(s.layers(), layers);
            assert_eq!(s.streams_head(), head);
            for interrupt in [false, true] {
                let (got, got_tokens) = run(&lm, &pool, interrupt);
                let what = format!("{name}, {} layers, head {head}, {mode:?}", layers.len());
                assert_eq!(got_tokens, want_tokens, "{what}: greedy tokens differ");
                for (step, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a == b,
                        "{what}, interrupted {interrupt}: step {step} differs"
                    );
                }
            }
            let st = lm.model.stream.as_ref().unwrap().stats();
            assert!(st.bytes_read > 0);
            // Nothing resident of the streamed layers but the ring.
            let f = lm.model.weight_footprint(true);
            assert!(f.streamed > 0 && f.stream_buffers > 0, "{f:?}");
        }
    }
}

#[test]
fn qwen_runs_under_a_128_mib_budget() {
    let mut lm = LoadedModel::open_with(model_path(QWEN), LoadOptions::READ_ONLY).unwrap();
    let params = EstimateParams {
        repack: true,
        kv: KvSizing::Context {
            n_ctx: 64,
            n_seq: 1,
        },
        n_ctx: 64,
        batch_tokens: 16,
        n_outputs: 1,
        runtime: 0,
    };
    let full = MemoryEstimate::new(&lm.model, &params);
    let budget = 128 << 20;
    assert!(full.total() > 2 * budget, "{full}");
    let costs = layer_costs(&mut lm.model, true);
    let p = plan(full.total(), &costs, StreamMode::Overlapped.slots(), budget).unwrap();
    // Its output head (Q8_0, 138 MiB) alone is more than the budget.
    assert!(
        p.head && !p.streamed.is_empty() && p.resident <= budget,
        "{p:?}"
    );
    stream::start(&mut lm.model, &p.streamed, p.head, StreamMode::Overlapped).unwrap();
    lm.model.repack();
    // The estimate of the streamed model is what the plan said (the plan may round the
    // head's chunks up by a few pages).
    let est = MemoryEstimate::new(&lm.model, &params);
    assert!(
        est.total() <= p.resident && p.resident - est.total() < 1 << 20,
        "{est}"
    );
    assert!(est.weights.streamed > 250 << 20, "{est}");
    let pool = ThreadPool::new(2);
    let (got, tokens) = run(&lm, &pool, false);
    drop(lm);
    let resident = LoadedModel::open(model_path(QWEN)).unwrap();
    let (want, want_tokens) = run(&resident, &pool, false);
    assert_eq!(tokens, want_tokens);
    assert!(got == want, "logits differ under the budget");
}

#[test]
fn a_budget_below_the_resident_parts_is_refused_with_the_numbers() {
    let mut lm = LoadedModel::open_with(model_path(SMOLLM), LoadOptions::READ_ONLY).unwrap();
    let costs = layer_costs(&mut lm.model, true);
    let e = plan(400 << 20, &costs, 3, 8 << 20).unwrap_err().to_string();
    assert!(
        e.contains("8.0 MiB is too small even with every layer and the output head streamed")
            && e.contains("in all"),
        "{e}"
    );
}

#[test]
fn streamed_weights_cannot_be_read_outside_their_turn() {
    let lm = streamed(SMOLLM, &[28, 29], false, StreamMode::Sync);
    let w = &lm.model.layers[29].wq.w;
    assert!(w.is_streamed() && !lm.model.layers[27].wq.w.is_streamed());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.view().data.len()));
    let msg = r.unwrap_err();
    let msg = msg.downcast_ref::<String>().unwrap();
    assert!(msg.contains("layer 29 were read outside"), "{msg}");
    // Streaming cannot be started twice, nor from a list that is not increasing layers.
    let mut lm = lm;
    assert!(stream::start(&mut lm.model, &[1], false, StreamMode::Sync).is_err());
    let mut other = LoadedModel::open_with(model_path(SMOLLM), LoadOptions::READ_ONLY).unwrap();
    let e = stream::start(&mut other.model, &[3, 2], false, StreamMode::Sync).unwrap_err();
    assert!(e.to_string().contains("not increasing"), "{e}");
    let e = stream::start(&mut other.model, &[99], false, StreamMode::Sync).unwrap_err();
    assert!(e.to_string().contains("not increasing"), "{e}");
    // A head streamed in chunks cannot be read whole.
    let h = streamed(SMOLLM, &[], true, StreamMode::Sync);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.model.output.w.view().data.len()
    }));
    assert!(r.is_err());
    // A self-speculation draft cannot drop streamed layers.
    assert!(!lm.model.truncate_layers(10));
}
