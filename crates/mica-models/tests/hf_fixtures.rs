//! Hugging Face folders of tiny random models against transformers (fixtures/hf, written by
//! fixtures/hf/make_fixtures.py): for each family, mica loads the safetensors folder through
//! the family's name table and config.json, and its logits at every position of the fixture
//! sequences must match transformers' float32 logits within [`MAX_ABS`]; its greedy
//! continuation must equal transformers' token for token.
//!
//! mica keeps llama.cpp's numerics — f16 KV cache, f16 query in the attention dot products,
//! GELU through an f16 table — so its logits are not transformers' float32 logits bit for
//! bit; the tolerance is the distance those roundings make on these models, measured and
//! printed per family.

use mica_kernels::ThreadPool;
use mica_models::blocks::attention::AttentionPolicy;
use mica_models::hf::HfFolder;
use mica_models::{Batch, KvCache, Model, Workspace};
use serde_json::Value;
use std::path::PathBuf;

/// Largest |mica − transformers| allowed on any logit.
const MAX_ABS: f32 = 1e-2;

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

/// A copy of a fixture folder whose config.json `edit` changes; the load error must name
/// `field`.
fn config_error_names(family: &str, field: &str, edit: impl Fn(&mut Value)) {
    let src = dir(family);
    let tmp =
        std::env::temp_dir().join(format!("mica-cfg-{family}-{field}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), tmp.join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    let err = HfFolder::open(&tmp)
        .and_then(|f| mica_models::arch::load_hf(&f))
        .err()
        .unwrap_or_else(|| panic!("{family}: loads despite the bad {field}"))
        .to_string();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(
        err.contains(field),
        "{family}: error does not name {field}: {err}"
    );
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
