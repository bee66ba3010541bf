//! The Gemma 4 (`gemma4`) and WordPiece (`bert`) tokenizer models on hand-written
//! vocabularies: the rules llama.cpp applies that its test suite's inputs do not all reach
//! (whole newline tokens, byte fallback, normalization, unknown words, BOS/SEP).

use mica_models::tokenizer::{Tokenizer, TokenizerSpec};

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Gemma 4: `<pad>` `<eos>` `<bos>`, the byte tokens of 'é', newline runs and `▁` pieces.
fn gemma4_spec() -> TokenizerSpec {
    let entries: [(&str, i32); 13] = [
        ("<pad>", 3),
        ("<eos>", 3),
        ("<bos>", 3),
        ("<0xC3>", 6),
        ("<0xA9>", 6),
        ("\n", 1),
        ("\n\n", 1),
        ("\n\n\n", 1),
        ("▁", 1),
        ("a", 1),
        ("b", 1),
        ("▁a", 1),
        ("ab", 1),
    ];
    TokenizerSpec {
        model: "gemma4".into(),
        tokens: entries.iter().map(|e| e.0.to_string()).collect(),
        token_types: Some(entries.iter().map(|e| e.1).collect()),
        // "\n\n\n" has no merge of its own: merging gives "\n\n" + "\n".
        merges: Some(strings(&["\n \n", "▁ a", "a b"])),
        bos_id: Some(2),
        eos_id: Some(1),
        add_bos: Some(false),
        ..TokenizerSpec::default()
    }
}

#[test]
fn gemma4_merges_raw_text_with_spaces_as_pieces() {
    let tok = Tokenizer::from_spec(&gemma4_spec()).unwrap();
    // " ab": "▁ab" merges "▁ a" first (rank 1), leaving "▁a" + "b".
    assert_eq!(tok.encode(" ab", false, false).unwrap(), vec![11, 10]);
    assert_eq!(tok.encode("ab b", false, false).unwrap(), vec![12, 8, 10]);
    // 'é' is not a token: its UTF-8 bytes.
    assert_eq!(tok.encode("é", false, false).unwrap(), vec![3, 4]);
    assert_eq!(tok.decode(&[11, 10, 3, 4]).unwrap(), " abé");
}

#[test]
fn gemma4_newline_runs_that_are_tokens_are_kept_whole() {
    let tok = Tokenizer::from_spec(&gemma4_spec()).unwrap();
    // Merging alone would give "\n\n" + "\n".
    assert_eq!(tok.encode("\n\n\n", false, false).unwrap(), vec![7]);
    assert_eq!(
        tok.encode("a\n\n\nb", false, false).unwrap(),
        vec![9, 7, 10]
    );
    // Four newlines are no token: merged.
    assert_eq!(tok.encode("\n\n\n\n", false, false).unwrap(), vec![6, 6]);
}

#[test]
fn gemma4_always_adds_bos() {
    let tok = Tokenizer::from_spec(&gemma4_spec()).unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.encode("a", true, false).unwrap(), vec![2, 9]);
    assert!(tok.warnings().iter().any(|w| w.contains("add_bos_token")));
}

/// WordPiece: BERT's specials at their default ids would need 100+ tokens, so the file
/// names them: 0 `[PAD]`, 1 `[UNK]`, 2 `[CLS]`, 3 `[SEP]`, then word-initial pieces (`▁`)
/// and continuations (bare).
fn bert_spec() -> TokenizerSpec {
    let entries: [(&str, i32); 14] = [
        ("[PAD]", 3),
        ("[UNK]", 3),
        ("[CLS]", 3),
        ("[SEP]", 3),
        ("▁cafe", 1),
        ("▁un", 1),
        ("able", 1),
        ("▁unable", 1),
        ("▁,", 1),
        ("▁中", 1),
        ("▁文", 1),
        ("▁$", 1),
        ("▁x", 1),
        ("y", 1),
    ];
    TokenizerSpec {
        model: "bert".into(),
        tokens: entries.iter().map(|e| e.0.to_string()).collect(),
        token_types: Some(entries.iter().map(|e| e.1).collect()),
        unk_id: Some(1),
        bos_id: Some(2),
        sep_id: Some(3),
        pad_id: Some(0),
        ..TokenizerSpec::default()
    }
}

#[test]
fn wordpiece_normalizes_and_splits_as_bert() {
    let tok = Tokenizer::from_spec(&bert_spec()).unwrap();
    // Lowercased, accents stripped (NFD), punctuation and CJK ideographs alone, the longest
    // piece first ("▁unable" over "▁un" + "able").
    assert_eq!(
        tok.encode("CAFÉ,unable 中文$", false, false).unwrap(),
        vec![4, 8, 7, 9, 10, 11]
    );
    // Control characters vanish; "xyy" is covered by "▁x" "y" "y".
    assert_eq!(
        tok.encode("x\u{7}yy", false, false).unwrap(),
        vec![12, 13, 13]
    );
    // A word that cannot be covered entirely is one [UNK].
    assert_eq!(tok.encode("unz cafe", false, false).unwrap(), vec![1, 4]);
    assert_eq!(tok.decode(&[4, 8, 5, 6]).unwrap(), " cafe , unable");
}

#[test]
fn wordpiece_cased_vocabulary_keeps_case_and_accents() {
    let spec = TokenizerSpec {
        normalizer_lowercase: Some(false),
        ..bert_spec()
    };
    let tok = Tokenizer::from_spec(&spec).unwrap();
    assert_eq!(tok.encode("CAFÉ cafe", false, false).unwrap(), vec![1, 4]);
}

#[test]
fn wordpiece_special_tokens_wrap_the_text() {
    let tok = Tokenizer::from_spec(&bert_spec()).unwrap();
    assert_eq!(tok.sep(), Some(3));
    assert_eq!(tok.encode("cafe", true, false).unwrap(), vec![2, 4, 3]);
    // Written specials are parsed only when asked.
    assert_eq!(tok.encode("[SEP]", false, true).unwrap(), vec![3]);
    assert_eq!(tok.encode("[SEP]", false, false).unwrap(), vec![1, 1, 1]);
}
