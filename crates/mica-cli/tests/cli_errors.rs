//! Bad input through the real binary: every case exits non-zero with one clear message
//! naming the problem, and never panics.

mod common;

use common::*;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

fn run_err(model: &std::path::Path, extra: &[&str]) -> String {
    let m = model.to_str().unwrap();
    let mut args = vec!["run", "-m", m, "-p", "Hello", "-n", "4", "-t", "1"];
    args.extend_from_slice(extra);
    let (ok, _, stderr) = mica(&args);
    assert!(!ok, "expected failure for {args:?}");
    assert!(
        stderr.starts_with("error: "),
        "one clear error line: {stderr}"
    );
    stderr
}

#[test]
fn tiny_model_runs() {
    // The control case: the unbroken tiny model loads and generates.
    let p = scratch("ok").join("tiny.gguf");
    write_tiny(&p, &Tiny::default());
    let (ok, out, err) = mica(&[
        "run",
        "-m",
        p.to_str().unwrap(),
        "-p",
        "Hi",
        "-n",
        "3",
        "--temp",
        "0",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["output_ids"].as_array().unwrap().len(), 3);
    assert_eq!(v["prompt_ids"].as_array().unwrap().len(), 2);
}

#[test]
fn truncated_file() {
    let src = std::fs::read(model_path(SMOLLM)).unwrap();
    let dir = scratch("trunc");
    // Cut inside the metadata: a parse error at a byte offset.
    let p = dir.join("head.gguf");
    std::fs::write(&p, &src[..100_000]).unwrap();
    let e = run_err(&p, &[]);
    assert!(e.contains("head.gguf") && e.contains("truncated"), "{e}");
    // Cut inside the tensor data: the first tensor whose bytes are missing is named.
    let p = dir.join("body.gguf");
    std::fs::write(&p, &src[..src.len() / 2]).unwrap();
    let e = run_err(&p, &[]);
    assert!(e.contains("body.gguf") && e.contains("tensor '"), "{e}");
    assert!(e.contains("past the end of the file"), "{e}");
}

#[test]
fn wrong_magic() {
    let p = scratch("magic").join("model.gguf");
    std::fs::write(&p, b"PK\x03\x04 this is a zip file, not a model").unwrap();
    let e = run_err(&p, &[]);
    assert!(e.contains("not a GGUF file"), "{e}");
}

#[test]
fn tensor_range_past_end_of_file() {
    // A tiny model whose last tensor claims more bytes than the file has.
    let p = scratch("range").join("tiny.gguf");
    write_tiny(&p, &Tiny::default());
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
    let e = run_err(&p, &[]);
    assert!(e.contains("tensor 'blk.1.ffn_down.weight'"), "{e}");
    assert!(e.contains("past the end of the file"), "{e}");
}

#[test]
fn unknown_tensor_types() {
    let dir = scratch("types");
    // An id ggml never assigned: refused when the file is read.
    let p = dir.join("unknown.gguf");
    write_tiny(
        &p,
        &Tiny {
            retype: Some(("blk.0.attn_q.weight".into(), 77)),
            ..Default::default()
        },
    );
    let e = run_err(&p, &[]);
    assert!(
        e.contains("tensor 'blk.0.attn_q.weight'") && e.contains("unknown tensor type id 77"),
        "{e}"
    );
    // A real ggml type mica does not compute with (integer tensors): refused when the
    // model is built.
    let p = dir.join("i32.gguf");
    write_tiny(
        &p,
        &Tiny {
            retype: Some(("blk.1.ffn_up.weight".into(), 26)),
            ..Default::default()
        },
    );
    let e = run_err(&p, &[]);
    assert!(
        e.contains("tensor 'blk.1.ffn_up.weight' has type I32"),
        "{e}"
    );
}

#[test]
fn missing_required_tensor() {
    let p = scratch("missing").join("tiny.gguf");
    write_tiny(
        &p,
        &Tiny {
            skip_tensor: Some("blk.1.ffn_gate.weight".into()),
            ..Default::default()
        },
    );
    let e = run_err(&p, &[]);
    assert!(
        e.contains("missing tensor 'blk.1.ffn_gate.weight'") && e.contains("llama"),
        "{e}"
    );
}

#[test]
fn unknown_architecture() {
    let p = scratch("arch").join("tiny.gguf");
    write_tiny(
        &p,
        &Tiny {
            arch: Some("mamba9".into()),
            ..Default::default()
        },
    );
    let e = run_err(&p, &[]);
    assert!(
        e.contains("unknown architecture 'mamba9'") && e.contains("llama"),
        "{e}"
    );
}

#[test]
fn prompt_longer_than_context() {
    let p = scratch("ctx").join("tiny.gguf");
    write_tiny(&p, &Tiny::default());
    let long = "a ".repeat(100);
    let m = p.to_str().unwrap();
    let (ok, _, e) = mica(&["run", "-m", m, "-p", &long, "-c", "32", "-t", "1"]);
    assert!(!ok);
    assert!(
        e.contains("the prompt has 200 tokens but the context holds 32"),
        "{e}"
    );
}

#[test]
fn missing_file_and_bad_flags() {
    let e = run_err(std::path::Path::new("/no/such/model.gguf"), &[]);
    assert!(e.contains("/no/such/model.gguf"), "{e}");
    let p = scratch("flags").join("tiny.gguf");
    write_tiny(&p, &Tiny::default());
    let e = run_err(&p, &["--top-p", "1.5"]);
    assert!(e.contains("top-p"), "{e}");
}

/// `--gpu-layers` takes a count or `all`; where no CUDA driver is installed (this machine
/// and CI), asking for GPU layers is one clear error, and `0` keeps everything on the CPU.
#[test]
fn gpu_layers_without_a_gpu() {
    let p = scratch("gpu").join("tiny.gguf");
    write_tiny(&p, &Tiny::default());
    let m = p.to_str().unwrap();
    let e = run_err(&p, &["--gpu-layers", "some"]);
    assert!(e.contains("takes a number of layers or `all`"), "{e}");
    let (ok, out, err) = mica(&["run", "-m", m, "-p", "Hi", "-n", "3", "--gpu-layers", "0"]);
    assert!(ok && !out.is_empty(), "{err}");
    let args = ["run", "-m", m, "-p", "Hi", "-n", "3", "--gpu-layers", "all"];
    let (ok, out, err) = mica(&args);
    if std::path::Path::new("/dev/nvidiactl").exists() {
        // A GPU machine (scripts/test-gpu): the tiny model runs there.
        assert!(ok && !out.is_empty(), "{err}");
    } else {
        assert!(!ok, "ran on a GPU that is not there: {out}");
        assert!(
            err.starts_with("error: --gpu-layers: no CUDA driver on this machine"),
            "{err}"
        );
        // `chat` refuses before the first answer, `serve` when it loads the model.
        let (ok, _, err) = mica(&["chat", "-m", m, "--gpu-layers", "1"]);
        assert!(!ok, "{err}");
        assert!(
            err.contains("error: --gpu-layers: no CUDA driver on this machine"),
            "{err}"
        );
        let (ok, _, err) = mica(&["serve", "-m", m, "--port", "0", "--gpu-layers", "all"]);
        assert!(!ok, "{err}");
        assert!(
            err.contains("cannot load model 'tiny': --gpu-layers: no CUDA driver on this machine"),
            "{err}"
        );
    }
}
