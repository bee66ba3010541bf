//! Every registered family converts from a Hugging Face folder: each tiny fixture under
//! `fixtures/hf` (and the folders llama.cpp's converter read, `fixtures/converted/*/hf`) is
//! converted with `mica convert DIR -o x.gguf --type f32`, and the GGUF must give the
//! folder's logits at every position of the fixture sequences and the same greedy tokens.
//! Where llama.cpp's own converter wrote a GGUF of the same folder, the two files must hold
//! the same tensors (names, shapes, types, bytes) and every `general.architecture` /
//! `{arch}.*` key llama.cpp wrote must be in mica's with the same value. Folders GGUF cannot
//! describe faithfully must fail with an error naming why.

mod common;

use common::*;
use mica::formats::{GgufFile, MetaValue};
use mica::kernels::ThreadPool;
use mica::models::blocks::attention::AttentionPolicy;
use mica::models::hf::HfFolder;
use mica::models::{Batch, KvCache, Model, Workspace};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Fixtures whose conversion must fail, and a phrase the error must contain.
const REFUSED: &[(&str, &str)] = &[
    // query_pre_attn_scalar 24 ≠ head_dim; layer_types not llama.cpp's every-6th pattern.
    ("gemma3", "layer_types"),
    // mlp_only_layers = [1]: llama.cpp's MoE graphs have no dense layers.
    ("qwen2moe", "mlp_only_layers"),
    ("qwen3moe", "mlp_only_layers"),
    // NoPE layers 1 and 3: llama.cpp's smollm3 fixes every 4th layer, and GGUF has no key.
    ("smollm3", "no_rope_layers"),
    // mica's converter does not write Gated DeltaNet layers (llama.cpp's does).
    ("qwen35", "Gated DeltaNet"),
    ("qwen35moe", "Gated DeltaNet"),
    // llama.cpp has no OPT architecture.
    ("opt", "no OPT architecture"),
    ("opt350", "no OPT architecture"),
    ("codegen", "no CodeGen architecture"),
    // DeepSeek-V2's groups ranked by their best expert; llama.cpp ranks them by their best two.
    ("deepseek2", "best two experts"),
    // mica's converter does not write gpt-oss yet (llama.cpp's does).
    ("gptoss", "writing gpt-oss as GGUF is not supported"),
    (
        "converted/gptoss",
        "writing gpt-oss as GGUF is not supported",
    ),
];

/// Families whose folders mica's converter refuses (every fixture of theirs is in
/// `REFUSED`): llama.cpp's converter writes their GGUF files.
const NOT_CONVERTED: &[&str] = &["qwen35", "qwen35moe", "opt", "codegen", "gptoss"];

/// Fixtures whose sliding window GGUF `llama` cannot say (dropped with a warning): compared
/// on the positions within the window only.
const WINDOW_DROPPED: &[(&str, usize)] = &[("mistral", 5), ("mixtral", 5)];

/// The folders: `fixtures/hf/<name>` and `fixtures/converted/<name>/hf`.
fn folders() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for (root, sub) in [("fixtures/hf", ""), ("fixtures/converted", "hf")] {
        let mut names: Vec<_> = std::fs::read_dir(workspace().join(root))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join(sub).join("config.json").is_file())
            .collect();
        names.sort();
        for p in names {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let label = if sub.is_empty() {
                name
            } else {
                format!("converted/{name}")
            };
            out.push((label, p.join(sub)));
        }
    }
    out
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

/// Logits at every position of `seq`, `[len, n_vocab]`.
fn logits(model: &Model, seq: &[u32]) -> Vec<f32> {
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::new(&model.config, 64, 1);
    let mut ws = Workspace::default();
    ws.attention = AttentionPolicy::Vector;
    let b = Batch::for_sequence(seq, 0, 0, true);
    model.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec()
}

/// `n` greedy tokens after `prompt`.
fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::new(&model.config, 64, 1);
    let mut ws = Workspace::default();
    let b = Batch::for_sequence(prompt, 0, 0, false);
    let mut last = model.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec();
    let mut out = Vec::new();
    for step in 0..n {
        let t = argmax(&last);
        out.push(t);
        let b = Batch::for_sequence(&[t], prompt.len() + step, 0, false);
        last = model.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec();
    }
    out
}

