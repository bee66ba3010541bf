//! LoRA adapters made with PEFT (`fixtures/lora/make_lora.py`) on the Hugging Face fixtures:
//! mica's float32 logits with the adapter applied unmerged and merged, against transformers
//! + PEFT's, within [`MAX_ABS`] at every position, and the greedy continuation identical.

mod common;
mod hf_common;
use hf_common::*;
use mica_models::LoraAdapter;

fn lora_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/lora")
        .join(name)
}

/// The base fixture with adapter `name` (unmerged or merged) and the adapter's expectations.
fn adapted(name: &str, merged: bool) -> (Model, Value, Vec<f32>) {
    let d = lora_dir(name);
    let (exp, want) = expected(&d);
    let base = exp["base"]
        .as_str()
        .unwrap()
        .trim_start_matches("fixtures/hf/");
    let (mut model, _, base_logits) = load(base);
    let adapter = LoraAdapter::open(&d, &model, 1.0).unwrap_or_else(|e| panic!("{name}: {e}"));
    if merged {
        model.merge_lora(&adapter).unwrap();
    } else {
        model.attach_lora(&adapter).unwrap();
    }
    // The adapter changes the output well beyond the tolerance (else the check proves
    // nothing).
    let moved = want
        .iter()
        .zip(&base_logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        moved > 0.1,
        "{name}: the adapter moves logits by only {moved}"
    );
    (model, exp, want)
}

#[test]
fn peft_lora_unmerged_matches_transformers() {
    let (model, exp, want) = adapted("llama", false);
    check_model("llama+lora", &model, &exp, &want);
}

#[test]
fn peft_lora_merged_matches_transformers() {
    let (model, exp, want) = adapted("llama", true);
    check_model("llama+lora merged", &model, &exp, &want);
}

#[test]
fn peft_rslora_on_some_projections_matches_transformers() {
    let (model, exp, want) = adapted("qwen2_rslora", false);
    check_model("qwen2+rslora", &model, &exp, &want);
    let (model, exp, want) = adapted("qwen2_rslora", true);
    check_model("qwen2+rslora merged", &model, &exp, &want);
}

/// Twice the adapter at half scale each is the adapter once.
#[test]
fn scales_add_up() {
    let d = lora_dir("llama");
    let (exp, want) = expected(&d);
    let (mut model, _, _) = load("llama");
    for _ in 0..2 {
        let half = LoraAdapter::open(&d, &model, 0.5).unwrap();
        model.attach_lora(&half).unwrap();
    }
    check_model("llama+lora/2+lora/2", &model, &exp, &want);
}

