//! What the k-quant batch (prompt) kernels cost: one thread, each llama.cpp batch path of the
//! k-quants at Qwen3.5-0.8B's shapes (hidden 1024, feed-forward 3584), weights as loaded
//! (Q4_K packed), 64 and 256 tokens per call. A probe to run and report, not a test:
//! `cargo run --release -p mica-kernels --example prefill_kernels [ROUNDS]`.
//!
//! The kinds of matrix take turns within each round, so a busy machine slows all alike;
//! prints the best and the median milliseconds per call and the best rate in multiply-adds
//! per second.

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
    path: DotPath,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    packed: Option<Vec<u8>>,
}

fn case(
    name: &'static str,
    dtype: DType,
    path: DotPath,
    rows: usize,
    cols: usize,
    r: &mut Rng,
) -> Case {
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
        path,
        rows,
        cols,
        data,
        packed,
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(9, |s| s.parse().expect("ROUNDS"));
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let cases = [
        case(
            "ffn_up Q4_K 3584x1024",
            DType::Q4_K,
            DotPath::RepackGemm,
            3584,
            1024,
            &mut r,
        ),
        case(
            "ffn_down Q4_K 1024x3584",
            DType::Q4_K,
            DotPath::RepackGemm,
            1024,
            3584,
            &mut r,
        ),
        case(
            "ffn_down Q6_K 1024x3584",
            DType::Q6_K,
            DotPath::Tiled,
            1024,
            3584,
            &mut r,
        ),
        case(
            "attn Q5_K 1024x1024",
            DType::Q5_K,
            DotPath::Tiled,
            1024,
            1024,
            &mut r,
        ),
    ];
    let k = kernels();
    println!("{} tier, 1 thread, {rounds} rounds", k.isa());
    for n in [64usize, 256] {
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
        let mut out = vec![0f32; n * 3584];
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
                    c.path,
                    &w,
                    &acts[i].view(),
                    &mut MatOut::new(o, c.rows, c.rows, n),
                );
                times[i].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        for (c, t) in cases.iter().zip(&mut times) {
            t.sort_by(f64::total_cmp);
            let gmacs = (c.rows * c.cols * n) as f64 / (t[0] * 1e-3) / 1e9;
            println!(
                "{n:>3} tokens  {:<24} {:?}  best {:7.3} ms  median {:7.3} ms  {gmacs:6.1} GMAC/s",
                c.name,
                c.path,
                t[0],
                t[t.len() / 2]
            );
        }
    }
}
