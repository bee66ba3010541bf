//! The serving engine and the session on a hybrid model (the tiny Qwen3.5 fixture quantized
//! to Q8_0 by llama.cpp: Gated DeltaNet layers with a recurrent state per sequence): 16
//! concurrent greedy requests give each one's tokens alone; preemption under KV pressure
//! recomputes from a zeroed state or a checkpoint and changes nothing; several completions
//! of one prompt fork its state; prefix caching goes through recurrent-state checkpoints (a
//! follow-up chat turn and prompts sharing a system prompt start from a saved state, with a
//! cold run's tokens, also when checkpoints and blocks are evicted), and is off without
//! checkpoints; drafts are refused (a recurrent state cannot be cut back); a session reuses
//! its cache for a follow-up turn and starts afresh when the prompt diverges.

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
    engine_ckpt(lm, kv_blocks, max_running, 16, 0)
}

fn engine_ckpt(
    lm: &Arc<LoadedModel>,
    kv_blocks: usize,
    max_running: usize,
    state_checkpoints: usize,
    state_checkpoint_interval: usize,
) -> EngineHandle {
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
        state_checkpoints,
        state_checkpoint_interval,
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
        lora: None,
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
    let e = engine_ckpt(&lm, 512, 16, 48, 0);
    assert!(e.config().prefix_caching, "on through checkpoints");
    // The second round starts from the first's checkpoints.
    for round in 0..2 {
        let got = run_all(&e, &ps);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "request {i} differs when batched (round {round})");
        }
    }
    assert!(e.metrics().steps.load(Relaxed) < 2 * 16 * 24);
    assert!(e.metrics().cached_prompt_tokens.load(Relaxed) > 0);
    let off = engine_ckpt(&lm, 512, 16, 0, 0);
    assert!(
        !off.config().prefix_caching,
        "without checkpoints prefix caching is off for a hybrid model"
    );
    assert_eq!(run_all(&off, &ps), want);
}

/// A pool of 12 blocks (192 positions) for 8 sequences of up to 87: the scheduler preempts,
/// the preempted sequences start again from position 0 with a zeroed state (no checkpoints)
/// or from a checkpoint of theirs still in the cache (a few checkpoints, evicted with their
/// blocks and by one another).
#[test]
fn preemption_recomputes_the_state_and_changes_nothing() {
    let lm = model();
    let ps = prompts(8);
    let want = alone(&lm, &ps);
    for ckpts in [0, 3] {
        let e = engine_ckpt(&lm, 12, 8, ckpts, 0);
        let got = run_all(&e, &ps);
        assert!(
            e.metrics().preemptions.load(Relaxed) > 0,
            "the pool was meant to force preemption"
        );
        assert_eq!(got, want, "{ckpts} checkpoints");
    }
}

/// Two completions of one prompt: the second is forked after the prompt, with the first's
/// recurrent state; greedy, both give the tokens of the prompt alone. The repeated prompt (29
/// tokens) starts from the checkpoint at its last block boundary (16), or from nothing
/// without checkpoints.
#[test]
fn forked_completions_continue_the_state_and_a_repeat_restores_it() {
    let lm = model();
    let p = prompts(5).remove(4);
    assert_eq!(p.len(), 29);
    let want = alone(&lm, std::slice::from_ref(&p)).remove(0);
    for (ckpts, cached_again) in [(16, 16), (0, 0)] {
        let e = engine_ckpt(&lm, 256, 4, ckpts, 0);
        for round in 0..2 {
            let (tx, rx) = channel();
            e.submit(request(p.clone(), 2, tx)).unwrap();
            let (tokens, cached) = collect(rx, 2);
            assert_eq!(tokens, [want.clone(), want.clone()]);
            assert_eq!(cached, if round == 0 { 0 } else { cached_again });
        }
    }
}

