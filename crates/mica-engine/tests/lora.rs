//! LoRA adapters chosen per request (`Request::lora`) on the test model, with a random PEFT
//! adapter: a request with the adapter gives exactly the tokens of the model with the
//! adapter attached to every token (`mica run --lora`), one without it the base model's;
//! requests with the adapter at two scales and with none, running in the same steps, each
//! give what they give alone; the prefix cache never hands blocks computed under one
//! selection to another.

mod common;

#[path = "common/peft.rs"]
mod peft;

use mica_engine::{
    EngineConfig, EngineHandle, Event, EventSink, GenerateParams, Lane, Request, SamplingParams,
    SchedulerConfig, Usage,
};
use mica_models::lora::LoraSelection;
use mica_models::{LoadedModel, LoraAdapter};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

struct ChanSink(Sender<Event>);
impl EventSink for ChanSink {
    fn send(&mut self, ev: Event) -> bool {
        self.0.send(ev).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

fn model() -> LoadedModel {
    LoadedModel::open(common::model_path(common::SMOLLM)).unwrap()
}

/// The random adapter for the test model, written once per test process (tests run in
/// parallel: rewriting the file while another test has it mapped would fault that test).
fn adapter_dir(lm: &LoadedModel) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("mica-engine-lora-{}", std::process::id()));
        let c = &lm.model.config;
        peft::write_random_peft(&dir, c.n_layer, c.n_embd, c.n_head_kv * c.head_dim, 7);
        dir
    })
    .clone()
}

fn engine(lm: Arc<LoadedModel>) -> EngineHandle {
    let cfg = EngineConfig {
        n_threads: 2,
        n_ctx: 1024,
        kv_blocks: 256,
        scheduler: SchedulerConfig::default(),
        max_waiting_per_lane: 64,
        prefix_caching: true,
        max_n: 4,
        abandon_every: 0,
        state_checkpoints: 0,
        state_checkpoint_interval: 0,
    };
    EngineHandle::start(lm, cfg).unwrap()
}

fn submit(e: &EngineHandle, prompt: &[u32], lora: Option<Arc<LoraSelection>>) -> Receiver<Event> {
    let (tx, rx) = channel();
    e.submit(Request {
        prompt: prompt.to_vec(),
        params: GenerateParams {
            max_tokens: 16,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: true,
            logit_bias: Vec::new(),
        },
        lane: Lane::Interactive,
        n: 1,
        logprobs: None,
        sink: Box::new(ChanSink(tx)),
        processors: None,
        proposer: None,
        lora,
    })
    .unwrap();
    rx
}

fn collect(rx: Receiver<Event>) -> (Vec<u32>, Usage) {
    let mut tokens = Vec::new();
    while let Ok(ev) = rx.recv_timeout(Duration::from_secs(120)) {
        match ev {
            Event::Token { token, .. } => tokens.push(token),
            Event::Finished { usage } => return (tokens, usage),
            Event::Error(e) => panic!("engine error: {e}"),
            Event::Done { .. } => {}
        }
    }
    panic!("no end of request");
}

fn run(e: &EngineHandle, prompt: &[u32], lora: Option<Arc<LoraSelection>>) -> (Vec<u32>, Usage) {
    collect(submit(e, prompt, lora))
}

fn select(adapters: &[(&Arc<LoraAdapter>, f32)]) -> Option<Arc<LoraSelection>> {
    Some(Arc::new(LoraSelection {
        adapters: adapters.iter().map(|(a, s)| ((*a).clone(), *s)).collect(),
    }))
}

fn prompt(lm: &LoadedModel, text: &str) -> Vec<u32> {
    lm.tokenizer.encode(text, true, true).unwrap()
}

#[test]
fn per_request_adapters_match_attached_ones_and_batch_together() {
    let base = model();
    let dir = adapter_dir(&base);
    let adapter = Arc::new(LoraAdapter::open(&dir, &base.model, 1.0).unwrap());
    let short = prompt(&base, "The capital of France is");
    // A prompt long enough for attention's tiled path (and chunked under load).
    let long = prompt(&base, &"One two three four five. ".repeat(20));

    // The adapter attached to every token, at scales 1 and 0.5: `mica run --lora`.
    let attached = |scale: f32| {
        let mut lm = model();
        let a = LoraAdapter::open(&dir, &lm.model, scale).unwrap();
        lm.model.attach_lora(&a).unwrap();
        let e = engine(Arc::new(lm));
        (run(&e, &short, None).0, run(&e, &long, None).0)
    };
    let (full_short, full_long) = attached(1.0);
    let (half_short, half_long) = attached(0.5);

    let e = engine(Arc::new(base));
    let one = select(&[(&adapter, 1.0)]);
    let half = select(&[(&adapter, 0.5)]);
    let plain_short = run(&e, &short, None).0;
    let plain_long = run(&e, &long, None).0;
    assert_ne!(plain_short, full_short, "the adapter changes the output");
    assert_ne!(full_short, half_short, "the scale changes the output");
    assert_eq!(run(&e, &short, one.clone()).0, full_short);
    assert_eq!(run(&e, &long, one.clone()).0, full_long);
    assert_eq!(run(&e, &short, half.clone()).0, half_short);
    assert_eq!(run(&e, &long, half.clone()).0, half_long);
    assert_eq!(run(&e, &short, None).0, plain_short, "no adapter: the base");

    // All together, in the same steps: each gives what it gives alone.
    let cases = [
        (&short, one.clone(), &full_short),
        (&long, None, &plain_long),
        (&short, half.clone(), &half_short),
        (&long, one.clone(), &full_long),
        (&short, None, &plain_short),
        (&long, half.clone(), &half_long),
    ];
    for round in 0..2 {
        let rxs: Vec<_> = cases
            .iter()
            .map(|(p, l, _)| submit(&e, p, l.clone()))
            .collect();
        for (i, (rx, (_, _, want))) in rxs.into_iter().zip(&cases).enumerate() {
            assert_eq!(&collect(rx).0, *want, "round {round}, request {i}");
        }
    }
    let steps = e.metrics().steps.load(std::sync::atomic::Ordering::Relaxed);
    assert!(steps > 0);
}

