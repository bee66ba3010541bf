//! The serving engine on a real model: batch invariance against one-at-a-time generation,
//! prefix-cache reuse, cancellation freeing blocks, several completions of one prompt, and
//! abandoned steps (forced, or for an arriving interactive request) changing no result.

mod common;

use mica_engine::{
    EngineConfig, EngineHandle, Event, EventSink, FinishReason, GenerateParams, Lane, Request,
    SamplingParams, SchedulerConfig, Session,
};
use mica_models::LoadedModel;
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

/// A sink whose client "disconnects" when the flag is set.
struct DropSink(Sender<Event>, Arc<std::sync::atomic::AtomicBool>);
impl EventSink for DropSink {
    fn send(&mut self, ev: Event) -> bool {
        self.0.send(ev).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn model() -> Arc<LoadedModel> {
    Arc::new(LoadedModel::open(common::model_path("smollm2-135m-instruct-q4_1")).unwrap())
}

fn engine(lm: &Arc<LoadedModel>, kv_blocks: usize) -> EngineHandle {
    engine_abandoning(lm, kv_blocks, 0)
}

fn engine_abandoning(lm: &Arc<LoadedModel>, kv_blocks: usize, abandon_every: u64) -> EngineHandle {
    let cfg = EngineConfig {
        n_threads: 2,
        n_ctx: 2048,
        kv_blocks,
        scheduler: SchedulerConfig::default(),
        max_waiting_per_lane: 64,
        prefix_caching: true,
        max_n: 8,
        abandon_every,
    };
    EngineHandle::start(lm.clone(), cfg).unwrap()
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        ignore_eos: false,
        logit_bias: Vec::new(),
    }
}

/// Collected output of one request: tokens and text per completion, and the usage.
#[derive(Default, Debug)]
struct Out {
    tokens: Vec<Vec<u32>>,
    text: Vec<String>,
    finish: Vec<Option<FinishReason>>,
    usage: Option<mica_engine::Usage>,
}

fn collect(rx: Receiver<Event>, n: usize) -> Out {
    let mut o = Out {
        tokens: vec![Vec::new(); n],
        text: vec![String::new(); n],
        finish: vec![None; n],
        usage: None,
    };
    while let Ok(ev) = rx.recv_timeout(Duration::from_secs(120)) {
        match ev {
            Event::Token {
                index, token, text, ..
            } => {
                o.tokens[index].push(token);
                o.text[index].push_str(&text);
            }
            Event::Done {
                index,
                finish,
                text,
            } => {
                o.text[index].push_str(&text);
                o.finish[index] = Some(finish);
            }
            Event::Finished { usage } => {
                o.usage = Some(usage);
                break;
            }
            Event::Error(e) => panic!("engine error: {e}"),
        }
    }
    o
}

fn submit(e: &EngineHandle, prompt: Vec<u32>, params: GenerateParams, n: usize) -> Receiver<Event> {
    submit_in(e, prompt, params, n, Lane::Interactive)
}

fn submit_in(
    e: &EngineHandle,
    prompt: Vec<u32>,
    params: GenerateParams,
    n: usize,
    lane: Lane,
) -> Receiver<Event> {
    let (tx, rx) = channel();
    e.submit(Request {
        prompt,
        params,
        lane,
        n,
        logprobs: None,
        sink: Box::new(ChanSink(tx)),
        processors: None,
        proposer: None,
    })
    .unwrap();
    rx
}

/// 16 concurrent greedy requests with different prompts (short ones on the vector path,
/// long ones chunked on the tiled path) give exactly the tokens each gets alone in a
/// `Session` (llama.cpp's arithmetic).
#[test]
fn sixteen_concurrent_requests_match_one_at_a_time() {
    let lm = model();
    let tok = &lm.tokenizer;
    let prompts: Vec<Vec<u32>> = (0..16)
        .map(|i| {
            let body = if i % 4 == 3 {
                // ~150-300 tokens: split into several tiled chunks under load.
                format!("Item {i}. ").repeat(30 + 10 * i) + "Summarize the list:"
            } else {
                format!("Question {i}: what is {} plus {}? Answer:", i * 7, i + 3)
            };
            tok.encode(&body, true, true).unwrap()
        })
        .collect();
    let n_gen = 24;
    let mut alone = Vec::new();
    let mut session = Session::new(&lm, 2048, 2);
    for p in &prompts {
        session.reset();
        let g = session.generate(p, &greedy(n_gen), |_| true).unwrap();
        alone.push(g.output_ids);
    }

    let e = engine(&lm, 2048);
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| submit(&e, p.clone(), greedy(n_gen), 1))
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        let out = collect(rx, 1);
        assert_eq!(out.tokens[0], alone[i], "request {i} differs when batched");
    }
    assert!(e.metrics().steps.load(std::sync::atomic::Ordering::Relaxed) < 16 * n_gen as u64);
}