/// Runs one request of `max_tokens` greedy tokens; its tokens and cached prompt tokens.
fn run_one(e: &EngineHandle, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, usize) {
    let (tx, rx) = channel();
    let mut req = request(prompt.to_vec(), 1, tx);
    req.params = greedy(max_tokens);
    e.submit(req).unwrap();
    let (mut tokens, cached) = collect(rx, 1);
    (tokens.remove(0), cached)
}

/// A two-turn chat: the second turn's prompt is the first's prompt, its answer and three
/// new tokens (47). The first turn left checkpoints at its prompt's last block boundary (16)
/// and at the last one it generated to (20 + 23 computed: 32), so the second turn reports 32
/// tokens cached, computes 15, and gives a cold run's tokens.
#[test]
fn a_follow_up_turn_starts_from_the_first_turns_state() {
    let lm = model();
    let p: Vec<u32> = (0..20u32).map(|k| 3 + (k * 31 + k * k) % 120).collect();
    let e = engine(&lm, 256, 4);
    let (first, cached) = run_one(&e, &p, 24);
    assert_eq!(cached, 0);
    assert_eq!(first, alone_n(&lm, &p, 24));
    let mut turn = p.clone();
    turn.extend_from_slice(&first);
    turn.extend_from_slice(&[7, 8, 9]);
    let (second, cached) = run_one(&e, &turn, 16);
    assert_eq!(
        cached, 32,
        "the first turn's prompt and answer up to a block boundary"
    );
    assert_eq!(second, alone_n(&lm, &turn, 16));
    let cold = engine_ckpt(&lm, 256, 4, 0, 0);
    assert_eq!(run_one(&cold, &turn, 16), (second, 0));
}

/// Prompts sharing a 40-token system prompt. Without a checkpoint interval the first leaves
/// a checkpoint at its own last block boundary (48) only; the second finds the shared blocks
/// (0..32) cached without a state, computes them and leaves a checkpoint where the prompts
/// part ways; the third starts there. With a 16-position interval the second starts at 32
/// already. Every one gives a cold run's tokens.
#[test]
fn a_shared_system_prompt_is_cached() {
    let lm = model();
    let sys: Vec<u32> = (0..40u32).map(|k| 3 + (k * 17 + k * k * 3) % 120).collect();
    let user = |salt: u32| -> Vec<u32> {
        let mut p = sys.clone();
        p.extend((0..10).map(|k| 5 + (salt * 13 + k * 7) % 110));
        p
    };
    let ps = [user(1), user(2), user(3)];
    let want = alone(&lm, &ps);
    for (interval, cached) in [(0, [0, 0, 32]), (16, [0, 32, 32])] {
        let e = engine_ckpt(&lm, 256, 4, 16, interval);
        for (i, p) in ps.iter().enumerate() {
            let (got, c) = run_one(&e, p, 24);
            assert_eq!(c, cached[i], "request {i}, interval {interval}");
            assert_eq!(got, want[i], "request {i}, interval {interval}");
        }
    }
}

/// Memory pressure: two checkpoints for many prompts, and a pool of 10 blocks that evicts
/// cached blocks (and the checkpoints keyed by them). A repeated prompt whose checkpoint was
/// evicted is computed from the start; every answer is a cold run's.
#[test]
fn evicted_checkpoints_and_blocks_change_nothing() {
    let lm = model();
    let ps = prompts(10);
    let want = alone(&lm, &ps);
    let e = engine_ckpt(&lm, 10, 2, 2, 16);
    let mut hits = 0;
    for round in 0..2 {
        for (i, p) in ps.iter().enumerate() {
            let (got, cached) = run_one(&e, p, 24);
            assert_eq!(got, want[i], "request {i}, round {round}");
            hits += usize::from(cached > 0);
        }
    }
    // The last prompt's checkpoints survive; the first ones' were evicted.
    let (got, cached) = run_one(&e, &ps[9], 24);
    assert_eq!(got, want[9]);
    assert!(cached > 0, "the most recent prompt is still cached");
    let (got, cached) = run_one(&e, &ps[2], 24);
    assert_eq!(got, want[2]);
    assert_eq!(cached, 0, "an early prompt's checkpoint was evicted");
    assert!(hits < 2 * ps.len() - 2, "pressure evicted some checkpoints");
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
/// are what is left after `max_running` states (and, with checkpoints, after those).
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
    // With checkpoints: a quarter of what the running states leave, the blocks the rest.
    let plan = EngineConfig::memory_plan(&lm, bytes, 8);
    assert_eq!(plan.state_checkpoints, 64 * block / 4 / state);
    assert!(plan.state_checkpoints > 0);
    assert_eq!(
        plan.kv_blocks,
        (64 * block - plan.state_checkpoints * state) / block
    );
    // At most two per running sequence.
    assert_eq!(
        EngineConfig::memory_plan(&lm, 100 * state, 1).state_checkpoints,
        2
    );
}

