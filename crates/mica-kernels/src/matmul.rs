//! Matrix products of weights (any [`DType`], straight from the file) with activations.
//!
//! As in ggml, activations are first quantized into the weight's vec-dot type (Q8_0, Q8_1,
//! Q8_K, F16...), once per token row, and every output is one [`Kernels::vec_dot`] of a
//! weight row with an activation row. Rows of the weight are split across the thread pool;
//! each thread walks its rows in small tiles and runs every token against a tile while it is
//! hot in cache, so a batch of prompt tokens reads each weight block from memory once.

use crate::pool::{ThreadPool, split_range};
use crate::simd::{DotPath, Kernels, kernels};
use crate::{DType, quant};

/// A row-major matrix of `rows` rows × `cols` elements stored in `dtype`.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// `rows * dtype.row_bytes(cols)` bytes.
    pub data: &'a [u8],
    /// Whether llama.cpp would place this matrix in its CPU "extra" buffers (repacked or
    /// tiled layouts, which change the float arithmetic of the product; see
    /// [`DotPath`]). False for the token embedding and an output head tied to it.
    pub extra_paths: bool,
}

impl<'a> QMatrix<'a> {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols).expect("validated at load")
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Dequantizes row `r` into `out` (`cols` floats), exactly as ggml's `get_rows` does.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        quant::dequantize_row(self.dtype, self.row(r), out);
    }
}

/// Activation rows quantized into one format, reused across every matrix that shares it.
#[derive(Default, Debug)]
pub struct QActs {
    dtype: Option<DType>,
    cols: usize,
    n: usize,
    row_bytes: usize,
    data: Vec<u8>,
}

impl QActs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `n` rows of `cols` floats (`x` is `[n, cols]`) into `dtype`, in parallel
    /// over rows. The buffer is reused; no allocation once it is large enough.
    pub fn quantize(&mut self, pool: &ThreadPool, dtype: DType, x: &[f32], n: usize, cols: usize) {
        debug_assert_eq!(x.len(), n * cols);
        let row_bytes = dtype
            .row_bytes(cols)
            .unwrap_or_else(|| panic!("{cols} columns is not a whole number of {dtype} blocks"));
        self.data.resize(n * row_bytes, 0);
        self.dtype = Some(dtype);
        (self.cols, self.n, self.row_bytes) = (cols, n, row_bytes);
        let k = kernels();
        let out = SyncPtr(self.data.as_mut_ptr());
        let quantize_rows = |rows: std::ops::Range<usize>| {
            for t in rows {
                // SAFETY: each thread writes a disjoint set of rows of `data`.
                let dst = unsafe { out.slice(t * row_bytes, row_bytes) };
                k.quantize_act(dtype, &x[t * cols..(t + 1) * cols], dst);
            }
        };
        if n == 1 {
            quantize_rows(0..1);
        } else {
            pool.run(|i, nt| quantize_rows(split_range(n, i, nt, 1)));
        }
    }

    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn row(&self, t: usize) -> &[u8] {
        &self.data[t * self.row_bytes..(t + 1) * self.row_bytes]
    }
}

/// Weight rows handled per tile: small enough to stay in L1/L2 while every token runs.
const ROW_TILE: usize = 16;

/// `out[t, r] = Σ_c w[r, c] · x[t, c]` for all tokens `t < xq.n()` and rows `r`; `out` is
/// `[n, w.rows]`, and `xq` must hold the activations quantized to `w.dtype.vec_dot_type()`.
pub fn matmul(pool: &ThreadPool, w: &QMatrix, xq: &QActs, out: &mut [f32]) {
    matmul_rows(pool, w, xq, out, 0..w.rows)
}

