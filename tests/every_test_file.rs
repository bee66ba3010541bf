//! Shared by the crates whose integration tests are one binary (`tests/main.rs`, with
//! `autotests = false`): every `tests/*.rs` file is compiled, either as a module of that
//! binary or as a test target of its own in the crate's `Cargo.toml` — so a new test file
//! that nobody declared fails this check instead of silently never running.

use std::path::Path;

/// Checks the crate at `manifest_dir` whose `tests/main.rs` reads `main_src`.
pub fn check(manifest_dir: &str, main_src: &str) {
    let dir = Path::new(manifest_dir);
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
    let mut missing = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(dir.join("tests")).expect("tests/") {
        let path = entry.expect("tests/ entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("file name");
        if stem == "main" {
            continue;
        }
        seen += 1;
        let in_main = main_src.lines().any(|l| l.trim() == format!("mod {stem};"));
        let own_target = manifest.contains(&format!("path = \"tests/{stem}.rs\""));
        if !in_main && !own_target {
            missing.push(format!("tests/{stem}.rs"));
        }
    }
    assert!(seen > 0, "no test files found under {}", dir.display());
    assert!(
        missing.is_empty(),
        "{missing:?} would never run: add `mod NAME;` to tests/main.rs (or a [[test]] with its path to Cargo.toml)"
    );
}
