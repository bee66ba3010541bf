//! Criterion micro-benchmarks of the matrix kernels, against the memory bandwidth they
//! stream weights from.
//!
//! `cargo bench -p mica-kernels --bench matmul [-- FILTER]`
//!
//! - `bandwidth/{1,2}t`: reading a 256 MiB buffer (one or two threads): the hardware limit
//!   a decode step streams its weights at.
//! - `gemv/TYPE/ROWSxCOLS`: one token through a weight matrix on one thread (decode), in GB/s
//!   of weights read. 4096×4096 (9-64 MiB) is past L2; 576×1536 (SmolLM2's FFN down) and
//!   896×4864 (Qwen2.5-0.5B's) are real shapes. Benchmark loops re-read the same matrix, so
//!   whatever fits in the last-level cache is read from it: compare against `bandwidth`
//!   (256 MiB) for the DRAM limit a whole model streams at.
//! - `gemv_2t/...`: the same through a two-thread pool (the split `matmul` does).
//! - `stream/TYPE/{1t,2t}`: one token through 256 MiB of 896×4864 matrices (Qwen2.5-0.5B's
//!   FFN down shape), one matrix after another as a decode step does, with the load-time
//!   repacked layout where there is one: the kernel's rate from DRAM, to hold against
//!   `bandwidth`.
//! - `gemm/TYPE/TOKENS`: a 896×4864 matrix times 128 or 512 tokens (prefill), in FLOP/s:
//!   criterion's "elem/s" here counts 2·rows·cols·tokens floating-point operations per run.
//! - `.../packed`: the same product with the load-time repacked copy (`QMatrix::pack`), for
//!   the types whose kernels have a packed layout.
//!
//! Each product takes the path llama.cpp would (`DotPath::for_token`), so its arithmetic is
//! the one mica runs. Sample counts and times are small to keep the default run short.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mica_kernels::matmul::{QActs, QMatrix, matmul};
use mica_kernels::quant::f32_to_f16;
use mica_kernels::simd::kernels;
use mica_kernels::{DType, ThreadPool};

/// xorshift64: fast deterministic bytes for large matrices.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Roughly normal (sum of uniforms), mean 0, unit-ish spread.
    fn normal(&mut self) -> f32 {
        let v = self.next();
        let s: i32 = (0..4).map(|k| ((v >> (16 * k)) & 0xFFFF) as i32).sum();
        (s as f32 / 65536.0 - 2.0) * 1.7
    }
}

/// Byte offsets of the f16 scale fields of a block (ggml-common.h).
fn f16_fields(t: DType) -> &'static [usize] {
    match t {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S
        | DType::IQ4_NL
        | DType::IQ4_XS => &[0],
        DType::TQ1_0 => &[52],
        DType::TQ2_0 => &[64],
        _ => &[],
    }
}

/// A `rows × cols` matrix of random quants with small finite scales (or random floats).
fn matrix(t: DType, rows: usize, cols: usize, r: &mut Rng) -> Vec<u8> {
    let bytes = rows * t.row_bytes(cols).unwrap();
    if !t.is_quantized() {
        let vals: Vec<f32> = (0..rows * cols).map(|_| r.normal() * 0.05).collect();
        let mut out = vec![0u8; bytes];
        kernels().quantize_act(t, &vals, &mut out);
        return out;
    }
    let mut out: Vec<u8> = (0..bytes).map(|_| r.next() as u8).collect();
    for b in out.chunks_exact_mut(t.type_size()) {
        for &off in f16_fields(t) {
            let s = 0.001 + (r.next() % 1000) as f32 * 1e-5;
            b[off..off + 2].copy_from_slice(&f32_to_f16(s));
        }
    }
    out
}

fn acts(t: DType, cols: usize, n: usize, r: &mut Rng) -> QActs {
    let x: Vec<f32> = (0..n * cols).map(|_| r.normal()).collect();
    let mut q = QActs::new();
    q.quantize(&ThreadPool::new(1), t.vec_dot_type(), &x, n, cols);
    q
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .without_plots()
}

fn bandwidth(c: &mut Criterion) {
    let buf: Vec<u64> = (0..32 << 20).map(|i| i as u64).collect();
    let mut g = c.benchmark_group("bandwidth");
    g.throughput(Throughput::Bytes((buf.len() * 8) as u64));
    let sum = |s: &[u64]| s.iter().fold(0u64, |a, &v| a.wrapping_add(v));
    g.bench_function("1t", |b| b.iter(|| black_box(sum(black_box(&buf)))));
    g.bench_function("2t", |b| {
        b.iter(|| {
            let (lo, hi) = buf.split_at(buf.len() / 2);
            std::thread::scope(|s| {
                let h = s.spawn(|| sum(black_box(hi)));
                black_box(sum(black_box(lo)).wrapping_add(h.join().unwrap()))
            })
        })
    });
    g.finish();
}

