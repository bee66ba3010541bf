//! Speculative decoding through the real binary: `mica run` with n-gram lookup (the
//! default) and with a draft model (the test model's first layers, `--draft-layers`) gives
//! the tokens of `--spec off`, and reports drafted and accepted tokens; flags that cannot
//! work (a draft model with another vocabulary, `--spec draft` without one, `--spec-max 0`)
//! fail with one clear error.

mod common;

use common::*;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m";

const PROMPT: &str = "Copy this list exactly, one item per line: apple, banana, cherry, damson, \
                      elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine.";

fn run_json(extra: &[&str]) -> serde_json::Value {
    let m = model_path(SMOLLM);
    let mut args = vec![
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        PROMPT,
        "--chat",
        "-n",
        "48",
        "--temp",
        "0",
        "-t",
        "2",
        "--json",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = mica(&args);
    assert!(ok, "{args:?}: {err}");
    serde_json::from_str(out.trim()).unwrap()
}

#[test]
fn speculative_runs_give_plain_tokens() {
    let plain = run_json(&["--spec", "off"]);
    assert_eq!(plain["timings"]["draft_tokens"], 0);
    let ngram = run_json(&[]);
    assert_eq!(
        ngram["timings"]["spec"], "ngram",
        "n-gram lookup is the default"
    );
    let m = model_path(SMOLLM);
    let draft = run_json(&[
        "--draft-model",
        m.to_str().unwrap(),
        "--draft-layers",
        "20",
        "--spec-max",
        "4",
    ]);
    assert_eq!(draft["timings"]["spec"], "draft");
    for v in [&ngram, &draft] {
        assert_eq!(v["output_ids"], plain["output_ids"], "{}", v["timings"]);
        let t = &v["timings"];
        let (d, a) = (
            t["draft_tokens"].as_u64().unwrap(),
            t["accepted_draft_tokens"].as_u64().unwrap(),
        );
        assert!(d > 0 && a <= d, "{t}");
    }
    let t = &draft["timings"];
    assert!(
        t["accepted_draft_tokens"].as_u64().unwrap() > 0,
        "the early-exit draft is sometimes right: {t}"
    );
}

#[test]
fn unusable_speculation_flags_fail_clearly() {
    let m = model_path(SMOLLM);
    let other = model_path(QWEN);
    let err = |extra: &[&str]| {
        let mut args = vec!["run", "-m", m.to_str().unwrap(), "-p", "Hi", "-n", "2"];
        args.extend_from_slice(extra);
        let (ok, _, stderr) = mica(&args);
        assert!(!ok, "expected failure for {extra:?}");
        assert!(stderr.starts_with("error: "), "one clear error: {stderr}");
        stderr
    };
    let e = err(&["--draft-model", other.to_str().unwrap()]);
    assert!(e.contains("vocabulary") && e.contains(QWEN), "{e}");
    let e = err(&["--spec", "draft"]);
    assert!(e.contains("--draft-model"), "{e}");
    let e = err(&["--spec-max", "0"]);
    assert!(e.contains("--spec-max"), "{e}");
}

/// `mica bench --copy N`: the plain and the n-gram record of the speculative test.
#[test]
fn bench_copy_test_times_plain_and_ngram() {
    let m = model_path(SMOLLM);
    let (ok, out, err) = mica(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "0",
        "-n",
        "0",
        "--copy",
        "24",
        "-r",
        "1",
        "-t",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    let recs: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(recs.len(), 2, "{out}");
    for (r, spec) in recs.iter().zip(["off", "ngram"]) {
        assert_eq!(r["spec"], spec, "{r}");
        assert_eq!(r["n_gen"], 24);
        assert!(
            r["n_depth"].as_u64().unwrap() > 100,
            "the prompt's length: {r}"
        );
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        let (d, a) = (
            r["draft_tokens"].as_u64().unwrap(),
            r["accepted_draft_tokens"].as_u64().unwrap(),
        );
        assert!(a <= d, "{r}");
        assert_eq!(d > 0, spec == "ngram", "{r}");
    }
}

/// A hybrid model (the tiny Qwen3.5 fixture) runs with the default settings — n-gram
/// speculation is off for it — and an explicit `--spec ngram` is one clear error.
#[test]
fn a_hybrid_model_runs_without_drafts_by_default() {
    let m = workspace().join("fixtures/converted/qwen35/model.q8_0.gguf");
    let args = [
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "<t5><t6>",
        "-n",
        "4",
        "-t",
        "2",
    ];
    let (ok, _, err) = mica(&args);
    assert!(ok, "{err}");
    let mut explicit = args.to_vec();
    explicit.extend_from_slice(&["--spec", "ngram"]);
    let (ok, _, err) = mica(&explicit);
    assert!(
        !ok && err.contains("recurrent") && err.contains("--spec off"),
        "{err}"
    );
    assert_eq!(err.matches("recurrent").count(), 1, "{err}");
}
