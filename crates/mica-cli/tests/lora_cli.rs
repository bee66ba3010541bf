//! `--lora` through the real binary: `mica run` with an adapter for another model, a missing
//! adapter and a bad scale each exit non-zero with one clear error; `mica convert --lora`
//! writes the merged fixture; `serve --lora` with several models is refused.

mod common;

use common::*;

fn fixtures() -> std::path::PathBuf {
    workspace().join("fixtures")
}

fn run_err(extra: &[&str]) -> String {
    let m = model_path("smollm2-135m-instruct-q4_1");
    let mut args = vec![
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Hi",
        "-n",
        "2",
        "-t",
        "1",
    ];
    args.extend_from_slice(extra);
    let (ok, _, err) = mica(&args);
    assert!(!ok, "expected failure for {args:?}");
    assert!(err.starts_with("error: "), "one clear error: {err}");
    err
}

#[test]
fn bad_adapters_are_clear_errors() {
    let other = fixtures().join("lora/llama/adapter-f32.gguf");
    let e = run_err(&["--lora", other.to_str().unwrap()]);
    assert!(e.contains("LoRA adapter") && e.contains("shape"), "{e}");
    let e = run_err(&["--lora", "/nonexistent/adapter:0.5"]);
    assert!(e.contains("no such adapter"), "{e}");
    let e = run_err(&["--lora", ":2"]);
    assert!(e.contains("--lora"), "{e}");
}

#[test]
fn convert_merges_an_adapter() {
    let out = scratch("lora").join("merged.gguf");
    let lora = fixtures().join("lora/llama");
    convert(
        &fixtures().join("hf/llama"),
        &out,
        &["--lora", &format!("{}:1", lora.display()), "--type", "q8_0"],
    );
    let (ok, stdout, err) = mica(&["inspect", out.to_str().unwrap(), "--tensors"]);
    assert!(ok, "{err}");
    assert!(stdout.contains("blk.0.attn_q.weight"), "{stdout}");
}

#[test]
fn serve_refuses_lora_with_several_models() {
    let dir = scratch("lora-serve");
    write_tiny(&dir.join("a.gguf"), &Tiny::default());
    write_tiny(&dir.join("b.gguf"), &Tiny::default());
    let (ok, _, err) = mica(&[
        "serve",
        "--models-dir",
        dir.to_str().unwrap(),
        "--lora",
        fixtures().join("lora/llama").to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("--lora applies to one model"), "{err}");
}

#[test]
fn serve_refuses_two_adapters_of_one_name() {
    let dir = scratch("lora-serve-names");
    write_tiny(&dir.join("a.gguf"), &Tiny::default());
    let lora = fixtures().join("lora/llama");
    let (ok, _, err) = mica(&[
        "serve",
        "-m",
        dir.join("a.gguf").to_str().unwrap(),
        "--lora",
        lora.to_str().unwrap(),
        "--lora",
        &format!("{}:0.5", lora.display()),
    ]);
    assert!(!ok);
    assert!(
        err.contains("adapters 0 and 1 are both named 'llama'"),
        "{err}"
    );
}
