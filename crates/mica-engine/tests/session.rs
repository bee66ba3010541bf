//! Generation sessions on a real model: cached-prefix reuse gives the same tokens as a fresh
//! run while processing only the new tokens; seeds reproduce runs; stop strings and limits;
//! drafted tokens verified several per pass; logit-bias validation.

mod common;

use common::*;
use mica_engine::{
    EngineError, FinishReason, GenerateParams, Hooks, LogitsProcessor, Param, Proposer,
    SamplingParams, Session,
};
use mica_models::LoadedModel;

fn greedy(n: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    }
}

#[test]
fn follow_up_reuses_the_cache_and_matches_a_fresh_run() {
    let lm = LoadedModel::open(model_path(SMOLLM)).unwrap();
    let p1 = lm
        .tokenizer
        .encode("The capital of France is", true, true)
        .unwrap();
    let mut s = Session::new(&lm, 512, threads());
    let g1 = s.generate(&p1, &greedy(8), |_| true).unwrap();
    assert_eq!(g1.timings.prompt_tokens, p1.len());

    // The next prompt extends the conversation: prompt + answer + new text.
    let mut p2 = p1.clone();
    p2.extend(&g1.output_ids);
    p2.extend(lm.tokenizer.encode(" And of Italy?", false, true).unwrap());
    let g2 = s.generate(&p2, &greedy(8), |_| true).unwrap();
    // The last generated token was never evaluated, so it and the new text are processed.
    assert_eq!(
        g2.timings.prompt_tokens,
        p2.len() - (p1.len() + g1.output_ids.len() - 1)
    );

    let mut fresh = Session::new(&lm, 512, threads());
    let g2_fresh = fresh.generate(&p2, &greedy(8), |_| true).unwrap();
    assert_eq!(g2.output_ids, g2_fresh.output_ids);
    assert_eq!(g2_fresh.timings.prompt_tokens, p2.len());

    // A prompt that diverges early re-processes from the divergence.
    let p3 = lm
        .tokenizer
        .encode("The capital of Spain is", true, true)
        .unwrap();
    let g3 = s.generate(&p3, &greedy(4), |_| true).unwrap();
    let common = p1.iter().zip(&p3).take_while(|(a, b)| a == b).count();
    assert_eq!(g3.timings.prompt_tokens, p3.len() - common);
    let g3_fresh = Session::new(&lm, 512, threads())
        .generate(&p3, &greedy(4), |_| true)
        .unwrap();
    assert_eq!(g3.output_ids, g3_fresh.output_ids);
}

#[test]
fn seeds_reproduce_sampling() {
    let lm = LoadedModel::open(model_path(SMOLLM)).unwrap();
    let p = lm.tokenizer.encode("Once upon a time", true, true).unwrap();
    let run = |seed| {
        let params = GenerateParams {
            max_tokens: 24,
            sampling: SamplingParams {
                temperature: 1.0,
                seed,
                ..Default::default()
            },
            ..Default::default()
        };
        Session::new(&lm, 256, threads())
            .generate(&p, &params, |_| true)
            .unwrap()
            .output_ids
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn stop_strings_limits_and_streaming() {
    let lm = LoadedModel::open(model_path(SMOLLM)).unwrap();
    let p = lm
        .tokenizer
        .encode("The capital of France is", true, true)
        .unwrap();
    let mut s = Session::new(&lm, 256, threads());
    // Greedy continues " Paris.\n\nThe United States ..." (llama.cpp's golden output).
    let mut streamed = String::new();
    let params = GenerateParams {
        stop: vec!["United".into()],
        ..greedy(40)
    };
    let g = s
        .generate(&p, &params, |t| {
            streamed.push_str(t);
            true
        })
        .unwrap();
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.text, " Paris.\n\nThe ");
    assert_eq!(streamed, g.text);

    let g = s.generate(&p, &greedy(3), |_| true).unwrap();
    assert_eq!(g.finish, FinishReason::Length);
    assert_eq!(g.output_ids.len(), 3);

    // The callback can cancel.
    let g = s.generate(&p, &greedy(20), |_| false).unwrap();
    assert_eq!(g.finish, FinishReason::Cancelled);
    assert_eq!(g.output_ids.len(), 1);

    // Generation stops when the context is full.
    let mut small = Session::new(&lm, p.len() + 4, threads());
    let g = small.generate(&p, &greedy(100), |_| true).unwrap();
    assert_eq!(g.finish, FinishReason::Context);
    assert!(g.output_ids.len() <= 5);
}

/// Proposes from a known continuation: the first `right` tokens of each draft are correct,
/// the rest (up to `lookahead`) wrong.
struct Drafts {
    prompt_len: usize,
    continuation: Vec<u32>,
    lookahead: usize,
    right: usize,
}

impl Proposer for Drafts {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let done = history.len() - self.prompt_len;
        (0..self.lookahead.min(max))
            .map(|i| match self.continuation.get(done + i) {
                Some(&t) if i < self.right => t,
                Some(&t) => t ^ 1,
                None => 0,
            })
            .collect()
    }
}

