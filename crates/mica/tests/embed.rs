//! Embeddings against llama.cpp's on the same GGUF files: for every pooling (mean, last,
//! CLS) and every text of fixtures/embeddings/<model>.json (written by
//! fixtures/embeddings/llama_cpp_ref.py through llama-cpp-python), the same tokens and a
//! normalized vector with cosine similarity ≥ 0.9999 to llama.cpp's.

use mica::engine::embed::cosine;
use mica::{EmbedOptions, Model, Pooling};
use std::path::PathBuf;

fn models_dir() -> PathBuf {
    PathBuf::from(
        std::env::var_os("MICA_TEST_MODELS")
            .expect("MICA_TEST_MODELS is not set: run scripts/test, which fetches the test models"),
    )
}

fn check(name: &str) {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/embeddings")
        .join(format!("{name}.json"));
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&fixture).expect("fixture")).expect("fixture JSON");
    let model = Model::open(models_dir().join(format!("{name}.gguf"))).expect("model");
    let texts: Vec<String> = want["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .map(|t| t.as_str().expect("text").to_string())
        .collect();
    for pooling in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
        let p = pooling.as_str();
        let opts = EmbedOptions {
            pooling: Some(pooling),
            n_ctx: Some(512),
            threads: Some(2),
            ..Default::default()
        };
        let got = model.embed(&texts, &opts).expect("embed");
        for (i, text) in texts.iter().enumerate() {
            let tokens: Vec<u32> = want[format!("{p}_tokens")][i]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| t.as_u64().expect("token") as u32)
                .collect();
            assert_eq!(model.tokenize(text).expect("tokenize"), tokens, "{text:?}");
            let reference: Vec<f32> = want[p][i]
                .as_array()
                .expect("vector")
                .iter()
                .map(|x| x.as_f64().expect("float") as f32)
                .collect();
            assert_eq!(got[i].len(), reference.len());
            let norm: f64 = got[i].iter().map(|&x| x as f64 * x as f64).sum();
            assert!((norm - 1.0).abs() < 1e-5, "not normalized: {norm}");
            let cos = cosine(&got[i], &reference);
            eprintln!("{name} {p} text {i}: cosine {cos:.7}");
            assert!(cos >= 0.9999, "{name} {p} {text:?}: cosine {cos}");
        }
    }
}

#[test]
fn smollm2_embeddings_match_llama_cpp() {
    check("smollm2-135m-instruct-q4_1");
}

#[test]
fn qwen_embeddings_match_llama_cpp() {
    check("qwen2.5-coder-0.5b-instruct-awq-q4_k_m");
}

#[test]
fn default_pooling_is_last_and_unnormalized_keeps_the_direction() {
    let model = Model::open(models_dir().join("smollm2-135m-instruct-q4_1.gguf")).expect("model");
    let base = EmbedOptions {
        n_ctx: Some(64),
        threads: Some(2),
        ..Default::default()
    };
    let e = model.embedder(&base).expect("embedder");
    assert_eq!(e.pooling(), Pooling::Last);
    let text = ["hello there"];
    let normed = model.embed(&text, &base).expect("embed");
    let raw = model
        .embed(
            &text,
            &EmbedOptions {
                normalize: false,
                ..base
            },
        )
        .expect("embed");
    let norm: f64 = raw[0].iter().map(|&x| x as f64 * x as f64).sum::<f64>();
    assert!(
        (norm - 1.0).abs() > 1e-3,
        "raw vector is already unit length"
    );
    assert!(cosine(&normed[0], &raw[0]) > 0.999_999);
    // Too long and empty inputs are errors, not truncations.
    let long = "word ".repeat(200);
    assert!(matches!(
        model.embed(&[long], &base),
        Err(mica::Error::Embed(mica::engine::EmbedError::TooLong { .. }))
    ));
}
