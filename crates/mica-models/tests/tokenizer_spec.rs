//! The tokenizer on hand-written vocabularies: error reporting for bad specs and ids, and the
//! llama.cpp rules (special-token parsing, BOS/EOS, SentencePiece space prefix, byte
//! fallback, BPE merge order) on inputs small enough to check by hand.

use mica_models::tokenizer::{DecodeOptions, Tokenizer, TokenizerError, TokenizerSpec};

/// A byte-level BPE vocabulary: ids 0 `<|end|>` (control), 1 `<tool>` (user-defined), then
/// single characters and merges of "hello" and " hi".
fn bpe_spec() -> TokenizerSpec {
    let tokens = [
        "<|end|>", "<tool>", "h", "e", "l", "o", "i", "Ġ", "he", "ll", "hell", "hello", "Ġh", "Ġhi",
    ];
    let mut types = vec![1; tokens.len()];
    types[0] = 3;
    types[1] = 4;
    TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens: tokens.iter().map(|s| s.to_string()).collect(),
        token_types: Some(types),
        merges: Some(
            ["h e", "l l", "he ll", "hell o", "Ġ h", "Ġh i"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ),
        eos_id: Some(0),
        ..TokenizerSpec::default()
    }
}

/// A SentencePiece vocabulary: `<unk>` `<s>` `</s>`, a control token, byte tokens for
/// '\n' and the three bytes of '€', and scored pieces.
fn spm_spec(add_space_prefix: bool) -> TokenizerSpec {
    let entries: [(&str, f32, i32); 14] = [
        ("<unk>", 0.0, 2),
        ("<s>", 0.0, 3),
        ("</s>", 0.0, 3),
        ("<ctl>", 0.0, 3),
        ("<0x0A>", 0.0, 6),
        ("<0xE2>", 0.0, 6),
        ("<0x82>", 0.0, 6),
        ("<0xAC>", 0.0, 6),
        ("▁", -1.0, 1),
        ("a", -2.0, 1),
        ("b", -2.0, 1),
        ("▁a", -0.5, 1),
        ("▁b", -0.6, 1),
        ("ab", -0.4, 1),
    ];
    TokenizerSpec {
        model: "llama".into(),
        tokens: entries.iter().map(|e| e.0.to_string()).collect(),
        scores: Some(entries.iter().map(|e| e.1).collect()),
        token_types: Some(entries.iter().map(|e| e.2).collect()),
        add_space_prefix: Some(add_space_prefix),
        ..TokenizerSpec::default()
    }
}

#[test]
fn unknown_model_type_is_named() {
    let spec = TokenizerSpec {
        model: "wordpiece-of-the-future".into(),
        ..bpe_spec()
    };
    let err = Tokenizer::from_spec(&spec).unwrap_err();
    assert!(matches!(&err, TokenizerError::UnknownModel(m) if m == "wordpiece-of-the-future"));
    assert!(
        err.to_string().contains("'wordpiece-of-the-future'"),
        "{err}"
    );
}

#[test]
fn merge_without_space_names_its_index() {
    let mut spec = bpe_spec();
    spec.merges.as_mut().unwrap()[3] = "hello".into();
    let err = Tokenizer::from_spec(&spec).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::BadMerge { index: 3, entry } if entry == "hello"),
        "{err}"
    );
    assert!(err.to_string().contains("merges entry 3"), "{err}");
}

#[test]
fn out_of_range_ids_are_errors() {
    let tok = Tokenizer::from_spec(&bpe_spec()).unwrap();
    let n = tok.vocab_size() as u32;
    let err = tok.decode(&[2, n]).unwrap_err();
    assert!(
        matches!(err, TokenizerError::IdOutOfRange { id, vocab_size: 14 } if id == n),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("token id {n} is out of range")),
        "{err}"
    );
    let mut stream = tok.stream_decoder(DecodeOptions::default());
    assert!(stream.push(u32::MAX).is_err());
    assert_eq!(tok.token_text(n), None);
    assert_eq!(tok.token_piece(n, DecodeOptions::default()), None);
    assert!(!tok.is_eog(n));
}

