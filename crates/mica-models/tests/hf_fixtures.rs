//! Hugging Face folders of tiny random models against transformers (fixtures/hf, written by
//! fixtures/hf/make_fixtures.py): for each family, mica loads the safetensors folder through
//! the family's name table and config.json, and its logits at every position of the fixture
//! sequences must match transformers' float32 logits within [`MAX_ABS`]; its greedy
//! continuation must equal transformers' token for token.
//!
//! The fixtures are float32 checkpoints, so mica runs them with `Numerics::F32` (f32 KV
//! cache, f32 attention, GELU by its formula): measured max |Δlogit| (transformers 5.23,
//! x86-64 AVX-512) llama 7.1e-6, mistral 4.9e-6, qwen2 5.0e-6, qwen3 5.6e-6, phi3 3.7e-6,
//! qwen2moe 4.5e-6, gemma3 2.5e-6, gemma3_swa6 5.4e-6, gpt2 2.9e-6, gptneox 2.0e-6, gemma2
//! 3.0e-6, smollm3 6.1e-6 (its llama.cpp-converted GGUF 7.2e-6), gemma4 1.1e-5, gemma4_shared
//! 3.5e-5, gemma4_moe 4.7e-6 (their converted GGUFs the same; the GGUF copies within 1e-7 of the folders); with llama.cpp's numerics (f16
//! cache) they were 3.8e-3..8.4e-3.

mod hf_common;
use hf_common::*;

#[test]
fn llama_matches_transformers() {
    check("llama");
}

#[test]
fn mistral_matches_transformers() {
    check("mistral");
}

#[test]
fn qwen2_matches_transformers() {
    check("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check("qwen3");
}

#[test]
fn gemma3_matches_transformers() {
    check("gemma3");
}

#[test]
fn phi3_matches_transformers() {
    check("phi3");
}

#[test]
fn qwen2moe_matches_transformers() {
    check("qwen2moe");
}

#[test]
fn mixtral_matches_transformers() {
    check("mixtral");
}

#[test]
fn qwen3moe_matches_transformers() {
    check("qwen3moe");
}

/// LongRoPE: a cache longer than `original_max_position_embeddings` takes the long factors
/// (transformers does for the fixture sequences, longer than it); a cache that fits takes
/// the short ones (transformers does for a sequence that fits).
#[test]
fn phi3_longrope_matches_transformers() {
    check("phi3_longrope");
    let (model, exp, _) = load("phi3_longrope");
    let lr = model.config.long_rope.as_ref().expect("LongRoPE config");
    let seq = ids(&exp["short_sequence"]);
    assert_eq!(
        seq.len(),
        lr.original_ctx,
        "the short sequence fills the original context"
    );
    let want = read_f32(&dir("phi3_longrope").join(exp["short_logits_file"].as_str().unwrap()));
    let short = max_diff("phi3_longrope", &model, &seq, lr.original_ctx, &want);
    println!("phi3_longrope short factors: max |Δlogit| {short:.2e}");
    assert!(short <= MAX_ABS, "short factors: {short:.2e}");
    // The long factors on the short sequence give other logits: the choice matters.
    let long = max_diff("phi3_longrope", &model, &seq, 64, &want);
    assert!(
        long > 10.0 * MAX_ABS,
        "long factors on a short cache: {long:.2e}"
    );
}

#[test]
fn phi3_longrope_gguf_matches_transformers() {
    let model = check_converted("phi3_longrope");
    let (hf, _, _) = load("phi3_longrope");
    assert_eq!(
        model.config.long_rope, hf.config.long_rope,
        "GGUF and config.json agree"
    );
    // The converted weights are the folder's: its short-sequence reference applies.
    let (exp, _) = expected(&dir("phi3_longrope"));
    let want = read_f32(&dir("phi3_longrope").join(exp["short_logits_file"].as_str().unwrap()));
    let seq = ids(&exp["short_sequence"]);
    let short = max_diff("phi3_longrope (GGUF)", &model, &seq, seq.len(), &want);
    assert!(short <= MAX_ABS, "short factors: {short:.2e}");
}

#[test]
fn mixtral_gguf_matches_transformers() {
    check_converted_moe("mixtral");
}

#[test]
fn qwen2moe_gguf_matches_transformers() {
    check_converted_moe("qwen2moe");
}

#[test]
fn qwen3moe_gguf_matches_transformers() {
    check_converted_moe("qwen3moe");
}

#[test]
fn mixtral_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("mixtral");
}

#[test]
fn qwen2moe_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("qwen2moe");
}

#[test]
fn qwen3moe_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("qwen3moe");
}

/// SmolLM3: the folder's NoPE layers are 1 and 3 (its explicit `no_rope_layers`), and they
/// are what makes the logits match: the same model with RoPE on every layer is far off.
#[test]
fn smollm3_matches_transformers() {
    check("smollm3");
    let (mut model, exp, want) = load("smollm3");
    assert_eq!(model.config.layer_rope, [true, false, true, false]);
    model.config.layer_rope = vec![true; 4];
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    let off = max_diff("smollm3 (RoPE everywhere)", &model, &seq, 64, &want[..n]);
    println!("smollm3 with RoPE on its NoPE layers: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "RoPE on the NoPE layers moved the logits by only {off:.2e}"
    );
}

/// SmolLM3 through llama.cpp's converter: `smollm3` GGUF files carry no NoPE key, and mica
/// makes every 4th layer NoPE as llama.cpp does (the converted model's default pattern).
#[test]
fn smollm3_gguf_matches_transformers() {
    let model = check_converted("smollm3");
    assert_eq!(model.config.layer_rope, [true, true, true, false]);
}

