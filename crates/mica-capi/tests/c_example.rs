//! The C example (examples/c/stream.c), compiled with `cc` against include/mica.h and the
//! libmica shared library (`cargo build -p mica-capi`), run on the SmolLM2 test model under
//! AddressSanitizer with its leak checker on: the streamed greedy text and tokens equal the
//! `mica` facade's (what `mica run --temp 0` prints) and llama.cpp's greedy tokens for the
//! same prompt (fixtures/golden), the callback stops generation early,
//! and a bad path comes back as `MICA_STATUS_NOT_FOUND` with a message — with no leak and
//! no memory error reported.
//!
//! libmica itself is not instrumented, but it allocates through the C library's `malloc`,
//! which ASan replaces for the whole process, so LeakSanitizer sees what the library
//! leaks: [`the_leak_checker_sees_what_libmica_leaks`] proves it with a program that
//! forgets to free a model and a string. (`scripts/c-api-valgrind` runs the same example
//! under valgrind, which is too slow for every test run.)
//!
//! The static library libmica.a is linked the way docs/c-api.md says, so that the list of
//! system libraries there stays right.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const PROMPT: &str = "The capital of France is";
const MAX_TOKENS: usize = 24;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model_path() -> PathBuf {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .expect("MICA_TEST_MODELS is not set: run scripts/test, which fetches the test models");
    let p = PathBuf::from(dir).join("smollm2-135m-instruct-q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-test-models",
        p.display()
    );
    p
}

/// Builds libmica in this test's target directory and profile and returns the directory
/// holding it. Cargo does not build a package's cdylib for its own integration tests (only
/// linkable libraries are), so the test asks for it, with
/// `cargo build --workspace --lib --examples`: cargo resolves dependency features for the
/// packages and targets selected, and this selection resolves them as
/// `cargo test --workspace` does (every member, dev-dependencies on), so under that command
/// (the README's test command) it reuses everything the tests were built from and only
/// links libmica. (`cargo build -p mica-capi` would resolve fewer features — libc without
/// `extra_traits`, syn without `full`… — and compile a second copy of the whole dependency
/// graph, mica's crates included.) Under `cargo test -p mica-capi` it builds the other
/// members' libraries once, the same artifacts a workspace run uses.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // <target>/tmp, and this binary is <target>/[<triple>/]<profile>/deps/<name>.
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target directory")
            .to_path_buf();
        let exe = std::env::current_exe().expect("the test binary's path");
        let out_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the profile's output directory")
            .to_path_buf();
        let profile = match out_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_string(),
            Some(p) => p.to_string(),
        };
        let mut cmd = Command::new(env!("CARGO"));
        // Without the variables cargo set for this test process: build scripts that watch
        // one (ring's watches CARGO_MANIFEST_DIR) would otherwise rebuild on every switch
        // between this build and an ordinary one.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_BIN_")
                || matches!(
                    &*key,
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                        | "OUT_DIR"
                )
            {
                cmd.env_remove(&*key);
            }
        }
        cmd.args(["build", "--workspace", "--lib", "--examples", "--locked"])
            .args(["--profile", &profile])
            .arg("--target-dir")
            .arg(&target);
        // A cross build puts its output under <target>/<triple>/<profile>.
        if let Some(triple) = out_dir
            .parent()
            .filter(|p| *p != target)
            .and_then(|p| p.file_name())
        {
            cmd.arg("--target").arg(triple);
        }
        let built = cmd.output().expect("running cargo to build libmica");
        assert!(
            built.status.success(),
            "`cargo build --workspace --lib --examples` (for libmica) failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let lib = out_dir.join(format!(
            "{}mica{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ));
        assert!(lib.is_file(), "{} was not built", lib.display());
        out_dir
    })
}

