//! SentencePiece-style `tokenizer.json` files (fixtures/tokenizers, written by
//! fixtures/tokenizers/make_spm_json.py): BPE with byte fallback and `▁` for spaces, in the
//! three layouts transformers writes (LLaMA-2 legacy `Prepend` + `Replace`, `Metaspace`
//! "first", Gemma's `Replace`). mica's ids must equal the Hugging Face `tokenizers` ids for
//! every test string (special tokens in the text parsed, none added), and decoding them must
//! give the text back.

use mica_models::tokenizer::hf_json::spec_from_hf;
use mica_models::tokenizer::{SpacePrefix, TokenType, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

fn read(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn check(variant: &str) {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tokenizers")
        .join(variant);
    let spec = spec_from_hf(
        &read(d.join("tokenizer.json")),
        Some(&read(d.join("tokenizer_config.json"))),
        None,
    )
    .unwrap_or_else(|e| panic!("{variant}: {e}"));
    assert_eq!(spec.model, "llama", "{variant}: SentencePiece-style");
    let tok = Tokenizer::from_spec(&spec).unwrap_or_else(|e| panic!("{variant}: {e}"));
    let byte_a = tok.token_id("<0x41>").expect("byte token");
    assert_eq!(tok.token_type(byte_a), Some(TokenType::Byte), "{variant}");
    let exp = read(d.join("expected.json"));
    let mut n = 0;
    for case in exp["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, false, true).unwrap();
        assert_eq!(got, want, "{variant}: ids of {text:?}");
        let back = tok.decode(&got).unwrap();
        let prefixed = spec.add_space_prefix == Some(true)
            && (spec.space_prefix_rule == SpacePrefix::EveryFragment || !text.starts_with(' '));
        // The space prefix decodes as a space (llama.cpp's pieces, no strip).
        let text_back = back.strip_prefix(' ').filter(|_| prefixed).unwrap_or(&back);
        if !text.contains('<') {
            assert_eq!(text_back, text, "{variant}: decoding {text:?}");
        }
        n += 1;
    }
    // With BOS: the config's `add_bos_token`.
    let ids = tok.encode("Hello", true, false).unwrap();
    assert_eq!(ids[0], tok.bos().unwrap(), "{variant}: BOS first");
    println!("{variant}: {n} strings, ids identical to HF tokenizers");
}

#[test]
fn llama_legacy_tokenizer_json_matches_hf() {
    check("llama-legacy");
}

#[test]
fn llama_metaspace_tokenizer_json_matches_hf() {
    check("llama-metaspace");
}

#[test]
fn gemma_tokenizer_json_matches_hf() {
    check("gemma");
}

/// A normalizer mica does not implement is an error naming it, not a silent mismatch.
#[test]
fn unsupported_normalizer_is_an_error() {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizers/gemma");
    let mut tok = read(d.join("tokenizer.json"));
    tok["normalizer"] = serde_json::json!({"type": "NFKC"});
    let err = spec_from_hf(&tok, None, None).unwrap_err().to_string();
    assert!(err.contains("NFKC"), "{err}");
}

/// A real SentencePiece-style tokenizer.json: Gemma 3's, as transformers writes it from the
/// GGUF (`python fixtures/tokenizers/make_spm_json.py --real-gemma MODELS_DIR OUT_DIR`, not
/// committed: 32 MB). mica's ids from it equal HF's, and equal mica's (llama.cpp's) from the
/// GGUF. Run: `MICA_HF_GEMMA_TOK=OUT_DIR MICA_TEST_MODELS=MODELS_DIR cargo test -p mica-models
/// --test hf_tokenizer_spm -- --ignored`.
#[test]
#[ignore]
fn real_gemma_tokenizer_json_matches_hf_and_gguf() {
    let d = PathBuf::from(std::env::var_os("MICA_HF_GEMMA_TOK").expect("set MICA_HF_GEMMA_TOK"));
    let models = PathBuf::from(std::env::var_os("MICA_TEST_MODELS").expect("set MICA_TEST_MODELS"));
    let spec = spec_from_hf(
        &read(d.join("tokenizer.json")),
        Some(&read(d.join("tokenizer_config.json"))),
        None,
    )
    .unwrap();
    let tok = Tokenizer::from_spec(&spec).unwrap();
    let gguf = mica_formats::GgufFile::open(models.join("gemma3-270m-q4_k_m.gguf")).unwrap();
    let from_gguf = Tokenizer::from_gguf(&gguf).unwrap();
    let exp = read(d.join("expected.json"));
    for case in exp.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text, false, true).unwrap(), want, "HF: {text:?}");
        assert_eq!(
            from_gguf.encode(text, false, true).unwrap(),
            want,
            "GGUF: {text:?}"
        );
    }
    println!("{} strings identical", exp.as_array().unwrap().len());
}
