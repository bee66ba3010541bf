//! The serving engine and the session on a hybrid model (the tiny Qwen3.5 fixture quantized
//! to Q8_0 by llama.cpp: Gated DeltaNet layers with a recurrent state per sequence): 16
//! concurrent greedy requests give each one's tokens alone; preemption under KV pressure
//! recomputes from a zeroed state and changes nothing; several completions of one prompt
//! fork its state; prefix caching is forced off and drafts are refused (a recurrent state
//! cannot be cut back); a session reuses its cache for a follow-up turn and starts afresh
//! when the prompt diverges.

mod common;

use mica_engine::{
    EngineConfig, EngineHandle, Event, EventSink, GenerateParams, Lane, Param, ParamError,
    Proposer, Request, SamplingParams, SchedulerConfig, Session, SubmitError,
};
use mica_models::LoadedModel;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
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

fn model() -> Arc<LoadedModel> {
    let path = common::workspace().join("fixtures/converted/qwen35/model.q8_0.gguf");
    Arc::new(LoadedModel::open(path).unwrap())
}

fn engine(lm: &Arc<LoadedModel>, kv_blocks: usize, max_running: usize) -> EngineHandle {
    let cfg = EngineConfig {
        n_threads: 2,
        n_ctx: 256,
        kv_blocks,
        scheduler: SchedulerConfig {
            max_running,
            ..SchedulerConfig::default()
        },
        max_waiting_per_lane: 64,
        prefix_caching: true,
        max_n: 4,
        abandon_every: 0,
    };
    EngineHandle::start(lm.clone(), cfg).unwrap()
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        ignore_eos: true,
        logit_bias: Vec::new(),
    }
}

fn request(prompt: Vec<u32>, n: usize, tx: Sender<Event>) -> Request {
    Request {
        prompt,
        params: greedy(24),
        lane: Lane::Interactive,
        n,
        logprobs: None,
        sink: Box::new(ChanSink(tx)),
        processors: None,
        proposer: None,
    }
}

/// Tokens per completion and the request's cached prompt tokens.
fn collect(rx: Receiver<Event>, n: usize) -> (Vec<Vec<u32>>, usize) {
    let mut tokens = vec![Vec::new(); n];
    while let Ok(ev) = rx.recv_timeout(Duration::from_secs(120)) {
        match ev {
            Event::Token { index, token, .. } => tokens[index].push(token),
            Event::Finished { usage } => return (tokens, usage.cached_tokens),
            Event::Error(e) => panic!("engine error: {e}"),
            _ => {}
        }
    }
    panic!("no Finished event")
}

/// Prompts of 3 to 63 token ids (the fixture has no tokenizer worth the name).
fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let len = 3 + (i * 37) % 61;
            (0..len)
                .map(|k| 3 + ((i * 53 + k * 29 + k * k) % 125) as u32)
                .collect()
        })
        .collect()
}

fn alone(lm: &LoadedModel, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let mut session = Session::new(lm, 256, 2);
    prompts
        .iter()
        .map(|p| {
            session.reset();
            session
                .generate(p, &greedy(24), |_| true)
                .unwrap()
                .output_ids
        })
        .collect()
}

fn run_all(e: &EngineHandle, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (tx, rx) = channel();
            e.submit(request(p.clone(), 1, tx)).unwrap();
            rx
        })
        .collect();
    rxs.into_iter()
        .map(|rx| collect(rx, 1).0.remove(0))
        .collect()
}

#[test]
fn sixteen_concurrent_requests_match_one_at_a_time() {
    let lm = model();
    let ps = prompts(16);
    let want = alone(&lm, &ps);
    let e = engine(&lm, 512, 16);
    assert!(
        !e.config().prefix_caching,
        "prefix caching must be off for a hybrid model"
    );
    let got = run_all(&e, &ps);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "request {i} differs when batched");
    }
    assert!(e.metrics().steps.load(Relaxed) < 16 * 24);
}

/// A pool of 12 blocks (192 positions) for 8 sequences of up to 87: the scheduler preempts,
/// the preempted sequences start again from position 0 with a zeroed state.
#[test]
fn preemption_recomputes_the_state_and_changes_nothing() {
    let lm = model();
    let ps = prompts(8);
    let want = alone(&lm, &ps);
    let e = engine(&lm, 12, 8);
    let got = run_all(&e, &ps);
    assert!(
        e.metrics().preemptions.load(Relaxed) > 0,
        "the pool was meant to force preemption"
    );
    assert_eq!(got, want);
}

