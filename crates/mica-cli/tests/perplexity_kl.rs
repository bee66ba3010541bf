//! `mica perplexity --kl-base`: KL-divergence of a model's next-token distributions from a
//! base model's, as llama-perplexity's `--kl-divergence` reports it. A model against itself
//! gives exactly 0 and the same top token everywhere; a Q8_0 requantization of the SmolLM2
//! Q4_1 file gives a small positive divergence.

mod common;

use common::*;
use std::path::Path;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

fn kl(model: &Path, base: &Path) -> String {
    kl_report(model, base, 128, 2)
}

#[test]
fn kl_divergence_against_itself_and_a_requantization() {
    let src = model_path(SMOLLM);
    let out = kl(&src, &src);
    assert_eq!(figure(&out, "Mean KLD"), 0.0, "{out}");
    assert_eq!(figure(&out, "Same top p"), 100.0, "{out}");
    assert_eq!(figure(&out, "PPL(base)"), figure(&out, "PPL"), "{out}");

    let q8 = scratch("kl").join("q8_0.gguf");
    let (ok, _, err) = mica(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        q8.to_str().unwrap(),
        "--type",
        "q8_0",
        "--quiet",
    ]);
    assert!(ok, "{err}");
    let out = kl(&q8, &src);
    let kld = figure(&out, "Mean KLD");
    println!("{out}");
    assert!(
        kld > 0.0 && kld < 0.02,
        "Q8_0 vs Q4_1 mean KLD {kld}\n{out}"
    );
    assert!(figure(&out, "Same top p") > 90.0, "{out}");
}

/// `--kl-chart FILE` draws the per-token KL-divergences as a histogram (SVG) with the mean
/// and the 99th percentile that the report prints; it needs `--kl-base`.
#[test]
fn kl_chart_of_a_quantized_cache() {
    let src = model_path(SMOLLM);
    let text = workspace().join("fixtures/text/GPL-3");
    let svg = scratch("kl-chart").join("kl.svg");
    let (ok, out, err) = mica(&[
        "perplexity",
        "-m",
        src.to_str().unwrap(),
        "--kl-base",
        src.to_str().unwrap(),
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
        "-f",
        text.to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "2",
        "--quiet",
        "--kl-chart",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let doc = std::fs::read_to_string(&svg).expect("the chart was written");
    assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
    let mean = figure(&out, "Mean KLD");
    assert!(mean > 0.0, "{out}");
    let on_chart: f64 = doc
        .split("mean ")
        .nth(1)
        .and_then(|r| r.split('<').next())
        .and_then(|v| v.trim().parse().ok())
        .expect("the mean's legend entry");
    assert!(
        (on_chart - mean).abs() < 1e-5,
        "chart mean {on_chart}, report {mean}"
    );
    assert!(doc.contains("q8_0/q8_0 KV cache") && doc.contains("positions"));

    let (ok, _, err) = mica(&[
        "perplexity",
        "-m",
        src.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "--kl-chart",
        svg.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("--kl-base"), "{err}");
}

#[test]
fn kl_base_with_another_vocabulary_is_an_error() {
    let dir = scratch("kl-vocab");
    let tiny = dir.join("tiny.gguf");
    write_tiny(&tiny, &Tiny::default());
    let text = workspace().join("fixtures/text/GPL-3");
    let (ok, _, err) = mica(&[
        "perplexity",
        "-m",
        model_path(SMOLLM).to_str().unwrap(),
        "--kl-base",
        tiny.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "128",
    ]);
    assert!(!ok && err.contains("same vocabulary"), "{err}");
}
