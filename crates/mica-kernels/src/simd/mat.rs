//! Matrix kernels: many weight rows against one or many activation rows in one call.
//!
//! A [`Kernels::vec_dot`] computes one output; calling it per output costs a function call,
//! scale conversions and a horizontal sum per output, and reads each activation block once per
//! weight row. The kernels here take a block of weight rows ([`WeightRows`]) and a block of
//! activation rows ([`ActRows`]) and fill the whole `tokens × rows` tile ([`MatOut`]):
//!
//! - **decode** (one token): several weight rows per step share every activation load, and
//!   their independent accumulator chains hide the FMA latency;
//! - **prefill** (many tokens): each weight block is unpacked once (nibbles to bytes, scales
//!   to f32) and reused for a small group of tokens, rows × tokens tiled for L1/L2.
//!
//! The float sequence of every output is the one its [`DotPath`] prescribes, exactly: each
//! output keeps its own accumulators and does the same FMAs in the same order as the dot
//! kernel for that path; only which outputs share a register changes. `tests/mat_kernels.rs`
//! checks every table's matrix kernels bit for bit against `dot_fn` per output.
//!
//! Activation rows carry per-block data computed once when they are quantized
//! ([`act_aux`]): the scales as f32 (and Q8_1's `s`), and the negated sums of each group of
//! four quants. The latter let a kernel multiply *unsigned* weight quants with `vpdpbusd` and
//! subtract the offset afterwards (`Σ (u - k)·y = Σ u·y - k·Σ y`, exact in i32) instead of the
//! sign trick, which has no 512-bit form.

use super::{DotPath, Kernels, MatFn};
use crate::DType;
use crate::quant::blocks::{BlockQ8_0, BlockQ8_1, QK, blocks, f16_to_f32};

/// How far ahead of the block it reads a kernel over packed weights (one sequential stream)
/// asks for the bytes it will need ([`prefetch`]).
pub const PACKED_AHEAD: usize = 2 << 10;

/// Asks the cache for the lines holding `len` bytes from `p` (a hint: nothing is read, and
/// `p` may point anywhere, inside the weights or not; a prefetch never faults).
///
/// A decode step streams every weight from DRAM once, and how far ahead of the kernels'
/// loads the memory system runs decides its speed. The kernels ask for the bytes of the
/// block they are at, a fixed distance ahead, one block at a time; measured through
/// 256 MiB of 896×4864 matrices (`stream` benchmark, Zen 3, 1 / 2 threads; bandwidth
/// 15 / 24 GiB/s):
///
/// | weights | no hints | a 4-row group's bytes at once, 8 KiB ahead | per block |
/// | --- | --- | --- | --- |
/// | packed Q5_0 | 8.9-9.1 / 15-16 | 6.3 / 11.4 | 2 KiB ahead: 12.0-12.5 / 18.8-20.5 |
/// | packed Q8_0 | 9.9-12.3 / 18-21 | 8.3 / 14.6 | 2 KiB ahead: 13.5-13.7 / 20.3-21.6 |
/// | Q6_K, rows in the file's layout | 3.7-3.8 / 6.9-7.9 | 4.4-4.9 / 7.1-8.8 | next 4 rows: 8.2-10.7 / 14.9-17.4 |
///
/// A burst of hints for a whole group fills the miss buffers the kernel's own loads need;
/// one block's worth at a time keeps a steady distance. Four separate rows are four streams
/// the hardware prefetcher follows poorly; asking for the same block of the next four rows
/// (same row, 1 KiB ahead: 5.6-5.7 / 9-10) keeps all four in flight.
#[inline(always)]
pub fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut o = 0;
        while o < len {
            // SAFETY: a prefetch reads nothing the program sees and never faults; the
            // address is computed without assuming it is inside any allocation.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    p.wrapping_add(o).cast(),
                )
            };
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Asks for block `i` of the four rows after `rows` (rows in the file's layout, `stride`
/// bytes apart), while a kernel reads block `i` of `rows` (see [`prefetch`]).
#[inline(always)]
pub fn prefetch_next4<B>(rows: &[&[B]; 4], i: usize, stride: usize) {
    for row in rows {
        let p = row.as_ptr().wrapping_add(i).cast::<u8>();
        prefetch(p.wrapping_add(4 * stride), std::mem::size_of::<B>());
    }
}

/// `rows` weight rows of `n` elements: row `r` at `data[r * stride..][..row bytes]`, or,
/// `packed`, groups of `group` rows interleaved by [`Kernels::pack`] (`stride` bytes per
/// group).
#[derive(Clone, Copy, Debug)]
pub struct WeightRows<'a> {
    pub dtype: DType,
    pub n: usize,
    pub rows: usize,
    pub stride: usize,
    pub data: &'a [u8],
    pub packed: bool,
    /// Rows per packed group ([`Kernels::pack_group`]); 1 when not packed.
    pub group: usize,
}

