//! Importance matrices and mixed precision in `mica convert`: `mica imatrix` writes a file
//! llama.cpp's loader format describes (one entry per projection, one value per input
//! column); `--imatrix` changes what the k-quant quantizers write and records itself in the
//! provenance; `--mix BPW` meets its budget (measured from the written tensors) and records
//! the recipe; impossible budgets are clear errors.

mod common;

use common::*;
use mica::formats::GgufFile;
use std::path::Path;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

/// Average bits per weight of a file's tensors.
fn bpw(path: &Path) -> f64 {
    let f = GgufFile::open(path).unwrap();
    let (bits, n) = f.tensors().iter().fold((0f64, 0f64), |(b, n), t| {
        (b + 8.0 * t.n_bytes as f64, n + t.n_elements() as f64)
    });
    bits / n
}

#[test]
fn mix_meets_the_budget_and_records_the_recipe() {
    let src = workspace().join("fixtures/hf/llama");
    let dir = scratch("mix");
    for budget in [5.0, 6.0, 7.5] {
        let out = dir.join(format!("mix-{budget}.gguf"));
        let log = convert(&src, &out, &["--mix", &budget.to_string()]);
        let got = bpw(&out);
        println!("--mix {budget}: {got:.4} bpw");
        assert!(got <= budget + 1e-9, "--mix {budget}: {got} bpw\n{log}");
        // Greedy fills the budget to within one upgrade of this small model's tensors.
        assert!(got > budget - 0.6, "--mix {budget}: only {got} bpw\n{log}");
        let f = GgufFile::open(&out).unwrap();
        let recipe = f.get_str_array("mica.recipe.tensor_types").unwrap();
        assert!(recipe.iter().any(|r| r.starts_with("blk.0.attn_q.weight=")));
        assert_eq!(
            f.get_f32("mica.recipe.mix_bpw").map(f64::from),
            Some(budget)
        );
    }
    let out = dir.join("too-small.gguf");
    let (ok, _, err) = mica(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--mix",
        "2",
    ]);
    assert!(!ok && err.contains("smallest mix"), "{err}");
    assert!(!out.exists());
}

#[test]
fn imatrix_is_written_read_and_used() {
    let src = model_path(SMOLLM);
    let dir = scratch("imatrix");
    let text = workspace().join("fixtures/text/calibration.txt");
    let im = dir.join("smol.imatrix.gguf");
    let (ok, _, err) = mica(&[
        "imatrix",
        "-m",
        src.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-o",
        im.to_str().unwrap(),
        "-c",
        "64",
        "--chunks",
        "2",
        "-t",
        "2",
        "--quiet",
    ]);
    assert!(ok, "{err}");
    let f = GgufFile::open(&im).unwrap();
    assert_eq!(f.get_str("general.type"), Some("imatrix"));
    assert_eq!(f.get_u32("imatrix.chunk_count"), Some(2));
    let q = f
        .tensor("blk.0.attn_q.weight.in_sum2")
        .expect("attn_q entry");
    assert_eq!(q.shape, vec![576, 1]);
    let c = f
        .tensor("blk.29.ffn_down.weight.counts")
        .expect("ffn_down counts");
    let count = f32::from_le_bytes(f.tensor_data(c)[..4].try_into().unwrap());
    assert_eq!(count, 128.0, "2 windows of 64 tokens");

    let plain = dir.join("plain.gguf");
    let weighted = dir.join("weighted.gguf");
    convert(&src, &plain, &["--type", "q4_k"]);
    convert(
        &src,
        &weighted,
        &["--type", "q4_k", "--imatrix", im.to_str().unwrap()],
    );
    let (a, b) = (
        GgufFile::open(&plain).unwrap(),
        GgufFile::open(&weighted).unwrap(),
    );
    let differs = |name: &str| {
        a.tensor_data(a.tensor(name).unwrap()) != b.tensor_data(b.tensor(name).unwrap())
    };
    // ffn_down is Q4_K/Q6_K (1536-wide rows): weighted; attn_q is Q5_0 (576-wide): weighted.
    assert!(differs("blk.3.ffn_down.weight"));
    assert!(differs("blk.3.attn_q.weight"));
    // The .mica provenance names the quantizer.
    let m = dir.join("weighted.mica");
    convert(
        &src,
        &m,
        &["--type", "q4_k", "--imatrix", im.to_str().unwrap()],
    );
    let (ok, out, err) = mica(&["inspect", m.to_str().unwrap(), "--metadata"]);
    assert!(ok, "{err}");
    assert!(out.contains("importance-weighted"), "{out}");

    // Not an imatrix: a clear error.
    let (ok, _, err) = mica(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        dir.join("x.gguf").to_str().unwrap(),
        "--type",
        "q4_k",
        "--imatrix",
        text.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("imatrix"), "{err}");
}

