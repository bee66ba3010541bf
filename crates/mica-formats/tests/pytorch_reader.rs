//! PyTorch checkpoints (fixtures made by `fixtures/pytorch/make_fixtures.py` with torch):
//! every tensor's type, shape and values as torch saved them; training checkpoints, shards,
//! and the refusals — non-contiguous tensors, the legacy format, and pickles that would run
//! code in Python (each would create a canary file; none may exist afterwards).

use mica_formats::pytorch::pickle::TorchDtype;
use mica_formats::{CheckpointSet, FormatError, TensorFile, TorchFile};
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch")
}

/// The values of a tensor, as f64, from its bytes.
fn values(f: &TorchFile, name: &str) -> (String, Vec<u64>, Vec<f64>) {
    let t = f
        .tensors()
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} missing"));
    let b = f.tensor_data(t);
    let ty = t.ggml_type.name();
    let v: Vec<f64> = match ty.as_str() {
        "F32" => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        "F16" => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        "BF16" => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        "F64" => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "I64" => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        "I8" => b.iter().map(|&x| x as i8 as f64).collect(),
        other => panic!("{name}: unexpected type {other}"),
    };
    let mut shape = t.shape.clone();
    shape.reverse();
    (ty, shape, v)
}

#[test]
fn a_state_dict_reads_as_torch_saved_it() {
    let f = TorchFile::open(fixtures().join("state_dict.pt")).unwrap();
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    let types = [
        ("float32", "F32"),
        ("float16", "F16"),
        ("bfloat16", "BF16"),
        ("float64", "F64"),
        ("int64", "I64"),
        ("int8", "I8"),
    ];
    let expected = expected.as_object().unwrap();
    assert_eq!(f.tensors().len(), expected.len());
    for (name, e) in expected {
        let (ty, shape, v) = values(&f, name);
        let want_ty = types
            .iter()
            .find(|t| t.0 == e["dtype"])
            .unwrap_or_else(|| panic!("{name}: {}", e["dtype"]))
            .1;
        assert_eq!(ty, want_ty, "{name}");
        let want_shape: Vec<u64> = e["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        // A 0-d tensor is one element with no dimensions.
        assert_eq!(shape, want_shape, "{name}");
        let want: Vec<f64> = e["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        // The JSON holds Python's shortest decimal of each value; parsed back it may be
        // one unit in the last place off.
        assert_eq!(v.len(), want.len(), "{name}");
        for (a, b) in v.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-15 * b.abs().max(1.0),
                "{name}: {a} vs {b}"
            );
        }
    }
    // The bool mask is held but left out.
    assert_eq!(f.skipped(), &[("mask".to_string(), TorchDtype::Bool)]);
}

#[test]
fn wrapped_and_sharded_checkpoints() {
    let f = TorchFile::open(fixtures().join("wrapped.pt")).unwrap();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["w"]);
    let set = CheckpointSet::open_dir(fixtures().join("sharded")).unwrap();
    assert_eq!(set.files.len(), 2);
    let (file, t) = set.tensor("y").unwrap();
    assert!(file.path().ends_with("pytorch_model-00002-of-00002.bin"));
    let y: Vec<f32> = file
        .tensor_data(t)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(y, [0.0, 2.0, 4.0]);
    assert!(set.tensor("x").is_some() && set.tensor("z").is_some());
}

#[test]
fn layouts_mica_cannot_map_are_refused_clearly() {
    let e = TorchFile::open(fixtures().join("noncontiguous.pt"))
        .err()
        .unwrap();
    assert!(
        matches!(&e, FormatError::Tensor { tensor, .. } if tensor == "t"),
        "{e}"
    );
    assert!(e.to_string().contains("not contiguous"), "{e}");
    let e = TorchFile::open(fixtures().join("legacy.pt"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("legacy format"), "{e}");
    let e = TorchFile::open(fixtures().join("expected.json"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a PyTorch checkpoint"), "{e}");
}

#[test]
fn pickles_that_would_run_code_are_refused_and_nothing_runs() {
    let cases = [
        ("os_system", "'posix.system'"),
        ("eval", "'builtins.eval'"),
        ("subprocess", "'subprocess.call'"),
        ("nested", "'posix.system'"),
        ("inst", "INST"),
        ("torch_lookalike", "'torch.load'"),
    ];
    for (name, needle) in cases {
        let canary = PathBuf::from(format!("/tmp/mica-pickle-canary-{name}"));
        let _ = std::fs::remove_file(&canary);
        let e = TorchFile::open(fixtures().join(format!("evil/{name}.pt")))
            .err()
            .unwrap_or_else(|| panic!("{name} was accepted"));
        let msg = e.to_string();
        assert!(matches!(e, FormatError::Parse { .. }), "{name}: {msg}");
        assert!(msg.contains(needle), "{name}: {msg}");
        assert!(!canary.exists(), "{name}: the payload ran");
    }
}
