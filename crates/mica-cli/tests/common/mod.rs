//! Shared helpers of the CLI tests: running the `mica` binary (`serve`: `mica serve`),
//! locating test models, building tiny GGUF models (valid or deliberately broken) with random
//! weights, and (`hub`) a fake model hub.
#![allow(dead_code)]

#[path = "../../../mica-hub/tests/common/server.rs"]
pub mod hub;
pub mod serve;

use mica::formats::ggml_types::GgmlType;
use mica::formats::{GgufWriter, MetaArray, MetaValue};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `mica` with `args`; returns (exit success, stdout, stderr).
pub fn mica(args: &[&str]) -> (bool, String, String) {
    mica_env(args, &[])
}

/// [`mica`] with `MICA_LOG=info`: the load stages, memory estimates and streaming lines on
/// stderr.
pub fn mica_info(args: &[&str]) -> (bool, String, String) {
    mica_env(args, &[("MICA_LOG", "info")])
}

/// [`mica`] with more environment variables.
pub fn mica_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_mica"))
        .args(args)
        .env("MICA_HOME", scratch("home"))
        .envs(env.iter().copied())
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

/// `mica convert SRC -o OUT --quiet EXTRA...`, which must succeed; returns its stderr
/// (warnings).
pub fn convert(src: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "convert",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    let (ok, _, err) = mica(&args);
    assert!(ok, "convert {args:?}: {err}");
    err
}

/// This test process's scratch root (`$TMPDIR/mica-cli-test-<pid>`).
fn scratch_root() -> PathBuf {
    std::env::temp_dir().join(format!("mica-cli-test-{}", std::process::id()))
}

/// Removes the scratch root when the test process exits (the harness ends with `exit`,
/// which runs `atexit` handlers), so a run leaves nothing behind in the temp folder.
extern "C" fn remove_scratch_root() {
    let _ = std::fs::remove_dir_all(scratch_root());
}

/// A fresh scratch directory for this test process, removed when the process exits. The
/// first call also removes scratch roots of earlier test processes that no longer run
/// (killed runs never reach their exit handler).
pub fn scratch(name: &str) -> PathBuf {
    static CLEANUP: std::sync::Once = std::sync::Once::new();
    CLEANUP.call_once(|| {
        if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
            for e in entries.flatten() {
                let name = e.file_name();
                let pid = name.to_str().and_then(|n| n.strip_prefix("mica-cli-test-"));
                if let Some(pid) = pid
                    && !Path::new("/proc").join(pid).exists()
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        // SAFETY: registers a plain `extern "C"` function with no captured state.
        let rc = unsafe { libc::atexit(remove_scratch_root) };
        assert_eq!(rc, 0, "atexit failed");
    });
    let d = scratch_root().join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A real test model; fails loudly when missing.
pub fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models"));
    let path = dir.join(format!("{name}.gguf"));
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/fetch-test-models, or set MICA_TEST_MODELS",
        path.display()
    );
    path
}

/// Hyper-parameters of the tiny LLaMA-style test model.
pub const N_EMBD: u64 = 64;
pub const N_FF: u64 = 128;
pub const N_HEAD: u64 = 4;
pub const N_HEAD_KV: u64 = 2;
pub const N_LAYER: u64 = 2;

/// GPT-2's byte-to-character alphabet: the 256 single-byte tokens of a byte-level BPE.
fn byte_tokens() -> Vec<String> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = bs.into_iter().zip(cs).collect();
    pairs.sort();
    pairs
        .into_iter()
        .map(|(_, c)| char::from_u32(c).unwrap().to_string())
        .collect()
}

/// Deterministic pseudo-random f32 bytes.
fn weights(n: u64, seed: u64) -> Vec<u8> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .flat_map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2;
            v.to_le_bytes()
        })
        .collect()
}