/// Two completions of one prompt: the second is forked after the prompt, with the first's
/// recurrent state; greedy, both give the tokens of the prompt alone. A repeated prompt takes
/// nothing from a prefix cache.
#[test]
fn forked_completions_continue_the_state_and_nothing_is_cached() {
    let lm = model();
    let p = prompts(5).remove(4);
    let want = alone(&lm, std::slice::from_ref(&p)).remove(0);
    let e = engine(&lm, 256, 4);
    for _ in 0..2 {
        let (tx, rx) = channel();
        e.submit(request(p.clone(), 2, tx)).unwrap();
        let (tokens, cached) = collect(rx, 2);
        assert_eq!(tokens, [want.clone(), want.clone()]);
        assert_eq!(cached, 0);
    }
}

struct Echo;
impl Proposer for Echo {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        history.iter().rev().take(max).copied().collect()
    }
}

#[test]
fn drafts_are_refused_naming_the_proposer() {
    let lm = model();
    let e = engine(&lm, 64, 4);
    let (tx, _rx) = channel();
    let mut req = request(vec![1, 5, 9], 1, tx);
    req.proposer = Some(Box::new(Echo));
    match e.submit(req) {
        Err(SubmitError::Params(p)) => {
            assert_eq!(p, ParamError::DraftsOnRecurrentModel);
            assert_eq!(p.param(), Param::Proposer);
        }
        other => panic!("expected a parameter error, got {other:?}"),
    }
    let mut s = Session::new(&*lm, 256, 2);
    let mut echo = Echo;
    let hooks = mica_engine::Hooks {
        processors: Vec::new(),
        proposer: Some(&mut echo),
    };
    let err = s
        .generate_with(&[1, 5, 9], &greedy(4), hooks, |_| true)
        .unwrap_err();
    assert!(err.to_string().contains("recurrent"), "{err}");
}

/// A follow-up turn continues the cached state (only the new tokens are computed); a prompt
/// that leaves the cache part-way is computed from its first token. Both give a fresh
/// session's tokens.
#[test]
fn a_session_continues_a_turn_and_restarts_a_diverging_prompt() {
    let lm = model();
    let p = prompts(3).remove(2);
    let mut s = Session::new(&*lm, 256, 2);
    let first = s.generate(&p, &greedy(8), |_| true).unwrap();
    let mut turn = p.clone();
    turn.extend_from_slice(&first.output_ids);
    turn.extend_from_slice(&[7, 8, 9]);
    let second = s.generate(&turn, &greedy(8), |_| true).unwrap();
    // The cache held the prompt and all but the last generated token.
    assert_eq!(second.timings.prompt_tokens, 1 + 3);
    let fresh = alone_n(&lm, &turn, 8);
    assert_eq!(second.output_ids, fresh);

    let mut diverged = p[..p.len() / 2].to_vec();
    diverged.extend_from_slice(&[11, 12, 13]);
    let third = s.generate(&diverged, &greedy(8), |_| true).unwrap();
    assert_eq!(third.timings.prompt_tokens, diverged.len());
    assert_eq!(third.output_ids, alone_n(&lm, &diverged, 8));
}

fn alone_n(lm: &LoadedModel, p: &[u32], n: usize) -> Vec<u32> {
    let mut s = Session::new(lm, 256, 2);
    s.generate(p, &greedy(n), |_| true).unwrap().output_ids
}

/// A hybrid model cannot be a draft model either: its state cannot drop rejected drafts.
#[test]
fn a_hybrid_draft_model_is_refused() {
    use mica_engine::spec::{DraftModelConfig, DraftModelProposer};
    let lm = model();
    let pool = Arc::new(mica_kernels::ThreadPool::new(1));
    let err = DraftModelProposer::new(lm.clone(), &lm, pool, DraftModelConfig::default())
        .err()
        .expect("refused");
    assert_eq!(err, mica_engine::SpecError::RecurrentDraft);
}

/// A KV memory budget holds the recurrent states of the running sequences first: the blocks
/// are what is left after `max_running` states.
#[test]
fn kv_memory_pays_for_the_recurrent_states_first() {
    use mica_models::KvCache;
    let lm = model();
    let cfg = &lm.model.config;
    let (state, block) = (
        KvCache::state_bytes_per_seq(cfg),
        KvCache::bytes_per_block(cfg),
    );
    assert!(state > 0);
    let bytes = 64 * block + 8 * state;
    assert_eq!(EngineConfig::blocks_for_memory(&lm, bytes, 8), 64);
    assert_eq!(
        EngineConfig::blocks_for_memory(&lm, bytes, 0),
        bytes / block
    );
    assert_eq!(EngineConfig::blocks_for_memory(&lm, state, 2), 0);
}
