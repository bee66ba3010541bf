//! Clear errors from Hugging Face folders: an unsupported `architectures` value names itself
//! and the supported list; a config missing a required field names the field; a missing
//! tensor names the file and the tensor. (Shards: see mica-formats' safetensors tests.)

use mica_models::hf::HfFolder;
use std::path::{Path, PathBuf};

/// A copy of the tiny Qwen3 fixture folder with `edit` applied to its config.json.
fn folder(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    folder_of("qwen3", name, edit)
}

/// A copy of a tiny fixture folder with `edit` applied to its config.json.
fn folder_of(family: &str, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(family);
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

#[test]
fn unsupported_gpt2_options_are_named() {
    let d = folder_of("gpt2", "gpt2-scale", |c| {
        c["scale_attn_by_inverse_layer_idx"] = true.into()
    });
    let e = load_err(&d);
    assert!(e.contains("scale_attn_by_inverse_layer_idx"), "{e}");
    let d = folder_of("gpt2", "gpt2-act", |c| {
        c["activation_function"] = "relu".into()
    });
    let e = load_err(&d);
    assert!(
        e.contains("activation_function") && e.contains("relu"),
        "{e}"
    );
}

#[test]
fn positions_past_learned_embeddings_are_an_error() {
    let d = folder_of("gpt2", "gpt2-pos", |_| {});
    let model = mica_models::arch::load_hf(&HfFolder::open(&d).unwrap()).unwrap();
    let n_pos = model.pos_embd.as_ref().unwrap().rows;
    let pool = mica_kernels::ThreadPool::new(1);
    let mut kv = mica_models::KvCache::new(&model.config, n_pos + 8, 1);
    let mut ws = mica_models::Workspace::default();
    let prompt = vec![5u32; n_pos + 1];
    let e = model
        .forward(
            &pool,
            &mica_models::Batch::for_sequence(&prompt, 0, 0, false),
            &mut kv,
            &mut ws,
        )
        .expect_err("a position past the table");
    assert!(e.to_string().contains("learned position"), "{e}");
}
