//! Q4_K decode (one token, llama.cpp's repacked-gemv arithmetic) on every x86 tier, the
//! file's layout beside the load-time packed one, alternating in one process so that a busy
//! machine slows both alike: `cargo run --release -p mica-kernels --example q4k_decode`.
//!
//! Prints, per tier and layout, the best and median GiB/s of weights read over the rounds:
//! `stream` reads 256 MiB of 896×4864 matrices one after another (from DRAM, as a decode step
//! does), `cache` one such matrix again and again (from the caches).

use std::time::Instant;

use mica_kernels::DType;
use mica_kernels::matmul::QActs;
use mica_kernels::quant::f32_to_f16;
use mica_kernels::simd::{DotPath, Kernels, MatOut, WeightRows};

const ROWS: usize = 896;
const COLS: usize = 4864;
const ROUNDS: usize = 15;

/// xorshift64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random Q4_K blocks with small, finite scales.
fn matrix(r: &mut Rng) -> Vec<u8> {
    let t = DType::Q4_K;
    let mut m: Vec<u8> = (0..ROWS * t.row_bytes(COLS).unwrap())
        .map(|_| r.next() as u8)
        .collect();
    for b in m.chunks_exact_mut(t.type_size()) {
        b[0..2].copy_from_slice(&f32_to_f16(0.01 + (r.next() % 100) as f32 * 1e-4));
        b[2..4].copy_from_slice(&f32_to_f16(0.005 + (r.next() % 100) as f32 * 1e-4));
    }
    m
}

fn main() {
    let t = DType::Q4_K;
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let one = matrix(&mut r);
    let count = (256 << 20) / one.len();
    let mats: Vec<Vec<u8>> = (0..count).map(|_| matrix(&mut r)).collect();
    let x: Vec<f32> = (0..COLS)
        .map(|_| (r.next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut out = vec![0f32; ROWS];
    for (name, k) in Kernels::all() {
        let Some(k) = k else { continue };
        if name == "scalar" || name == "neon" {
            continue;
        }
        let mut xq = vec![0u8; DType::Q8_K.row_bytes(COLS).unwrap()];
        k.quantize_act(DType::Q8_K, &x, &mut xq);
        let acts = QActs::from_quantized(DType::Q8_K, COLS, 1, &xq);
        let packed: Option<Vec<Vec<u8>>> = k.pack(t, COLS, ROWS, &one).map(|_| {
            mats.iter()
                .map(|m| k.pack(t, COLS, ROWS, m).unwrap())
                .collect()
        });
        let group = k.pack_group(t);
        fn view(m: &[u8], group: usize, packed: bool) -> WeightRows<'_> {
            if packed {
                WeightRows::packed(DType::Q4_K, COLS, ROWS, group, m)
            } else {
                WeightRows::new(DType::Q4_K, COLS, ROWS, m)
            }
        }
        let mut layouts: Vec<(&str, Vec<WeightRows>)> =
            vec![("file", mats.iter().map(|m| view(m, group, false)).collect())];
        if let Some(p) = &packed {
            layouts.push(("packed", p.iter().map(|m| view(m, group, true)).collect()));
        }
        let mut times: Vec<[Vec<f64>; 2]> = layouts.iter().map(|_| [vec![], vec![]]).collect();
        for _ in 0..ROUNDS {
            for (i, (_, ws)) in layouts.iter().enumerate() {
                let mut run = |ws: &[WeightRows]| {
                    let t0 = Instant::now();
                    for w in ws {
                        k.matmul(
                            DotPath::RepackGemv,
                            w,
                            &acts.view(),
                            &mut MatOut::new(&mut out, ROWS, ROWS, 1),
                        );
                    }
                    t0.elapsed().as_secs_f64()
                };
                times[i][0].push(run(ws));
                let cached = vec![ws[0]; ws.len()];
                times[i][1].push(run(&cached));
            }
        }
        let gib = (count * one.len()) as f64 / (1u64 << 30) as f64;
        for ((layout, _), t) in layouts.iter().zip(&mut times) {
            for (what, t) in ["stream", "cache"].iter().zip(t.iter_mut()) {
                t.sort_by(f64::total_cmp);
                println!(
                    "{name:>6} {layout:>6} {what:>6}: best {:5.2} GiB/s, median {:5.2}",
                    gib / t[0],
                    gib / t[t.len() / 2]
                );
            }
        }
    }
    std::hint::black_box(&out);
}
