//! Shared by the Hugging Face fixture tests (`hf_fixtures.rs`, `hf_fixtures_gemma4_qwen35.rs`):
//! loading a fixture, comparing logits and greedy tokens with transformers' and llama.cpp's.
#![allow(dead_code)]

pub use mica_kernels::ThreadPool;
pub use mica_models::blocks::attention::AttentionPolicy;
pub use mica_models::hf::HfFolder;
pub use mica_models::{Batch, KvCache, Model, Workspace};
pub use serde_json::Value;
pub use std::path::PathBuf;

/// Largest |mica − transformers| allowed on any logit.
pub const MAX_ABS: f32 = 1e-4;

pub fn dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(family)
}

pub fn load(family: &str) -> (Model, Value, Vec<f32>) {
    let d = dir(family);
    let folder = HfFolder::open(&d).unwrap_or_else(|e| panic!("{family}: {e}"));
    let model = mica_models::arch::load_hf(&folder).unwrap_or_else(|e| panic!("{family}: {e}"));
    let (exp, logits) = expected(&d);
    (model, exp, logits)
}

/// `expected.json` and the logits file it names.
pub fn expected(d: &std::path::Path) -> (Value, Vec<f32>) {
    let exp: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("expected.json")).unwrap()).unwrap();
    let logits = read_f32(&d.join(exp["logits_file"].as_str().unwrap()));
    (exp, logits)
}

pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Max |Δ| between mica's logits for `seq` (a cache of `n_ctx` tokens) and `want`.
pub fn max_diff(family: &str, model: &Model, seq: &[u32], n_ctx: usize, want: &[f32]) -> f32 {
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

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

pub fn check(family: &str) {
    let (model, exp, want) = load(family);
    check_model(family, &model, &exp, &want);
}

pub fn check_model(family: &str, model: &Model, exp: &Value, want: &[f32]) {
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

/// Fixtures converted to GGUF by llama.cpp's convert_hf_to_gguf.py (fixtures/converted: MoE
/// with stacked `ffn_*_exps` experts, LongRoPE factors as tensors) against transformers on
/// the converted model.
pub fn check_converted(family: &str) -> Model {
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

pub fn check_converted_moe(family: &str) {
    let model = check_converted(family);
    assert!(
        model
            .layers
            .iter()
            .any(|l| matches!(l.ffn, mica_models::model::Ffn::Moe(_))),
        "{family}: no sparse layer"
    );
}

/// The converted MoE fixtures quantized to Q8_0 by llama.cpp: mica's greedy continuation
/// equals llama.cpp's on the same file, and its logits along the path match llama.cpp's
/// (fixtures/converted/llama_cpp_ref.py recorded both; measured identical).
pub fn check_llama_cpp_q8(family: &str) {
    check_llama_cpp_ref(family, "llama_cpp.json", (0, 0.0));
}

/// [`check_llama_cpp_q8`] for the reference `json` (of fixtures/converted/<family>/) and
/// the file it names; `(n, tol)`: up to `n` positions may differ from llama.cpp's logits by
/// up to `tol` instead of 1e-4.
pub fn check_llama_cpp_ref(family: &str, json: &str, (n_off, tol): (usize, f32)) {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/converted")
        .join(family);
    let refj: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join(json)).unwrap()).unwrap();
    let label = refj["gguf"].as_str().unwrap();
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
        "{family} {label}: greedy tokens differ from llama.cpp's"
    );
    let lc = read_f32(&d.join(refj["logits_file"].as_str().unwrap()));
    assert_eq!(lc.len(), all.len(), "{family}: llama.cpp logits size");
    let mut per_pos: Vec<f32> = all
        .chunks_exact(v)
        .zip(lc.chunks_exact(v))
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        })
        .collect();
    per_pos.sort_by(|a, b| b.total_cmp(a));
    let off = per_pos.iter().take_while(|&&d| d > 1e-4).count();
    assert!(
        off <= n_off && per_pos[0] <= tol.max(1e-4),
        "{family} {label}: {off} positions off llama.cpp's logits, the worst by {:.2e}",
        per_pos[0]
    );
    let worst = per_pos[off.min(per_pos.len() - 1)];
    println!(
        "{family} {label}: greedy identical, max |Δlogit| vs llama.cpp {worst:.1e} \
         (beyond {off} positions off by up to {:.1e})",
        per_pos[0]
    );
    assert!(
        worst <= 1e-4,
        "{family} {label}: max |Δlogit| vs llama.cpp {worst:.2e}"
    );
}

/// A copy of a fixture folder whose config.json `edit` changes; the load error must name
/// `field`.
/// The fixture `family` with `edit` applied to its config.json, loaded (the copy removed).
pub fn load_edited(
    family: &str,
    tag: &str,
    edit: impl Fn(&mut Value),
) -> mica_models::Result<Model> {
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
pub fn config_error_names(family: &str, field: &str, edit: impl Fn(&mut Value)) -> String {
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

pub fn tiled_prefill_matches_token_by_token(family: &str) {
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
pub fn check_gguf(family: &str) {
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
