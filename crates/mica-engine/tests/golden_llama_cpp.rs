//! Agreement with llama.cpp on real models, case by case (fixtures/golden/*.json, copied
//! from llama.cpp 0c1e57098's greedy runs): SmolLM2 (llama), Qwen2.5 (qwen2) and Gemma 3
//! (gemma3; its file has no chat template, so its chat cases use the ChatML fallback, as
//! llama.cpp did).
//!
//! Gemma 3 has two references. The llama-server run of `../shared/golden` and a native build
//! of the same llama.cpp commit (llama-cpp-python, `fixtures/golden/llama_cpp_python_ref.py`)
//! disagree with each other on Gemma by ~0.08 nats per top-5 log-prob, and their greedy texts
//! fork on three of five cases at margins up to 0.18 nats; mica agrees with the native build
//! bit for bit. So mica is held to the native build by the strict rules below, and to the
//! llama-server file by the same rules with [`GEMMA_SERVER_NEAR_TIE`], the gap the two
//! llama.cpp builds show between themselves.
//!
//! Two correct engines can disagree where the top two tokens are nearly tied, because they
//! round differently (llama.cpp quantizes activations to 8 bits and keeps the KV cache in
//! f16; so does mica, but summation orders differ). So, per case:
//! - the prompt tokenizes (or the chat renders and tokenizes) to llama.cpp's ids;
//! - *teacher-forced*: the prompt, then llama.cpp's output one token at a time (as llama.cpp
//!   computed them); at every position llama.cpp's next token is mica's top choice or within
//!   [`NEAR_TIE`] nats of it;
//! - *free-running*: mica's greedy tokens equal llama.cpp's, unless the first difference is
//!   a near-tie (its margin is printed);
//! - the top-5 log-probs at the first 8 positions differ by at most [`MAX_MEAN_LOGPROB_DIFF`]
//!   nats on average.

mod common;

use common::*;
use mica_engine::Session;
use mica_engine::sampler::{argmax, log_softmax};
use mica_models::LoadedModel;
use mica_models::blocks::attention::AttentionPolicy;
use mica_models::chat::ChatMessage;
use serde_json::Value;

/// Largest log-prob gap below mica's top token that still counts as a tie (nats).
const NEAR_TIE: f32 = 0.1;
/// Largest mean |Δ log-prob| over the golden top-5 entries of the first 8 positions.
const MAX_MEAN_LOGPROB_DIFF: f64 = 0.1;
/// Near-tie allowance against Gemma 3's llama-server golden (see the module docs): the
/// native llama.cpp build's own tokens are up to 0.18 nats below the server's choice.
const GEMMA_SERVER_NEAR_TIE: f32 = 0.2;

struct Case {
    id: String,
    prompt_ids: Vec<u32>,
    output_ids: Vec<u32>,
    top: Vec<Value>,
}

/// Loads the cases of `golden/{file}.json` and checks each prompt tokenizes to llama.cpp's
/// ids.
fn cases(lm: &LoadedModel, model: &str, file: &str) -> Vec<Case> {
    let fx = fixture(&format!("golden/{file}.json"));
    let mut out = Vec::new();
    for c in fx["cases"].as_array().unwrap() {
        let id = c["id"].as_str().unwrap().to_string();
        let text = match c.get("messages") {
            Some(msgs) => {
                let msgs: Vec<ChatMessage> = msgs
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        ChatMessage::new(
                            m["role"].as_str().unwrap(),
                            m["content"].as_str().unwrap(),
                        )
                    })
                    .collect();
                let rendered = lm.template.render(&msgs, true).unwrap();
                assert_eq!(rendered, c["rendered_prompt"].as_str().unwrap(), "{id}");
                rendered
            }
            None => c["prompt"].as_str().unwrap().to_string(),
        };
        let prompt_ids = ids(&c["prompt_ids"]);
        let mine = lm.tokenizer.encode(&text, true, true).unwrap();
        assert_eq!(mine, prompt_ids, "{model}/{id}: prompt tokenization");
        out.push(Case {
            id,
            prompt_ids,
            output_ids: ids(&c["output_ids"]),
            top: c["top_logprobs_first_8_positions"]
                .as_array()
                .unwrap()
                .clone(),
        });
    }
    out
}

/// The log-prob gap between mica's best token and `want` (0 when `want` is the best).
fn margin(logits: &[f32], want: u32) -> f32 {
    let best = argmax(logits);
    logits[best as usize] - logits[want as usize]
}

