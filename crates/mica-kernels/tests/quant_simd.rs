//! Every SIMD kernel table this CPU supports against the scalar reference.
//!
//! Dot products: integer sums are exact in every kernel, so SIMD (llama.cpp's x86 float
//! structure, pinned bit for bit by `llama_exact.rs`) and `vec_dot_ref` (ggml's generic
//! one) differ only in float rounding order. Budget, with `M = sum (|w_i| + |offset_i|) |x_i|`
//! over dequantized values and `B` the number of blocks:
//! - quantized types: `|simd - ref| <= 2 (B + 8) eps M`
//! - F32 / F16 / BF16 (FMA and 8-lane accumulators vs. one sequential sum): `(n + 8) eps M`
//!
//! Activation quantizers: byte-identical to the scalar table's (the run-time Q8_0/Q8_1
//! quantizers, ties and non-finite inputs included).
//! ISAs the CPU lacks are printed as skipped.

mod quant_common;

use std::io::Write;

use mica_kernels::DType;
use mica_kernels::quant::vec_dot_ref;
use mica_kernels::simd::{DotPath, Kernels, kernels};
use quant_common::*;

const LENGTHS_IN_BLOCKS: [usize; 5] = [1, 3, 17, 33, 127];

/// The SIMD tables to test; prints the ones this CPU cannot run.
fn simd_tables() -> Vec<&'static Kernels> {
    let mut out = Vec::new();
    for (name, k) in Kernels::all() {
        match k {
            Some(k) if name != "scalar" => out.push(k),
            Some(_) => {}
            None => {
                // Written to stderr directly, past the test harness's output capture, so a
                // skipped ISA is visible in every run.
                let msg = format!("SKIPPED: {name} kernels (this CPU lacks the instruction set)\n");
                let _ = std::io::stderr().write_all(msg.as_bytes());
            }
        }
    }
    println!(
        "testing: {:?}; kernels() picks {}",
        out.iter().map(|k| k.isa()).collect::<Vec<_>>(),
        kernels().isa()
    );
    out
}

fn budget(t: DType, n: usize, mag: f64) -> f64 {
    let eps = f32::EPSILON as f64;
    if t.is_quantized() {
        2.0 * (n / t.block_size() + 8) as f64 * eps * mag
    } else {
        (n + 8) as f64 * eps * mag
    }
}

#[test]
fn simd_dot_products_match_reference_within_budget() {
    let tables = simd_tables();
    let mut r = rng(10);
    for k in &tables {
        for t in DType::WEIGHT_TYPES {
            let mut worst = 0.0f64; // largest err / (eps * M) seen
            let mut cases = 0;
            for nblocks in LENGTHS_IN_BLOCKS {
                // Float types: odd element counts around the same sizes.
                let n = if t.is_quantized() {
                    nblocks * t.block_size()
                } else {
                    nblocks * 33
                };
                for wk in WEIGHT_KINDS {
                    for ak in ACT_KINDS {
                        let w = weight_row(t, n / t.block_size(), wk, &mut r);
                        let xq = quantize_act(t, &activations(n, ak, &mut r));
                        let want = vec_dot_ref(t, n, &w, &xq);
                        let got = k.vec_dot(t, n, &w, &xq);
                        let (_, mag) = reference_f64(t, n, &w, &xq);
                        let ctx = format!("{} {t} n={n} {wk:?} {ak:?}", k.isa());
                        if !want.is_finite() || mag > 1e36 {
                            assert!(
                                got.is_nan() == want.is_nan() || mag > 1e36,
                                "{ctx}: simd {got}, ref {want}"
                            );
                            continue;
                        }
                        let err = (got as f64 - want as f64).abs();
                        assert!(
                            err <= budget(t, n, mag),
                            "{ctx}: simd {got:e}, ref {want:e}, err {err:e}, budget {:e}",
                            budget(t, n, mag)
                        );
                        if mag > 0.0 {
                            worst = worst.max(err / (f32::EPSILON as f64 * mag));
                        }
                        cases += 1;
                    }
                }
            }
            println!(
                "{:>6} {t:>4}: {cases} cases, worst |simd-ref| = {worst:.2} eps*M",
                k.isa()
            );
        }
    }
}