#[test]
fn smollm3_config_errors_name_the_field() {
    config_error_names("smollm3", "no_rope_layers", |c| {
        c["no_rope_layers"] = serde_json::json!([1, 0]);
    });
    config_error_names("smollm3", "no_rope_layers", |c| {
        c["no_rope_layers"] = serde_json::json!([1, 0, 2, 1]);
    });
    config_error_names("smollm3", "no_rope_layer_interval", |c| {
        c.as_object_mut().unwrap().remove("no_rope_layers");
        c["no_rope_layer_interval"] = 0.into();
    });
}

#[test]
fn smollm3_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("smollm3");
}

#[test]
fn moe_and_longrope_config_errors_name_the_field() {
    config_error_names("mixtral", "num_local_experts", |c| {
        c.as_object_mut().unwrap().remove("num_local_experts");
    });
    config_error_names("mixtral", "num_experts_per_tok", |c| {
        c["num_experts_per_tok"] = 5.into()
    });
    config_error_names("qwen3moe", "moe_intermediate_size", |c| {
        c.as_object_mut().unwrap().remove("moe_intermediate_size");
    });
    config_error_names("phi3_longrope", "short_factor", |c| {
        c["rope_parameters"]["short_factor"] = serde_json::json!([1.0, 2.0]);
    });
    config_error_names("phi3_longrope", "long_factor", |c| {
        c["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("long_factor");
    });
}

#[test]
fn gpt2_matches_transformers() {
    check("gpt2");
}

#[test]
fn gptneox_matches_transformers() {
    check("gptneox");
}

/// The tiled attention path (batches of 64+ tokens) over the f32 cache gives what the vector
/// path gives, within float32 summation-order noise: a 96-token prompt evaluated at once
/// against the same prompt evaluated token by token.
#[test]
fn f32_cache_tiled_prefill_matches_token_by_token() {
    tiled_prefill_matches_token_by_token("mistral");
}

#[test]
fn llama_gguf_matches_transformers() {
    check_gguf("llama");
}

#[test]
fn qwen2_gguf_matches_transformers() {
    check_gguf("qwen2");
}

#[test]
fn qwen3_gguf_matches_transformers() {
    check_gguf("qwen3");
}

#[test]
fn phi3_gguf_matches_transformers() {
    check_gguf("phi3");
}

/// Gemma 3 as GGUF can describe it (every 6th layer global, `query_pre_attn_scalar` =
/// head_dim), made for the GGUF path; also checked as a folder.
#[test]
fn gemma3_swa6_matches_transformers() {
    check("gemma3_swa6");
}

#[test]
fn gemma3_swa6_gguf_matches_transformers() {
    check_gguf("gemma3_swa6");
}

#[test]
fn gpt2_gguf_matches_transformers() {
    check_gguf("gpt2");
}

#[test]
fn gptneox_gguf_matches_transformers() {
    check_gguf("gptneox");
}

/// Gemma 2, the family added as one file (`arch/gemma2.rs`) and one registry entry to test
/// the family descriptor: local and global layers alternating (window 5), attention and
/// final logit soft-capping, pre/post norms, GeGLU, tied head.
#[test]
fn gemma2_matches_transformers() {
    check("gemma2");
    // The attention soft-cap bites on the fixture: without it the logits move.
    let (mut model, exp, want) = load("gemma2");
    assert_eq!(model.config.attn_softcap, Some(2.0));
    model.config.attn_softcap = None;
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    let off = max_diff("gemma2 (no attention cap)", &model, &seq, 64, &want[..n]);
    assert!(
        off > 10.0 * MAX_ABS,
        "attention cap has no effect: {off:.2e}"
    );
}

/// StarCoder / GPTBigCode: GPT-2's layers with one key/value head (multi-query) and
/// `nn.Linear` projections.
#[test]
fn starcoder_matches_transformers() {
    check("starcoder");
    let (model, _, _) = load("starcoder");
    assert_eq!((model.config.n_head, model.config.n_head_kv), (4, 1));
}

#[test]
fn starcoder_gguf_matches_transformers() {
    check_converted("starcoder");
}

#[test]
fn starcoder_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("starcoder");
}

/// OPT: learned positions read 2 rows in, separate q/k/v with biases, ReLU MLP.
#[test]
fn opt_matches_transformers() {
    check("opt");
}

/// OPT-350m's layout: post-norm (LayerNorms after the residual adds, no final LayerNorm)
/// and a 16-wide embedding projected in to the 32-wide layers and out before the head.
#[test]
fn opt_post_norm_with_embedding_projection_matches_transformers() {
    check("opt350");
    let (model, _, _) = load("opt350");
    assert!(model.config.post_norm && !model.config.final_norm);
    assert_eq!(model.tok_embd.cols, 16);
    assert!(model.embd_proj.is_some());
}

#[test]
fn opt_config_errors_name_the_field() {
    config_error_names("opt", "word_embed_proj_dim", |c| {
        c["word_embed_proj_dim"] = 0.into()
    });
    config_error_names("opt", "enable_bias", |c| c["enable_bias"] = false.into());
    config_error_names("opt", "do_layer_norm_before", |c| {
        c["do_layer_norm_before"] = "yes".into()
    });
    config_error_names("opt", "activation_function", |c| {
        c["activation_function"] = "gelu".into()
    });
}

/// CodeGen: one LayerNorm before parallel attention and MLP, GPT-J rotary on 2 of each head's
/// 4 dimensions, the fused projection regrouped from 4 blocks of (q | v | k), a head bias.
#[test]
fn codegen_matches_transformers() {
    check("codegen");
}

#[test]
fn codegen_config_errors_name_the_field() {
    config_error_names("codegen", "rotary_dim", |c| c["rotary_dim"] = 5.into());
    config_error_names("codegen", "n_head", |c| {
        c["n_head"] = 2.into();
    });
}