fn teacher_forced(lm: &LoadedModel, model: &str, case: &Case, near_tie: f32) {
    let mut s = Session::new(lm, 2048, threads());
    // llama.cpp produced every reference position while decoding: the prompt in one batch
    // (under 64 tokens: its vector attention path), then one token at a time. Feeding its
    // tokens the same way gives mica the same arithmetic at every position (a single
    // batch would take the batched matmul paths, whose rounding differs).
    s.set_attention_policy(AttentionPolicy::Vector);
    let all: Vec<u32> = case
        .prompt_ids
        .iter()
        .chain(&case.output_ids)
        .copied()
        .collect();
    let mut logits = s.eval(&case.prompt_ids, false).unwrap().to_vec();
    let (mut flips, mut worst) = (0, 0f32);
    for i in case.prompt_ids.len() - 1..all.len() - 1 {
        let m = margin(&logits, all[i + 1]);
        if m > 0.0 {
            flips += 1;
            worst = worst.max(m);
        }
        assert!(
            m <= near_tie,
            "{model}/{}: teacher-forced position {} (output token {}): llama.cpp's token {} is \
             {m:.3} nats below mica's {} — not a near-tie",
            case.id,
            i,
            i + 1 - case.prompt_ids.len(),
            all[i + 1],
            argmax(&logits)
        );
        if i + 2 < all.len() {
            logits = s.eval(&[all[i + 1]], false).unwrap().to_vec();
        }
    }
    println!(
        "{model}/{}: teacher-forced {} positions, {flips} near-tie flips (largest {worst:.3} nats)",
        case.id,
        case.output_ids.len()
    );
}

/// Greedy decoding step by step, keeping the logits of each step.
fn free_running(lm: &LoadedModel, model: &str, case: &Case, near_tie: f32) -> f64 {
    let mut s = Session::new(lm, 2048, threads());
    let mut logits = s.eval(&case.prompt_ids, false).unwrap();
    let mut diffs = Vec::new();
    let mut diverged = None;
    for (step, &want) in case.output_ids.iter().enumerate() {
        // Top-5 log-probs of llama.cpp at the first 8 positions, while the sequences agree.
        if let Some(Value::Object(p)) = case.top.get(step) {
            let lp = log_softmax(&logits);
            for t in p["top"].as_array().unwrap() {
                let (id, want_lp) = (t[0].as_u64().unwrap() as usize, t[1].as_f64().unwrap());
                diffs.push((lp[id] as f64 - want_lp).abs());
            }
        }
        let got = argmax(&logits);
        if got != want {
            let m = margin(&logits, want);
            assert!(
                m <= near_tie,
                "{model}/{}: greedy output differs at token {step}: mica {got}, llama.cpp {want}, \
                 margin {m:.3} nats — not a near-tie",
                case.id
            );
            diverged = Some((step, m));
            break;
        }
        if step + 1 < case.output_ids.len() {
            logits = s.eval(&[got], false).unwrap();
        }
    }
    match diverged {
        None => println!(
            "{model}/{}: free-running {} tokens identical to llama.cpp",
            case.id,
            case.output_ids.len()
        ),
        Some((step, m)) => println!(
            "{model}/{}: free-running identical for {step} tokens, then a near-tie ({m:.3} nats)",
            case.id
        ),
    }
    let mean = diffs.iter().sum::<f64>() / diffs.len().max(1) as f64;
    println!(
        "{model}/{}: top-5 log-probs, mean |diff| {mean:.4} nats over {} entries",
        case.id,
        diffs.len()
    );
    mean
}

fn check_model(model: &str) {
    let lm = LoadedModel::open(model_path(model)).unwrap();
    check_fixture(&lm, model, model, NEAR_TIE);
}

/// Every case of `golden/{file}.json`, with `near_tie` as the tie allowance.
fn check_fixture(lm: &LoadedModel, model: &str, file: &str, near_tie: f32) {
    let cases = cases(lm, model, file);
    assert_eq!(cases.len(), 5, "fixture cases");
    let mut all_diffs = Vec::new();
    for case in &cases {
        teacher_forced(lm, model, case, near_tie);
        all_diffs.push(free_running(lm, model, case, near_tie));
    }
    let mean = all_diffs.iter().sum::<f64>() / all_diffs.len() as f64;
    println!("{file}: mean top-5 log-prob difference over all cases {mean:.4} nats");
    for (case, d) in cases.iter().zip(&all_diffs) {
        assert!(
            *d <= MAX_MEAN_LOGPROB_DIFF,
            "{model}/{}: top-5 log-probs differ by {d:.4} nats on average",
            case.id
        );
    }
}

#[test]
fn smollm2_agrees_with_llama_cpp() {
    check_model(SMOLLM);
}

#[test]
fn qwen2_agrees_with_llama_cpp() {
    check_model(QWEN);
}

#[test]
fn gemma3_agrees_with_llama_cpp() {
    let lm = LoadedModel::open(model_path(GEMMA)).unwrap();
    assert!(
        lm.template.is_fallback(),
        "the Gemma 3 file has no chat template: the ChatML fallback is expected"
    );
    // Token for token with the native llama.cpp build...
    check_fixture(&lm, GEMMA, &format!("{GEMMA}.llama-cpp-python"), NEAR_TIE);
    // ...and within that build's own distance of the llama-server golden.
    check_fixture(&lm, GEMMA, GEMMA, GEMMA_SERVER_NEAR_TIE);
}
