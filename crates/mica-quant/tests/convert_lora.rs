//! `mica convert --lora`: the PEFT adapter of `fixtures/lora/llama` merged into the tiny
//! LLaMA fixture, from its Hugging Face folder and from its GGUF (query and key rows permuted
//! by llama.cpp's converter), gives transformers + PEFT's logits within 1e-4 when written as
//! f32; merged tensors are quantized after merging, to their own type or the one asked for.

use mica_formats::GgufFile;
use mica_kernels::{DType, ThreadPool};
use mica_models::lora::LoraSpec;
use mica_models::{Batch, KvCache, Model, Workspace};
use mica_quant::{ConvertOptions, FileType, convert};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mica-lora-convert-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn lora_opts(ft: Option<FileType>) -> ConvertOptions {
    ConvertOptions {
        file_type: ft,
        threads: 2,
        lora: vec![LoraSpec {
            name: None,
            path: fixtures().join("lora/llama"),
            scale: 1.0,
        }],
        ..ConvertOptions::default()
    }
}

fn load(path: &Path) -> (Model, Arc<GgufFile>) {
    let file = Arc::new(GgufFile::open(path).unwrap());
    (mica_models::arch::load_gguf(file.clone()).unwrap(), file)
}

/// Max |Δ| of the model's logits over the adapter fixture's sequences against PEFT's.
fn max_diff(model: &Model) -> f32 {
    let d = fixtures().join("lora/llama");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("expected.json")).unwrap()).unwrap();
    let want: Vec<f32> = std::fs::read(d.join("logits.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let pool = ThreadPool::new(2);
    let mut got = Vec::new();
    for seq in exp["sequences"].as_array().unwrap() {
        let seq: Vec<u32> = seq
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let mut kv = KvCache::new(&model.config, 64, 1);
        let mut ws = Workspace::default();
        let b = Batch::for_sequence(&seq, 0, 0, true);
        got.extend_from_slice(model.forward(&pool, &b, &mut kv, &mut ws).unwrap());
    }
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

#[test]
fn merged_f32_conversion_matches_peft_from_a_folder_and_from_gguf() {
    for (src, name) in [
        (fixtures().join("hf/llama"), "from-folder.gguf"),
        (fixtures().join("hf/llama/model-f32.gguf"), "from-gguf.gguf"),
    ] {
        let out = scratch(name);
        convert(&src, &out, &lora_opts(None), &mut |_| {}).unwrap();
        let (model, _) = load(&out);
        let d = max_diff(&model);
        assert!(d <= 1e-4, "{}: max |Δlogit| {d:.2e}", src.display());
        // Without the adapter the logits are far off (the check can fail).
        let (base, _) = load(&fixtures().join("hf/llama/model-f32.gguf"));
        assert!(max_diff(&base) > 0.1);
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn merged_tensors_are_quantized_after_merging() {
    let q8_base = fixtures().join("lora/llama/base.q8_0.gguf");
    for (src, ft) in [
        (q8_base, None),
        (
            fixtures().join("hf/llama/model-f32.gguf"),
            Some(FileType::Q8_0),
        ),
    ] {
        let out = scratch("q8.gguf");
        convert(&src, &out, &lora_opts(ft), &mut |_| {}).unwrap();
        let (model, file) = load(&out);
        let t = file
            .tensors()
            .iter()
            .find(|t| t.name == "blk.0.attn_q.weight")
            .unwrap();
        assert_eq!(t.dtype(), Some(DType::Q8_0), "{}", src.display());
        // Merged then rounded to Q8_0: near PEFT's logits (a small fraction of how far the
        // base without the adapter is from them).
        let d = max_diff(&model);
        let (base, _) = load(&src);
        let off = max_diff(&base);
        assert!(
            d < off / 5.0,
            "{}: max |Δlogit| {d} (without the adapter {off})",
            src.display()
        );
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn a_folder_that_is_no_adapter_is_refused_and_writes_nothing() {
    let out = scratch("refused.gguf");
    // A model folder is no adapter.
    let mut opts = lora_opts(None);
    opts.lora[0].path = fixtures().join("hf/qwen3");
    let e = convert(&fixtures().join("hf/llama"), &out, &opts, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("adapter_config.json"), "{e}");
    assert!(!out.exists());
}
