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

use mica_kernels::ThreadPool;
use mica_models::blocks::attention::AttentionPolicy;
use mica_models::hf::HfFolder;
use mica_models::{Batch, KvCache, Model, Workspace};
use serde_json::Value;
use std::path::PathBuf;

/// Largest |mica − transformers| allowed on any logit.
const MAX_ABS: f32 = 1e-4;

fn dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(family)
}

fn load(family: &str) -> (Model, Value, Vec<f32>) {
    let d = dir(family);
    let folder = HfFolder::open(&d).unwrap_or_else(|e| panic!("{family}: {e}"));
    let model = mica_models::arch::load_hf(&folder).unwrap_or_else(|e| panic!("{family}: {e}"));
    let (exp, logits) = expected(&d);
    (model, exp, logits)
}

/// `expected.json` and the logits file it names.
fn expected(d: &std::path::Path) -> (Value, Vec<f32>) {
    let exp: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("expected.json")).unwrap()).unwrap();
    let logits = read_f32(&d.join(exp["logits_file"].as_str().unwrap()));
    (exp, logits)
}

fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Max |Δ| between mica's logits for `seq` (a cache of `n_ctx` tokens) and `want`.
fn max_diff(family: &str, model: &Model, seq: &[u32], n_ctx: usize, want: &[f32]) -> f32 {
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::new(&model.config, n_ctx, 1);
    let mut ws = Workspace::default();
    ws.attention = AttentionPolicy::Vector;
    let got = model
        .forward(
            &pool,
            &Batch::for_sequence(seq, 0, 0, true),
            &mut kv,
            &mut ws,
        )
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    assert_eq!(got.len(), want.len(), "{family}: logits size");
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn check(family: &str) {
    let (model, exp, want) = load(family);
    check_model(family, &model, &exp, &want);
}

fn check_model(family: &str, model: &Model, exp: &Value, want: &[f32]) {
    assert_eq!(
        model.config.arch,
        exp["architecture"].as_str().unwrap(),
        "{family}: architecture"
    );
    let pool = ThreadPool::new(2);
    let v = model.config.n_vocab;
    let mut offset = 0;
    let mut worst = 0f32;
    for seq in exp["sequences"].as_array().unwrap() {
        let seq = ids(seq);
        let mut kv = KvCache::new(&model.config, 64, 1);
        let mut ws = Workspace::default();
        ws.attention = AttentionPolicy::Vector;
        let got = model
            .forward(
                &pool,
                &Batch::for_sequence(&seq, 0, 0, true),
                &mut kv,
                &mut ws,
            )
            .unwrap();
        let w = &want[offset..offset + seq.len() * v];
        offset += seq.len() * v;
        for (p, (g, e)) in got.chunks_exact(v).zip(w.chunks_exact(v)).enumerate() {
            let d = g
                .iter()
                .zip(e)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            worst = worst.max(d);
            assert!(
                d <= MAX_ABS,
                "{family}: position {p}: max |Δlogit| {d:.2e} > {MAX_ABS:.0e}"
            );
        }
    }
    assert_eq!(offset, want.len(), "{family}: logits file size");

    // Greedy continuation, one token at a time.
    let prompt = ids(&exp["greedy_prompt"]);
    let want_ids = ids(&exp["greedy_ids"]);
    let mut kv = KvCache::new(&model.config, 64, 1);
    let mut ws = Workspace::default();
    let mut logits = model
        .forward(
            &pool,
            &Batch::for_sequence(&prompt, 0, 0, false),
            &mut kv,
            &mut ws,
        )
        .unwrap()
        .to_vec();
    let mut got_ids = Vec::new();
    for step in 0..want_ids.len() {
        let t = argmax(&logits);
        got_ids.push(t);
        let b = Batch::for_sequence(&[t], prompt.len() + step, 0, false);
        logits = model.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec();
    }
    assert_eq!(got_ids, want_ids, "{family}: greedy continuation");
    println!(
        "{family}: max |Δlogit| {worst:.2e} over {} positions; greedy {} tokens identical",
        exp["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_array().unwrap().len())
            .sum::<usize>(),
        want_ids.len()
    );
}

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

/// Fixtures converted to GGUF by llama.cpp's convert_hf_to_gguf.py (fixtures/converted: MoE
/// with stacked `ffn_*_exps` experts, LongRoPE factors as tensors) against transformers on
/// the converted model.
fn check_converted(family: &str) -> Model {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/converted")
        .join(family);
    let (exp, want) = expected(&d);
    let file = mica_formats::GgufFile::open(d.join(exp["gguf"].as_str().unwrap()))
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    let model = mica_models::arch::load_gguf(std::sync::Arc::new(file))
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    let mut exp = exp;
    // The GGUF names its architecture the llama.cpp way.
    exp["architecture"] = model.config.arch.clone().into();
    check_model(&format!("{family} (GGUF)"), &model, &exp, &want);
    model
}

fn check_converted_moe(family: &str) {
    let model = check_converted(family);
    assert!(
        model
            .layers
            .iter()
            .any(|l| matches!(l.ffn, mica_models::model::Ffn::Moe(_))),
        "{family}: no sparse layer"
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

/// The converted MoE fixtures quantized to Q8_0 by llama.cpp: mica's greedy continuation
/// equals llama.cpp's on the same file, and its logits along the path match llama.cpp's
/// (fixtures/converted/llama_cpp_ref.py recorded both; measured identical).
fn check_llama_cpp_q8(family: &str) {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/converted")
        .join(family);
    let refj: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("llama_cpp.json")).unwrap()).unwrap();
    let file = mica_formats::GgufFile::open(d.join(refj["gguf"].as_str().unwrap()))
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    let model = mica_models::arch::load_gguf(std::sync::Arc::new(file))
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    let pool = ThreadPool::new(2);
    let prompt = ids(&refj["prompt"]);
    let want = ids(&refj["greedy_ids"]);
    let mut kv = KvCache::new(&model.config, 64, 1);
    let mut ws = Workspace::default();
    // Every position's logits, as llama.cpp computed them: the prompt as one batch, then
    // one token at a time.
    let mut all = model
        .forward(
            &pool,
            &Batch::for_sequence(&prompt, 0, 0, true),
            &mut kv,
            &mut ws,
        )
        .unwrap()
        .to_vec();
    let v = model.config.n_vocab;
    let mut got = Vec::new();
    for step in 0..want.len() {
        let t = argmax(&all[all.len() - v..]);
        got.push(t);
        let b = Batch::for_sequence(&[t], prompt.len() + step, 0, true);
        all.extend_from_slice(model.forward(&pool, &b, &mut kv, &mut ws).unwrap());
    }
    assert_eq!(
        got, want,
        "{family} Q8_0: greedy tokens differ from llama.cpp's"
    );
    let lc = read_f32(&d.join(refj["logits_file"].as_str().unwrap()));
    assert_eq!(lc.len(), all.len(), "{family}: llama.cpp logits size");
    let worst = all
        .iter()
        .zip(&lc)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("{family} Q8_0: greedy identical, max |Δlogit| vs llama.cpp {worst:.1e}");
    assert!(
        worst <= 1e-4,
        "{family} Q8_0: max |Δlogit| vs llama.cpp {worst:.2e}"
    );
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

/// A copy of a fixture folder whose config.json `edit` changes; the load error must name
/// `field`.
/// The fixture `family` with `edit` applied to its config.json, loaded (the copy removed).
fn load_edited(family: &str, tag: &str, edit: impl Fn(&mut Value)) -> mica_models::Result<Model> {
    let src = dir(family);
    let tmp = std::env::temp_dir().join(format!("mica-cfg-{family}-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), tmp.join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    let model = HfFolder::open(&tmp).and_then(|f| mica_models::arch::load_hf(&f));
    std::fs::remove_dir_all(&tmp).unwrap();
    model
}

/// Loading `family` with `edit` fails with an error naming `field`; returns the message.
fn config_error_names(family: &str, field: &str, edit: impl Fn(&mut Value)) -> String {
    let err = load_edited(family, field, edit)
        .err()
        .unwrap_or_else(|| panic!("{family}: loads despite the bad {field}"))
        .to_string();
    assert!(
        err.contains(field),
        "{family}: error does not name {field}: {err}"
    );
    err
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

/// The same for Gemma 4, whose layers differ in head size and key/value heads (the cache
/// holds rows of each layer's own width) and alternate sliding and global attention.
#[test]
fn gemma4_tiled_prefill_matches_token_by_token() {
    tiled_prefill_matches_token_by_token("gemma4");
}

/// And for Gemma 4 MoE: 96 prompt tokens routed as one batch, grouped by expert, give each
/// token what it gets alone.
#[test]
fn gemma4_moe_tiled_prefill_matches_token_by_token() {
    tiled_prefill_matches_token_by_token("gemma4_moe");
}

fn tiled_prefill_matches_token_by_token(family: &str) {
    let (model, _, _) = load(family);
    assert_eq!(
        model.config.numerics,
        mica_models::config::Numerics::F32,
        "a float32 checkpoint runs with f32 numerics"
    );
    let pool = ThreadPool::new(2);
    let v = model.config.n_vocab;
    let prompt: Vec<u32> = (0..96u32).map(|i| (i * 37 + 11) % v as u32).collect();
    let mut kv = KvCache::new(&model.config, 128, 1);
    assert_eq!(kv.kv_type(), mica_models::kv_cache::KvType::F32);
    let mut ws = Workspace::default();
    let all = model
        .forward(
            &pool,
            &Batch::for_sequence(&prompt, 0, 0, true),
            &mut kv,
            &mut ws,
        )
        .unwrap()
        .to_vec();
    let mut kv = KvCache::new(&model.config, 128, 1);
    let mut worst = 0f32;
    for (p, &t) in prompt.iter().enumerate() {
        let b = Batch::for_sequence(&[t], p, 0, true);
        let one = model.forward(&pool, &b, &mut kv, &mut ws).unwrap();
        for (a, b) in one.iter().zip(&all[p * v..(p + 1) * v]) {
            worst = worst.max((a - b).abs());
        }
    }
    println!("{family}: tiled vs vector (f32 cache): max |Δlogit| {worst:.2e}");
    assert!(worst <= 1e-4, "{family}: tiled vs vector: {worst:.2e}");
}

// The dense fixtures through the GGUF path: llama.cpp's converter (`--outtype f32`) wrote
// `model-f32.gguf` into each folder (fixtures/hf/make_fixtures.py --gguf), permuting LLaMA's
// Q/K rows for its RoPE layout, folding Gemma's `1 + w` into the norms, transposing GPT-2's
// Conv1D weights and regrouping GPT-NeoX's qkv rows; mica must compute the same logits.
// Not written there: mistral (llama.cpp's `llama` architecture has no sliding window, so the
// converter drops it and the file would be another model), gemma3 (GGUF has no key for the
// fixture's `query_pre_attn_scalar` of 24, which llama.cpp assumes equals head_dim, 16, nor
// for its `layer_types`; `gemma3_swa6` is the Gemma 3 variant within what GGUF says), and
// the MoE / LongRoPE fixtures (converted into fixtures/converted, checked above).

/// A fixture's `model-f32.gguf` against the folder's transformers logits.
fn check_gguf(family: &str) {
    let d = dir(family);
    let (mut exp, want) = expected(&d);
    let file = mica_formats::GgufFile::open(d.join("model-f32.gguf"))
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    let model = mica_models::arch::load_gguf(std::sync::Arc::new(file))
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    // The GGUF names its architecture the llama.cpp way.
    exp["architecture"] = model.config.arch.clone().into();
    check_model(&format!("{family} (GGUF)"), &model, &exp, &want);
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

/// Gemma 4 (dense): sliding layers of 2 KV heads × 16, global layers (2 and 4) of 1 KV head
/// × 32 whose values are their keys (`attention_k_eq_v`), proportional RoPE on the global
/// layers, weightless value norm, random per-layer output scales. Each of these is seen to
/// matter: the same model without the layer scales, or with the global layers' unrotated
/// pairs rotated, is far off.
#[test]
fn gemma4_matches_transformers() {
    check("gemma4");
    let (mut model, exp, want) = load("gemma4");
    let cfg = &model.config;
    assert_eq!(cfg.layer_head_dim, [16, 16, 32, 16, 32]);
    assert_eq!(cfg.layer_n_head_kv, [2, 2, 1, 2, 1]);
    assert_eq!(
        cfg.layer_window,
        [Some(5), Some(5), None, Some(5), None],
        "sliding pattern"
    );
    assert!(model.layers[2].wv.is_none() && model.layers[0].wv.is_some());
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    let scales: Vec<Option<f32>> = model.layers.iter().map(|l| l.out_scale).collect();
    for l in &mut model.layers {
        l.out_scale = None;
    }
    let off = max_diff("gemma4 (no layer scale)", &model, &seq, 64, &want[..n]);
    println!("gemma4 without its layer scales: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "layer scales moved the logits by {off:.2e}"
    );
    for (l, s) in model.layers.iter_mut().zip(scales) {
        l.out_scale = s;
    }
    model.config.rope.freq_factors = None;
    let off = max_diff("gemma4 (full RoPE)", &model, &seq, 64, &want[..n]);
    println!("gemma4 with whole-head RoPE on its global layers: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "proportional RoPE moved the logits by {off:.2e}"
    );
}

/// Gemma 4 through llama.cpp's converter: per-layer `head_count_kv`, `key_length` /
/// `key_length_swa`, the layer pattern, `rope_freqs.weight` and `layer_output_scale.weight`.
#[test]
fn gemma4_gguf_matches_transformers() {
    let model = check_converted("gemma4");
    assert_eq!(model.config.layer_head_dim, [16, 16, 32, 16, 32]);
    assert_eq!(model.config.layer_n_head_kv, [2, 2, 1, 2, 1]);
}

#[test]
fn gemma4_config_errors_name_the_field() {
    // The MoE block switched on without its experts.
    config_error_names("gemma4", "num_experts", |c| {
        c["enable_moe_block"] = true.into();
    });
    // Only layer 0 (sliding) left unshared: the global layers have none to reuse.
    config_error_names("gemma4", "num_kv_shared_layers", |c| {
        c["num_kv_shared_layers"] = 4.into();
    });
    config_error_names("gemma4", "per_layer_config.2.num_key_value_heads", |c| {
        c["per_layer_config"]["2"]["num_key_value_heads"] = 3.into();
    });
}

/// What a Gemma 4 text config may carry that mica does not run is refused at load, the
/// error naming the field and the value: bidirectional attention over text, attention
/// biases, another activation, a per-layer embedding table that disagrees with the config.
#[test]
fn gemma4_unsupported_options_are_refused_naming_field_and_value() {
    let cases: [(&str, &str, &str, Value); 5] = [
        (
            "gemma4",
            "use_bidirectional_attention",
            "\"all\"",
            "all".into(),
        ),
        (
            "gemma4",
            "use_bidirectional_attention",
            "\"both\"",
            "both".into(),
        ),
        ("gemma4", "attention_bias", "true", true.into()),
        ("gemma4", "hidden_activation", "\"silu\"", "silu".into()),
        (
            "gemma4_shared",
            "vocab_size_per_layer_input",
            "64",
            64.into(),
        ),
    ];
    for (family, field, shown, value) in cases {
        let err = config_error_names(family, field, |c| c[field] = value.clone());
        assert!(
            err.contains(shown),
            "{family} {field}: value not named: {err}"
        );
        println!("{field} = {shown}: {err}");
    }
}

/// `use_bidirectional_attention: "vision"` makes only image tokens bidirectional: a text
/// model runs causally, as without it (and as llama.cpp runs it).
#[test]
fn gemma4_vision_bidirectional_attention_leaves_text_causal() {
    let model = load_edited("gemma4", "vision", |c| {
        c["use_bidirectional_attention"] = "vision".into();
    })
    .unwrap();
    let (_, exp, want) = load("gemma4");
    check_model("gemma4 (vision)", &model, &exp, &want);
}

#[test]
fn gemma4_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("gemma4");
}

/// A paged cache for Gemma 4's layers of different widths: a prefix copied block by block
/// (`copy_block`, as the engine's copy-on-write does) into another sequence continues
/// exactly as the original, and a block costs each layer's own width.
#[test]
fn gemma4_paged_cache_copies_blocks_of_every_layer_width() {
    use mica_models::kv_cache::BLOCK_SIZE;
    let (model, _, _) = load("gemma4");
    let cfg = &model.config;
    let width: usize = (0..cfg.n_layer).map(|l| cfg.kv_dim_of(l)).sum();
    assert_eq!(width, 3 * 32 + 2 * 32, "sliding 2×16, global 1×32");
    assert_eq!(KvCache::bytes_per_block(cfg), 2 * BLOCK_SIZE * width * 4);
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::paged(cfg, 8, 2, 64);
    let mut ws = Workspace::default();
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 29 + 5) % 128).collect();
    kv.set_table(0, &[3, 1], 0).unwrap();
    model
        .forward(
            &pool,
            &Batch::for_sequence(&prompt, 0, 0, false),
            &mut kv,
            &mut ws,
        )
        .unwrap();
    kv.copy_block(3, 5);
    kv.copy_block(1, 0);
    kv.set_table(1, &[5, 0], prompt.len()).unwrap();
    let next = |kv: &mut KvCache, ws: &mut Workspace, seq| {
        let b = Batch::for_sequence(&[7], prompt.len(), seq, true);
        model.forward(&pool, &b, kv, ws).unwrap().to_vec()
    };
    let a = next(&mut kv, &mut ws, 0);
    let b = next(&mut kv, &mut ws, 1);
    assert_eq!(a, b, "the copied prefix continues as the original");
}

/// Gemma 4 as its smallest models are built: per-layer embeddings, and layers 4 and 5
/// computing no keys or values, attending over layers 2 and 3's (stored once), with
/// double-wide feed-forwards. The folder, its llama.cpp conversion, and that quantized to
/// Q8_0 by llama.cpp.
#[test]
fn gemma4_shared_matches_transformers() {
    check("gemma4_shared");
    let (mut model, exp, want) = load("gemma4_shared");
    assert_eq!(model.ple.as_ref().map(|p| p.dim), Some(8));
    let cfg = &model.config;
    assert_eq!(
        cfg.layer_kv_from,
        [None, None, None, None, Some(2), Some(3)]
    );
    assert_eq!(cfg.layer_n_ff, [96, 96, 96, 96, 192, 192]);
    assert!(model.layers[4].wk.is_none() && model.layers[5].wv.is_none());
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    for l in &mut model.layers {
        l.ple = None;
    }
    let off = max_diff("gemma4_shared (no PLE)", &model, &seq, 64, &want[..n]);
    println!("gemma4_shared without its per-layer terms: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "per-layer embeddings moved the logits by {off:.2e}"
    );
    let cfg = &model.config;
    // Shared layers store nothing: two sliding layers of 2×16 and two global of 1×32.
    assert_eq!(
        KvCache::bytes_per_block(cfg),
        2 * mica_models::kv_cache::BLOCK_SIZE * (2 * 32 + 2 * 32) * 4
    );
}

#[test]
fn gemma4_shared_gguf_matches_transformers() {
    let model = check_converted("gemma4_shared");
    assert_eq!(
        model.config.layer_kv_from,
        [None, None, None, None, Some(2), Some(3)]
    );
}

#[test]
fn gemma4_shared_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("gemma4_shared");
}

/// The experts of a Gemma 4 MoE layer, with the layer's MLP beside them.
fn gemma4_moe_layers(model: &Model) -> Vec<&mica_models::model::Moe> {
    model
        .layers
        .iter()
        .map(|l| match &l.ffn {
            mica_models::model::Ffn::Moe(m) => m,
            _ => panic!("gemma4_moe: a dense layer"),
        })
        .collect()
}

/// Gemma 4's MoE block: every layer runs its dense MLP (as the shared expert, on the
/// feed-forward norm) beside four GeGLU experts of width 32 read from the stacked
/// `experts.gate_up_proj` (top 2 renormalized, router on its own scaled norm, per-expert
/// output scales), each branch normed before the sum. The router's scale and the per-expert
/// scales are each seen to matter.
#[test]
fn gemma4_moe_matches_transformers() {
    check("gemma4_moe");
    let (mut model, exp, want) = load("gemma4_moe");
    for m in gemma4_moe_layers(&model) {
        assert_eq!((m.experts.len(), m.top_k, m.norm_topk), (4, 2, true));
        assert_eq!(m.experts[0].up.out_dim(), 32);
        assert_eq!(m.shared.as_ref().map(|s| s.up.out_dim()), Some(32));
        assert!(m.norms.is_some() && m.expert_scale.is_some() && m.shared_gate.is_none());
    }
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    fn moes(model: &mut Model) -> Vec<&mut mica_models::model::Moe> {
        model
            .layers
            .iter_mut()
            .filter_map(|l| match &mut l.ffn {
                mica_models::model::Ffn::Moe(m) => Some(m),
                _ => None,
            })
            .collect()
    }
    let scales: Vec<_> = moes(&mut model)
        .into_iter()
        .map(|m| m.expert_scale.take())
        .collect();
    let off = max_diff("gemma4_moe (no expert scale)", &model, &seq, 64, &want[..n]);
    println!("gemma4_moe without its per-expert scales: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "per-expert scales moved the logits by {off:.2e}"
    );
    for (m, s) in moes(&mut model).into_iter().zip(scales) {
        m.expert_scale = s;
        let norms = m.norms.as_mut().unwrap();
        norms.router_in.iter_mut().for_each(|v| *v = 1.0);
    }
    let off = max_diff("gemma4_moe (router scale 1)", &model, &seq, 64, &want[..n]);
    println!("gemma4_moe with router scale 1: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "the router scale moved the logits by {off:.2e}"
    );
}

/// The MoE model through llama.cpp's converter: `expert_count`, `expert_used_count`,
/// `expert_feed_forward_length`, the fused `ffn_gate_up_exps`, `ffn_gate_inp.scale`,
/// `ffn_down_exps.scale` and the branch norms.
#[test]
fn gemma4_moe_gguf_matches_transformers() {
    let model = check_converted("gemma4_moe");
    assert_eq!(gemma4_moe_layers(&model).len(), 2);
}

#[test]
fn gemma4_moe_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("gemma4_moe");
}

#[test]
fn gemma4_moe_config_errors_name_the_field() {
    config_error_names("gemma4_moe", "top_k_experts", |c| {
        c["top_k_experts"] = 5.into();
    });
    config_error_names("gemma4_moe", "moe_intermediate_size", |c| {
        c.as_object_mut().unwrap().remove("moe_intermediate_size");
    });
}

/// llama.cpp's `convert_hf_to_gguf.py --fuse-qkv` stores q, k and v of every layer that has
/// all three as one `attn_qkv` (rows q | k | v): Gemma 4 MoE's sliding layer, while its
/// global layer (values from the keys) keeps `attn_q` and `attn_k`. That file, made here from
/// the converted fixture by concatenating the rows (the converter's own `--fuse-qkv` output
/// for this folder has the same bytes), gives the unfused file's logits bit for bit.
#[test]
fn gemma4_fused_qkv_gguf_gives_the_same_logits() {
    use mica_formats::{GgufFile, GgufWriter};
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/converted/gemma4_moe");
    let src = GgufFile::open(d.join("model.f32.gguf")).unwrap();
    let prefix = |n: &str| n.rsplit_once("attn_").map(|(p, _)| p.to_string());
    let has_v = |p: &str| src.tensor(&format!("{p}attn_v.weight")).is_some();
    let mut fused = Vec::new();
    for t in src.tensors() {
        if let Some(p) = prefix(&t.name).filter(|p| has_v(p))
            && t.name == format!("{p}attn_q.weight")
        {
            let parts =
                ["q", "k", "v"].map(|x| src.tensor(&format!("{p}attn_{x}.weight")).unwrap());
            let bytes: Vec<u8> = parts
                .iter()
                .flat_map(|t| src.tensor_data(t).to_vec())
                .collect();
            let rows: u64 = parts.iter().map(|t| t.shape[1]).sum();
            fused.push((format!("{p}attn_qkv.weight"), t.shape[0], rows, bytes));
        }
    }
    assert_eq!(fused.len(), 1, "the sliding layer only");
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata_entries() {
        w.meta(k, v.clone());
    }
    for t in src.tensors() {
        let fused_away = ["attn_q.weight", "attn_k.weight", "attn_v.weight"]
            .iter()
            .any(|s| t.name.ends_with(s))
            && prefix(&t.name).is_some_and(|p| has_v(&p));
        if !fused_away {
            w.tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t));
        }
    }
    for (name, cols, rows, bytes) in &fused {
        w.tensor(name, src.tensors()[0].ggml_type, &[*cols, *rows], bytes);
    }
    let path = std::env::temp_dir().join(format!("mica-fused-qkv-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert!(
        file.tensor("blk.0.attn_qkv.weight").is_some()
            && file.tensor("blk.0.attn_q.weight").is_none()
    );
    let model = mica_models::arch::load_gguf(std::sync::Arc::new(file)).unwrap();
    std::fs::remove_file(&path).unwrap();
    let plain = mica_models::arch::load_gguf(std::sync::Arc::new(src)).unwrap();
    let seq = [1u32, 17, 33, 5, 98, 64, 12, 77, 3, 120];
    let run = |m: &Model| {
        let pool = ThreadPool::new(2);
        let mut kv = KvCache::new(&m.config, 64, 1);
        let mut ws = Workspace::default();
        let b = Batch::for_sequence(&seq, 0, 0, true);
        m.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec()
    };
    assert_eq!(run(&model), run(&plain), "fused and separate q, k, v");
}

/// Qwen3.5: three Gated DeltaNet layers (2 key heads, 4 grouped value heads) and one gated
/// attention layer.
#[test]
fn qwen35_matches_transformers() {
    check("qwen35");
}

/// Qwen3.5 through llama.cpp's converter (value heads reordered to tiled, `A_log` as
/// `-exp(A_log)`, norms with the 1 folded in).
#[test]
fn qwen35_gguf_matches_transformers() {
    let model = check_converted("qwen35");
    let d = model.config.delta_net.as_ref().unwrap();
    assert_eq!(d.layers, [true, true, true, false]);
    assert!(d.v_tiled);
}

#[test]
fn qwen35_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("qwen35");
}

