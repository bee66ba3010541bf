//! `mica tokenize` through the real binary: llama-tokenize's output formats, the flags, a
//! vocabulary-only GGUF (llama.cpp's `ggml-vocab-*.gguf`, from `$MICA_TEST_MODELS/vocab/`,
//! fetched by `scripts/fetch-test-models`) checked against llama.cpp's own expected ids, and
//! the clear error when such a file is run as a model.

mod common;

use common::*;
use std::path::{Path, PathBuf};

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

/// A vocabulary-only GGUF of llama.cpp's tokenizer suite; fails loudly when missing.
fn vocab_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models"));
    let path = dir.join("vocab").join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-test-models --only vocab`",
        path.display()
    );
    path
}

/// llama.cpp's expected ids for `input` in the suite's `.inp`/`.out` files (tokenized
/// without special tokens, special tokens not parsed).
fn expected_ids(vocab: &Path, input: &str) -> Vec<u32> {
    let inp = std::fs::read_to_string(format!("{}.inp", vocab.display())).unwrap();
    let out = std::fs::read_to_string(format!("{}.out", vocab.display())).unwrap();
    let i = inp
        .split("\n__ggml_vocab_test__\n")
        .position(|case| case == input)
        .unwrap_or_else(|| panic!("{input:?} is not a case of {}", vocab.display()));
    let line = out.lines().nth(i).unwrap();
    line.split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

fn list(ids: &[u32]) -> String {
    let items: Vec<String> = ids.iter().map(u32::to_string).collect();
    format!("[{}]\n", items.join(", "))
}

#[test]
fn ids_of_a_vocabulary_only_file_match_llama_cpp() {
    let vocab = vocab_path("llama-spm");
    let v = vocab.to_str().unwrap();
    let expected = expected_ids(&vocab, "Hello world");
    let (ok, out, err) = mica(&[
        "tokenize",
        "-m",
        v,
        "-p",
        "Hello world",
        "--ids",
        "--no-bos",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, list(&expected));
    assert!(
        err.contains(&format!("Total number of tokens: {}", expected.len())),
        "{err}"
    );
    // LLaMA's SentencePiece vocabulary adds BOS (id 1) unless told not to.
    let (ok, out, err) = mica(&["tokenize", "-m", v, "-p", "Hello world", "--ids"]);
    assert!(ok, "{err}");
    let mut with_bos = vec![1];
    with_bos.extend(&expected);
    assert_eq!(out, list(&with_bos));
}

#[test]
fn default_output_is_one_token_per_line_with_its_piece() {
    let model = model_path(SMOLLM);
    let m = model.to_str().unwrap();
    let (ok, out, err) = mica(&["tokenize", "-m", m, "-p", "<|im_start|>user Hi"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    // Special tokens written in the text are parsed, and shown as their text.
    assert_eq!(lines[0], "     1 -> '<|im_start|>'", "{out}");
    assert!(lines[1].ends_with(" -> 'user'"), "{out}");
    assert!(lines[2].ends_with(" -> ' Hi'"), "{out}");
    assert_eq!(lines.len(), 3, "{out}");
    assert!(err.contains("Total number of tokens: 3"), "{err}");

    // The --ids list holds the same ids as the lines.
    let (ok, ids, _) = mica(&["tokenize", "-m", m, "-p", "<|im_start|>user Hi", "--ids"]);
    assert!(ok);
    let from_lines: Vec<u32> = lines
        .iter()
        .map(|l| l.split(" -> ").next().unwrap().trim().parse().unwrap())
        .collect();
    assert_eq!(ids, list(&from_lines));

    // --no-parse-special spells the marker out; --show-count puts the count on stdout.
    let (ok, out, err) = mica(&[
        "tokenize",
        "-m",
        m,
        "-p",
        "<|im_start|>user Hi",
        "--no-parse-special",
        "--show-count",
    ]);
    assert!(ok, "{err}");
    let n = out.lines().count() - 1;
    assert!(n > 3, "{out}");
    assert!(!out.contains("'<|im_start|>'"), "{out}");
    assert_eq!(
        out.lines().last().unwrap(),
        format!("Total number of tokens: {n}")
    );
    assert!(!err.contains("Total number of tokens"), "{err}");
}

#[test]
fn text_from_a_file_or_stdin() {
    let vocab = vocab_path("gpt-2");
    let v = vocab.to_str().unwrap();
    let text = "Hello world";
    let expected = list(&expected_ids(&vocab, text));
    let file = scratch("tokenize").join("prompt.txt");
    std::fs::write(&file, text).unwrap();
    let (ok, out, err) = mica(&["tokenize", "-m", v, "-f", file.to_str().unwrap(), "--ids"]);
    assert!(ok, "{err}");
    assert_eq!(out, expected);

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mica"))
        .args(["tokenize", "-m", v, "--stdin", "--ids"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8(output.stdout).unwrap(), expected);
}

#[test]
fn text_is_required() {
    let vocab = vocab_path("gpt-2");
    let (ok, _, err) = mica(&["tokenize", "-m", vocab.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("--prompt") || err.contains("required"),
        "{err}"
    );
}

#[test]
fn running_a_vocabulary_only_file_is_a_clear_error() {
    let vocab = vocab_path("llama-spm");
    let (ok, _, err) = mica(&["run", "-m", vocab.to_str().unwrap(), "-p", "Hi", "-n", "1"]);
    assert!(!ok);
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        err.contains("ggml-vocab-llama-spm.gguf has no tensors")
            && err.contains("vocabulary-only GGUF"),
        "{err}"
    );
}

#[test]
fn inspect_describes_a_vocabulary_only_file() {
    let vocab = vocab_path("bert-bge");
    let (ok, out, err) = mica(&["inspect", vocab.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("0 tensors"), "{out}");
    assert!(out.contains("vocabulary only"), "{out}");
    assert!(
        out.contains("tokenizer:     WordPiece (bert), 30522 tokens"),
        "{out}"
    );
}
