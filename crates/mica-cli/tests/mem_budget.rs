//! The memory budget through the real binary: a model that does not fit under
//! `--mem-limit` is refused with every number, `--force` loads it anyway, and the check
//! after the first forward pass reports the estimate's error.

mod common;

use common::*;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

fn run_args<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run", "-m", model, "-p", "Hello", "-n", "4", "-t", "1", "-c", "512", "--temp", "0",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_model_over_the_limit_is_refused_with_the_numbers() {
    let m = model_path(SMOLLM);
    let m = m.to_str().unwrap();
    let (ok, out, err) = mica(&run_args(m, &["--mem-limit", "64M"]));
    assert!(!ok, "loaded under a 64 MiB limit:\n{err}");
    assert!(out.is_empty(), "generated before refusing: {out}");
    assert!(
        err.starts_with("error: the model does not fit in memory"),
        "{err}"
    );
    for part in [
        "weights ",
        "repacked ",
        // 512 positions × 30 layers × 3 KV heads × 64 × 2 (K, V) × 2 bytes.
        "KV cache 11.2 MiB",
        "compute ",
        "runtime ",
        "only 64.0 MiB available (the given memory limit)",
        "--force",
    ] {
        assert!(err.contains(part), "{part:?} missing:\n{err}");
    }
}

#[test]
fn force_loads_anyway_and_the_estimate_is_checked_after_the_first_pass() {
    let m = model_path(SMOLLM);
    let m = m.to_str().unwrap();
    let (ok, out, err) = mica_info(&run_args(m, &["--mem-limit", "64M", "--force"]));
    assert!(ok, "{err}");
    assert!(!out.trim().is_empty(), "nothing generated:\n{err}");
    assert!(err.contains("loading anyway (--force)"), "{err}");
    // The load stages and the resident-set check, with its error in percent.
    for stage in [
        "load: tokenizer built in",
        "memory estimate: weights",
        "load: repacked",
    ] {
        assert!(err.contains(stage), "{stage:?} missing:\n{err}");
    }
    let line = err
        .lines()
        .find(|l| l.contains("memory after the first forward pass: resident"))
        .unwrap_or_else(|| panic!("no resident-set check:\n{err}"));
    assert!(
        line.contains("vs estimated") && line.contains("%)"),
        "{line}"
    );
    // The default log level shows none of this.
    let (ok, _, quiet) = mica(&run_args(m, &[]));
    assert!(ok, "{quiet}");
    assert!(!quiet.contains("[mica] info"), "{quiet}");
}

#[test]
fn without_a_limit_the_source_of_the_figure_is_named() {
    let m = model_path(SMOLLM);
    let (ok, _, err) = mica_info(&run_args(m.to_str().unwrap(), &[]));
    assert!(ok, "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("[mica] info: memory: "))
        .unwrap_or_else(|| panic!("no available-memory line:\n{err}"));
    assert!(
        line.contains("MemAvailable") || line.contains("cgroup"),
        "{line}"
    );
}