impl<'a> WeightRows<'a> {
    /// Rows of a row-major matrix of `dtype` (the stride is the row size). Panics when
    /// `data` is shorter than `rows` rows.
    pub fn new(dtype: DType, n: usize, rows: usize, data: &'a [u8]) -> Self {
        let stride = dtype.row_bytes(n).expect("whole blocks");
        assert!(data.len() >= rows * stride, "weight rows out of bounds");
        WeightRows {
            dtype,
            n,
            rows,
            stride,
            data,
            packed: false,
            group: 1,
        }
    }

    /// Rows packed by [`Kernels::pack`] in groups of `group` (`data` is its output for
    /// these `rows`).
    pub fn packed(dtype: DType, n: usize, rows: usize, group: usize, data: &'a [u8]) -> Self {
        assert!(group > 0, "packed group size");
        let stride = group * dtype.row_bytes(n).expect("whole blocks");
        assert!(
            data.len() >= rows.div_ceil(group) * stride,
            "packed rows out of bounds"
        );
        WeightRows {
            dtype,
            n,
            rows,
            stride,
            data,
            packed: true,
            group,
        }
    }

    /// The bytes of row `r` (rows in the file's layout only).
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(!self.packed, "row of packed weights");
        let rb = self.dtype.row_bytes(self.n).unwrap_or(0);
        &self.data[r * self.stride..r * self.stride + rb]
    }

    /// Rows `range` of these rows (packed: `range.start` a multiple of the group).
    pub fn sub(&self, range: std::ops::Range<usize>) -> Self {
        assert!(range.end <= self.rows);
        let start = if self.packed {
            assert!(
                range.start.is_multiple_of(self.group),
                "packed rows split inside a group"
            );
            range.start / self.group * self.stride
        } else {
            range.start * self.stride
        };
        let data = &self.data[start.min(self.data.len())..];
        WeightRows {
            rows: range.len(),
            data,
            ..*self
        }
    }
}

/// Per-block data of one quantized activation row (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockAux {
    /// The block scale `d` as f32.
    pub d: f32,
    /// Q8_1's `s` as f32 (0 for other formats).
    pub s: f32,
    /// `-Σ q[4j..4j+4]` for j = 0..8 (the quants of each i32 lane of a 32-element block).
    pub neg_lane_sums: [i32; 8],
}

/// Size of the per-block data of a row of `n` elements in format `t` (0 for formats
/// without any).
pub fn aux_len(t: DType, n: usize) -> usize {
    match t {
        DType::Q8_0 | DType::Q8_1 => n / QK,
        _ => 0,
    }
}

/// Computes the per-block data of one activation row of format `t` (bytes `row`).
pub fn act_aux(t: DType, row: &[u8], aux: &mut [BlockAux]) {
    fn lanes(qs: &[i8; 32]) -> [i32; 8] {
        std::array::from_fn(|j| -qs[4 * j..4 * j + 4].iter().map(|&q| q as i32).sum::<i32>())
    }
    match t {
        DType::Q8_0 => {
            for (b, a) in blocks::<BlockQ8_0>(row).iter().zip(aux) {
                *a = BlockAux {
                    d: f16_to_f32(b.d),
                    s: 0.0,
                    neg_lane_sums: lanes(&b.qs),
                };
            }
        }
        DType::Q8_1 => {
            for (b, a) in blocks::<BlockQ8_1>(row).iter().zip(aux) {
                *a = BlockAux {
                    d: f16_to_f32(b.d),
                    s: f16_to_f32(b.s),
                    neg_lane_sums: lanes(&b.qs),
                };
            }
        }
        _ => {}
    }
}

/// `n` activation rows quantized into one format, with their per-block data.
#[derive(Clone, Copy, Debug)]
pub struct ActRows<'a> {
    pub dtype: DType,
    /// Elements per row.
    pub cols: usize,
    /// Rows (tokens).
    pub n: usize,
    /// `n` rows of `dtype.row_bytes(cols)` bytes.
    pub data: &'a [u8],
    /// `n` rows of `aux_len(dtype, cols)` entries.
    pub aux: &'a [BlockAux],
}

