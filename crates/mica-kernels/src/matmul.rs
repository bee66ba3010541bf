//! Matrix products of weights (any [`DType`], straight from the file) with activations.
//!
//! As in ggml, activations are first quantized into the weight's vec-dot type (Q8_0, Q8_1,
//! Q8_K, F16...), once per token row, and every output is the dot product llama.cpp would
//! compute for it ([`DotPath::for_token`]). The work goes to the table's matrix kernels
//! ([`Kernels::matmul`](crate::simd::Kernels::matmul), `simd/mat.rs`), which handle many weight rows and tokens per call:
//! weight rows are split across the thread pool in chunks of whole row groups, each thread
//! runs its rows against every token (tiled inside the kernel so a batch of prompt tokens
//! reads each weight block from memory once).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::pool::{ThreadPool, split_range};
use crate::simd::mat::{act_aux, aux_len};
use crate::simd::{ActRows, BlockAux, DotPath, MatOut, WeightRows, kernels};
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
    /// Optional load-time repacked copy of `data` ([`QMatrix::pack`]), used by the products
    /// instead of `data` when present (same results, bit for bit).
    pub packed: Option<&'a [u8]>,
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

    /// Dequantizes row `r` into `out` (`cols` floats), exactly as ggml's `get_rows` does
    /// (from the packed copy when there is one, so the file's pages stay untouched).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let Some(p) = self.packed else {
            return quant::dequantize_row(self.dtype, self.row(r), out);
        };
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let (bs, ts) = (self.dtype.block_size(), self.dtype.type_size());
        let mut buf = [0u8; 1024];
        let step = buf.len() / ts;
        let nb = self.cols / bs;
        for b0 in (0..nb).step_by(step) {
            let b1 = (b0 + step).min(nb);
            let bytes = &mut buf[..(b1 - b0) * ts];
            kernels().unpack_blocks(self.dtype, self.cols, p, r, b0..b1, bytes);
            quant::dequantize_row(self.dtype, bytes, &mut out[b0 * bs..b1 * bs]);
        }
    }

    /// A repacked copy of the weights for this CPU's kernels (groups of
    /// [`QMatrix::pack_group`] rows interleaved, so one load serves several rows), or `None`
    /// where the kernels have no packed layout for this type. Costs as much memory as `data`
    /// (rows rounded up to a group).
    pub fn pack(&self) -> Option<Vec<u8>> {
        kernels().pack(self.dtype, self.cols, self.rows, self.data)
    }

    /// Bytes [`QMatrix::pack`] would return, without packing: `rows` rounded up to a whole
    /// group, times the row's bytes; `None` where the kernels have no packed layout for this
    /// type (or the matrix has no rows).
    pub fn packed_len(&self) -> Option<usize> {
        (self.rows > 0 && kernels().has_packed(self.dtype))
            .then(|| self.rows.div_ceil(self.pack_group()) * self.pack_group() * self.row_bytes())
    }

    /// Rows per group of [`QMatrix::pack`]'s layout (1 where there is none).
    pub fn pack_group(&self) -> usize {
        kernels().pack_group(self.dtype)
    }

    /// Rows `range` as the kernels' view (the packed copy when there is one and the range
    /// starts on a group).
    fn rows_view(&self, range: std::ops::Range<usize>) -> WeightRows<'a> {
        let group = self.pack_group();
        match self.packed {
            Some(p) if range.start.is_multiple_of(group) => {
                WeightRows::packed(self.dtype, self.cols, self.rows, group, p).sub(range)
            }
            _ => WeightRows::new(self.dtype, self.cols, self.rows, self.data).sub(range),
        }
    }
}

/// Activation rows quantized into one format, reused across every matrix that shares it,
/// with the per-block data the matrix kernels use ([`BlockAux`]).
#[derive(Default, Debug)]
pub struct QActs {
    dtype: Option<DType>,
    cols: usize,
    n: usize,
    row_bytes: usize,
    /// `[n, row_bytes]`
    data: Vec<u8>,
    /// `[n, aux_len(dtype, cols)]`
    aux: Vec<BlockAux>,
    /// Multiply every row with the arithmetic it gets in a one-row product (see
    /// [`QActs::set_alone`]).
    alone: bool,
}