#[test]
fn repeated_prompt_hits_the_prefix_cache_and_n_completions_share_it() {
    let lm = model();
    let e = engine(&lm, 512);
    let prompt = lm
        .tokenizer
        .encode(&"The history of the city is long. ".repeat(20), true, true)
        .unwrap();
    let first = collect(submit(&e, prompt.clone(), greedy(8), 1), 1);
    assert_eq!(first.usage.unwrap().cached_tokens, 0);
    let second = collect(submit(&e, prompt.clone(), greedy(8), 1), 1);
    let u = second.usage.unwrap();
    assert_eq!(u.cached_tokens, (prompt.len() - 1) / 16 * 16);
    assert_eq!(
        second.tokens, first.tokens,
        "cached prefix, same greedy tokens"
    );

    // Three sampled completions of one prompt: forked from one prefill, each its own seed.
    let params = GenerateParams {
        max_tokens: 12,
        sampling: SamplingParams {
            temperature: 1.0,
            seed: 5,
            ..Default::default()
        },
        ..greedy(12)
    };
    let out = collect(submit(&e, prompt.clone(), params, 3), 3);
    assert!(out.finish.iter().all(|f| f.is_some()));
    assert_eq!(
        out.usage.unwrap().completion_tokens,
        out.tokens.iter().map(Vec::len).sum::<usize>()
    );
    assert!(
        out.tokens[0] != out.tokens[1] || out.tokens[1] != out.tokens[2],
        "different seeds, different samples"
    );
    // Everything released: only cached blocks remain.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        e.metrics()
            .kv_blocks_used
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[test]
fn cancelled_request_frees_its_blocks() {
    let lm = model();
    let e = engine(&lm, 512);
    let prompt = lm
        .tokenizer
        .encode("Tell me a very long story.", true, true)
        .unwrap();
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = channel();
    let params = GenerateParams {
        ignore_eos: true,
        ..greedy(100_000)
    };
    e.submit(Request {
        prompt,
        params,
        lane: Lane::Bulk,
        n: 1,
        logprobs: None,
        sink: Box::new(DropSink(tx, flag.clone())),
        processors: None,
        proposer: None,
    })
    .unwrap();
    for _ in 0..5 {
        rx.recv_timeout(Duration::from_secs(60)).unwrap();
    }
    let used = || {
        e.metrics()
            .kv_blocks_used
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert!(used() > 0);
    flag.store(true, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::Instant::now();
    while used() > 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(used(), 0);
    assert_eq!(
        e.metrics()
            .requests(Lane::Bulk, mica_engine::RequestStatus::Cancelled),
        1
    );
}

/// Greedy tokens of each prompt run alone through the engine, one request at a time (no
/// step is ever abandoned then). (The engine, not a `Session`: a `Session` computes a
/// prompt's last sub-64-token piece on the vector attention path, the engine's chunks all
/// take the tiled one.)
fn alone(lm: &Arc<LoadedModel>, prompts: &[Vec<u32>], n_gen: usize) -> Vec<Vec<u32>> {
    let e = engine(lm, 1024);
    let out = prompts
        .iter()
        .map(|p| collect(submit(&e, p.clone(), greedy(n_gen), 1), 1).tokens[0].clone())
        .collect();
    assert_eq!(count(&e.metrics().abandoned_steps), 0);
    out
}

/// Long "bulk" prompts (several 128-token chunks each) and short "interactive" ones.
fn mixed_prompts(
    lm: &LoadedModel,
    n_bulk: usize,
    bulk_words: usize,
    n_inter: usize,
) -> Vec<Vec<u32>> {
    let tok = &lm.tokenizer;
    let bulk = (0..n_bulk).map(|i| {
        let body: String = (0..bulk_words)
            .map(|k| format!("item{} ", (i * 31 + k) % 997))
            .collect();
        tok.encode(&format!("Report {i}. {body}\nSummary:"), true, true)
            .unwrap()
    });
    let inter = (0..n_inter).map(|i| {
        tok.encode(&format!("Question {i}: name a fruit."), true, true)
            .unwrap()
    });
    bulk.chain(inter).collect()
}

fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(std::sync::atomic::Ordering::Relaxed)
}

/// Every second step abandoned half-way through the layers (keys and values of some layers
/// written, nothing marked computed, nothing sampled): the tokens are exactly those of
/// requests run alone, without abandoned steps.
#[test]
fn abandoned_steps_change_no_result() {
    let lm = model();
    let prompts = mixed_prompts(&lm, 3, 80, 3);
    let n_gen = 12;
    let want = alone(&lm, &prompts, n_gen);
    let e = engine_abandoning(&lm, 1024, 2);
    let rxs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let lane = if i < 3 { Lane::Bulk } else { Lane::Interactive };
            submit_in(&e, p.clone(), greedy(n_gen), 1, lane)
        })
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        let out = collect(rx, 1);
        assert_eq!(
            out.tokens[0], want[i],
            "request {i} differs with abandoned steps"
        );
    }
    let m = e.metrics();
    assert!(count(&m.abandoned_steps) > 0, "steps were abandoned");
    assert!(count(&m.steps) > 0);
    // The finished prompts are in the prefix cache as usual.
    let again = collect(submit(&e, prompts[0].clone(), greedy(n_gen), 1), 1);
    assert_eq!(again.tokens[0], want[0]);
    assert!(again.usage.unwrap().cached_tokens > 0);
}

