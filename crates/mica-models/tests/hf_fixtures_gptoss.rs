//! gpt-oss's fixture (fixtures/hf/gptoss: sliding and full layers, attention sinks, biased
//! q/k/v/o and experts, top-2 of 4 experts softmaxed among themselves, the clamped SwiGLU,
//! YaRN RoPE) against transformers, and its GGUF conversion by llama.cpp's converter
//! (fixtures/converted/gptoss) against transformers and, quantized to Q8_0 and to MXFP4
//! experts by llama.cpp, against llama.cpp's tokens and logits.

mod hf_common;
use hf_common::*;
use mica_models::model::Ffn;

/// The logits and greedy tokens of the folder match transformers', and each of gpt-oss's
/// features is seen to matter: without the sinks, with Qwen-style routing (softmax over all
/// experts, then top-k) or without YaRN the logits are far off.
#[test]
fn gptoss_matches_transformers() {
    check("gptoss");
    let (mut model, exp, want) = load("gptoss");
    assert_eq!(
        model.config.layer_window,
        [Some(5), None],
        "sliding pattern"
    );
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    let far = |what: &str, model: &Model| {
        let off = max_diff(&format!("gptoss ({what})"), model, &seq, 64, &want[..n]);
        println!("gptoss {what}: max |Δlogit| {off:.2e}");
        assert!(
            off > 100.0 * MAX_ABS,
            "{what}: the logits moved by {off:.2e}"
        );
    };
    let sinks: Vec<_> = model.layers.iter_mut().map(|l| l.sinks.take()).collect();
    far("without sinks", &model);
    for (l, s) in model.layers.iter_mut().zip(sinks) {
        l.sinks = s;
    }
    let set_routing = |model: &mut Model, on: bool| {
        for l in &mut model.layers {
            match &mut l.ffn {
                Ffn::Moe(m) => m.topk_softmax = on,
                _ => panic!("gptoss: a dense layer"),
            }
        }
    };
    set_routing(&mut model, false);
    far("softmax over all experts", &model);
    set_routing(&mut model, true);
    let yarn = model.config.rope.freq_factors.take();
    model.config.rope.attn_factor = 1.0;
    far("without YaRN", &model);
    assert!(yarn.is_some());
}

/// Prompt tokens processed as one tiled batch give what they give one at a time.
#[test]
fn gptoss_tiled_prefill_matches_token_by_token() {
    tiled_prefill_matches_token_by_token("gptoss");
}

/// The folder through llama.cpp's converter (`gpt-oss`: experts stacked with gate and up
/// apart, `post_attention_norm`, `attn_sinks`, YaRN keys) matches transformers.
#[test]
fn gptoss_gguf_matches_transformers() {
    check_converted_moe("gptoss");
}

/// llama.cpp's Q8_0 quantization of that file: tokens and logits equal llama.cpp's.
#[test]
fn gptoss_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("gptoss");
}

/// llama.cpp's MXFP4_MOE quantization (experts MXFP4, the rest Q8_0): tokens equal
/// llama.cpp's, and so do the logits, bit for bit, at every position but one of the 39,
/// which differs by 2.6e-2 (measured). Likely cause: on AVX2 llama.cpp repacks MXFP4 rows
/// 8 × 8 (ggml's `mxfp4_8x8_q8_0`), whose sums round in another order than the plain dot
/// product mica runs, and one such difference moves one Q8_0 activation by a step (computing
/// the sink factor in f64 instead leaves the difference as it is).
#[test]
fn gptoss_mxfp4_matches_llama_cpp() {
    check_llama_cpp_ref("gptoss", "llama_cpp_mxfp4.json", (1, 3e-2));
}

/// A config whose SwiGLU differs from llama.cpp's fixed one is refused, naming the field.
#[test]
fn gptoss_other_swiglu_limit_is_refused() {
    let msg = config_error_names("gptoss", "swiglu_limit", |c| {
        c["swiglu_limit"] = 5.0.into();
    });
    assert!(msg.contains("7"), "{msg}");
}

/// Attention sinks are applied over f16 and f32 caches; another cache type (bf16 here; the
/// block types need heads wider than the fixture's 16) is an error saying so, not a wrong
/// result.
#[test]
fn gptoss_other_kv_cache_types_are_an_error() {
    use mica_models::kv_cache::{CacheTypes, KvType};
    let (mut model, exp, _) = load("gptoss");
    model
        .config
        .set_cache_types(CacheTypes::both(KvType::from_name("bf16").unwrap()))
        .unwrap();
    let pool = ThreadPool::new(1);
    let mut kv = KvCache::new(&model.config, 64, 1);
    let mut ws = Workspace::default();
    let seq = ids(&exp["sequences"][0]);
    let err = model
        .forward(
            &pool,
            &Batch::for_sequence(&seq, 0, 0, true),
            &mut kv,
            &mut ws,
        )
        .expect_err("a bf16 cache with attention sinks")
        .to_string();
    assert!(err.contains("attention sinks"), "{err}");
}
