//! Generation sessions on a real model: cached-prefix reuse gives the same tokens as a fresh
//! run while processing only the new tokens; seeds reproduce runs; stop strings and limits.

mod common;

use common::*;
use mica_engine::{FinishReason, GenerateParams, SamplingParams, Session};
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
