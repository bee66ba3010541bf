//! The serving engine on a real model: batch invariance against one-at-a-time generation,
//! prefix-cache reuse, cancellation freeing blocks, several completions of one prompt,
//! abandoned steps (forced, or for an arriving interactive request) changing no result,
//! multi-token steps verifying drafted tokens, logits processors, parameter errors.

mod common;

use mica_engine::{
    EngineConfig, EngineHandle, Event, EventSink, FinishReason, GenerateParams, Hooks, Lane,
    LogitsProcessor, Param, ProcessorFactory, Proposer, Request, SamplingParams, SchedulerConfig,
    Session, SubmitError,
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
        state_checkpoints: 0,
        state_checkpoint_interval: 0,
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
        lora: None,
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
    let mut session = Session::new(&*lm, 2048, 2);
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
        lora: None,
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

/// Proposes the next tokens of a known continuation of `prompt` (`lookahead` at a time):
/// every draft is right until the continuation runs out.
struct Oracle {
    prompt_len: usize,
    continuation: Vec<u32>,
    lookahead: usize,
}

impl Proposer for Oracle {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let done = history.len() - self.prompt_len;
        let end = (done + self.lookahead.min(max)).min(self.continuation.len());
        self.continuation[done.min(end)..end].to_vec()
    }
}

/// Proposes `lookahead` pseudo-random tokens, except that every third draft starts with
/// `right` correct tokens of the continuation (so some drafts are partly accepted).
struct Noisy {
    oracle: Oracle,
    n_vocab: u32,
    state: u64,
    calls: usize,
    right: usize,
}

impl Proposer for Noisy {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        self.calls += 1;
        let mut d = if self.calls.is_multiple_of(3) {
            let mut good = self.oracle.propose(history, max);
            good.truncate(self.right);
            good
        } else {
            Vec::new()
        };
        while d.len() < self.oracle.lookahead.min(max) {
            self.state = self
                .state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            d.push((self.state >> 33) as u32 % self.n_vocab);
        }
        d
    }
}

fn submit_with(
    e: &EngineHandle,
    prompt: Vec<u32>,
    params: GenerateParams,
    proposer: Option<Box<dyn Proposer>>,
    processors: Option<ProcessorFactory>,
) -> Receiver<Event> {
    let (tx, rx) = channel();
    e.submit(Request {
        prompt,
        params,
        lane: Lane::Interactive,
        n: 1,
        logprobs: Some(2),
        sink: Box::new(ChanSink(tx)),
        processors,
        proposer,
        lora: None,
    })
    .unwrap();
    rx
}

fn short_prompts(lm: &LoadedModel) -> Vec<Vec<u32>> {
    [
        "The capital of France is",
        "Write a list of three colors:",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
    ]
    .iter()
    .map(|t| lm.tokenizer.encode(t, true, true).unwrap())
    .collect()
}

fn long_greedy(n: usize) -> GenerateParams {
    GenerateParams {
        ignore_eos: true,
        ..greedy(n)
    }
}

/// A proposer that knows the greedy continuation: the tokens are exactly plain greedy's, in
/// far fewer steps (several drafted tokens accepted per step).
#[test]
fn right_drafts_give_greedy_tokens_in_fewer_steps() {
    let lm = model();
    let prompt = short_prompts(&lm).swap_remove(0);
    let n_gen = 24;
    let plain = engine(&lm, 256);
    let want = collect(submit(&plain, prompt.clone(), long_greedy(n_gen), 1), 1);
    let plain_steps = count(&plain.metrics().steps);
    assert_eq!(want.tokens[0].len(), n_gen);

    let e = engine(&lm, 256);
    let oracle = Oracle {
        prompt_len: prompt.len(),
        continuation: want.tokens[0].clone(),
        lookahead: 4,
    };
    let rx = submit_with(&e, prompt, long_greedy(n_gen), Some(Box::new(oracle)), None);
    let out = collect(rx, 1);
    assert_eq!(out.tokens, want.tokens);
    assert_eq!(out.text, want.text);
    assert_eq!(out.finish, want.finish);
    let steps = count(&e.metrics().steps);
    // 1 prompt step, then 5 tokens a step.
    assert!(2 * steps < plain_steps, "{steps} steps vs {plain_steps}");
    let m = e.metrics();
    assert!(count(&m.accepted_draft_tokens) > 0);
    assert_eq!(count(&m.accepted_draft_tokens), count(&m.draft_tokens));
    assert_eq!(count(&m.generated_tokens), n_gen as u64);
}

