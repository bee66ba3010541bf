//! Golden tests against gguf-py (`gguf.quants`, written by llama.cpp's authors): mica's
//! dequantization must reproduce its floats bit for bit for every weight type, and mica's
//! reference quantizers must write the same bytes for every type gguf-py can quantize.
//! Fixtures come from `scripts/gen_quant_fixtures.py` (see `fixtures/quant/manifest.json`).

use std::path::PathBuf;

use mica_kernels::DType;
use mica_kernels::quant::{dequantize_row, quantize_row};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/quant")
}

fn manifest() -> Value {
    let path = fixture_dir().join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/gen_quant_fixtures.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("manifest.json parses")
}

/// Reads a fixture file and checks its recorded length.
fn read(entry: &Value) -> Vec<u8> {
    let name = entry["file"].as_str().expect("file name");
    let bytes = std::fs::read(fixture_dir().join(name)).expect("fixture file");
    assert_eq!(
        bytes.len() as u64,
        entry["bytes"].as_u64().unwrap(),
        "{name} length"
    );
    bytes
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn dtype(entry: &Value) -> DType {
    let name = entry["type"].as_str().unwrap();
    DType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"))
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let m = manifest();
    let entries = m["dequant"].as_array().unwrap();
    let mut seen = Vec::new();
    for e in entries {
        let t = dtype(e);
        let blocks = read(&e["blocks"]);
        let expected = f32s(&read(&e["expected"]));
        let mut got = vec![0.0f32; expected.len()];
        dequantize_row(t, &blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{t}: element {i} (block {}): mica {g:e}, gguf-py {w:e}",
                i / t.block_size()
            );
        }
        seen.push(t);
    }
    for t in DType::WEIGHT_TYPES {
        assert!(seen.contains(&t), "no dequant fixture for {t}");
    }
}

#[test]
fn reference_quantizers_match_gguf_py_byte_for_byte() {
    let m = manifest();
    for e in m["quantize"].as_array().unwrap() {
        let t = dtype(e);
        let input = f32s(&read(&e["input"]));
        let expected = read(&e["expected"]);
        let mut got = vec![0u8; expected.len()];
        quantize_row(t, &input, &mut got);
        let bs = t.type_size();
        for (b, (g, w)) in got.chunks(bs).zip(expected.chunks(bs)).enumerate() {
            assert_eq!(g, w, "{t}: block {b} differs from gguf-py");
        }
    }
}