#[test]
fn other_spec_errors() {
    let spec = TokenizerSpec {
        tokens: vec![],
        ..bpe_spec()
    };
    assert!(matches!(
        Tokenizer::from_spec(&spec),
        Err(TokenizerError::MissingVocab)
    ));

    let spec = TokenizerSpec {
        pre: Some("mystery".into()),
        ..bpe_spec()
    };
    let err = Tokenizer::from_spec(&spec).unwrap_err();
    assert!(err.to_string().contains("'mystery'"), "{err}");

    let spec = TokenizerSpec {
        merges: None,
        ..bpe_spec()
    };
    let err = Tokenizer::from_spec(&spec).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.merges"), "{err}");

    let mut spec = spm_spec(true);
    spec.scores.as_mut().unwrap().pop();
    let err = Tokenizer::from_spec(&spec).unwrap_err();
    assert!(
        matches!(
            err,
            TokenizerError::LengthMismatch {
                len: 13,
                vocab: 14,
                ..
            }
        ),
        "{err}"
    );

    // add_bos with no BOS in range (BPE's llama.cpp default id 11 is out of this vocabulary's
    // range once the vocabulary is cut short).
    let mut spec = bpe_spec();
    spec.tokens.truncate(8);
    spec.token_types.as_mut().unwrap().truncate(8);
    spec.merges = Some(vec![]);
    spec.add_bos = Some(true);
    let err = Tokenizer::from_spec(&spec).unwrap_err();
    assert!(
        matches!(err, TokenizerError::MissingSpecialToken { .. }),
        "{err}"
    );

    // An out-of-range special id in the file is a warning, not an error.
    let spec = TokenizerSpec {
        bos_id: Some(999),
        ..bpe_spec()
    };
    let tok = Tokenizer::from_spec(&spec).unwrap();
    assert!(
        tok.warnings().iter().any(|w| w.contains("999")),
        "{:?}",
        tok.warnings()
    );

    // A missing pre-tokenizer name falls back to llama.cpp's default, with a warning.
    let spec = TokenizerSpec {
        pre: None,
        ..bpe_spec()
    };
    let tok = Tokenizer::from_spec(&spec).unwrap();
    assert_eq!(tok.pre_tokenizer(), Some("default"));
    assert!(
        tok.warnings()
            .iter()
            .any(|w| w.contains("tokenizer.ggml.pre"))
    );
}

#[test]
fn bpe_merges_and_special_tokens() {
    let tok = Tokenizer::from_spec(&bpe_spec()).unwrap();
    assert_eq!(tok.encode("hello hi", false, false).unwrap(), vec![11, 13]);
    // Control tokens only when parsing special tokens; user-defined ones always.
    assert_eq!(
        tok.encode("hello<|end|>", false, true).unwrap(),
        vec![11, 0]
    );
    assert_ne!(
        tok.encode("hello<|end|>", false, false).unwrap(),
        vec![11, 0]
    );
    assert_eq!(tok.encode("<tool>hi", false, false).unwrap(), vec![1, 2, 6]);
    // No BOS/EOS by default for byte-level BPE.
    assert_eq!(tok.encode("hello", true, true).unwrap(), vec![11]);
    assert!(tok.is_eog(0));
    assert_eq!(tok.decode(&[11, 13, 0]).unwrap(), "hello hi<|end|>");
    let hide = DecodeOptions { skip_special: true };
    assert_eq!(tok.decode_with(&[11, 0, 1], hide).unwrap(), "hello<tool>");
}

#[test]
fn sentencepiece_space_prefix_bos_and_byte_fallback() {
    let tok = Tokenizer::from_spec(&spm_spec(true)).unwrap();
    assert_eq!(
        (tok.bos(), tok.eos(), tok.unk(), tok.add_bos()),
        (Some(1), Some(2), Some(0), true)
    );
    // "a b" → "▁a▁b": "▁a" (-0.5) beats "▁b" (-0.6); both merge.
    assert_eq!(tok.encode("a b", false, false).unwrap(), vec![11, 12]);
    // BOS is added; the text after a special token gets the space prefix again.
    assert_eq!(
        tok.encode("a<ctl>b", true, true).unwrap(),
        vec![1, 11, 3, 12]
    );
    // "ab" (-0.4) is the best first merge without the prefix.
    let plain = Tokenizer::from_spec(&spm_spec(false)).unwrap();
    assert_eq!(plain.encode("ab", false, false).unwrap(), vec![13]);
    // Characters missing from the vocabulary become their UTF-8 byte tokens.
    assert_eq!(plain.encode("€\n", false, false).unwrap(), vec![5, 6, 7, 4]);
    assert_eq!(plain.decode(&[5, 6, 7, 4, 11]).unwrap(), "€\n a");

    // A stream split inside '€' holds the bytes back.
    let mut stream = plain.stream_decoder(DecodeOptions::default());
    assert_eq!(stream.push(5).unwrap(), "");
    assert_eq!(stream.push(6).unwrap(), "");
    assert_eq!(stream.pending_bytes(), 2);
    assert_eq!(stream.push(7).unwrap(), "€");
    assert_eq!(stream.push(5).unwrap(), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
}
