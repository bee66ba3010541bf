//! What the matrix kernels of a speculative verification pass cost: one thread, the
//! one-token path (`VecDot`) of each weight type of Qwen2.5-Coder-0.5B Q4_K_M at its shapes
//! (Q5_0 packed as loaded, Q6_K `ffn_down`, a slice of the Q8_0 output head), 1..=8 tokens
//! per call. A probe to run and report, not a test:
//! `cargo run --release -p mica-kernels --example verify_kernels [ROUNDS]`.
//!
//! The kinds of matrix take turns within each round, so a busy machine slows all alike;
//! prints the best and the median milliseconds per call over the rounds.

use std::time::Instant;

use mica_kernels::DType;
use mica_kernels::matmul::QActs;
use mica_kernels::quant;
use mica_kernels::simd::{DotPath, MatOut, WeightRows, kernels};

/// xorshift64, to uniform floats in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

struct Case {
    name: &'static str,
    dtype: DType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    packed: Option<Vec<u8>>,
}

fn case(name: &'static str, dtype: DType, rows: usize, cols: usize, r: &mut Rng) -> Case {
    let rb = dtype.row_bytes(cols).expect("whole blocks");
    let mut data = vec![0u8; rows * rb];
    let mut row = vec![0f32; cols];
    for dst in data.chunks_exact_mut(rb) {
        row.iter_mut().for_each(|x| *x = r.next());
        quant::quantize_row(dtype, &row, dst);
    }
    let packed = kernels().pack(dtype, cols, rows, &data);
    Case {
        name,
        dtype,
        rows,
        cols,
        data,
        packed,
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(25, |s| s.parse().expect("ROUNDS"));
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let cases = [
        case("ffn_up Q5_0 4864x896", DType::Q5_0, 4864, 896, &mut r),
        case("attn_q Q5_0 896x896", DType::Q5_0, 896, 896, &mut r),
        case("ffn_down Q6_K 896x4864", DType::Q6_K, 896, 4864, &mut r),
        case("output Q8_0 8192x896", DType::Q8_0, 8192, 896, &mut r),
    ];
    let k = kernels();
    println!("{} tier, 1 thread, {rounds} rounds", k.isa());
    for n in (1..=8).chain([12, 16]) {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
        let acts: Vec<QActs> = cases
            .iter()
            .map(|c| {
                let vt = c.dtype.vec_dot_type();
                let rb = vt.row_bytes(c.cols).expect("whole blocks");
                let mut q = vec![0u8; n * rb];
                for dst in q.chunks_exact_mut(rb) {
                    let x: Vec<f32> = (0..c.cols).map(|_| 2.0 * r.next()).collect();
                    k.quantize_act(vt, &x, dst);
                }
                QActs::from_quantized(vt, c.cols, n, &q)
            })
            .collect();
        let mut out = vec![0f32; n * 8192];
        for _ in 0..rounds {
            for (i, c) in cases.iter().enumerate() {
                let w = match &c.packed {
                    Some(p) => {
                        WeightRows::packed(c.dtype, c.cols, c.rows, k.pack_group(c.dtype), p)
                    }
                    None => WeightRows::new(c.dtype, c.cols, c.rows, &c.data),
                };
                let o = &mut out[..n * c.rows];
                let t = Instant::now();
                k.matmul(
                    DotPath::VecDot,
                    &w,
                    &acts[i].view(),
                    &mut MatOut::new(o, c.rows, c.rows, n),
                );
                times[i].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        for (c, t) in cases.iter().zip(&mut times) {
            t.sort_by(f64::total_cmp);
            println!(
                "{n} tokens  {:<24} best {:7.3} ms  median {:7.3} ms",
                c.name,
                t[0],
                t[t.len() / 2]
            );
        }
    }
}