/// An adapter for another model, a malformed config and unsupported options are refused
/// with the reason.
#[test]
fn mismatched_or_unsupported_adapters_are_refused() {
    // llama's adapter has q/k/v updates of llama's sizes; qwen3's heads are wider.
    let (qwen, _, _) = load("qwen3");
    // Phi-3 stores q, k, v fused (`qkv_proj`): no `q_proj` to update.
    let (phi3, _, _) = load("phi3");
    let tmp = std::env::temp_dir().join(format!("mica-lora-test-{}", std::process::id()));
    let copy = |edit: &dyn Fn(&mut Value)| {
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        let src = lora_dir("llama");
        std::fs::copy(
            src.join("adapter_model.safetensors"),
            tmp.join("adapter_model.safetensors"),
        )
        .unwrap();
        let mut c: Value = serde_json::from_str(
            &std::fs::read_to_string(src.join("adapter_config.json")).unwrap(),
        )
        .unwrap();
        edit(&mut c);
        std::fs::write(tmp.join("adapter_config.json"), c.to_string()).unwrap();
    };
    let err_of = |m: &Model| match LoraAdapter::open(&tmp, m, 1.0) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    let (llama, _, _) = load("llama");
    copy(&|_| {});
    let e = err_of(&qwen);
    assert!(e.contains("shape"), "{e}");
    let e = err_of(&phi3);
    assert!(e.contains("not a projection mica knows"), "{e}");
    copy(&|c| c["use_dora"] = true.into());
    let e = err_of(&llama);
    assert!(e.contains("use_dora"), "{e}");
    copy(&|c| c["bias"] = "all".into());
    let e = err_of(&llama);
    assert!(e.contains("bias"), "{e}");
    copy(&|c| c["r"] = 0.into());
    let e = err_of(&llama);
    assert!(e.contains("'r'") || e.contains(" r"), "{e}");
    std::fs::write(tmp.join("adapter_config.json"), "{not json").unwrap();
    let e = err_of(&llama);
    assert!(e.contains("adapter_config.json"), "{e}");
    std::fs::remove_dir_all(&tmp).unwrap();
    let e = LoraAdapter::open(&lora_dir("nope"), &llama, 1.0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no such adapter"), "{e}");
    // A GGUF base whose q/k rows are permuted and whose heads differ (SmolLM2: 9 heads of
    // 64): a shape error, not a failed permutation.
    let smol = common::model_path(common::SMOLLM);
    let file = mica_formats::GgufFile::open(&smol).unwrap();
    let smol = mica_models::arch::load_gguf(std::sync::Arc::new(file)).unwrap();
    let e = LoraAdapter::open(&lora_dir("llama"), &smol, 1.0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("shape"), "{e}");
}

/// The PEFT adapter on the base as llama.cpp's converter wrote it (GGUF, f32, query and key
/// rows permuted for adjacent-pair RoPE): the updates of q and k are permuted alike.
#[test]
fn peft_lora_on_a_gguf_base_matches_transformers() {
    let d = lora_dir("llama");
    let (exp, want) = expected(&d);
    let gguf = dir("llama").join("model-f32.gguf");
    let file = std::sync::Arc::new(mica_formats::GgufFile::open(&gguf).unwrap());
    let mut model = mica_models::arch::load_gguf(file).unwrap();
    let adapter = LoraAdapter::open(&d, &model, 1.0).unwrap();
    model.attach_lora(&adapter).unwrap();
    let mut exp = exp;
    exp["architecture"] = model.config.arch.clone().into();
    check_model("llama gguf+lora", &model, &exp, &want);
}

/// mica's greedy continuation of `prompt` (one token at a time).
fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::new(&model.config, 64, 1);
    let mut ws = Workspace::default();
    let mut logits = model
        .forward(
            &pool,
            &Batch::for_sequence(prompt, 0, 0, false),
            &mut kv,
            &mut ws,
        )
        .unwrap()
        .to_vec();
    let mut out = Vec::new();
    for i in 0..n {
        let t = argmax(&logits);
        out.push(t);
        logits = model
            .forward(
                &pool,
                &Batch::for_sequence(&[t], prompt.len() + i, 0, true),
                &mut kv,
                &mut ws,
            )
            .unwrap()
            .to_vec();
    }
    out
}

/// llama.cpp's own LoRA files (its converter's output for the PEFT adapter, f32 and f16) on
/// a base quantized to Q8_0 by llama.cpp give llama.cpp's greedy tokens with each; so does
/// the PEFT folder itself (f32) on the same base.
#[test]
fn gguf_lora_on_a_q8_0_base_matches_llama_cpp() {
    let d = lora_dir("llama");
    let refs: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("llama_cpp.json")).unwrap()).unwrap();
    let (prompt, want) = (ids(&refs["prompt"]), ids(&refs["tokens"]));
    let base = || {
        let file = mica_formats::GgufFile::open(d.join("base.q8_0.gguf")).unwrap();
        mica_models::arch::load_gguf(std::sync::Arc::new(file)).unwrap()
    };
    let plain = base();
    assert_eq!(
        greedy(&plain, &prompt, want.len()),
        ids(&refs["tokens_without_lora"]),
        "base without adapter"
    );
    // The f16 file (llama.cpp's converter's default type) takes its own path: its products
    // round the activations to f16, in mica as in ggml.
    let want_f16 = ids(&refs["tokens_f16_adapter"]);
    assert_ne!(want_f16, want);
    for (src, want) in [
        (d.join("adapter-f32.gguf"), &want),
        (d.clone(), &want),
        (d.join("adapter-f16.gguf"), &want_f16),
    ] {
        let mut model = base();
        let adapter = LoraAdapter::open(&src, &model, 1.0).unwrap();
        assert_eq!(adapter.targets.len(), 14, "{}", src.display());
        model.attach_lora(&adapter).unwrap();
        let got = greedy(&model, &prompt, want.len());
        assert_eq!(&got, want, "{}", src.display());
    }
}
