//! llama.cpp's tokenizer test suite (`tests/test-tokenizer-0.cpp`) run against mica: every
//! `ggml-vocab-*.gguf` vocabulary-only file that comes with `.inp`/`.out` test cases, from
//! the vendored llama.cpp tree of the `llama-cpp-python` 0.3.36 sdist.
//!
//! `scripts/fetch-test-models` extracts them into `$MICA_TEST_MODELS/vocab/` (default
//! `<workspace>/models/vocab/`); a missing directory or vocabulary fails the test.
//!
//! As test-tokenizer-0 does: the `.inp` file holds the inputs separated by
//! `"\n__ggml_vocab_test__\n"`, line `i` of the `.out` file (whitespace-stripped) the
//! space-separated expected ids of input `i`; the cases are a map keyed by input (a repeated
//! input keeps its last expectation); each input is tokenized with `add_special = false`
//! and `parse_special = false`, and the ids must match exactly.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mica_models::tokenizer::Tokenizer;
use mica_models::{LoadedModel, ModelError, open_tokenizer};

/// The vocabularies of llama.cpp's suite that have test cases, as shipped in the sdist.
const VOCABS: [&str; 15] = [
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn vocab_dir() -> PathBuf {
    let dir = common::models_dir().join("vocab");
    assert!(
        dir.is_dir(),
        "{} is missing: run `scripts/fetch-test-models --only vocab`, or set MICA_TEST_MODELS to \
         the directory holding the test models",
        dir.display()
    );
    dir
}

fn vocab_path(name: &str) -> PathBuf {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-test-models --only vocab`",
        path.display()
    );
    path
}

/// The cases of one vocabulary, read exactly as test-tokenizer-0's `read_tests` reads them.
fn read_cases(gguf: &Path) -> BTreeMap<String, Vec<u32>> {
    let read = |ext: &str| {
        let path = PathBuf::from(format!("{}.{ext}", gguf.display()));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let raw = read("inp");
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].find(SEPARATOR) {
            Some(next) => {
                inputs.push(&raw[pos..pos + next]);
                pos += next + SEPARATOR.len();
            }
            None => {
                inputs.push(&raw[pos..]);
                break;
            }
        }
    }
    let out = read("out");
    let outputs: Vec<&str> = out.split_terminator('\n').collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{}: the .inp and .out files hold different numbers of cases",
        gguf.display()
    );
    let mut cases = BTreeMap::new();
    for (input, output) in inputs.into_iter().zip(outputs) {
        let ids = output
            .trim()
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap_or_else(|e| panic!("{output:?}: {e}")))
            .collect();
        cases.insert(input.to_string(), ids);
    }
    assert!(!cases.is_empty(), "{}: no test cases", gguf.display());
    cases
}

/// One vocabulary's result: passed and total cases, and the first mismatches described.
struct Outcome {
    passed: usize,
    total: usize,
    failures: Vec<String>,
}

fn run_vocab(name: &str) -> Outcome {
    let path = vocab_path(name);
    let cases = read_cases(&path);
    let tokenizer: Tokenizer = match open_tokenizer(&path) {
        Ok(t) => t,
        Err(e) => {
            return Outcome {
                passed: 0,
                total: cases.len(),
                failures: vec![format!("cannot load: {e}")],
            };
        }
    };
    let mut outcome = Outcome {
        passed: 0,
        total: cases.len(),
        failures: Vec::new(),
    };
    for (input, expected) in &cases {
        let got = tokenizer.encode(input, false, false);
        match got {
            Ok(ids) if &ids == expected => outcome.passed += 1,
            got => {
                if outcome.failures.len() < 3 {
                    outcome
                        .failures
                        .push(format!("{input:?}: expected {expected:?}, got {got:?}"));
                }
            }
        }
    }
    outcome
}

#[test]
fn llama_cpp_tokenizer_suite() {
    let dir = vocab_dir();
    // Every vocabulary with test cases in the directory is run, and the expected ones must
    // all be there.
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let stem = name
                .strip_prefix("ggml-vocab-")?
                .strip_suffix(".gguf.inp")?;
            Some(stem.to_string())
        })
        .collect();
    found.sort();
    for name in VOCABS {
        assert!(
            found.iter().any(|f| f == name),
            "ggml-vocab-{name}.gguf.inp is missing from {}: run `scripts/fetch-test-models --only vocab`",
            dir.display()
        );
    }

    let outcomes: Vec<(String, Outcome)> = std::thread::scope(|s| {
        let handles: Vec<_> = found
            .iter()
            .map(|name| (name.clone(), s.spawn(move || run_vocab(name))))
            .collect();
        handles
            .into_iter()
            .map(|(name, h)| (name, h.join().expect("vocabulary thread panicked")))
            .collect()
    });

    let mut report = String::new();
    let (mut passed, mut total) = (0, 0);
    for (name, o) in &outcomes {
        report.push_str(&format!("  {name:16} {:4} / {:4}\n", o.passed, o.total));
        passed += o.passed;
        total += o.total;
    }
    eprintln!(
        "llama.cpp tokenizer suite: {passed} of {total} cases pass across {} vocabularies\n{report}",
        outcomes.len()
    );
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| o.passed != o.total)
        .map(|(name, o)| format!("{name}:\n    {}", o.failures.join("\n    ")))
        .collect();
    assert!(
        failed.is_empty(),
        "mismatches (first 3 per vocabulary):\n{}",
        failed.join("\n")
    );
}

/// A vocabulary-only GGUF tokenizes, but opening it as a model to run is a clear error.
#[test]
fn vocab_only_file_is_not_a_runnable_model() {
    let path = vocab_path("llama-spm");
    let tokenizer = open_tokenizer(&path).expect("the vocabulary loads");
    assert!(tokenizer.vocab_size() > 0);
    match LoadedModel::open(&path) {
        Ok(_) => panic!("a vocabulary-only file opened as a model"),
        Err(e) => {
            assert!(matches!(e, ModelError::VocabOnly { .. }), "{e:?}");
            let msg = e.to_string();
            assert!(
                msg.contains("no tensors") && msg.contains("vocabulary-only"),
                "{msg}"
            );
            assert!(msg.contains("ggml-vocab-llama-spm.gguf"), "{msg}");
        }
    }
}