/// A memory estimate sized by the engine's plan counts the blocks it buys and a recurrent
/// state per running sequence and per checkpoint.
#[test]
fn memory_estimate_of_a_hybrid_models_plan() {
    use mica_models::{EstimateParams, KvCache, MemoryEstimate};
    let lm = model();
    let cfg = &lm.model.config;
    let (state, block) = (
        KvCache::state_bytes_per_seq(cfg),
        KvCache::bytes_per_block(cfg),
    );
    let plan = EngineConfig::memory_plan(&lm, 64 * block + 8 * state, 8);
    let est = MemoryEstimate::new(
        &lm.model,
        &EstimateParams {
            repack: false,
            kv: plan.kv_sizing(8),
            n_ctx: 256,
            batch_tokens: 64,
            n_outputs: 8,
            runtime: 0,
        },
    );
    assert_eq!(est.kv_cache, plan.kv_blocks * block);
    assert_eq!(est.recurrent_state, (8 + plan.state_checkpoints) * state);
    // The plan spends what it was given, up to less than one block.
    let spent = est.kv_cache + est.recurrent_state;
    assert!(spent <= 64 * block + 8 * state && spent + block > 64 * block + 8 * state);
}

/// The second turn of a chat with and without state checkpoints: its time to first token
/// (prompt processing) and its cached tokens, printed. A measurement, not a check of speed:
/// run by hand, on the fixture or on the model at `MICA_HYBRID_TIMING_GGUF` (e.g. random
/// weights with Qwen3.5-0.8B's shapes), with `MICA_HYBRID_TIMING_SHAPE=PROMPT,ANSWER,NEW`
/// token counts (default 20,24,3: under attention's tiled-path threshold, so the answer's
/// blocks are shared too; at 64 tokens or more a prompt is computed on the tiled path and
/// shares only the first turn's prompt blocks).
#[test]
#[ignore = "a measurement: run by hand with --ignored --nocapture"]
fn second_turn_timing() {
    use std::time::Instant;
    let lm = match std::env::var_os("MICA_HYBRID_TIMING_GGUF") {
        Some(p) => Arc::new(LoadedModel::open(std::path::Path::new(&p)).unwrap()),
        None => model(),
    };
    let shape: Vec<usize> = std::env::var("MICA_HYBRID_TIMING_SHAPE")
        .unwrap_or_else(|_| "20,24,3".into())
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let (np, na, nn) = (shape[0], shape[1], shape[2]);
    let vocab = lm.model.config.n_vocab as u32;
    let p: Vec<u32> = (0..np as u32)
        .map(|k| 3 + (k * 31 + k * k) % (vocab - 3))
        .collect();
    let state = mica_models::KvCache::state_bytes_per_seq(&lm.model.config);
    eprintln!("recurrent state (one checkpoint): {state} bytes");
    for ckpts in [16, 0] {
        let cfg = EngineConfig {
            n_threads: 2,
            n_ctx: 4096,
            kv_blocks: 512,
            scheduler: SchedulerConfig {
                max_running: 4,
                max_batch_tokens: 512,
                ..SchedulerConfig::default()
            },
            max_waiting_per_lane: 64,
            prefix_caching: true,
            max_n: 1,
            abandon_every: 0,
            state_checkpoints: ckpts,
            state_checkpoint_interval: 0,
        };
        let e = EngineHandle::start(lm.clone(), cfg).unwrap();
        let (first, _) = run_one(&e, &p, na);
        let mut turn = p.clone();
        turn.extend_from_slice(&first);
        turn.extend((0..nn as u32).map(|k| 5 + k % (vocab - 5)));
        let t = Instant::now();
        let (second, cached) = run_one(&e, &turn, 1);
        let ttft = t.elapsed();
        eprintln!(
            "{ckpts} checkpoints: second turn of {} tokens, {cached} cached, first token in \
             {:.1} ms (token {second:?})",
            turn.len(),
            ttft.as_secs_f64() * 1e3
        );
    }
}

