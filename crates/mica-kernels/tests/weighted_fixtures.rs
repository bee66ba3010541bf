//! The importance-weighted quantizers against llama.cpp's: `fixtures/quant/weighted` holds
//! 4 rows of 512 weights, an importance vector, and what ggml's `ggml_quantize_chunk` wrote
//! for each type with that importance (`scripts/gen_weighted_quant_fixtures.py`, run through
//! llama-cpp-python's libggml-base, llama.cpp 0c1e57098). mica must write the same bytes
//! for every type.

use mica_kernels::DType;
use mica_kernels::quant::quantize_row;
use mica_kernels::quant::weighted::quantize_row_weighted;
use std::path::PathBuf;

const COLS: usize = 512;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/quant/weighted")
}

fn f32s(name: &str) -> Vec<f32> {
    std::fs::read(dir().join(name))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn weighted_quantizers_match_llama_cpp_bytes() {
    let x = f32s("x.f32");
    let imp = f32s("imp.f32");
    assert_eq!(imp.len(), COLS);
    let mut failures = Vec::new();
    for (name, t) in [
        ("Q4_0", DType::Q4_0),
        ("Q4_1", DType::Q4_1),
        ("Q5_0", DType::Q5_0),
        ("Q5_1", DType::Q5_1),
        ("Q2_K", DType::Q2_K),
        ("Q3_K", DType::Q3_K),
        ("Q4_K", DType::Q4_K),
        ("Q5_K", DType::Q5_K),
        ("Q6_K", DType::Q6_K),
        ("IQ4_NL", DType::IQ4_NL),
        ("IQ4_XS", DType::IQ4_XS),
        ("TQ1_0", DType::TQ1_0),
        ("TQ2_0", DType::TQ2_0),
        ("MXFP4", DType::MXFP4),
    ] {
        let want = std::fs::read(dir().join(format!("{name}.bin"))).unwrap();
        let row = t.row_bytes(COLS).unwrap();
        let mut got = vec![0u8; want.len()];
        for (xr, out) in x.chunks_exact(COLS).zip(got.chunks_exact_mut(row)) {
            quantize_row_weighted(t, xr, &imp, out);
        }
        let same = got
            .chunks(t.type_size())
            .zip(want.chunks(t.type_size()))
            .filter(|(a, b)| a == b)
            .count();
        println!(
            "{name}: {same}/{} blocks identical",
            want.len() / t.type_size()
        );
        if got != want {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "differ from llama.cpp: {failures:?}");
}

/// Without an importance matrix, `quantize_row` writes what llama.cpp writes for a file
/// (`ggml_quantize_chunk` with no imatrix: for IQ4_NL/IQ4_XS `quantize_iq4_*` with seven
/// scale tries, for the others the reference quantizers).
#[test]
fn unweighted_quantizers_match_llama_cpp_bytes() {
    let x = f32s("x.f32");
    let mut failures = Vec::new();
    for (name, t) in [
        ("IQ4_NL", DType::IQ4_NL),
        ("IQ4_XS", DType::IQ4_XS),
        ("TQ1_0", DType::TQ1_0),
        ("TQ2_0", DType::TQ2_0),
        ("MXFP4", DType::MXFP4),
    ] {
        let want = std::fs::read(dir().join(format!("{name}.noimp.bin"))).unwrap();
        let mut got = vec![0u8; want.len()];
        let row = t.row_bytes(COLS).unwrap();
        for (xr, out) in x.chunks_exact(COLS).zip(got.chunks_exact_mut(row)) {
            quantize_row(t, xr, out);
        }
        if got != want {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "differ from llama.cpp: {failures:?}");
}

/// IQ2_XS (llama.cpp writes it only with an importance matrix): 32 rows of their own,
/// among them an all-zero row, a super-block of tiny values and an all-negative row.
#[test]
fn iq2_xs_matches_llama_cpp_bytes() {
    use mica_kernels::quant::weighted::requires_importance;
    let x = f32s("x_grid.f32");
    let imp = f32s("imp.f32");
    let t = DType::IQ2_XS;
    assert!(requires_importance(t) && !mica_kernels::quant::can_quantize(t));
    let want = std::fs::read(dir().join("IQ2_XS.bin")).unwrap();
    let row = t.row_bytes(COLS).unwrap();
    assert_eq!(want.len(), row * 32);
    let mut got = vec![0u8; want.len()];
    for (xr, out) in x.chunks_exact(COLS).zip(got.chunks_exact_mut(row)) {
        quantize_row_weighted(t, xr, &imp, out);
    }
    let blocks = |b: &[u8]| {
        b.chunks(t.type_size())
            .map(<[u8]>::to_vec)
            .collect::<Vec<_>>()
    };
    let differ: Vec<usize> = blocks(&got)
        .iter()
        .zip(blocks(&want))
        .enumerate()
        .filter(|(_, (a, b))| *a != b)
        .map(|(i, _)| i)
        .collect();
    assert!(
        differ.is_empty(),
        "IQ2_XS blocks differ from llama.cpp's: {differ:?}"
    );
}