/// Qwen3.5-MoE: the Qwen3.5 layers with 4 experts (top-2, renormalized) and a gated shared
/// expert in every layer.
#[test]
fn qwen35moe_matches_transformers() {
    check("qwen35moe");
}

#[test]
fn qwen35moe_gguf_matches_transformers() {
    check_converted_moe("qwen35moe");
}

#[test]
fn qwen35moe_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("qwen35moe");
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

#[test]
fn opt_config_errors_name_the_field() {
    config_error_names("opt", "do_layer_norm_before", |c| {
        c["do_layer_norm_before"] = false.into()
    });
    config_error_names("opt", "word_embed_proj_dim", |c| {
        c["word_embed_proj_dim"] = 16.into()
    });
    config_error_names("opt", "_remove_final_layer_norm", |c| {
        c["_remove_final_layer_norm"] = true.into()
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

/// The published Gemma 4 checkpoints are `Gemma4ForConditionalGeneration` folders: the text
/// model's config under `text_config`, its weights under `model.language_model.`, vision and
/// audio towers beside it (transformers 5.23's layout). The gemma4_shared fixture rewritten
/// so, with a vision tensor added, gives the plain folder's logits bit for bit; `mica convert`
/// refuses it naming the class.
#[test]
fn gemma4_for_conditional_generation_runs_its_text_model() {
    let src = dir("gemma4_shared");
    let tmp = std::env::temp_dir().join(format!("mica-gemma4-wrapped-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut text: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    text.as_object_mut().unwrap().remove("architectures");
    let cfg = serde_json::json!({
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 2},
        "audio_config": null,
        "tie_word_embeddings": true,
    });
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        src.join("generation_config.json"),
        tmp.join("generation_config.json"),
    )
    .unwrap();
    // The checkpoint's tensors renamed, and one of a vision tower.
    let st = mica_formats::SafetensorsFile::open(src.join("model.safetensors")).unwrap();
    let vision = [0u8; 16];
    let mut entries: Vec<(String, Vec<u64>, &[u8])> = st
        .tensors()
        .iter()
        .map(|t| {
            let name = t.name.replacen("model.", "model.language_model.", 1);
            (
                name,
                t.shape.iter().rev().copied().collect(),
                st.tensor_data(t),
            )
        })
        .collect();
    entries.push((
        "model.vision_tower.patch_embedder.input_proj.weight".into(),
        vec![2, 2],
        &vision,
    ));
    let (mut header, mut offset) = (serde_json::Map::new(), 0usize);
    for (name, shape, data) in &entries {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + data.len()]}),
        );
        offset += data.len();
    }
    let header = Value::Object(header).to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    for (_, _, data) in &entries {
        file.extend_from_slice(data);
    }
    std::fs::write(tmp.join("model.safetensors"), file).unwrap();

    let folder = HfFolder::open(&tmp).unwrap();
    let wrapped = mica_models::arch::load_hf(&folder).unwrap();
    let refused = mica_models::arch::to_gguf::GgufLayout::from_hf(&folder)
        .err()
        .expect("mica convert refuses the wrapper")
        .to_string();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(
        refused.contains("Gemma4ForConditionalGeneration"),
        "{refused}"
    );
    assert_eq!(wrapped.ple.as_ref().map(|p| p.dim), Some(8));
    let (plain, exp, _) = load("gemma4_shared");
    let seq = ids(&exp["sequences"][0]);
    let run = |m: &Model| {
        let pool = ThreadPool::new(2);
        let mut kv = KvCache::new(&m.config, 64, 1);
        let mut ws = Workspace::default();
        let b = Batch::for_sequence(&seq, 0, 0, true);
        m.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec()
    };
    assert_eq!(run(&wrapped), run(&plain), "the wrapped text model");
}

/// Qwen3.5 with DeltaNet heads of 128 (as published), against llama.cpp only: ggml's vector
/// kernels take their SIMD paths there (the tiny fixture's heads of 16 only their scalar
/// tails), and mica's DeltaNet arithmetic follows them.
#[test]
fn qwen35_wide_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("qwen35_wide");
}