/// A sink whose client goes away after `left` tokens.
struct HangUp(Sender<Event>, usize);
impl EventSink for HangUp {
    fn send(&mut self, ev: Event) -> bool {
        if matches!(ev, Event::Token { .. }) {
            if self.1 == 0 {
                return false;
            }
            self.1 -= 1;
        }
        self.0.send(ev).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.1 == 0
    }
}

/// Requests cancelled part-way (their clients gone), with two checkpoints to go round: a
/// cancelled request keeps the checkpoint its prompt completed (a repeat starts from it),
/// and what it reserved or pinned comes back, so later prompts still checkpoint; every
/// answer is a cold run's.
#[test]
fn cancelled_requests_give_their_checkpoints_back() {
    let lm = model();
    let ps = prompts(6);
    let want = alone(&lm, &ps);
    let e = engine_ckpt(&lm, 64, 4, 2, 0);
    for (i, p) in ps.iter().enumerate() {
        let (tx, rx) = channel();
        let mut req = request(p.clone(), 1, tx.clone());
        req.sink = Box::new(HangUp(tx, 2 + i));
        e.submit(req).unwrap();
        let got: Vec<u32> = rx
            .iter()
            .filter_map(|ev| match ev {
                Event::Token { token, .. } => Some(token),
                _ => None,
            })
            .collect();
        assert_eq!(
            got[..],
            want[i][..2 + i],
            "request {i} before it was cancelled"
        );
    }
    let p = &ps[4];
    assert_eq!(p.len(), 29);
    assert_eq!(run_one(&e, p, 24), (want[4].clone(), 16));
    let q = &ps[1];
    assert_eq!(q.len(), 40);
    assert_eq!(run_one(&e, q, 24), (want[1].clone(), 0));
    assert_eq!(run_one(&e, q, 24), (want[1].clone(), 32));
    assert_eq!(
        run_one(&e, p, 24),
        (want[4].clone(), 0),
        "evicted by q's two"
    );
    let m = e.metrics();
    assert_eq!(m.state_checkpoints_total.load(Relaxed), 2);
    assert_eq!(m.state_checkpoints_cached.load(Relaxed), 2);
}

/// A checkpoint interval must fall on block boundaries.
#[test]
fn a_checkpoint_interval_off_the_blocks_is_refused() {
    let lm = model();
    let cfg = EngineConfig {
        n_threads: 1,
        n_ctx: 256,
        kv_blocks: 64,
        scheduler: SchedulerConfig::default(),
        max_waiting_per_lane: 4,
        prefix_caching: true,
        max_n: 1,
        abandon_every: 0,
        state_checkpoints: 4,
        state_checkpoint_interval: 24,
    };
    let err = EngineHandle::start(lm, cfg).err().expect("refused");
    assert!(
        matches!(
            err,
            mica_engine::EngineError::Config(mica_engine::ConfigError::CheckpointInterval {
                interval: 24,
                block_size: 16
            })
        ),
        "{err}"
    );
}
