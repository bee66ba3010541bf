//! A hybrid model served (the tiny Qwen3.5 fixture, Gated DeltaNet layers with a recurrent
//! state): a follow-up turn whose prompt extends the first turn's prompt and answer reports
//! the tokens it took from the prefix cache (restored from a recurrent-state checkpoint) in
//! `usage.prompt_tokens_details.cached_tokens`, and writes what a single-sequence session
//! writes for the whole prompt.
//!
//! The fixture's vocabulary spells token `n` as `<tn>`, which its tokenizer reads back as
//! several tokens: the follow-up prompt shares the first prompt's tokens but not the
//! generated ones, and both prompts are long enough (64 tokens or more) for attention's
//! tiled path, so the second turn takes the first prompt's blocks up to its last block
//! boundary (the engine's tests cover a turn that also takes the answer's blocks).

mod common;

use common::*;
use mica::engine::{GenerateParams, SamplingParams, SchedulerConfig, Session};
use mica::models::LoadedModel;
use serde_json::json;

#[test]
fn a_follow_up_turn_reports_the_first_turns_tokens_cached() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/converted/qwen35/model.q8_0.gguf");
    let lm = LoadedModel::open(&path).unwrap();
    let cfg = mica_server::ServerConfig {
        models: vec![("qwen35".to_string(), path)],
        ..config(SchedulerConfig::default(), vec![])
    };
    let srv = start_with(cfg, Some("qwen35"));
    let complete = |prompt: &str, max_tokens: usize| {
        let r = post(
            srv.addr,
            "/v1/completions",
            &json!({"model": "qwen35", "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": true}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let prompt: String = (0..20u32)
        .map(|k| format!("<t{}>", 3 + (k * 31 + k * k) % 120))
        .collect();
    let first = complete(&prompt, 24);
    let n_first = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n_first >= 64, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let turn = format!(
        "{prompt}{}<t7><t8><t9>",
        first["choices"][0]["text"].as_str().unwrap()
    );
    let second = complete(&turn, 8);
    let ids = lm.tokenizer.encode(&turn, true, true).unwrap();
    assert_eq!(second["usage"]["prompt_tokens"], ids.len(), "{second}");
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        (n_first - 1) / 16 * 16,
        "the first prompt up to its last block boundary"
    );

    let params = GenerateParams {
        max_tokens: 8,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..Default::default()
    };
    let cold = Session::new(&lm, 256, 2)
        .generate(&ids, &params, |_| true)
        .unwrap()
        .text;
    assert_eq!(second["choices"][0]["text"], cold.as_str());
}
