//! Clear errors from Hugging Face folders: an unsupported `architectures` value names itself
//! and the supported list; a config missing a required field names the field; a missing
//! tensor names the file and the tensor. (Shards: see mica-formats' safetensors tests.)

use mica_models::hf::HfFolder;
use std::path::{Path, PathBuf};

/// A copy of the tiny Qwen3 fixture folder with `edit` applied to its config.json.
fn folder(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf/qwen3");
    let dst = std::env::temp_dir().join(format!("mica-hf-err-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let p = dst.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&p, serde_json::to_vec(&cfg).unwrap()).unwrap();
    dst
}

fn load_err(dir: &Path) -> String {
    let f = HfFolder::open(dir).unwrap();
    match mica_models::arch::load_hf(&f) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_architecture_names_itself_and_the_supported_list() {
    let d = folder("arch", |c| {
        c["architectures"] = serde_json::json!(["FancyNetForCausalLM"])
    });
    let e = load_err(&d);
    assert!(e.contains("FancyNetForCausalLM"), "{e}");
    assert!(
        e.contains("Qwen3ForCausalLM") && e.contains("gemma3"),
        "{e}"
    );
}

#[test]
fn missing_required_field_is_named() {
    let d = folder("field", |c| {
        c.as_object_mut().unwrap().remove("num_attention_heads");
    });
    let e = load_err(&d);
    assert!(
        e.contains("num_attention_heads") && e.contains("config.json"),
        "{e}"
    );
}

#[test]
fn missing_tensor_names_the_file_and_tensor() {
    // A Qwen3 checkpoint declared as Gemma 3: Gemma 3's name table asks for tensors
    // (`pre_feedforward_layernorm`, ...) the checkpoint does not have.
    let d = folder("tensor", |c| {
        c["architectures"] = serde_json::json!(["Gemma3ForCausalLM"])
    });
    let e = load_err(&d);
    assert!(e.contains("model.layers.0."), "{e}");
    assert!(e.contains(&d.display().to_string()), "{e}");
}