/// Checks that a stateful processor's accept/rollback calls keep it in step with the
/// history it is shown: its own record of accepted tokens always equals the history's tail.
struct Tracker {
    prompt_len: usize,
    accepted: Vec<u32>,
    rollbacks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl LogitsProcessor for Tracker {
    fn process(&mut self, history: &[u32], _logits: &mut [f32]) {
        assert_eq!(&history[self.prompt_len..], &self.accepted[..]);
    }
    fn accept(&mut self, token: u32) -> bool {
        self.accepted.push(token);
        true
    }
    fn rollback(&mut self, n: usize) {
        self.rollbacks
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        self.accepted.truncate(self.accepted.len() - n);
    }
}

/// Drafts verified several per forward pass give exactly greedy's tokens: all right (fewer
/// passes), all wrong, or partly right; a stateful processor sees every draft rolled back;
/// and the cache afterwards (rejected drafts truncated away) serves a follow-up prompt with
/// the tokens of a fresh run.
#[test]
fn drafted_tokens_give_greedy_output() {
    let lm = LoadedModel::open(model_path(SMOLLM)).unwrap();
    let p = lm
        .tokenizer
        .encode("The capital of France is", true, true)
        .unwrap();
    let params = GenerateParams {
        ignore_eos: true,
        ..greedy(30)
    };
    let mut s = Session::new(&lm, 512, threads());
    let plain = s.generate(&p, &params, |_| true).unwrap();
    assert_eq!(plain.timings.gen_passes, 29);
    for (lookahead, right) in [(4, 4), (5, 0), (6, 2), (3, 3)] {
        let mut drafts = Drafts {
            prompt_len: p.len(),
            continuation: plain.output_ids.clone(),
            lookahead,
            right,
        };
        let rollbacks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tracker = Tracker {
            prompt_len: p.len(),
            accepted: Vec::new(),
            rollbacks: rollbacks.clone(),
        };
        let hooks = Hooks {
            processors: vec![Box::new(tracker)],
            proposer: Some(&mut drafts),
        };
        let mut streamed = String::new();
        let mut fresh = Session::new(&lm, 512, threads());
        let g = fresh
            .generate_with(&p, &params, hooks, |t| {
                streamed.push_str(t);
                true
            })
            .unwrap();
        let case = format!("lookahead {lookahead}, right {right}");
        assert_eq!(g.output_ids, plain.output_ids, "{case}");
        assert_eq!(g.text, plain.text, "{case}");
        assert_eq!(streamed, g.text);
        let passes = g.timings.gen_passes;
        if right == 0 {
            assert_eq!(passes, plain.timings.gen_passes, "{case}");
        } else {
            // `right` drafted tokens accepted per pass, plus the model's own.
            assert!(
                passes <= 29_usize.div_ceil(right + 1) + 1,
                "{case}: {passes}"
            );
        }
        assert!(rollbacks.load(std::sync::atomic::Ordering::Relaxed) > 0);
        assert_eq!(fresh.cached().len(), p.len() + g.output_ids.len() - 1);

        // The cache holds exactly the prompt and the accepted tokens: a follow-up reuses it.
        let mut p2 = p.clone();
        p2.extend(&g.output_ids);
        p2.extend(lm.tokenizer.encode(" And of Italy?", false, true).unwrap());
        let follow = fresh.generate(&p2, &greedy(8), |_| true).unwrap();
        let again = Session::new(&lm, 512, threads())
            .generate(&p2, &greedy(8), |_| true)
            .unwrap();
        assert_eq!(follow.output_ids, again.output_ids, "{case}");
    }

    // A small context: drafts never run past it, and the finish is the same.
    let mut small = Session::new(&lm, p.len() + 6, threads());
    let plain_small = small.generate(&p, &greedy(100), |_| true).unwrap();
    let mut drafts = Drafts {
        prompt_len: p.len(),
        continuation: plain_small.output_ids.clone(),
        lookahead: 8,
        right: 8,
    };
    let hooks = Hooks {
        processors: Vec::new(),
        proposer: Some(&mut drafts),
    };
    let g = Session::new(&lm, p.len() + 6, threads())
        .generate_with(&p, &greedy(100), hooks, |_| true)
        .unwrap();
    assert_eq!(g.output_ids, plain_small.output_ids);
    assert_eq!(g.finish, plain_small.finish);
}

/// Logit bias validation names the parameter.
#[test]
fn logit_bias_is_validated() {
    let lm = LoadedModel::open(model_path(SMOLLM)).unwrap();
    let mut s = Session::new(&lm, 64, threads());
    let n_vocab = lm.model.config.n_vocab as u32;
    for bias in [vec![(n_vocab, 1.0)], vec![(5, f32::INFINITY)]] {
        let params = GenerateParams {
            logit_bias: bias,
            ..greedy(2)
        };
        match s.generate(&[1, 2], &params, |_| true) {
            Err(EngineError::Params(e)) => assert_eq!(e.param(), Param::LogitBias, "{e}"),
            other => panic!("expected a parameter error, got {other:?}"),
        }
    }
}