/// A list of adapters adds their updates in order, as several `--lora` do.
#[test]
fn a_list_of_adapters_adds_up() {
    let base = model();
    let dir = adapter_dir(&base);
    let p = prompt(&base, "Once upon a time");
    let mut lm = model();
    for _ in 0..2 {
        let a = LoraAdapter::open(&dir, &lm.model, 0.5).unwrap();
        lm.model.attach_lora(&a).unwrap();
    }
    let want = run(&engine(Arc::new(lm)), &p, None).0;
    let a = Arc::new(LoraAdapter::open(&dir, &base.model, 1.0).unwrap());
    let e = engine(Arc::new(base));
    assert_eq!(run(&e, &p, select(&[(&a, 0.5), (&a, 0.5)])).0, want);
}

/// Blocks cached under one selection are not reused under another (nor under none), and
/// are under the same one.
#[test]
fn the_prefix_cache_is_keyed_by_the_adapters() {
    let base = model();
    let dir = adapter_dir(&base);
    let a = Arc::new(LoraAdapter::open(&dir, &base.model, 1.0).unwrap());
    // The same adapter loaded again is another adapter (it may have changed on disk).
    let again = Arc::new(LoraAdapter::open(&dir, &base.model, 1.0).unwrap());
    let p = prompt(&base, &"A long shared prefix of many words. ".repeat(8));
    assert!(p.len() > 64);
    let e = engine(Arc::new(base));
    let (with_a, u) = run(&e, &p, select(&[(&a, 1.0)]));
    assert_eq!(u.cached_tokens, 0);
    let (_, u) = run(&e, &p, select(&[(&a, 1.0)]));
    assert!(u.cached_tokens > 0, "same adapter: the prefix is reused");
    for (what, sel) in [
        ("none", None),
        ("another scale", select(&[(&a, 0.5)])),
        ("the adapter loaded again", select(&[(&again, 1.0)])),
    ] {
        let (_, u) = run(&e, &p, sel);
        assert_eq!(u.cached_tokens, 0, "{what}");
    }
    // The base's blocks (cached above) do not serve the adapter either: its output is still
    // the adapter's.
    let (out, u) = run(&e, &p, select(&[(&a, 1.0)]));
    assert!(u.cached_tokens > 0);
    assert_eq!(out, with_a);
}

/// What mixing adapters in a batch costs (`--ignored --nocapture`; timings, not a check):
/// four concurrent greedy requests of 48 tokens with no adapter, all with adapter A, two
/// with A and two with B, two with A and two without; rounds alternate the four, medians.
#[test]
#[ignore]
fn mixed_batch_cost() {
    let base = model();
    let c = &base.model.config;
    let kv = c.n_head_kv * c.head_dim;
    let tmp = std::env::temp_dir().join(format!("mica-engine-lora-cost-{}", std::process::id()));
    let (da, db) = (tmp.join("a"), tmp.join("b"));
    peft::write_random_peft(&da, c.n_layer, c.n_embd, kv, 7);
    peft::write_random_peft(&db, c.n_layer, c.n_embd, kv, 8);
    let a = Arc::new(LoraAdapter::open(&da, &base.model, 1.0).unwrap());
    let b = Arc::new(LoraAdapter::open(&db, &base.model, 1.0).unwrap());
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            prompt(
                &base,
                &format!("Request {i}: tell me a story about a dragon."),
            )
        })
        .collect();
    let e = engine(Arc::new(base));
    let configs: [(&str, [Option<Arc<LoraSelection>>; 4]); 4] = [
        ("none", [None, None, None, None]),
        ("all A", std::array::from_fn(|_| select(&[(&a, 1.0)]))),
        (
            "2 A + 2 B",
            std::array::from_fn(|i| select(&[(if i % 2 == 0 { &a } else { &b }, 1.0)])),
        ),
        (
            "2 A + 2 none",
            std::array::from_fn(|i| {
                if i % 2 == 0 {
                    select(&[(&a, 1.0)])
                } else {
                    None
                }
            }),
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..6 {
        for (k, (_, sels)) in configs.iter().enumerate() {
            let t0 = std::time::Instant::now();
            let rxs: Vec<_> = prompts
                .iter()
                .zip(sels)
                .map(|(p, s)| {
                    let (tx, rx) = channel();
                    e.submit(Request {
                        prompt: p.clone(),
                        params: GenerateParams {
                            max_tokens: 48,
                            sampling: SamplingParams::greedy(),
                            stop: Vec::new(),
                            ignore_eos: true,
                            logit_bias: Vec::new(),
                        },
                        lane: Lane::Interactive,
                        n: 1,
                        logprobs: None,
                        sink: Box::new(ChanSink(tx)),
                        processors: None,
                        proposer: None,
                        lora: s.clone(),
                    })
                    .unwrap();
                    rx
                })
                .collect();
            let n: usize = rxs.into_iter().map(|rx| collect(rx).0.len()).sum();
            if round > 0 {
                times[k].push(n as f64 / t0.elapsed().as_secs_f64());
            }
        }
    }
    for ((name, _), t) in configs.iter().zip(&mut times) {
        t.sort_by(f64::total_cmp);
        println!(
            "{name:>14}: {:.1} tokens/s (median of {}; range {:.1}–{:.1})",
            t[t.len() / 2],
            t.len(),
            t[0],
            t[t.len() - 1]
        );
    }
}