/// Options for breaking the tiny model.
#[derive(Default, Clone)]
pub struct Tiny {
    pub arch: Option<String>,
    pub skip_tensor: Option<String>,
    /// (tensor name, ggml type id) to declare a tensor with another type.
    pub retype: Option<(String, u32)>,
}

/// Writes a tiny LLaMA-style GGUF (random F32 weights, byte-level vocabulary) to `path`.
pub fn write_tiny(path: &Path, opts: &Tiny) {
    let vocab = byte_tokens();
    let n_vocab = vocab.len() as u64;
    let hd = N_EMBD / N_HEAD;
    let mut shapes: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![N_EMBD, n_vocab]),
        ("output_norm.weight".into(), vec![N_EMBD]),
    ];
    for l in 0..N_LAYER {
        let p = |s: &str| format!("blk.{l}.{s}");
        shapes.extend([
            (p("attn_norm.weight"), vec![N_EMBD]),
            (p("attn_q.weight"), vec![N_EMBD, N_HEAD * hd]),
            (p("attn_k.weight"), vec![N_EMBD, N_HEAD_KV * hd]),
            (p("attn_v.weight"), vec![N_EMBD, N_HEAD_KV * hd]),
            (p("attn_output.weight"), vec![N_HEAD * hd, N_EMBD]),
            (p("ffn_norm.weight"), vec![N_EMBD]),
            (p("ffn_gate.weight"), vec![N_EMBD, N_FF]),
            (p("ffn_up.weight"), vec![N_EMBD, N_FF]),
            (p("ffn_down.weight"), vec![N_FF, N_EMBD]),
        ]);
    }
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(i, (_, s))| weights(s.iter().product(), i as u64))
        .collect();
    let arch = opts.arch.clone().unwrap_or_else(|| "llama".into());
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    w.meta("general.architecture", MetaValue::String(arch.clone()))
        .meta(&k("embedding_length"), MetaValue::U32(N_EMBD as u32))
        .meta(&k("block_count"), MetaValue::U32(N_LAYER as u32))
        .meta(&k("feed_forward_length"), MetaValue::U32(N_FF as u32))
        .meta(&k("attention.head_count"), MetaValue::U32(N_HEAD as u32))
        .meta(
            &k("attention.head_count_kv"),
            MetaValue::U32(N_HEAD_KV as u32),
        )
        .meta(&k("context_length"), MetaValue::U32(256))
        .meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-5))
        .meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", MetaValue::String("gpt-2".into()))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(MetaArray::String(vocab)),
        )
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(vec![1; n_vocab as usize])),
        )
        .meta(
            "tokenizer.ggml.merges",
            MetaValue::Array(MetaArray::String(vec![])),
        )
        .meta("tokenizer.ggml.eos_token_id", MetaValue::U32(0));
    for ((name, shape), bytes) in shapes.iter().zip(&data) {
        if opts.skip_tensor.as_deref() == Some(name) {
            continue;
        }
        let ty = match &opts.retype {
            Some((n, t)) if n == name => *t,
            _ => 0,
        };
        w.tensor(name, GgmlType(ty), shape, bytes);
    }
    let mut f = std::fs::File::create(path).unwrap();
    w.write_to(&mut f).unwrap();
}

/// `mica perplexity -m MODEL --kl-base BASE` over the first `chunks` windows of `ctx` tokens
/// of fixtures/text/GPL-3 (2 threads); its report.
pub fn kl_report(model: &Path, base: &Path, ctx: usize, chunks: usize) -> String {
    let text = workspace().join("fixtures/text/GPL-3");
    let (ctx, chunks) = (ctx.to_string(), chunks.to_string());
    let (ok, out, err) = mica(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "--kl-base",
        base.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        &ctx,
        "--chunks",
        &chunks,
        "-t",
        "2",
        "--quiet",
    ]);
    assert!(ok, "{err}");
    out
}

/// The `NAME = X` number of a perplexity report.
pub fn figure(out: &str, name: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no '{name}' in:\n{out}"));
    line[name.len()..]
        .trim_start_matches([' ', '='])
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