/// Compiles `source` with AddressSanitizer into the test's scratch directory, linked with
/// libmica; panics with the compiler's output when it fails (or when there is no `cc`).
fn compile(source: &Path, name: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let lib = lib_dir();
    let result = Command::new(&cc)
        .args(["-std=c11", "-g", "-O1", "-Wall", "-Wextra", "-Werror"])
        .args(["-fsanitize=address", "-fno-omit-frame-pointer"])
        .arg("-I")
        .arg(repo_root().join("include"))
        .arg(source)
        .arg("-L")
        .arg(lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lmica")
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run the C compiler `{cc}` ({e}): install one (e.g. gcc) or set CC")
        });
    assert!(
        result.status.success(),
        "`{cc}` failed to compile {} with -fsanitize=address:\n{}",
        source.display(),
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// examples/c/stream.c, compiled once for all the tests here.
fn example() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| compile(&repo_root().join("examples/c/stream.c"), "stream"))
}

/// Runs a sanitized program with leak detection on.
fn run(exe: &Path, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        .output()
        .expect("running the compiled C program")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Neither AddressSanitizer nor LeakSanitizer reported anything.
fn assert_clean(o: &Output) {
    let err = stderr(o);
    assert!(
        !err.contains("Sanitizer"),
        "the sanitizer reported a problem:\n{err}"
    );
}

/// The token ids the example prints on its `tokens:` line.
fn printed_tokens(o: &Output) -> Vec<u32> {
    let err = stderr(o);
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("tokens:"))
        .unwrap_or_else(|| panic!("no `tokens:` line in:\n{err}"));
    line.split_whitespace()
        .map(|t| t.parse().expect("a token id"))
        .collect()
}

/// The greedy completion of [`PROMPT`] through the `mica` facade, tokenized as `mica run -p`
/// tokenizes it.
fn facade_greedy() -> facade::Generation {
    let model = facade::Model::open(model_path()).unwrap();
    let prompt = model.tokenize(PROMPT).unwrap();
    let params = facade::GenerateParams {
        max_tokens: MAX_TOKENS,
        sampling: facade::SamplingParams::greedy(),
        ..Default::default()
    };
    let mut session = model.session(facade::SessionOptions::default());
    session.generate(&prompt, &params).unwrap()
}