impl<'a> ActRows<'a> {
    /// Checks the sizes.
    pub fn new(dtype: DType, cols: usize, n: usize, data: &'a [u8], aux: &'a [BlockAux]) -> Self {
        let rb = dtype.row_bytes(cols).expect("whole blocks");
        assert_eq!(data.len(), n * rb, "activation bytes");
        assert_eq!(aux.len(), n * aux_len(dtype, cols), "activation block data");
        ActRows {
            dtype,
            cols,
            n,
            data,
            aux,
        }
    }

    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols).unwrap_or(0)
    }

    /// Bytes of row `t`.
    #[inline]
    pub fn row(&self, t: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[t * rb..(t + 1) * rb]
    }

    /// Per-block data of row `t`.
    #[inline]
    pub fn row_aux(&self, t: usize) -> &'a [BlockAux] {
        let l = aux_len(self.dtype, self.cols);
        &self.aux[t * l..(t + 1) * l]
    }

    /// Rows `range`.
    pub fn sub(&self, range: std::ops::Range<usize>) -> Self {
        let (rb, l) = (self.row_bytes(), aux_len(self.dtype, self.cols));
        ActRows {
            n: range.len(),
            data: &self.data[range.start * rb..range.end * rb],
            aux: &self.aux[range.start * l..range.end * l],
            ..*self
        }
    }
}

/// Where a matrix kernel writes: output `(token t, row r)` goes to `ptr[t * stride + r]`.
///
/// Threads computing disjoint rows of one product share the output matrix, so this is a
/// raw view; [`MatOut::new`] makes one from a slice safely.
#[derive(Debug)]
pub struct MatOut<'a> {
    ptr: *mut f32,
    stride: usize,
    rows: usize,
    tokens: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> MatOut<'a> {
    /// `out` is `[tokens, stride]`, rows `0..rows` written (`rows <= stride`).
    pub fn new(out: &'a mut [f32], stride: usize, rows: usize, tokens: usize) -> Self {
        assert!(rows <= stride && (tokens == 0 || out.len() >= (tokens - 1) * stride + rows));
        MatOut {
            ptr: out.as_mut_ptr(),
            stride,
            rows,
            tokens,
            _out: std::marker::PhantomData,
        }
    }

    /// # Safety
    /// `ptr[t * stride + r]` must be valid for writes for `t < tokens`, `r < rows`, and no
    /// one else may access those elements while the view lives.
    pub unsafe fn from_raw(ptr: *mut f32, stride: usize, rows: usize, tokens: usize) -> Self {
        MatOut {
            ptr,
            stride,
            rows,
            tokens,
            _out: std::marker::PhantomData,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Writes output `(t, r)`.
    #[inline(always)]
    pub fn set(&mut self, t: usize, r: usize, v: f32) {
        assert!(t < self.tokens && r < self.rows);
        // SAFETY: in bounds (checked above) and exclusively ours (constructor contract).
        unsafe { self.ptr.add(t * self.stride + r).write(v) }
    }

    /// Writes outputs `(t, r0..r0 + v.len())`.
    #[inline(always)]
    pub fn set_run(&mut self, t: usize, r0: usize, v: &[f32]) {
        assert!(t < self.tokens && r0 + v.len() <= self.rows);
        // SAFETY: in bounds (checked above) and exclusively ours (constructor contract).
        unsafe {
            std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(t * self.stride + r0), v.len())
        }
    }

    /// The view of rows `r0..` and tokens `t0..`.
    pub fn offset(&mut self, t0: usize, r0: usize) -> MatOut<'_> {
        assert!(t0 <= self.tokens && r0 <= self.rows);
        MatOut {
            // SAFETY: in bounds or one past the end (then nothing is written).
            ptr: unsafe { self.ptr.add(t0 * self.stride + r0) },
            stride: self.stride,
            rows: self.rows - r0,
            tokens: self.tokens - t0,
            _out: std::marker::PhantomData,
        }
    }
}

/// Weight rows per tile of the generic kernel: small enough to stay in L1/L2 while every
/// token runs over them.
const ROW_TILE: usize = 16;

/// The generic matrix kernel: one `dot` per output, rows in small tiles so that a batch of
/// tokens reads each weight block from memory once. Every table falls back to it for the
/// (type, path) pairs without a dedicated kernel; the scalar table uses it for everything.
pub(super) fn by_dots(k: &Kernels, path: DotPath, w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    let dot = k.dot_fn(path, w.dtype);
    let mut r = 0;
    while r < w.rows {
        let r_end = (r + ROW_TILE).min(w.rows);
        for t in 0..x.n {
            let xr = x.row(t);
            for rr in r..r_end {
                out.set(t, rr, dot(w.n, w.row(rr), xr));
            }
        }
        r = r_end;
    }
}

/// Runs the table's matrix kernel, or [`by_dots`] where it has none.
#[inline]
pub(super) fn run(
    k: &Kernels,
    f: Option<MatFn>,
    path: DotPath,
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
) {
    debug_assert_eq!(w.n, x.cols);
    debug_assert_eq!(x.dtype, w.dtype.vec_dot_type());
    assert!(out.rows() >= w.rows && out.tokens() >= x.n, "output tile");
    if w.rows == 0 || x.n == 0 {
        return;
    }
    match f {
        Some(f) => f(w, x, out),
        None => {
            assert!(!w.packed, "packed weights need their kernel");
            by_dots(k, path, w, x, out)
        }
    }
}