/// Wrong, partly right and right drafts, a sampled request with a proposer (which takes
/// none) and plain requests in one batch: every output is what it is alone, drafts were
/// rejected (rolled back) and accepted, and every block is free at the end. Then the same
/// with every second step abandoned.
#[test]
fn wrong_drafts_are_rolled_back_in_a_mixed_batch() {
    let lm = model();
    let prompts = short_prompts(&lm);
    let n_gen = 20;
    let sampled = GenerateParams {
        sampling: SamplingParams {
            temperature: 0.9,
            seed: 11,
            ..Default::default()
        },
        ..long_greedy(n_gen)
    };
    let params = |i: usize| {
        if i == 3 {
            sampled.clone()
        } else {
            long_greedy(n_gen)
        }
    };
    let solo = engine(&lm, 512);
    let want: Vec<Out> = (0..prompts.len())
        .map(|i| collect(submit(&solo, prompts[i].clone(), params(i), 1), 1))
        .collect();
    let n_vocab = lm.model.config.n_vocab as u32;
    let oracle = |i: usize, lookahead| Oracle {
        prompt_len: prompts[i].len(),
        continuation: want[i].tokens[0].clone(),
        lookahead,
    };
    for abandon_every in [0, 2] {
        let e = engine_abandoning(&lm, 512, abandon_every);
        let proposers: Vec<Option<Box<dyn Proposer>>> = vec![
            Some(Box::new(Noisy {
                oracle: oracle(0, 6),
                n_vocab,
                state: 1,
                calls: 0,
                right: 0,
            })),
            Some(Box::new(Noisy {
                oracle: oracle(1, 5),
                n_vocab,
                state: 2,
                calls: 0,
                right: 3,
            })),
            Some(Box::new(oracle(2, 3))),
            Some(Box::new(oracle(3, 3))),
        ];
        let rxs: Vec<_> = proposers
            .into_iter()
            .enumerate()
            .map(|(i, p)| submit_with(&e, prompts[i].clone(), params(i), p, None))
            .chain([submit(&e, prompts[0].clone(), long_greedy(n_gen), 1)])
            .collect();
        for (i, rx) in rxs.into_iter().enumerate() {
            let out = collect(rx, 1);
            let w = &want[i % prompts.len()];
            assert_eq!(
                out.tokens, w.tokens,
                "request {i}, abandon_every {abandon_every}"
            );
            assert_eq!(out.text, w.text, "request {i}");
        }
        let m = e.metrics();
        let (drafted, accepted) = (count(&m.draft_tokens), count(&m.accepted_draft_tokens));
        assert!(
            accepted > 0 && accepted < drafted,
            "{accepted} of {drafted}"
        );
        if abandon_every > 0 {
            assert!(count(&m.abandoned_steps) > 0);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(count(&m.kv_blocks_used), 0, "every block released");
    }
}

/// Bans whatever token comes first in the logits it is shown, after `skip` positions.
struct BanTop {
    skip: usize,
    seen: usize,
    banned: Arc<std::sync::Mutex<Vec<u32>>>,
}

impl LogitsProcessor for BanTop {
    fn process(&mut self, _history: &[u32], logits: &mut [f32]) {
        self.seen += 1;
        if self.seen > self.skip {
            let top = mica_engine::sampler::argmax(logits);
            logits[top as usize] = f32::NEG_INFINITY;
            self.banned.lock().unwrap().push(top);
        }
    }
}

/// Logit bias and a custom processor act the same in the engine as in a `Session`, and
/// change the greedy tokens.
#[test]
fn processors_and_logit_bias_match_a_session() {
    let lm = model();
    let prompt = short_prompts(&lm).swap_remove(0);
    let n_gen = 12;
    let boost = lm.tokenizer.encode(" banana", false, true).unwrap()[0];
    let biased = GenerateParams {
        logit_bias: vec![(boost, 30.0)],
        ..long_greedy(n_gen)
    };
    let mut s = Session::new(&*lm, 512, 2);
    let plain = s.generate(&prompt, &long_greedy(n_gen), |_| true).unwrap();
    let g = s.generate(&prompt, &biased, |_| true).unwrap();
    assert_eq!(g.output_ids, vec![boost; n_gen]);
    let banned = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ban = |banned: &Arc<std::sync::Mutex<Vec<u32>>>| BanTop {
        skip: 2,
        seen: 0,
        banned: banned.clone(),
    };
    let hooks = Hooks {
        processors: vec![Box::new(ban(&banned))],
        proposer: None,
    };
    let g_ban = s
        .generate_with(&prompt, &long_greedy(n_gen), hooks, |_| true)
        .unwrap();
    assert_eq!(g_ban.output_ids[..2], plain.output_ids[..2]);
    assert_ne!(g_ban.output_ids, plain.output_ids);
    for (t, b) in g_ban.output_ids[2..]
        .iter()
        .zip(banned.lock().unwrap().iter())
    {
        assert_ne!(t, b, "a banned token was chosen");
    }

    let e = engine(&lm, 256);
    let out = collect(submit(&e, prompt.clone(), biased, 1), 1);
    assert_eq!(out.tokens[0], g.output_ids);
    let engine_banned = Arc::new(std::sync::Mutex::new(Vec::new()));
    let eb = engine_banned.clone();
    let factory: ProcessorFactory = Box::new(move |_| {
        vec![Box::new(BanTop {
            skip: 2,
            seen: 0,
            banned: eb.clone(),
        }) as Box<dyn LogitsProcessor>]
    });
    let rx = submit_with(&e, prompt, long_greedy(n_gen), None, Some(factory));
    assert_eq!(collect(rx, 1).tokens[0], g_ban.output_ids);
}

/// Invalid parameters are refused at submission, naming the parameter.
#[test]
fn invalid_parameters_name_the_parameter() {
    let lm = model();
    let e = engine(&lm, 64);
    let n_vocab = lm.model.config.n_vocab;
    let (tx, _rx) = channel();
    let try_submit = |params: GenerateParams, prompt: Vec<u32>, n: usize| {
        e.submit(Request {
            prompt,
            params,
            lane: Lane::Interactive,
            n,
            logprobs: None,
            sink: Box::new(ChanSink(tx.clone())),
            processors: None,
            proposer: None,
            lora: None,
        })
        .unwrap_err()
    };
    let cases = [
        (
            GenerateParams {
                logit_bias: vec![(n_vocab as u32, 1.0)],
                ..greedy(4)
            },
            vec![1],
            1,
            Param::LogitBias,
        ),
        (
            GenerateParams {
                logit_bias: vec![(3, f32::NAN)],
                ..greedy(4)
            },
            vec![1],
            1,
            Param::LogitBias,
        ),
        (
            GenerateParams {
                sampling: SamplingParams {
                    min_p: 2.0,
                    ..SamplingParams::greedy()
                },
                ..greedy(4)
            },
            vec![1],
            1,
            Param::MinP,
        ),
        (greedy(4), vec![], 1, Param::Prompt),
        (greedy(4), vec![1], 0, Param::N),
    ];
    for (params, prompt, n, param) in cases {
        match try_submit(params, prompt, n) {
            SubmitError::Params(p) => assert_eq!(p.param(), param, "{p}"),
            other => panic!("expected a parameter error, got {other}"),
        }
    }
}

/// A prefix cached by one prompt serves another only where it was computed with the
/// arithmetic the other prompt gets alone: after a long prompt (tiled attention) and a
/// duplicate of it, a short prompt sharing their first blocks (vector attention) gives a
/// plain session's tokens, and so do the long prompt after the short one and the long
/// prompt again (most of it from the cache, the rest on the tiled path all the same).
#[test]
fn a_cached_prefix_never_changes_the_tokens() {
    let lm = model();
    let chat = |q: &str| {
        let text = lm
            .template
            .render(&[mica_models::chat::ChatMessage::new("user", q)], true)
            .unwrap();
        lm.tokenizer.encode(&text, true, true).unwrap()
    };
    let copy = chat(
        "Repeat this list exactly: alpha, beta, gamma, delta, epsilon, zeta, eta, theta, \
         iota, kappa, lambda, mu, nu, xi, omicron, pi.",
    );
    // A near-tie after "la femme" (0.03 nats) that a tiled-path prefix flips.
    let capital = chat("What is the capital of France?");
    let common = copy
        .iter()
        .zip(&capital)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(copy.len() >= 64 && capital.len() < 64 && common >= 16);
    let n_gen = 40;
    let mut session = Session::new(&*lm, 2048, 2);
    let mut alone = |p: &[u32]| {
        session.reset();
        session
            .generate(p, &greedy(n_gen), |_| true)
            .unwrap()
            .output_ids
    };
    let (want_copy, want_capital) = (alone(&copy), alone(&capital));

    let e = engine(&lm, 512);
    let a = submit(&e, copy.clone(), greedy(n_gen), 1);
    let b = submit(&e, copy.clone(), greedy(n_gen), 1);
    assert_eq!(collect(a, 1).tokens[0], want_copy);
    assert_eq!(collect(b, 1).tokens[0], want_copy);
    let out = collect(submit(&e, capital.clone(), greedy(n_gen), 1), 1);
    assert_eq!(out.tokens[0], want_capital, "after the long prompt");
    // The long prompt again: its last 8 tokens, after a hit of 64, take the tiled path
    // as they do alone.
    let out = collect(submit(&e, copy.clone(), greedy(n_gen), 1), 1);
    assert_eq!(out.usage.unwrap().cached_tokens, 64);
    assert_eq!(out.tokens[0], want_copy, "the long prompt from the cache");

    let e = engine(&lm, 512);
    let first = collect(submit(&e, capital.clone(), greedy(n_gen), 1), 1);
    assert_eq!(first.tokens[0], want_capital);
    let again = collect(submit(&e, capital.clone(), greedy(n_gen), 1), 1);
    assert_eq!(again.tokens[0], want_capital);
    assert_eq!(
        again.usage.unwrap().cached_tokens,
        32,
        "its own blocks match"
    );
    let out = collect(submit(&e, copy.clone(), greedy(n_gen), 1), 1);
    assert_eq!(out.tokens[0], want_copy, "after the short prompt");
}

/// An attention-only model's memory plan is all blocks: no recurrent states, no checkpoints
/// (and an engine asked for checkpoints reports none).
#[test]
fn an_attention_model_plans_no_state_checkpoints() {
    let lm = model();
    let bytes = 64 << 20;
    let plan = EngineConfig::memory_plan(&lm, bytes, 8);
    assert_eq!(plan.state_checkpoints, 0);
    assert_eq!(
        plan.kv_blocks,
        EngineConfig::blocks_for_memory(&lm, bytes, 8)
    );
    let cfg = EngineConfig {
        n_threads: 1,
        n_ctx: 256,
        kv_blocks: 64,
        scheduler: SchedulerConfig::default(),
        max_waiting_per_lane: 4,
        prefix_caching: true,
        max_n: 1,
        abandon_every: 0,
        state_checkpoints: 8,
        state_checkpoint_interval: 16,
    };
    let e = EngineHandle::start(lm.clone(), cfg).unwrap();
    assert_eq!(e.config().state_checkpoints, 0);
    assert!(e.config().prefix_caching);
}
