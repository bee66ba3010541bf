//! Micro-benchmark of the dot-product and quantizer tables (ignored by default):
//! `cargo test -p mica-kernels --test quant_bench -- --ignored --nocapture`.
//!
//! Each dot product runs over 64 rows of 4096 weights (a matrix-vector product's inner
//! loop, weights ~1 MiB at 4.5 bits so they stay in cache: this measures compute, not DRAM)
//! and reports weight bytes per second (GB/s) and ns per row.

mod quant_common;

use std::hint::black_box;
use std::time::Instant;

use mica_kernels::DType;
use mica_kernels::simd::{DotPath, Kernels};
use quant_common::*;

const N: usize = 4096;
const ROWS: usize = 64;

fn time<F: FnMut()>(mut f: F) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..10 {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / 10.0);
    }
    best
}

#[test]
#[ignore]
fn bench_vec_dot_and_quantize() {
    let mut r = rng(99);
    let tables: Vec<_> = Kernels::all().into_iter().filter_map(|(_, k)| k).collect();
    for t in DType::WEIGHT_TYPES {
        let rb = t.row_bytes(N).unwrap();
        let w = weight_row(t, ROWS * N / t.block_size(), WeightKind::Quantized, &mut r);
        let xq = quantize_act(t, &activations(N, ActKind::Normal, &mut r));
        let mut line = format!("{t:>5} dot:");
        for k in &tables {
            let s = time(|| {
                let mut acc = 0.0f32;
                for row in w.chunks_exact(rb) {
                    acc += k.vec_dot(t, N, black_box(row), black_box(&xq));
                }
                black_box(acc);
            });
            let gbs = (w.len() as f64) / s / 1e9;
            line += &format!(
                "  {} {gbs:6.2} GB/s {:7.0} ns/row",
                k.isa(),
                s * 1e9 / ROWS as f64
            );
        }
        println!("{line}");
    }
    // llama.cpp's batch paths (repacked Q4_K, tiled k-quants).
    for (path, t) in [
        (DotPath::RepackGemv, DType::Q4_K),
        (DotPath::RepackGemm, DType::Q4_K),
        (DotPath::Tiled, DType::Q4_K),
        (DotPath::Tiled, DType::Q6_K),
    ] {
        let rb = t.row_bytes(N).unwrap();
        let w = weight_row(t, ROWS * N / t.block_size(), WeightKind::Quantized, &mut r);
        let xq = quantize_act(t, &activations(N, ActKind::Normal, &mut r));
        let mut line = format!("{t:>5} {path:?}:");
        for k in &tables {
            let f = k.dot_fn(path, t);
            let s = time(|| {
                let mut acc = 0.0f32;
                for row in w.chunks_exact(rb) {
                    acc += f(N, black_box(row), black_box(&xq));
                }
                black_box(acc);
            });
            let gbs = (w.len() as f64) / s / 1e9;
            line += &format!("  {} {gbs:6.2} GB/s", k.isa());
        }
        println!("{line}");
    }
    for t in [
        DType::Q8_0,
        DType::Q8_1,
        DType::Q8_K,
        DType::F16,
        DType::BF16,
    ] {
        let x = activations(N, ActKind::Normal, &mut r);
        let mut out = vec![0u8; t.row_bytes(N).unwrap()];
        let mut line = format!("{t:>5} quantize:");
        for k in &tables {
            let s = time(|| k.quantize_act(t, black_box(&x), &mut out));
            line += &format!("  {} {:7.0} ns/row", k.isa(), s * 1e9);
        }
        println!("{line}");
    }
}