/// llama.cpp's batch paths (repacked Q4_K gemv/gemm, tiled k-quants) compute the same value
/// as the reference up to float rounding, in every table.
#[test]
fn batch_path_dot_products_match_reference_within_budget() {
    let mut r = rng(12);
    let paths = [DotPath::RepackGemv, DotPath::RepackGemm, DotPath::Tiled];
    for (_, k) in Kernels::all() {
        let Some(k) = k else { continue };
        for t in [
            DType::Q2_K,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
        ] {
            for path in paths {
                let mut worst = 0.0f64;
                for nblocks in LENGTHS_IN_BLOCKS {
                    let n = nblocks * t.block_size();
                    for wk in WEIGHT_KINDS {
                        for ak in ACT_KINDS {
                            let w = weight_row(t, nblocks, wk, &mut r);
                            let xq = quantize_act(t, &activations(n, ak, &mut r));
                            let want = vec_dot_ref(t, n, &w, &xq);
                            let got = k.dot_fn(path, t)(n, &w, &xq);
                            let (_, mag) = reference_f64(t, n, &w, &xq);
                            if !want.is_finite() || mag > 1e36 {
                                continue;
                            }
                            let err = (got as f64 - want as f64).abs();
                            assert!(
                                err <= budget(t, n, mag),
                                "{} {path:?} {t} n={n} {wk:?} {ak:?}: {got:e} vs ref {want:e}",
                                k.isa()
                            );
                            if mag > 0.0 {
                                worst = worst.max(err / (f32::EPSILON as f64 * mag));
                            }
                        }
                    }
                }
                println!(
                    "{:>6} {path:?} {t}: worst |path-ref| = {worst:.2} eps*M",
                    k.isa()
                );
            }
        }
    }
}

/// Activations whose scaled values land exactly on k + 0.5 (amax 127 gives `127 / amax = 1`):
/// the rounding direction of ties is what separates `roundf` from the FPU default.
fn ties(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if i % 32 == 0 {
                127.0
            } else {
                (i % 32) as f32 - 16.5
            }
        })
        .collect()
}

#[test]
fn simd_activation_quantizers_are_byte_identical() {
    let tables = simd_tables();
    let mut r = rng(11);
    let acts = [
        DType::Q8_0,
        DType::Q8_1,
        DType::Q8_K,
        DType::F16,
        DType::BF16,
        DType::F32,
    ];
    for k in &tables {
        for t in acts {
            let mut cases = 0;
            for nblocks in LENGTHS_IN_BLOCKS {
                let n = if t.is_quantized() {
                    nblocks * t.block_size()
                } else {
                    nblocks * 33
                };
                let mut inputs: Vec<Vec<f32>> = ACT_KINDS
                    .iter()
                    .map(|&a| activations(n, a, &mut r))
                    .collect();
                inputs.push(ties(n));
                // Repeated magnitudes of both signs: Q8_K must pick the first one.
                inputs.push(
                    (0..n)
                        .map(|i| if i % 3 == 0 { -2.0 } else { 2.0 })
                        .collect(),
                );
                // Non-finite values (NaN, +-inf) and a subnormal-only row.
                let mut nonfinite = activations(n, ActKind::Normal, &mut r);
                for (i, v) in nonfinite.iter_mut().enumerate() {
                    *v = match i % 41 {
                        5 => f32::NAN,
                        9 => f32::INFINITY,
                        20 => f32::NEG_INFINITY,
                        _ => *v,
                    };
                }
                inputs.push(nonfinite);
                inputs.push(vec![1e-44; n]);
                for (case, x) in inputs.iter().enumerate() {
                    let mut want = vec![0u8; t.row_bytes(n).unwrap()];
                    let mut got = vec![0xAAu8; want.len()];
                    Kernels::scalar().quantize_act(t, x, &mut want);
                    k.quantize_act(t, x, &mut got);
                    let bs = t.type_size();
                    for (b, (g, w)) in got.chunks(bs).zip(want.chunks(bs)).enumerate() {
                        assert_eq!(
                            g,
                            w,
                            "{} {t} n={n} input {case}: block {b} differs",
                            k.isa()
                        );
                    }
                    cases += 1;
                }
            }
            println!("{:>6} quantize {t}: {cases} rows byte-identical", k.isa());
        }
    }
}

#[test]
fn dispatch_picks_a_supported_table() {
    let best = kernels();
    let names: Vec<_> = Kernels::all()
        .into_iter()
        .filter_map(|(n, k)| k.map(|_| n))
        .collect();
    assert!(names.contains(&best.isa()));
    assert_eq!(
        names.last(),
        Some(&best.isa()),
        "kernels() should pick the fastest table"
    );
}
