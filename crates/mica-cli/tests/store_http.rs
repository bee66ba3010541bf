//! `mica pull`, `mica list` and `mica rm` through the real binary, against a local HTTP
//! server that lays files out as the model hub does (`/{org}/{repo}/resolve/main/{file}`,
//! `/api/models/{org}/{repo}` for the file list with LFS sha256s), reached through
//! `MICA_HF_ENDPOINT`. The server honours `Range` requests, can cut a transfer short once,
//! and records every request so the tests can see that a pull resumed.

mod common;

use common::hub::{Route, Server};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `mica` with its store at `home` and the hub at `hub`.
fn mica_at(home: &Path, hub: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mica"))
        .args(args)
        .env("MICA_HOME", home)
        .env("MICA_HF_ENDPOINT", hub)
        .env_remove("HF_TOKEN")
        .output()
        .expect("running mica");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        !stderr.contains("panicked"),
        "mica panicked on {args:?}:\n{stderr}"
    );
    (out.status.success(), stdout, stderr)
}

/// The last line of stderr, which for a failure is its one `error:` line.
fn error_line(stderr: &str) -> &str {
    let line = stderr.lines().last().unwrap_or("");
    assert!(
        line.starts_with("error: "),
        "expected an error line: {stderr}"
    );
    line
}

/// File names under `dir`, recursively, relative to it.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.retain(|n| !n.ends_with(".lock"));
    out.sort();
    out
}

fn tiny_bytes(dir: &Path) -> Vec<u8> {
    let p = dir.join("src-tiny.gguf");
    write_tiny(&p, &Tiny::default());
    std::fs::read(p).unwrap()
}

#[test]
fn pull_resumes_after_a_cut_connection_then_list_run_rm() {
    let server = Server::start();
    let home = scratch("resume");
    let tiny = tiny_bytes(&home);
    let cut = tiny.len() / 3;
    server.repo(
        "org/tiny-GGUF",
        &[("tiny-F32.gguf", Route::CutOnce(tiny.clone(), cut))],
        None,
    );

    let (ok, _, err) = mica_at(
        &home,
        &server.base,
        &["pull", "hf:org/tiny-GGUF:tiny-F32.gguf"],
    );
    assert!(!ok);
    let e = error_line(&err);
    assert!(
        e.contains("interrupted") && e.contains("again to resume"),
        "{e}"
    );
    let store = home.join("models/hf/org/tiny-GGUF");
    assert_eq!(
        tree(&store),
        ["tiny-F32.gguf.part"],
        "only the partial download"
    );
    assert_eq!(
        std::fs::metadata(store.join("tiny-F32.gguf.part"))
            .unwrap()
            .len(),
        cut as u64
    );

    // The same command resumes where the transfer stopped.
    let (ok, out, err) = mica_at(
        &home,
        &server.base,
        &["pull", "hf:org/tiny-GGUF:tiny-F32.gguf"],
    );
    assert!(ok, "{err}");
    assert!(err.contains("resuming"), "{err}");
    let dest = store.join("tiny-F32.gguf");
    assert_eq!(out.trim(), dest.to_str().unwrap());
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        tiny,
        "resumed file is byte-identical"
    );
    assert_eq!(tree(&store), ["tiny-F32.gguf"], "no partial file left");
    let ranges: Vec<_> = server
        .log()
        .into_iter()
        .filter(|r| r.path.ends_with("/resolve/main/tiny-F32.gguf"))
        .map(|r| r.range)
        .collect();
    assert_eq!(ranges, [None, Some(format!("bytes={cut}-"))]);

    // Listed with its header's architecture; runnable by store name and by file stem.
    let (ok, out, err) = mica_at(&home, &server.base, &["list"]);
    assert!(ok, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("hf:org/tiny-GGUF:tiny-F32.gguf"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("gguf") && row.contains("llama"), "{row}");
    for name in ["hf:org/tiny-GGUF:tiny-F32.gguf", "tiny-F32"] {
        let (ok, out, err) = mica_at(
            &home,
            &server.base,
            &[
                "run", "-m", name, "-p", "Hi", "-n", "2", "--temp", "0", "--json",
            ],
        );
        assert!(ok, "{name}: {err}");
        assert!(out.contains("\"output_ids\""), "{out}");
    }
    // Pulling again finds it in place.
    let (ok, _, err) = mica_at(
        &home,
        &server.base,
        &["pull", "hf:org/tiny-GGUF:tiny-F32.gguf"],
    );
    assert!(ok && err.contains("already in the store"), "{err}");

    let (ok, out, err) = mica_at(
        &home,
        &server.base,
        &["rm", "hf:org/tiny-GGUF:tiny-F32.gguf"],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("removed hf:org/tiny-GGUF:tiny-F32.gguf"),
        "{out}"
    );
    assert!(
        !home.join("models/hf/org").exists(),
        "emptied directories removed"
    );
    let (ok, out, _) = mica_at(&home, &server.base, &["list"]);
    assert!(ok && out.contains("no models"), "{out}");
    let (ok, _, err) = mica_at(&home, &server.base, &["rm", "tiny-F32"]);
    assert!(!ok);
    assert!(error_line(&err).contains("no model called"), "{err}");
}

