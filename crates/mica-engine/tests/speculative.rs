//! Speculative decoding changes no greedy token: on every llama.cpp golden case of the three
//! test models, generation with an n-gram proposer and with a draft model (the model's own
//! first layers: an early-exit copy with its vocabulary, whose drafts are often wrong, so
//! rejection and rollback are exercised) gives exactly plain greedy decoding's tokens; and in
//! the serving engine, concurrent requests with proposers give what each gives alone.

mod common;

use common::*;
use mica_engine::spec::{
    Adaptive, AdaptiveConfig, DraftModelConfig, DraftModelProposer, NgramConfig, NgramProposer,
    SpecConfig, check_vocab,
};
use mica_engine::{
    EngineConfig, EngineHandle, Event, EventSink, GenerateParams, Hooks, Lane, Proposer, Request,
    SamplingParams, SchedulerConfig, Session, SpecError,
};
use mica_models::LoadedModel;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

/// Asks the wrapped proposer for at most `cap` tokens.
struct Capped<P>(P, usize);

impl<P: Proposer> Proposer for Capped<P> {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        self.0.propose(history, max.min(self.1))
    }
    fn draft(&mut self, h: &[u32], max: usize, s: &SamplingParams) -> mica_engine::Draft {
        self.0.draft(h, max.min(self.1), s)
    }
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    }
}

/// The first `n` layers of the model at `path`, as a draft model.
fn early_exit(path: &std::path::Path, n: usize) -> Arc<LoadedModel> {
    let mut lm = LoadedModel::open(path).unwrap();
    let n = n.min(lm.model.layers.len());
    assert!(lm.model.truncate_layers(n));
    Arc::new(lm)
}

fn golden_prompts(model: &str) -> Vec<(String, Vec<u32>, usize)> {
    let fx = fixture(&format!("golden/{model}.json"));
    fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                ids(&c["prompt_ids"]),
                ids(&c["output_ids"]).len(),
            )
        })
        .collect()
}

fn check_golden(model: &str, adaptive: bool) {
    let path = model_path(model);
    let lm = LoadedModel::open(&path).unwrap();
    let n_layer = lm.model.layers.len();
    let draft = early_exit(&path, n_layer / 2);
    let mut plain = Session::new(&lm, 1024, threads());
    let (mut drafted, mut accepted) = (0, 0);
    for (id, prompt, n) in golden_prompts(model) {
        plain.reset();
        let want = plain.generate(&prompt, &greedy(n), |_| true).unwrap();
        let mut proposers: Vec<(&str, Box<dyn Proposer>)> = vec![(
            "ngram",
            Box::new(NgramProposer::new(NgramConfig::default())),
        )];
        // The adaptive wrapper changes how many tokens are drafted, not how they are
        // verified: checked on one model (the smallest) to keep the test's time down.
        if adaptive {
            proposers.push((
                "ngram-adaptive",
                Box::new(Adaptive::new(
                    NgramProposer::new(NgramConfig::default()),
                    AdaptiveConfig::default(),
                )),
            ));
        }
        proposers.push((
            "draft",
            Box::new(Capped(
                DraftModelProposer::new(
                    draft.clone(),
                    &lm,
                    plain.shared_pool(),
                    DraftModelConfig {
                        n_ctx: 1024,
                        p_min: 0.0,
                        sample: true,
                    },
                )
                .unwrap(),
                5,
            )),
        ));
        for (name, mut p) in proposers {
            let mut s = Session::new(&lm, 1024, threads());
            let hooks = Hooks {
                processors: Vec::new(),
                proposer: Some(p.as_mut()),
            };
            let g = s
                .generate_with(&prompt, &greedy(n), hooks, |_| true)
                .unwrap();
            assert_eq!(g.output_ids, want.output_ids, "{model}/{id}: {name}");
            assert_eq!(g.text, want.text, "{model}/{id}: {name}");
            let t = g.timings;
            println!(
                "{model}/{id} {name}: {} tokens in {} passes, {}/{} drafted tokens accepted",
                t.gen_tokens, t.gen_passes, t.accepted_draft_tokens, t.draft_tokens
            );
            if name == "draft" {
                drafted += t.draft_tokens;
                accepted += t.accepted_draft_tokens;
            }
        }
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "{model}: the early-exit draft is partly right ({accepted} of {drafted})"
    );
}

#[test]
fn smollm2_speculative_greedy_is_plain_greedy() {
    check_golden(SMOLLM, true);
}

#[test]
fn qwen2_speculative_greedy_is_plain_greedy() {
    check_golden(QWEN, false);
}

#[test]
fn gemma3_speculative_greedy_is_plain_greedy() {
    check_golden(GEMMA, false);
}

/// A sampled request with a draft model: greedy drafts (point masses) give plain
/// sampling's very tokens for the seed; sampled drafts give the same tokens run after run.
#[test]
fn sampled_requests_with_a_draft_model_are_deterministic() {
    let path = model_path(SMOLLM);
    let lm = LoadedModel::open(&path).unwrap();
    let draft = early_exit(&path, 20);
    let prompt = lm
        .tokenizer
        .encode("Once upon a time, in a small village,", true, true)
        .unwrap();
    let params = GenerateParams {
        max_tokens: 40,
        ignore_eos: true,
        sampling: SamplingParams {
            temperature: 0.7,
            seed: 42,
            ..Default::default()
        },
        ..Default::default()
    };
    let plain = Session::new(&lm, 512, threads())
        .generate(&prompt, &params, |_| true)
        .unwrap();
    let run = |sample: bool| {
        let mut s = Session::new(&lm, 512, threads());
        let mut p = DraftModelProposer::new(
            draft.clone(),
            &lm,
            s.shared_pool(),
            DraftModelConfig {
                n_ctx: 512,
                p_min: 0.0,
                sample,
            },
        )
        .unwrap();
        let hooks = Hooks {
            processors: Vec::new(),
            proposer: Some(&mut p),
        };
        s.generate_with(&prompt, &params, hooks, |_| true).unwrap()
    };
    let greedy_drafts = run(false);
    assert_eq!(greedy_drafts.output_ids, plain.output_ids);
    assert!(greedy_drafts.timings.accepted_draft_tokens > 0);
    let (a, b) = (run(true), run(true));
    assert_eq!(a.output_ids, b.output_ids);
    assert!(a.timings.accepted_draft_tokens > 0, "{:?}", a.timings);
}