/// llama.cpp's greedy output ids for [`PROMPT`] (the `capital` case of
/// fixtures/golden/smollm2-135m-instruct-q4_1.json, 48 tokens).
fn llama_cpp_greedy() -> Vec<u32> {
    let path = repo_root().join("fixtures/golden/smollm2-135m-instruct-q4_1.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let golden: serde_json::Value = serde_json::from_str(&text).expect("the golden file is JSON");
    let case = golden["cases"]
        .as_array()
        .and_then(|cases| cases.iter().find(|c| c["id"] == "capital"))
        .expect("the golden file's `capital` case");
    assert_eq!(case["prompt"], PROMPT);
    case["output_ids"]
        .as_array()
        .expect("output_ids")
        .iter()
        .map(|v| v.as_u64().expect("a token id") as u32)
        .collect()
}

#[test]
fn the_example_streams_the_greedy_completion_mica_gives() {
    let model = model_path();
    let o = run(
        example(),
        &[model.to_str().unwrap(), PROMPT, &MAX_TOKENS.to_string()],
    );
    assert_clean(&o);
    assert!(o.status.success(), "exit {}:\n{}", o.status, stderr(&o));
    let want = facade_greedy();
    assert_eq!(String::from_utf8_lossy(&o.stdout), want.text);
    assert_eq!(printed_tokens(&o), want.output_ids);
    // An anchor outside mica: the same tokens as llama.cpp's greedy run.
    assert_eq!(printed_tokens(&o), llama_cpp_greedy()[..MAX_TOKENS]);
    assert!(
        stderr(&o).contains(&format!(
            "{MAX_TOKENS} generated, finish: {}",
            want.finish.as_str()
        )),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_callback_stops_generation_early() {
    let model = model_path();
    let o = run(
        example(),
        &[
            model.to_str().unwrap(),
            PROMPT,
            &MAX_TOKENS.to_string(),
            "3",
        ],
    );
    assert_clean(&o);
    assert!(o.status.success(), "exit {}:\n{}", o.status, stderr(&o));
    let want = facade_greedy();
    let got = String::from_utf8_lossy(&o.stdout).into_owned();
    let tokens = printed_tokens(&o);
    assert!(stderr(&o).contains("finish: cancelled"), "{}", stderr(&o));
    assert!(
        !got.is_empty() && want.text.starts_with(&got) && got.len() < want.text.len(),
        "stopped text {got:?} is not a proper prefix of {:?}",
        want.text
    );
    assert!(tokens.len() >= 3 && tokens.len() < MAX_TOKENS, "{tokens:?}");
    assert_eq!(tokens, want.output_ids[..tokens.len()]);
}

#[test]
fn a_bad_path_is_an_error_code_with_a_message() {
    let bad = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-model.gguf");
    let o = run(example(), &[bad.to_str().unwrap(), PROMPT]);
    assert_clean(&o);
    // MICA_STATUS_NOT_FOUND, as the program's exit code.
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("mica_model_open failed: status 5:") && err.contains("no-such-model.gguf"),
        "{err}"
    );
}

#[test]
fn the_leak_checker_sees_what_libmica_leaks() {
    let source = Path::new(env!("CARGO_TARGET_TMPDIR")).join("leaky.c");
    std::fs::write(
        &source,
        r#"#include <stdio.h>
#include "mica.h"
/* Forgets mica_model_free and mica_string_free: both must show up as leaks. */
int main(int argc, char **argv) {
    (void)argc;
    mica_model *model = NULL;
    if (mica_model_open(argv[1], NULL, &model) != MICA_STATUS_OK) return 1;
    uint32_t ids[2] = {504, 3575};
    char *text = NULL;
    if (mica_detokenize(model, ids, 2, &text, NULL) != MICA_STATUS_OK) return 1;
    printf("%s\n", text);
    model = NULL;
    text = NULL;
    return 0;
}
"#,
    )
    .unwrap();
    let exe = compile(&source, "leaky");
    let o = run(&exe, &[model_path().to_str().unwrap()]);
    let err = stderr(&o);
    assert!(!o.status.success(), "the leaks went unnoticed:\n{err}");
    assert!(
        err.contains("LeakSanitizer: detected memory leaks") && err.contains("Direct leak"),
        "{err}"
    );
    assert!(err.contains("libmica"), "the leaks are libmica's: {err}");
}

/// The system libraries docs/c-api.md lists for linking libmica.a on Linux (what
/// `cargo rustc -p mica-capi --crate-type staticlib -- --print native-static-libs` prints).
#[cfg(target_os = "linux")]
const STATIC_LIBS: &[&str] = &[
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

#[cfg(target_os = "linux")]
#[test]
fn the_static_library_links_as_documented() {
    let docs = std::fs::read_to_string(repo_root().join("docs/c-api.md")).unwrap();
    assert!(
        docs.contains(&format!(
            "target/release/libmica.a {} -o app",
            STATIC_LIBS.join(" ")
        )),
        "docs/c-api.md no longer lists {STATIC_LIBS:?} for the static library"
    );
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stream-static");
    let result = Command::new(&cc)
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(repo_root().join("include"))
        .arg(repo_root().join("examples/c/stream.c"))
        .arg(lib_dir().join("libmica.a"))
        .args(STATIC_LIBS)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run the C compiler `{cc}` ({e}): install one (e.g. gcc) or set CC")
        });
    assert!(
        result.status.success(),
        "`{cc}` failed to link examples/c/stream.c with libmica.a:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    // Run without an rpath or LD_LIBRARY_PATH: it needs no libmica.so.
    let model = model_path();
    let o = Command::new(&out)
        .args([model.to_str().unwrap(), PROMPT, "4"])
        .output()
        .expect("running the statically linked example");
    assert!(o.status.success(), "exit {}:\n{}", o.status, stderr(&o));
    assert_eq!(printed_tokens(&o), llama_cpp_greedy()[..4]);
}