impl QActs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `n` rows of `cols` floats (`x` is `[n, cols]`) into `dtype`, in parallel
    /// over rows. The buffer is reused; no allocation once it is large enough.
    pub fn quantize(&mut self, pool: &ThreadPool, dtype: DType, x: &[f32], n: usize, cols: usize) {
        debug_assert_eq!(x.len(), n * cols);
        let row_bytes = self.shape(dtype, n, cols);
        let aux_row = aux_len(dtype, cols);
        let k = kernels();
        let out = SyncPtr(self.data.as_mut_ptr());
        let aux = SyncPtr(self.aux.as_mut_ptr());
        let quantize_rows = |rows: std::ops::Range<usize>| {
            for t in rows {
                // SAFETY: each thread writes a disjoint set of rows of `data` and `aux`.
                let (dst, a) = unsafe {
                    (
                        out.slice(t * row_bytes, row_bytes),
                        aux.slice(t * aux_row, aux_row),
                    )
                };
                k.quantize_act(dtype, &x[t * cols..(t + 1) * cols], dst);
                act_aux(dtype, dst, a);
            }
        };
        if n == 1 {
            quantize_rows(0..1);
        } else {
            pool.run(|i, nt| quantize_rows(split_range(n, i, nt, 1)));
        }
    }

    /// Activations already quantized (`data` is `[n, dtype.row_bytes(cols)]`), e.g. for
    /// tests and benchmarks; computes their block data.
    pub fn from_quantized(dtype: DType, cols: usize, n: usize, data: &[u8]) -> Self {
        let mut q = QActs::new();
        let rb = q.shape(dtype, n, cols);
        assert_eq!(data.len(), n * rb, "activation bytes");
        q.data.copy_from_slice(data);
        let l = aux_len(dtype, cols);
        for t in 0..n {
            act_aux(
                dtype,
                &q.data[t * rb..(t + 1) * rb],
                &mut q.aux[t * l..(t + 1) * l],
            );
        }
        q
    }

    /// Sizes the buffers for `n` rows of `cols` in `dtype`; returns the row size.
    fn shape(&mut self, dtype: DType, n: usize, cols: usize) -> usize {
        let row_bytes = dtype
            .row_bytes(cols)
            .unwrap_or_else(|| panic!("{cols} columns is not a whole number of {dtype} blocks"));
        self.data.resize(n * row_bytes, 0);
        self.aux
            .resize(n * aux_len(dtype, cols), BlockAux::default());
        self.dtype = Some(dtype);
        (self.cols, self.n, self.row_bytes) = (cols, n, row_bytes);
        row_bytes
    }

    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }

    /// Whether products take, for every row, the code path of a product of that row alone
    /// rather than the batch's (llama.cpp's paths depend on the batch size, see
    /// [`DotPath::for_token`]): each row's result is then bit-identical to a one-token
    /// product. Speculative verification needs this, so that the logits of a token and its
    /// draft equal one-at-a-time decoding's.
    pub fn set_alone(&mut self, alone: bool) {
        self.alone = alone;
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn row(&self, t: usize) -> &[u8] {
        &self.data[t * self.row_bytes..(t + 1) * self.row_bytes]
    }

    /// The kernels' view of all rows.
    pub fn view(&self) -> ActRows<'_> {
        let dtype = self.dtype.expect("quantized activations");
        ActRows::new(dtype, self.cols, self.n, &self.data, &self.aux)
    }
}

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
    matmul_split(pool, w, xq, out, rows, SPLIT_WORK)
}

/// A single small product is not worth waking the pool for: multiply-adds below which
/// [`matmul`] runs on the calling thread.
const SPLIT_WORK: usize = 64 * 1024;

/// Like [`matmul`], split across the pool from `min_work` multiply-adds on (rather than
/// [`matmul`]'s threshold): for products whose weights are streamed from memory once per
/// call, such as a LoRA adapter's. The split does not change any output.
pub fn matmul_min_work(
    pool: &ThreadPool,
    w: &QMatrix,
    xq: &QActs,
    out: &mut [f32],
    min_work: usize,
) {
    matmul_split(pool, w, xq, out, 0..w.rows, min_work)
}