#[test]
fn sha256_mismatch_leaves_no_file() {
    let server = Server::start();
    let home = scratch("sha");
    let tiny = tiny_bytes(&home);
    let wrong = "0".repeat(64);
    server.repo(
        "org/bad",
        &[("model.gguf", Route::Full(tiny))],
        Some(&wrong),
    );
    let (ok, _, err) = mica_at(&home, &server.base, &["pull", "hf:org/bad:model.gguf"]);
    assert!(!ok);
    let e = error_line(&err);
    assert!(e.contains("sha256 mismatch") && e.contains(&wrong), "{e}");
    assert!(e.contains("deleted"), "{e}");
    assert_eq!(
        tree(&home.join("models")),
        Vec::<String>::new(),
        "nothing left behind"
    );
}

#[test]
fn missing_repo_or_file_is_a_clear_404() {
    let server = Server::start();
    let home = scratch("404");
    // No such repository: the file list is a 404.
    let (ok, _, err) = mica_at(&home, &server.base, &["pull", "hf:org/nothing"]);
    assert!(!ok);
    let e = error_line(&err);
    assert!(
        e.contains("hf:org/nothing was not found") && e.contains("404"),
        "{e}"
    );
    // A listed file the server does not have.
    server.route(
        "/api/models/org/half?blobs=true",
        Route::Json(r#"{"siblings":[{"rfilename":"x.gguf","size":10}]}"#.into()),
    );
    let (ok, _, err) = mica_at(&home, &server.base, &["pull", "hf:org/half:x.gguf"]);
    assert!(!ok);
    let e = error_line(&err);
    assert!(
        e.contains("not found") && e.contains("/org/half/resolve/main/x.gguf") && e.contains("404"),
        "{e}"
    );
    // A file the list does not have.
    let (ok, _, err) = mica_at(&home, &server.base, &["pull", "hf:org/half:y.gguf"]);
    assert!(!ok);
    assert!(error_line(&err).contains("has no file y.gguf"), "{err}");
    assert_eq!(tree(&home.join("models")), Vec::<String>::new());
    // Names that are neither catalog nor hub names.
    for (name, want) in [
        ("llama3.2", "did you mean llama3.2-1b-instruct"),
        ("hf:no-slash", "hf:ORG/REPO"),
    ] {
        let (ok, _, err) = mica_at(&home, &server.base, &["pull", name]);
        assert!(!ok);
        assert!(error_line(&err).contains(want), "{err}");
    }
}

#[test]
fn pull_without_a_file_picks_the_gguf() {
    let server = Server::start();
    let home = scratch("pick");
    let tiny = tiny_bytes(&home);
    server.repo(
        "org/multi",
        &[
            ("m-Q8_0.gguf", Route::Full(vec![1, 2, 3])),
            ("m-Q4_K_M.gguf", Route::Full(tiny.clone())),
        ],
        None,
    );
    let (ok, out, err) = mica_at(&home, &server.base, &["pull", "hf:org/multi"]);
    assert!(ok, "{err}");
    assert!(out.trim().ends_with("m-Q4_K_M.gguf"), "{out}");
    assert_eq!(tree(&home.join("models")), ["hf/org/multi/m-Q4_K_M.gguf"]);
}

#[test]
fn catalog_model_already_in_the_store() {
    let home = scratch("catalog");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let link: PathBuf = models.join("smollm2-135m-instruct-q4_1.gguf");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(model_path("smollm2-135m-instruct-q4_1"), &link).unwrap();
    let hub = "http://127.0.0.1:9"; // never contacted
    let (ok, _, err) = mica_at(&home, hub, &["pull", "smollm2-135m-instruct"]);
    assert!(ok && err.contains("already in the store"), "{err}");
    let (ok, out, err) = mica_at(&home, hub, &["list"]);
    assert!(ok, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("smollm2-135m-instruct "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("llama") && row.contains("Q4_1") && row.contains("93.81 MiB"),
        "{row}"
    );
    let (ok, out, _) = mica_at(&home, hub, &["list", "--catalog"]);
    assert!(ok);
    assert!(
        out.contains("smollm2-135m-instruct *") && out.contains("qwen2.5-coder-0.5b-instruct"),
        "{out}"
    );
    let (ok, out, err) = mica_at(&home, hub, &["inspect", "smollm2-135m-instruct"]);
    assert!(ok, "{err}");
    assert!(out.contains("architecture:  llama"), "{out}");
}

#[test]
fn file_names_from_the_hub_cannot_leave_the_store() {
    let server = Server::start();
    let home = scratch("escape");
    server.route(
        "/api/models/org/evil?blobs=true",
        Route::Json(r#"{"siblings":[{"rfilename":"../../../escaped.gguf","size":3}]}"#.into()),
    );
    server.route(
        "/org/evil/resolve/main/../../../escaped.gguf",
        Route::Full(vec![1, 2, 3]),
    );
    let (ok, _, err) = mica_at(&home, &server.base, &["pull", "hf:org/evil"]);
    assert!(!ok);
    assert!(error_line(&err).contains("unsafe name"), "{err}");
    assert!(!home.join("escaped.gguf").exists());
    assert_eq!(tree(&home.join("models")), Vec::<String>::new());
}

#[test]
fn a_safetensors_repository_is_pulled_as_a_directory() {
    let server = Server::start();
    let home = scratch("safetensors");
    let config = br#"{"architectures":["LlamaForCausalLM"],"torch_dtype":"bfloat16"}"#.to_vec();
    server.repo(
        "org/st",
        &[
            ("model.safetensors", Route::Full(vec![7; 1000])),
            ("config.json", Route::Full(config)),
            ("README.md", Route::Full(b"hello".to_vec())),
        ],
        None,
    );
    let (ok, out, err) = mica_at(&home, &server.base, &["pull", "hf:org/st"]);
    assert!(ok, "{err}");
    assert!(out.trim().ends_with("hf/org/st"), "{out}");
    assert_eq!(
        tree(&home.join("models")),
        ["hf/org/st/config.json", "hf/org/st/model.safetensors"],
        "weights and configs, not the README"
    );
    let (ok, out, _) = mica_at(&home, &server.base, &["list"]);
    assert!(ok);
    let row = out
        .lines()
        .find(|l| l.starts_with("hf:org/st "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("safetensors") && row.contains("LlamaForCausalLM") && row.contains("bfloat16"),
        "{row}"
    );
    // The store resolves the name to the folder, and the loader reads it as a Hugging Face
    // folder: this one's weights are 1000 junk bytes, which it must reject clearly.
    let (ok, _, err) = mica_at(&home, &server.base, &["run", "-m", "hf:org/st", "-p", "x"]);
    assert!(!ok);
    let line = error_line(&err);
    assert!(line.contains("model.safetensors"), "{err}");
    let (ok, _, err) = mica_at(&home, &server.base, &["rm", "hf:org/st"]);
    assert!(ok, "{err}");
    assert_eq!(tree(&home.join("models")), Vec::<String>::new());
}