fn gemv(c: &mut Criterion) {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let one = ThreadPool::new(1);
    let two = ThreadPool::new(2);
    let shapes = [(4096, 4096), (576, 1536), (896, 4864)];
    for t in DType::WEIGHT_TYPES {
        let mut g = c.benchmark_group(format!("gemv/{t}"));
        for (rows, cols) in shapes {
            let data = matrix(t, rows, cols, &mut r);
            let w = QMatrix {
                dtype: t,
                rows,
                cols,
                data: &data,
                extra_paths: true,
                packed: None,
            };
            let x = acts(t, cols, 1, &mut r);
            let mut out = vec![0f32; rows];
            g.throughput(Throughput::Bytes(data.len() as u64));
            let id = BenchmarkId::from_parameter(format!("{rows}x{cols}"));
            g.bench_function(id, |b| b.iter(|| matmul(&one, &w, &x, &mut out)));
            // The load-time repacked layout, where the kernels have one.
            if let Some(p) = w.pack() {
                let wp = QMatrix {
                    packed: Some(&p),
                    ..w
                };
                let id = BenchmarkId::from_parameter(format!("{rows}x{cols}/packed"));
                g.bench_function(id, |b| b.iter(|| matmul(&one, &wp, &x, &mut out)));
            }
            if rows == 896
                && matches!(
                    t,
                    DType::Q4_1 | DType::Q5_0 | DType::Q8_0 | DType::Q4_K | DType::Q6_K
                )
            {
                let id = BenchmarkId::from_parameter(format!("{rows}x{cols}/2t"));
                g.bench_function(id, |b| b.iter(|| matmul(&two, &w, &x, &mut out)));
            }
        }
        g.finish();
    }
}

fn stream(c: &mut Criterion) {
    let mut r = Rng(0x1234_5678_9abc_def1);
    let pools = [("1t", ThreadPool::new(1)), ("2t", ThreadPool::new(2))];
    let (rows, cols) = (896, 4864);
    for t in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        let one = matrix(t, rows, cols, &mut r);
        let count = (256 << 20) / one.len();
        let mats: Vec<Vec<u8>> = (0..count)
            .map(|_| {
                let m = matrix(t, rows, cols, &mut r);
                let w = QMatrix {
                    dtype: t,
                    rows,
                    cols,
                    data: &m,
                    extra_paths: true,
                    packed: None,
                };
                w.pack().unwrap_or(m)
            })
            .collect();
        // Only the packed copies are kept (256 MiB, not twice that): where there is one, the
        // products read nothing else, and `data` is one shared matrix of the right size.
        let packed = kernels().pack_group(t) > 1;
        let views: Vec<QMatrix> = mats
            .iter()
            .map(|m| QMatrix {
                dtype: t,
                rows,
                cols,
                data: if packed { &one } else { m },
                extra_paths: true,
                packed: packed.then_some(m.as_slice()),
            })
            .collect();
        let x = acts(t, cols, 1, &mut r);
        let mut out = vec![0f32; rows];
        let mut g = c.benchmark_group(format!("stream/{t}"));
        g.throughput(Throughput::Bytes((count * one.len()) as u64));
        for (name, pool) in &pools {
            g.bench_function(*name, |b| {
                b.iter(|| {
                    for w in &views {
                        matmul(pool, w, &x, &mut out);
                    }
                })
            });
        }
        g.finish();
    }
}

fn gemm(c: &mut Criterion) {
    let mut r = Rng(0x2545_f491_4f6c_dd1d);
    let one = ThreadPool::new(1);
    let (rows, cols) = (896, 4864);
    for t in DType::WEIGHT_TYPES {
        let mut g = c.benchmark_group(format!("gemm/{t}"));
        let data = matrix(t, rows, cols, &mut r);
        let w = QMatrix {
            dtype: t,
            rows,
            cols,
            data: &data,
            extra_paths: true,
            packed: None,
        };
        for n in [128, 512] {
            let x = acts(t, cols, n, &mut r);
            let mut out = vec![0f32; rows * n];
            g.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
            g.bench_function(BenchmarkId::from_parameter(n), |b| {
                b.iter(|| matmul(&one, &w, &x, &mut out))
            });
            if let Some(p) = w.pack() {
                let wp = QMatrix {
                    packed: Some(&p),
                    ..w
                };
                g.bench_function(BenchmarkId::from_parameter(format!("{n}/packed")), |b| {
                    b.iter(|| matmul(&one, &wp, &x, &mut out))
                });
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = bandwidth, gemv, stream, gemm
}
criterion_main!(benches);