/// The fixture's `expected.json` (next to the folder, or one level up for `converted/*/hf`).
fn expected(dir: &Path) -> Value {
    let p = [dir.join("expected.json"), dir.join("../expected.json")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap();
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Converts `dir` to F32 GGUF and checks it against the folder; returns the GGUF path.
fn converts_to_the_same_model(label: &str, dir: &Path, window: Option<usize>) -> PathBuf {
    let out = scratch("convert-hf-families").join(format!("{}.gguf", label.replace('/', "_")));
    let warnings = convert(dir, &out, &["--type", "f32"]);
    assert_eq!(
        window.is_some(),
        warnings.contains("sliding window"),
        "{label}: {warnings}"
    );
    let folder = mica::models::arch::load_hf(&HfFolder::open(dir).unwrap()).unwrap();
    let gguf = mica::models::arch::load_gguf(Arc::new(GgufFile::open(&out).unwrap()))
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_eq!(gguf.config.numerics, folder.config.numerics, "{label}");
    let exp = expected(dir);
    let mut worst = 0f32;
    for seq in exp["sequences"].as_array().unwrap() {
        let mut seq = ids(seq);
        if let Some(w) = window {
            seq.truncate(w);
        }
        let (a, b) = (logits(&folder, &seq), logits(&gguf, &seq));
        assert_eq!(a.len(), b.len(), "{label}");
        for (x, y) in a.iter().zip(&b) {
            worst = worst.max((x - y).abs());
        }
    }
    println!("{label}: GGUF vs folder max |Δlogit| {worst:.1e}");
    assert!(worst <= 1e-4, "{label}: max |Δlogit| {worst:.2e}");
    if window.is_none() {
        let prompt = ids(&exp["greedy_prompt"]);
        let n = exp["greedy_ids"].as_array().unwrap().len();
        let g = greedy(&gguf, &prompt, n);
        assert_eq!(g, greedy(&folder, &prompt, n), "{label}: greedy tokens");
        assert_eq!(
            g,
            ids(&exp["greedy_ids"]),
            "{label}: transformers' greedy tokens"
        );
    }
    out
}

/// mica's GGUF against llama.cpp's for the same folder.
fn matches_llama_cpp(label: &str, ours: &Path, theirs: &Path) {
    let (a, b) = (
        GgufFile::open(ours).unwrap(),
        GgufFile::open(theirs).unwrap(),
    );
    let arch = b.get_str("general.architecture").unwrap().to_string();
    let ours_md: Vec<&(String, MetaValue)> = a.metadata_entries().iter().collect();
    let mut n_keys = 0;
    for (k, v) in b.metadata_entries() {
        if !(k == "general.architecture" || k.starts_with(&format!("{arch}."))) {
            continue;
        }
        n_keys += 1;
        let mine = ours_md.iter().find(|(m, _)| m == k).map(|e| &e.1);
        assert_eq!(mine, Some(v), "{label}: key {k}");
    }
    let mut theirs_t: Vec<_> = b.tensors().iter().collect();
    let mut ours_t: Vec<_> = a.tensors().iter().collect();
    theirs_t.sort_by(|x, y| x.name.cmp(&y.name));
    ours_t.sort_by(|x, y| x.name.cmp(&y.name));
    let names = |v: &[&mica::formats::TensorInfo]| v.iter().map(|t| t.name.clone()).collect();
    let (on, tn): (Vec<String>, Vec<String>) = (names(&ours_t), names(&theirs_t));
    assert_eq!(on, tn, "{label}: tensor names");
    for (x, y) in ours_t.iter().zip(&theirs_t) {
        assert_eq!(
            (&x.shape, x.ggml_type),
            (&y.shape, y.ggml_type),
            "{label}: {}",
            x.name
        );
        assert!(
            a.tensor_data(x) == b.tensor_data(y),
            "{label}: bytes of {}",
            x.name
        );
    }
    println!(
        "{label}: {} tensors byte-identical to llama.cpp's, its {n_keys} {arch} keys equal",
        ours_t.len()
    );
}

#[test]
fn every_fixture_converts_or_is_refused_with_the_reason() {
    let mut converted = Vec::new();
    for (label, dir) in folders() {
        let name = label.rsplit('/').next().unwrap();
        if let Some((_, why)) = REFUSED.iter().find(|(n, _)| *n == label) {
            let out = scratch("convert-hf-families").join(format!("{name}-refused.gguf"));
            let (ok, _, err) = mica(&[
                "convert",
                dir.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ]);
            let class = expected(&dir)["architecture"].as_str().unwrap().to_string();
            assert!(
                !ok && err.contains(why) && err.contains(&class),
                "{label}: {err}"
            );
            assert!(!out.exists(), "{label}: an output was written");
            println!("{label}: refused: {}", err.trim());
            continue;
        }
        let window = WINDOW_DROPPED
            .iter()
            .find(|(n, _)| *n == label)
            .map(|e| e.1);
        let out = converts_to_the_same_model(&label, &dir, window);
        // llama.cpp's converter output for the same folder, where the fixtures have one.
        for theirs in [dir.join("model-f32.gguf"), dir.join("../model.f32.gguf")] {
            if theirs.is_file() {
                matches_llama_cpp(&label, &out, &theirs);
            }
        }
        converted.push(label);
    }
    // Every registered family converted at least one fixture.
    let classes: Vec<String> = folders()
        .iter()
        .filter(|(l, _)| converted.contains(l))
        .map(|(_, d)| expected(d)["architecture"].as_str().unwrap().to_string())
        .collect();
    for family in mica::models::arch::REGISTRY {
        if NOT_CONVERTED.contains(&family.name) {
            continue;
        }
        assert!(
            family
                .hf_classes
                .iter()
                .any(|c| classes.iter().any(|x| x == c)),
            "family {} has no converted fixture",
            family.name
        );
    }
}

#[test]
fn unknown_architectures_name_the_supported_ones() {
    let dir = scratch("convert-hf-unknown").join("folder");
    std::fs::create_dir_all(&dir).unwrap();
    let src = workspace().join("fixtures/hf/llama");
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["architectures"] = serde_json::json!(["FalconForCausalLM"]);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let out = dir.join("x.gguf");
    let (ok, _, err) = mica(&[
        "convert",
        dir.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("FalconForCausalLM") && err.contains("Gemma2ForCausalLM"),
        "{err}"
    );
    assert!(!out.exists());
}
