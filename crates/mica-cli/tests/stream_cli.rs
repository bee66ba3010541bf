//! Layer streaming through the real binary: under `--mem-budget` far below the model's
//! size, or automatically when `--mem-limit` says it does not fit, greedy output is the
//! fully resident run's in both stream modes, for a GGUF file and its `.mica` conversion;
//! bad flag values and a budget too small even for the resident parts are refused with the
//! numbers.

mod common;

use common::*;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";
const GEMMA: &str = "gemma3-270m-q4_k_m";

fn run_args<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "-m",
        model,
        "-p",
        "The capital of France is",
        "-n",
        "12",
        "-t",
        "2",
        "-c",
        "512",
        "--temp",
        "0",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn greedy_output_under_a_budget_is_the_resident_runs() {
    // SmolLM2 (98 MB file, about 150 MiB fully resident) streams its last layers under
    // 140 MiB; Gemma 3 (253 MB, over 300 MiB resident) its layers and output head under
    // 200 MiB. (The budgets leave room for the runtime part, the process's resident set
    // before loading, which varies by tens of MiB.)
    for (name, budget, head) in [(SMOLLM, "140M", false), (GEMMA, "200M", true)] {
        let m = model_path(name);
        let m = m.to_str().unwrap();
        let (ok, want, err) = mica(&run_args(m, &[]));
        assert!(ok && !want.trim().is_empty(), "{err}");
        for mode in ["overlapped", "sync"] {
            let extra = ["--mem-budget", budget, "--stream-mode", mode];
            let (ok, got, err) = mica_info(&run_args(m, &extra));
            assert!(ok, "{name} {mode}:\n{err}");
            assert_eq!(got, want, "{name} {mode}: output differs\n{err}");
            let line = err
                .lines()
                .find(|l| l.contains("memory: streaming "))
                .unwrap_or_else(|| panic!("{name}: nothing streamed:\n{err}"));
            assert_eq!(line.contains("and the output head"), head, "{line}");
            let budget = format!("of a budget of {}.0 MiB", budget.trim_end_matches('M'));
            assert!(line.contains(&budget), "{line}");
        }
    }
}

#[test]
fn a_model_over_the_limit_is_streamed_instead_of_refused() {
    let m = model_path(GEMMA);
    let m = m.to_str().unwrap();
    let (ok, want, err) = mica(&run_args(m, &[]));
    assert!(ok, "{err}");
    let (ok, got, err) = mica_info(&run_args(m, &["--mem-limit", "160M"]));
    assert!(ok, "{err}");
    assert_eq!(got, want, "{err}");
    assert!(
        err.contains("the model does not fit in memory")
            && err.contains("streaming layers instead")
            && err.contains("memory: streaming "),
        "{err}"
    );
}

#[test]
fn bad_budgets_are_refused_clearly() {
    let m = model_path(SMOLLM);
    let m = m.to_str().unwrap();
    for (extra, want) in [
        (
            &["--mem-budget", "lots"][..],
            "--mem-budget: cannot read size 'lots'",
        ),
        (
            &["--mem-budget", "0"],
            "--mem-budget: size '0' must be positive",
        ),
        (
            &["--mem-budget", "1G", "--stream-mode", "fast"],
            "--stream-mode: unknown stream mode \"fast\" (expected \"overlapped\" or \"sync\")",
        ),
    ] {
        let (ok, out, err) = mica(&run_args(m, extra));
        assert!(!ok && out.is_empty(), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // Too small even for what stays resident: every number.
    let (ok, _, err) = mica(&run_args(m, &["--mem-budget", "40M"]));
    assert!(!ok);
    for part in [
        "error: layer streaming: a memory budget of 40.0 MiB is too small even with every layer \
         and the output head streamed",
        "the parts that stay resident (embeddings, norms, KV cache, buffers, runtime) take ",
        "the ring of 3 buffer(s) ",
        " in all",
    ] {
        assert!(err.contains(part), "{part:?} missing:\n{err}");
    }
    // A budget the model fits in streams nothing.
    let (ok, _, err) = mica_info(&run_args(m, &["--mem-budget", "4G"]));
    assert!(ok, "{err}");
    assert!(err.contains("fully resident; nothing streamed"), "{err}");
}

#[test]
fn a_mica_file_streams_like_its_gguf() {
    let src = model_path(SMOLLM);
    let m = scratch("stream-mica").join("smol.mica");
    convert(&src, &m, &[]);
    let m = m.to_str().unwrap();
    let (ok, want, err) = mica(&run_args(src.to_str().unwrap(), &[]));
    assert!(ok, "{err}");
    for mode in ["overlapped", "sync"] {
        let extra = ["--mem-budget", "140M", "--stream-mode", mode];
        let (ok, got, err) = mica_info(&run_args(m, &extra));
        assert!(ok, "{mode}:\n{err}");
        assert_eq!(got, want, "{mode}: .mica streamed output differs\n{err}");
        assert!(err.contains("memory: streaming layers"), "{err}");
    }
}