/// Interactive requests arriving while long bulk prompts are being computed abandon the
/// bulk steps in flight; every request still gets exactly its tokens alone.
#[test]
fn interactive_arrivals_abandon_bulk_steps_without_changing_results() {
    let lm = model();
    let prompts = mixed_prompts(&lm, 2, 300, 8);
    let n_gen = 6;
    let want = alone(&lm, &prompts, n_gen);
    let e = engine(&lm, 1024);
    let bulk: Vec<_> = (0..2)
        .map(|i| submit_in(&e, prompts[i].clone(), greedy(n_gen), 1, Lane::Bulk))
        .collect();
    // One interactive request at a time, each sent while bulk prompt chunks run, until one
    // has abandoned a step (bounded).
    for (i, p) in prompts[2..].iter().enumerate() {
        std::thread::sleep(Duration::from_millis(30));
        let out = collect(submit(&e, p.clone(), greedy(n_gen), 1), 1);
        assert_eq!(out.tokens[0], want[2 + i], "interactive {i}");
        if count(&e.metrics().abandoned_steps) > 0 {
            break;
        }
    }
    for (i, rx) in bulk.into_iter().enumerate() {
        assert_eq!(collect(rx, 1).tokens[0], want[i], "bulk {i}");
    }
    assert!(
        count(&e.metrics().abandoned_steps) > 0,
        "an interactive arrival abandoned a bulk step"
    );
}