#[test]
fn tensor_type_overrides_the_rules_and_the_mix() {
    let src = workspace().join("fixtures/hf/llama");
    let dir = scratch("tensor-type");
    let types = |path: &Path| -> Vec<(String, String)> {
        let f = GgufFile::open(path).unwrap();
        f.tensors()
            .iter()
            .map(|t| (t.name.clone(), t.ggml_type.name().to_string()))
            .collect()
    };
    let ty = |all: &[(String, String)], name: &str| {
        all.iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
            .1
            .clone()
    };

    // On top of --type: the first matching rule wins; norms are never touched.
    let out = dir.join("q4_0-over.gguf");
    convert(
        &src,
        &out,
        &[
            "--type",
            "q4_0",
            "--tensor-type",
            r"blk\.0\.attn_v=q8_0",
            "--tensor-type",
            "attn_v=q5_1",
            "--tensor-type",
            ".=q4_1",
        ],
    );
    let t = types(&out);
    assert_eq!(ty(&t, "blk.0.attn_v.weight"), "Q8_0");
    assert_eq!(ty(&t, "blk.1.attn_v.weight"), "Q5_1");
    assert_eq!(ty(&t, "blk.1.ffn_up.weight"), "Q4_1");
    assert_eq!(ty(&t, "blk.0.attn_norm.weight"), "F32");

    // Under --mix the overridden tensors keep their type and count towards the budget.
    let out = dir.join("mix-over.gguf");
    let log = convert(
        &src,
        &out,
        &["--mix", "6", "--tensor-type", "ffn_down=q8_0"],
    );
    let t = types(&out);
    for l in 0..2 {
        assert_eq!(ty(&t, &format!("blk.{l}.ffn_down.weight")), "Q8_0", "{log}");
    }
    assert!(!log.contains("ffn_down.weight = "), "mixed anyway:\n{log}");
    assert!(bpw(&out) <= 6.0 + 1e-9);

    // Clear errors, and no file left behind.
    let bad = dir.join("bad.gguf");
    for (arg, want) in [
        ("attn_v", "expected REGEX=TYPE"),
        ("attn_v=q9_9", "unknown type 'q9_9'"),
        ("attn_(=q8_0", "bad regular expression"),
        ("no_such_tensor=q8_0", "matches no quantizable tensor"),
        ("attn_v=q4_k", "not a multiple of Q4_K's block of 256"),
    ] {
        let (ok, _, err) = mica(&[
            "convert",
            src.to_str().unwrap(),
            "-o",
            bad.to_str().unwrap(),
            "--type",
            "q8_0",
            "--tensor-type",
            arg,
        ]);
        assert!(!ok && err.contains(want), "--tensor-type {arg}: {err}");
        assert!(!bad.exists());
    }
}

#[test]
fn mix_with_calibration_text_measures_each_tensor_alone() {
    // SmolLM2 with every tensor but layer 0's fixed, so that only 7 are measured (each
    // measurement runs the model over the probe's windows).
    let src = model_path(SMOLLM);
    let text = workspace().join("fixtures/text/calibration.txt");
    let out = scratch("mix-kl").join("mix-kl.gguf");
    let log = convert(
        &src,
        &out,
        &[
            "--mix",
            "5",
            "--tensor-type",
            r"token_embd|blk\.([1-9]|[12][0-9])\.=q4_0",
            "--calibrate",
            text.to_str().unwrap(),
            "--calibrate-ctx",
            "64",
            "--calibrate-chunks",
            "2",
            "-t",
            "2",
        ],
    );
    assert!(log.contains("mix: measured 7 tensors alone"), "{log}");
    assert!(!log.contains("could not be measured"), "{log}");
    assert!(log.contains("blk.0.attn_k.weight = "), "{log}");
    assert!(bpw(&out) <= 5.0 + 1e-9, "{log}");
}

/// Mean KL-divergence of `model` from `base` over the first four 256-token windows of
/// GPL-3 (`mica perplexity --kl-base`).
fn mean_kld(model: &Path, base: &Path) -> f64 {
    figure(&kl_report(model, base, 256, 4), "Mean KLD")
}

#[test]
fn gptq_moves_the_model_less_than_rounding_alone() {
    // SmolLM2 to Q4_0 (every 576-wide matrix, the embedding at Q8_0), importance-weighted
    // both times, with and without error compensation; measured on text that is not the
    // calibration text.
    let src = model_path(SMOLLM);
    let text = workspace().join("fixtures/text/calibration.txt");
    let dir = scratch("gptq");
    let calib = [
        "--type",
        "q4_0",
        "--calibrate",
        text.to_str().unwrap(),
        "--calibrate-ctx",
        "256",
        "--calibrate-chunks",
        "6",
        "-t",
        "2",
    ];
    let plain = dir.join("plain.gguf");
    convert(&src, &plain, &calib);
    let gptq = dir.join("gptq.gguf");
    let log = convert(&src, &gptq, &[&calib[..], &["--gptq"]].concat());
    // Every matrix of the 30 layers (7 each) is compensated.
    let n: usize = log
        .split("GPTQ: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no GPTQ count in {log}"));
    assert!(n >= 210, "{log}");
    assert_eq!(bpw(&plain), bpw(&gptq), "same types, same size");
    let (kl_plain, kl_gptq) = (mean_kld(&plain, &src), mean_kld(&gptq, &src));
    assert!(
        kl_gptq < 0.85 * kl_plain,
        "KL-divergence from the source: GPTQ {kl_gptq}, rounding alone {kl_plain}"
    );

    // --gptq needs the calibration text.
    let (ok, _, err) = mica(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        dir.join("x.gguf").to_str().unwrap(),
        "--type",
        "q4_0",
        "--gptq",
    ]);
    assert!(!ok && err.contains("--calibrate"), "{err}");
}