/// A draft model with another vocabulary is refused with the token that differs.
#[test]
fn an_incompatible_draft_model_is_refused() {
    let target = LoadedModel::open(model_path(QWEN)).unwrap();
    let other = LoadedModel::open(model_path(SMOLLM)).unwrap();
    let err = check_vocab(&target.tokenizer, &other.tokenizer).unwrap_err();
    assert!(
        matches!(err, SpecError::VocabSize { .. }),
        "{err}: Qwen's 151k tokens against SmolLM's 49k"
    );
    assert!(err.to_string().contains("vocabulary"), "{err}");
    let pool = Arc::new(mica_kernels::ThreadPool::new(1));
    assert!(
        DraftModelProposer::new(Arc::new(other), &target, pool, DraftModelConfig::default())
            .is_err()
    );
}

struct ChanSink(Sender<Event>);

impl EventSink for ChanSink {
    fn send(&mut self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// The tokens of a request, and its usage.
fn collect(rx: Receiver<Event>) -> (Vec<u32>, mica_engine::Usage) {
    let mut tokens = Vec::new();
    loop {
        match rx.recv().expect("the engine ended the request") {
            Event::Token { token, .. } => tokens.push(token),
            Event::Done { .. } => {}
            Event::Finished { usage } => return (tokens, usage),
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

/// Sixteen concurrent requests, with n-gram or draft-model proposers (adaptive, as the
/// front ends make them) or none, greedy or sampled: each gets exactly the tokens it gets
/// alone in a plain session; drafts were accepted and counted per request.
#[test]
fn concurrent_speculative_requests_match_plain_ones() {
    let path = model_path(SMOLLM);
    let lm = Arc::new(LoadedModel::open(&path).unwrap());
    let draft = early_exit(&path, 24);
    let tok = &lm.tokenizer;
    let prompts: Vec<Vec<u32>> = (0..16)
        .map(|i| {
            let body = if i % 4 == 3 {
                format!("Item {i}. ").repeat(20 + 5 * i) + "Repeat the list:"
            } else {
                format!(
                    "Copy this line twice: the number {} follows {}.",
                    i * 7,
                    i + 3
                )
            };
            tok.encode(&body, true, true).unwrap()
        })
        .collect();
    let params = |i: usize| {
        let mut p = greedy(32);
        if i % 5 == 4 {
            p.sampling = SamplingParams {
                temperature: 0.8,
                seed: i as u64,
                ..Default::default()
            };
        }
        p
    };
    let mut alone = Vec::new();
    let mut session = Session::new(&*lm, 2048, 2);
    for (i, p) in prompts.iter().enumerate() {
        session.reset();
        alone.push(
            session
                .generate(p, &params(i), |_| true)
                .unwrap()
                .output_ids,
        );
    }

    let cfg = EngineConfig {
        n_threads: threads(),
        n_ctx: 2048,
        kv_blocks: 2048,
        scheduler: SchedulerConfig::default(),
        max_waiting_per_lane: 64,
        prefix_caching: true,
        max_n: 4,
        abandon_every: 0,
        state_checkpoints: 0,
        state_checkpoint_interval: 0,
    };
    let e = EngineHandle::start(lm.clone(), cfg).unwrap();
    let adaptive = SpecConfig::ngram(8);
    let rxs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            // Plain proposers (every draft verified) and the adaptive one the front ends use.
            let proposer: Option<Box<dyn Proposer>> = match i % 3 {
                0 => Some(Box::new(Capped(
                    NgramProposer::new(NgramConfig::default()),
                    8,
                ))),
                1 => Some(Box::new(Capped(
                    DraftModelProposer::new(
                        draft.clone(),
                        &lm,
                        e.pool(),
                        DraftModelConfig {
                            n_ctx: 2048,
                            p_min: 0.0,
                            sample: true,
                        },
                    )
                    .unwrap(),
                    4,
                ))),
                _ if i % 2 == 0 => adaptive.proposer(&lm, &e.pool()).unwrap(),
                _ => None,
            };
            let (tx, rx) = channel();
            e.submit(Request {
                prompt: p.clone(),
                params: params(i),
                lane: Lane::Interactive,
                n: 1,
                logprobs: None,
                sink: Box::new(ChanSink(tx)),
                processors: None,
                proposer,
                lora: None,
            })
            .unwrap();
            rx
        })
        .collect();
    let mut accepted = 0;
    for (i, rx) in rxs.into_iter().enumerate() {
        let (tokens, usage) = collect(rx);
        // Sampled requests with a sampling draft model follow the distribution, not the
        // plain draws; every other one is token for token.
        if !(i % 5 == 4 && i % 3 == 1) {
            assert_eq!(tokens, alone[i], "request {i} differs with speculation");
        }
        assert!(usage.accepted_draft_tokens <= usage.draft_tokens);
        accepted += usage.accepted_draft_tokens;
    }
    let m = e.metrics();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(count(&m.accepted_draft_tokens), accepted as u64);
    assert!(accepted > 0, "some drafts were accepted");
}