fn matmul_split(
    pool: &ThreadPool,
    w: &QMatrix,
    xq: &QActs,
    out: &mut [f32],
    rows: std::ops::Range<usize>,
    min_work: usize,
) {
    assert_eq!(xq.dtype, Some(w.dtype.vec_dot_type()), "activation format");
    assert_eq!(xq.cols, w.cols, "activation width");
    assert!(rows.end <= w.rows, "row range");
    let n = xq.n;
    let n_out = rows.len();
    assert_eq!(out.len(), n * n_out, "output size");
    if n == 0 || n_out == 0 {
        return;
    }
    let k = kernels();
    let x = xq.view();
    let dst = SyncPtr(out.as_mut_ptr());
    // Rows `mine` of the product against every token.
    let run_rows = |mine: std::ops::Range<usize>| {
        let wv = w.rows_view(rows.start + mine.start..rows.start + mine.end);
        // SAFETY: this call alone writes columns `mine` of every token's output row.
        let mut o = unsafe { MatOut::from_raw(dst.ptr().add(mine.start), n_out, mine.len(), n) };
        for_each_path(w, n, xq.alone, |path, toks| {
            let mut ot = o.offset(toks.start, 0);
            k.matmul(path, &wv, &x.sub(toks), &mut ot);
        });
    };
    let nt = pool.n_threads();
    // A small product runs on this thread, and one thread takes all rows in one call.
    if n * n_out * w.cols < min_work || nt == 1 {
        return run_rows(0..n_out);
    }
    let chunk = chunk_rows(n_out, nt, row_align(n_out, nt).max(w.pack_group()));
    let n_chunks = n_out.div_ceil(chunk);
    // Chunks beyond each thread's first are handed out on demand, so a thread that runs
    // slower (a descheduled vCPU, a busier core) takes fewer of them instead of holding
    // everyone at the join.
    let next = AtomicUsize::new(nt);
    pool.run(|i, _| {
        let (mut c, mut taken) = (i, 0);
        while c < n_chunks {
            run_rows(c * chunk..((c + 1) * chunk).min(n_out));
            c = next.fetch_add(1, Ordering::Relaxed);
            taken += 1;
        }
        crate::pool::record_chunks(taken);
    });
}

/// Chunks per thread of a product's rows: enough that the threads finish together when one
/// runs slower than the other, few enough that each kernel call streams a long run of rows.
const CHUNKS_PER_THREAD: usize = 4;

/// Rows per chunk: a multiple of `align`, about `n_out / (nt * CHUNKS_PER_THREAD)`.
fn chunk_rows(n_out: usize, nt: usize, align: usize) -> usize {
    let want = n_out.div_ceil(nt * CHUNKS_PER_THREAD);
    want.div_ceil(align).max(1) * align
}

/// Rows per chunk of the split across threads: whole row groups of the kernels (16 rows)
/// when every thread still gets several, else 4 (the caller rounds up to a packed group).
fn row_align(n_out: usize, nt: usize) -> usize {
    if n_out >= 64 * nt { 16 } else { 4 }
}

/// Calls `f(path, tokens)` for each run of consecutive tokens that llama.cpp computes by
/// the same path (at most two: repacked Q4_K's groups of four, then the rest); with
/// `alone`, the path of a one-token product for all of them.
fn for_each_path(
    w: &QMatrix,
    n: usize,
    alone: bool,
    mut f: impl FnMut(DotPath, std::ops::Range<usize>),
) {
    let path = |t: usize| {
        if w.extra_paths && alone {
            DotPath::for_token(w.dtype, w.rows, 1, 0)
        } else if w.extra_paths {
            DotPath::for_token(w.dtype, w.rows, n, t)
        } else {
            DotPath::VecDot
        }
    };
    let mut t0 = 0;
    while t0 < n {
        let p = path(t0);
        let mut t1 = t0 + 1;
        while t1 < n && path(t1) == p {
            t1 += 1;
        }
        f(p, t0..t1);
        t0 = t1;
    }
}

/// A raw pointer that threads writing disjoint elements may share.
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);
unsafe impl<T> Sync for SyncPtr<T> {}
unsafe impl<T> Send for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    fn ptr(self) -> *mut T {
        self.0
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
                packed: None,
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

    /// Rows looked up from a packed copy (wide rows, unpacked a bufferful of blocks at a
    /// time) are the file's rows.
    #[test]
    fn dequantize_row_from_the_packed_copy() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        for dtype in [DType::Q4_0, DType::Q5_1, DType::Q8_0] {
            let (rows, cols) = (6, 75 * 32);
            let rb = dtype.row_bytes(cols).unwrap();
            let mut wq = vec![0u8; rows * rb];
            for r in 0..rows {
                let wf: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0..1.0)).collect();
                quant::quantize_row(dtype, &wf, &mut wq[r * rb..][..rb]);
            }
            let plain = QMatrix {
                dtype,
                rows,
                cols,
                data: &wq,
                extra_paths: false,
                packed: None,
            };
            let Some(p) = plain.pack() else { continue };
            let packed = QMatrix {
                packed: Some(&p),
                ..plain
            };
            for r in 0..rows {
                let (mut a, mut b) = (vec![0f32; cols], vec![1f32; cols]);
                plain.dequantize_row(r, &mut a);
                packed.dequantize_row(r, &mut b);
                assert_eq!(a, b, "{dtype} row {r}");
            }
        }
    }
}