/// Like [`matmul`] but only for weight rows in `rows`; `out` is `[n, rows.len()]`.
pub fn matmul_rows(
    pool: &ThreadPool,
    w: &QMatrix,
    xq: &QActs,
    out: &mut [f32],
    rows: std::ops::Range<usize>,
) {
    assert_eq!(xq.dtype, Some(w.dtype.vec_dot_type()), "activation format");
    assert_eq!(xq.cols, w.cols, "activation width");
    let n = xq.n;
    let n_out = rows.len();
    assert_eq!(out.len(), n * n_out, "output size");
    let k = kernels();
    let dst = SyncPtr(out.as_mut_ptr());
    let work = |i: usize, nt: usize| {
        let mine = split_range(n_out, i, nt, ROW_TILE.min(n_out.div_ceil(nt)).max(1));
        tile_loop(k, w, xq, dst, rows.start, n_out, mine);
    };
    // A single small product is not worth waking the pool for.
    if n * n_out * w.cols < 64 * 1024 {
        work(0, 1);
    } else {
        pool.run(work);
    }
}

fn tile_loop(
    k: &Kernels,
    w: &QMatrix,
    xq: &QActs,
    dst: SyncPtr<f32>,
    row0: usize,
    n_out: usize,
    mine: std::ops::Range<usize>,
) {
    let (t, cols) = (w.dtype, w.cols);
    let mut r = mine.start;
    while r < mine.end {
        let r_end = (r + ROW_TILE).min(mine.end);
        for tok in 0..xq.n {
            let x = xq.row(tok);
            let path = if w.extra_paths {
                DotPath::for_token(t, w.rows, xq.n, tok)
            } else {
                DotPath::VecDot
            };
            let dot = k.dot_fn(path, t);
            for rr in r..r_end {
                let v = dot(cols, w.row(row0 + rr), x);
                // SAFETY: rows `mine` of every token are written by this thread only.
                unsafe { dst.write(tok * n_out + rr, v) };
            }
        }
        r = r_end;
    }
}

/// A raw pointer that threads writing disjoint elements may share.
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);
unsafe impl<T> Sync for SyncPtr<T> {}
unsafe impl<T> Send for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// SAFETY: in bounds, and no other thread accesses element `i` concurrently.
    unsafe fn write(self, i: usize, v: T) {
        unsafe { self.0.add(i).write(v) }
    }

    /// SAFETY: in bounds, and no other thread accesses the range concurrently.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn matmul_equals_per_row_dot_products() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let pool = ThreadPool::new(3);
        for dtype in [
            DType::Q4_1,
            DType::Q8_0,
            DType::Q4_K,
            DType::F16,
            DType::F32,
        ] {
            let (rows, cols, n) = (37, 512, 5);
            let wf: Vec<f32> = (0..rows * cols)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let rb = dtype.row_bytes(cols).unwrap();
            let mut wq = vec![0u8; rows * rb];
            for r in 0..rows {
                quant::quantize_row(
                    dtype,
                    &wf[r * cols..(r + 1) * cols],
                    &mut wq[r * rb..][..rb],
                );
            }
            let w = QMatrix {
                dtype,
                rows,
                cols,
                data: &wq,
                extra_paths: false,
            };
            let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-2.0..2.0)).collect();
            let mut xq = QActs::new();
            xq.quantize(&pool, dtype.vec_dot_type(), &x, n, cols);
            let mut out = vec![0f32; n * rows];
            matmul(&pool, &w, &xq, &mut out);
            for t in 0..n {
                for r in 0..rows {
                    let want = quant::vec_dot_ref(dtype, cols, w.row(r), xq.row(t));
                    let got = out[t * rows + r];
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{dtype} t={t} r={r}: {got} vs {want}"
                    );
                }
            }
            // A row range gives the same values.
            let mut part = vec![0f32; n * 10];
            matmul_rows(&pool, &w, &xq, &mut part, 20..30);
            for t in 0..n {
                assert_eq!(
                    &part[t * 10..t * 10 + 10],
                    &out[t * rows + 20..t * rows + 30]
                );
            }
        }
    }
}
