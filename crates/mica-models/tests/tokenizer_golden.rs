//! The tokenizer against llama.cpp on the three real test models: every `/tokenize` entry of
//! the golden files (all four add_special/parse_special combinations), every case's prompt
//! ids, and decoding of every generated sequence, whole and streamed.
//!
//! Facts come from `fixtures/tokenizer/<model>.json` (llama.cpp 0c1e57098 via
//! llama-cpp-python 0.3.36, see `fixtures/tokenizer/extract_golden.py`). Models are found in
//! `$MICA_TEST_MODELS` (default `<workspace>/models`); a missing model fails the test.

mod common;

use std::time::Instant;

use common::{GEMMA, QWEN, SMOLLM, load_tokenizer, model_path, tokenizer_fixture};
use mica_formats::GgufFile;
use mica_models::tokenizer::{DecodeOptions, TokenType, Tokenizer, TokenizerSpec, VocabKind};
use serde_json::Value;

/// `fixtures/tokenizer/NAME.json`.
fn fixture(name: &str) -> Value {
    tokenizer_fixture(&format!("{name}.json"))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Every `/tokenize` entry of the fixture; all mismatches are listed before failing.
fn check_tokenize(name: &str) {
    let tok = load_tokenizer(name);
    let fx = fixture(name);
    let mut failures = Vec::new();
    let entries = fx["tokenize"].as_array().unwrap();
    assert!(!entries.is_empty());
    for e in entries {
        let text = e["text"].as_str().unwrap();
        let (add, parse) = (
            e["add_special"].as_bool().unwrap(),
            e["parse_special"].as_bool().unwrap(),
        );
        let expect = ids(&e["ids"]);
        let got = tok.encode(text, add, parse).unwrap();
        if got != expect {
            failures.push(format!("{text:?} add_special={add} parse_special={parse}: got {got:?}, llama.cpp {expect:?}"));
        }
    }
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

/// Each case's prompt as llama.cpp's `/completion` tokenized it (special tokens parsed, BOS
/// as the model says); chat cases tokenize the rendered prompt.
fn check_prompt_ids(name: &str) {
    let tok = load_tokenizer(name);
    let fx = fixture(name);
    let mut failures = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let text = case
            .get("prompt")
            .or_else(|| case.get("rendered_prompt"))
            .and_then(Value::as_str)
            .unwrap();
        let expect = ids(&case["prompt_ids"]);
        let got = tok.encode(text, true, true).unwrap();
        if got != expect {
            failures.push(format!(
                "case {}: got {got:?}, llama.cpp {expect:?}",
                case["id"]
            ));
        }
    }
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

/// Generated ids decode to llama-server's text. llama-server renders control tokens as
/// nothing (its `special` option is off), so decoding hides them here; with them shown, the
/// end-of-turn token that stopped a chat case appears as its text. A text ending inside a
/// character (the `unicode` case of SmolLM2 stops after three of an emoji's four bytes) ends in
/// U+FFFD in both: llama-server sends the incomplete bytes, the JSON layer replaces them.
fn check_decode(name: &str) {
    let tok = load_tokenizer(name);
    let fx = fixture(name);
    let hide = DecodeOptions { skip_special: true };
    for case in fx["cases"].as_array().unwrap() {
        let out = ids(&case["output_ids"]);
        let expect = case["output_text"].as_str().unwrap();
        let got = tok.decode_with(&out, hide).unwrap();
        assert_eq!(got, expect, "{name} case {}", case["id"]);

        // Streaming, with special tokens hidden and shown, equals whole-sequence decoding.
        for options in [hide, DecodeOptions::default()] {
            let whole = tok.decode_with(&out, options).unwrap();
            let mut stream = tok.stream_decoder(options);
            let mut text = String::new();
            for &id in &out {
                text += &stream.push(id).unwrap();
            }
            text += &stream.finish();
            assert_eq!(
                text, whole,
                "{name} case {} streamed ({options:?})",
                case["id"]
            );
        }

        if case["stop_type"] == "eos" {
            let last = *out.last().unwrap();
            assert!(
                tok.is_eog(last),
                "{name}: stop token {last} is not end-of-generation"
            );
            let shown = tok.decode(&out).unwrap();
            assert_eq!(shown, format!("{expect}{}", tok.token_text(last).unwrap()));
        }
    }
}

#[test]
fn smollm2_tokenize_matches_llama_cpp() {
    check_tokenize(SMOLLM);
}
#[test]
fn qwen25_tokenize_matches_llama_cpp() {
    check_tokenize(QWEN);
}
#[test]
fn gemma3_tokenize_matches_llama_cpp() {
    check_tokenize(GEMMA);
}

#[test]
fn smollm2_prompt_ids_match_llama_cpp() {
    check_prompt_ids(SMOLLM);
}
#[test]
fn qwen25_prompt_ids_match_llama_cpp() {
    check_prompt_ids(QWEN);
}
#[test]
fn gemma3_prompt_ids_match_llama_cpp() {
    check_prompt_ids(GEMMA);
}

#[test]
fn smollm2_decode_matches_llama_server() {
    check_decode(SMOLLM);
}
#[test]
fn qwen25_decode_matches_llama_server() {
    check_decode(QWEN);
}
#[test]
fn gemma3_decode_matches_llama_server() {
    check_decode(GEMMA);
}

/// The SmolLM2 `unicode` case generates 🌈 (4 bytes) as three byte-level tokens, so the
/// decoder must hold bytes back and release the emoji whole.
#[test]
fn stream_decoder_holds_split_emoji() {
    let tok = load_tokenizer(SMOLLM);
    let fx = fixture(SMOLLM);
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "unicode")
        .expect("unicode case");
    let mut stream = tok.stream_decoder(DecodeOptions::default());
    let (mut held, mut emojis) = (0, 0);
    for id in ids(&case["output_ids"]) {
        let piece = stream.push(id).unwrap();
        if piece.is_empty() && stream.pending_bytes() > 0 {
            held += 1;
        }
        emojis += piece.matches('🌈').count();
        assert!(
            !piece.contains('\u{FFFD}'),
            "no replacement character mid-stream"
        );
    }
    assert!(
        held >= 2 * 15,
        "expected the emoji's first tokens to be held, held {held}"
    );
    assert_eq!(emojis, 15);
    assert_eq!(
        stream.pending_bytes(),
        3,
        "the last emoji is cut after three of its four bytes"
    );
    assert_eq!(stream.finish(), "\u{FFFD}");
}

/// decode(encode(text)) gives the text back on all three models (byte-level BPE is lossless;
/// Gemma's SentencePiece has byte fallback and no added space prefix).
#[test]
fn encode_decode_roundtrip() {
    let texts = [
        "Hello, world! It's 2024-07-26 and π ≈ 3.14159.",
        "  leading and trailing spaces  \n\n\ttabs\r\nCRLF",
        "Ünïcödé: 東京, 日本語, العربية, עברית, हिन्दी, 🚀✨👩‍👩‍👧 \u{200b}zero-width",
        "code:\n    def f(x):\n        return x ** 2  # comment\n",
        "<|im_start|>user\nnot special when unparsed<|im_end|>",
        "",
    ];
    for name in [SMOLLM, QWEN, GEMMA] {
        let tok = load_tokenizer(name);
        for text in texts {
            let ids = tok.encode(text, false, false).unwrap();
            assert_eq!(
                tok.decode(&ids).unwrap(),
                text,
                "{name}: {text:?} -> {ids:?}"
            );
        }
    }
}

#[test]
fn special_ids_and_end_of_generation() {
    let smollm = load_tokenizer(SMOLLM);
    assert_eq!(smollm.kind(), VocabKind::Bpe);
    assert_eq!(smollm.pre_tokenizer(), Some("smollm"));
    assert_eq!(
        (smollm.bos(), smollm.eos(), smollm.add_bos()),
        (Some(1), Some(2), false)
    );
    assert!(
        smollm.is_eog(2) && smollm.is_eog(0),
        "<|im_end|> and <|endoftext|> end generation"
    );
    assert!(!smollm.is_eog(1), "<|im_start|> does not");
    assert_eq!(smollm.token_type(1), Some(TokenType::Control));

    let qwen = load_tokenizer(QWEN);
    assert_eq!(qwen.vocab_size(), 151936);
    assert_eq!(qwen.eos(), Some(151645));
    assert!(qwen.is_eog(151645) && qwen.is_eog(151643));
    assert_eq!(qwen.token_type(151657), Some(TokenType::UserDefined)); // <tool_call>
    // UNUSED padding tokens render as nothing, as in llama.cpp.
    assert_eq!(qwen.decode(&[151700]).unwrap(), "");

    let gemma = load_tokenizer(GEMMA);
    assert_eq!(gemma.kind(), VocabKind::Spm);
    assert_eq!(gemma.vocab_size(), 262144);
    assert_eq!(
        (gemma.bos(), gemma.eos(), gemma.add_bos()),
        (Some(2), Some(1), true)
    );
    let end_of_turn = gemma.token_id("<end_of_turn>").unwrap();
    assert_eq!(gemma.eot(), Some(end_of_turn));
    assert!(gemma.is_eog(1) && gemma.is_eog(end_of_turn));
    assert_eq!(gemma.token_text(248), Some("<0x0A>"));
    assert_eq!(gemma.decode(&[248]).unwrap(), "\n");
    // Control tokens are recognised in text only when asked.
    assert_eq!(
        gemma.encode("<end_of_turn>", false, true).unwrap(),
        vec![end_of_turn]
    );
    assert_ne!(
        gemma.encode("<end_of_turn>", false, false).unwrap(),
        vec![end_of_turn]
    );
    for tok in [&smollm, &qwen, &gemma] {
        assert!(tok.warnings().is_empty(), "{:?}", tok.warnings());
    }
}

/// The loader moves the vocabulary and merges out of the file (`take_from_gguf`) instead of
/// copying them: the spec must be the same, and the arrays gone from the file.
#[test]
fn taking_the_spec_equals_copying_it() {
    for name in [SMOLLM, QWEN, GEMMA] {
        let mut gguf = GgufFile::open(model_path(name)).unwrap();
        let copied = TokenizerSpec::from_gguf(&gguf).unwrap();
        let taken = TokenizerSpec::take_from_gguf(&mut gguf).unwrap();
        assert!(copied.tokens.len() > 40_000, "{name}");
        assert_eq!(format!("{copied:?}"), format!("{taken:?}"), "{name}");
        assert!(gguf.metadata("tokenizer.ggml.tokens").is_none(), "{name}");
        assert!(gguf.metadata("tokenizer.ggml.merges").is_none(), "{name}");
        assert!(gguf.metadata("tokenizer.ggml.model").is_some(), "{name}");
    }
}

/// Build time of each real tokenizer (printed, not asserted; run with `--nocapture`).
#[test]
fn tokenizer_build_times() {
    for name in [SMOLLM, QWEN, GEMMA] {
        let t0 = Instant::now();
        let gguf = GgufFile::open(model_path(name)).unwrap();
        let t1 = Instant::now();
        let tok = Tokenizer::from_gguf(&gguf).unwrap();
        let t2 = Instant::now();
        println!(
            "{name}: GGUF open {:.0} ms, tokenizer build {:.0} ms ({} tokens)",
            (t1 - t0).as_secs_f64() * 1e3,
            (t2 - t1).as_secs_f64() * 1e3,
            tok.vocab_size()
        );
    }
}
