//! The second product of a low-rank (LoRA) update, `y[t] = B · m[t]` for a `B` of `out`
//! rows and only `rank` columns (`m[t]` is `A x[t]`, `rank` values per row).
//!
//! A matrix product kernel built for long rows spends its time on per-row overhead for rows
//! of 8 or 64 elements. Here `B` is held transposed, `Bᵀ` (`rank × out`), in column panels
//! of [`PANEL`] outputs (`[out / PANEL][rank][PANEL]`, the last panel padded with zeros), so
//! the product is a sum of scaled rows, `y[t] += m[t, k] · Bᵀ[k, :]` for `k = 0..rank`, read
//! from memory in one sequential pass. Each output is one chain of fused multiply-adds over
//! `k` in order, starting from 0: the scalar reference, the AVX2+FMA(+F16C) version and the
//! AVX-512 one agree bit for bit, and a row's result does not depend on the other rows of
//! the batch or on how the panels are split across threads.

use crate::DType;
use crate::pool::ThreadPool;
use half::f16;
use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Outputs per panel (four AVX-512 vectors).
pub const PANEL: usize = 64;

/// An element of `Bᵀ`: f32, or f16 (converted exactly to f32 before the multiply-add).
trait Elem: Copy + Send + Sync + 'static {
    /// Whether the type is f16 (else f32).
    const F16: bool;
    fn to_f32(self) -> f32;
}

impl Elem for f32 {
    const F16: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elem for f16 {
    const F16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

#[derive(Clone)]
enum Panels {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// `B` (`out × rank`) of a low-rank update, transposed into panels (see the module doc), in
/// f32 or f16 as given.
#[derive(Clone)]
pub struct LowRankB {
    rank: usize,
    out: usize,
    panels: Panels,
}

/// Panels for `b` (`out` rows of `rank` values, row-major), as `conv` converts each value.
fn to_panels<S: Copy, E: Copy>(
    b: &[S],
    out: usize,
    rank: usize,
    zero: E,
    conv: impl Fn(S) -> E,
) -> Vec<E> {
    assert_eq!(b.len(), out * rank, "B is out × rank");
    let n_panels = out.div_ceil(PANEL);
    let mut v = vec![zero; n_panels * rank * PANEL];
    for (o, row) in b.chunks_exact(rank.max(1)).enumerate().take(out) {
        let (p, j) = (o / PANEL, o % PANEL);
        for (k, &x) in row.iter().enumerate() {
            v[(p * rank + k) * PANEL + j] = conv(x);
        }
    }
    v
}

impl LowRankB {
    /// `B` from its row-major little-endian bytes in `dtype`, which must be F32 or F16
    /// (`out` rows of `rank` values).
    pub fn from_bytes(dtype: DType, out: usize, rank: usize, bytes: &[u8]) -> LowRankB {
        let panels = match dtype {
            DType::F32 => {
                let v: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                Panels::F32(to_panels(&v, out, rank, 0.0, |x| x))
            }
            DType::F16 => {
                let v: Vec<f16> = bytes
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]))
                    .collect();
                Panels::F16(to_panels(&v, out, rank, f16::ZERO, |x| x))
            }
            d => panic!("a low-rank B must be f32 or f16, not {d}"),
        };
        LowRankB { rank, out, panels }
    }

    /// The columns of `B` (the update's rank).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The rows of `B` (the projection's outputs).
    pub fn out(&self) -> usize {
        self.out
    }

    /// F32 or F16, as held.
    pub fn dtype(&self) -> DType {
        match self.panels {
            Panels::F32(_) => DType::F32,
            Panels::F16(_) => DType::F16,
        }
    }

    /// `B[o, k]` as f32.
    pub fn get(&self, o: usize, k: usize) -> f32 {
        assert!(o < self.out && k < self.rank, "B[{o}, {k}]");
        let i = ((o / PANEL) * self.rank + k) * PANEL + o % PANEL;
        match &self.panels {
            Panels::F32(v) => v[i],
            Panels::F16(v) => v[i].to_f32(),
        }
    }

    /// `y[t] = B · m[t]` for the `n` rows of `m` (`[n, rank]`); `y` is `[n, out]`. Outputs
    /// are split across `pool` in chunks of panels when the product has at least
    /// `min_work` multiply-adds, else computed on the calling thread.
    pub fn product(&self, pool: &ThreadPool, m: &[f32], n: usize, y: &mut [f32], min_work: usize) {
        self.product_with(best(), pool, m, n, y, min_work)
    }

    fn product_with(
        &self,
        imp: &Impl,
        pool: &ThreadPool,
        m: &[f32],
        n: usize,
        y: &mut [f32],
        min_work: usize,
    ) {
        assert_eq!(m.len(), n * self.rank, "m is [n, rank]");
        assert_eq!(y.len(), n * self.out, "y is [n, out]");
        if n == 0 || self.out == 0 {
            return;
        }
        let dst = SyncPtr(y.as_mut_ptr());
        let (r, cols) = (self.rank, self.out);
        let run = |panels: Range<usize>| {
            // SAFETY: `m`, `y` and the panels have the sizes checked above; each call writes
            // the columns of its own panels only.
            unsafe {
                match &self.panels {
                    Panels::F32(b) => (imp.f32)(b, r, cols, panels, m, n, dst.get()),
                    Panels::F16(b) => (imp.f16)(b, r, cols, panels, m, n, dst.get()),
                }
            }
        };
        let n_panels = cols.div_ceil(PANEL);
        let nt = pool.n_threads();
        if nt == 1 || n_panels == 1 || n * r * cols < min_work {
            return run(0..n_panels);
        }
        // Chunks beyond each thread's first are handed out on demand, so a slower thread
        // takes fewer of them.
        let chunk = n_panels.div_ceil(nt * 4).max(1);
        let n_chunks = n_panels.div_ceil(chunk);
        let next = AtomicUsize::new(nt);
        pool.run(|i, _| {
            let mut c = i;
            while c < n_chunks {
                run(c * chunk..((c + 1) * chunk).min(n_panels));
                c = next.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

/// A raw pointer that threads writing disjoint elements may share.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
unsafe impl Sync for SyncPtr {}
unsafe impl Send for SyncPtr {}

impl SyncPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `y[t, c] = Σ_k m[t, k] · Bᵀ[k, c]` for the columns `c` of `panels`: `b` is all panels
/// (`[n_panels][r][PANEL]`), `m` is `[n, r]`, `y` points to `[n, cols]`.
///
/// # Safety
///
/// `b` holds `cols.div_ceil(PANEL)` panels, `panels` lies within them, `m` is `n · r`
/// values, `y` is valid for `n · cols` writes and no other thread touches the columns of
/// `panels` meanwhile.
type PanelFn<E> = unsafe fn(&[E], usize, usize, Range<usize>, &[f32], usize, *mut f32);

/// One implementation: its name and its panel function for each element type.
struct Impl {
    name: &'static str,
    f32: PanelFn<f32>,
    f16: PanelFn<f16>,
}

/// The scalar reference: one `mul_add` chain per output.
unsafe fn panels_scalar<E: Elem>(
    b: &[E],
    r: usize,
    cols: usize,
    panels: Range<usize>,
    m: &[f32],
    n: usize,
    y: *mut f32,
) {
    for p in panels {
        let pb = &b[p * r * PANEL..(p + 1) * r * PANEL];
        let c0 = p * PANEL;
        let w = PANEL.min(cols - c0);
        for t in 0..n {
            let mt = &m[t * r..(t + 1) * r];
            // SAFETY: the caller owns columns `c0..c0 + w` of row `t`.
            let yt = unsafe { std::slice::from_raw_parts_mut(y.add(t * cols + c0), w) };
            for (j, o) in yt.iter_mut().enumerate() {
                let mut acc = 0f32;
                for (k, &mk) in mt.iter().enumerate() {
                    acc = mk.mul_add(pb[k * PANEL + j].to_f32(), acc);
                }
                *o = acc;
            }
        }
    }
}

const SCALAR: Impl = Impl {
    name: "scalar",
    f32: panels_scalar::<f32>,
    f16: panels_scalar::<f16>,
};

/// The name of the implementation this CPU runs: `avx512`, `avx2` or `scalar`.
pub fn implementation() -> &'static str {
    best().name
}

/// The implementation this CPU runs.
fn best() -> &'static Impl {
    static BEST: OnceLock<&'static Impl> = OnceLock::new();
    BEST.get_or_init(|| {
        all()
            .into_iter()
            .rev()
            .find(|(_, ok)| *ok)
            .map_or(&SCALAR, |(i, _)| i)
    })
}

/// The implementations, slowest first, each with whether this CPU runs it.
fn all() -> Vec<(&'static Impl, bool)> {
    #[allow(unused_mut)]
    let mut v = vec![(&SCALAR, true)];
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        v.push((&x86::AVX2, avx2));
        v.push((&x86::AVX512, std::is_x86_feature_detected!("avx512f")));
    }
    v
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Elem, Impl, PANEL};
    use half::f16;
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// 16 values at `p` as f32 lanes (f16 converted exactly).
    ///
    /// # Safety
    ///
    /// 16 values are readable at `p`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16<E: Elem>(p: *const E) -> __m512 {
        // SAFETY: (caller) 16 readable values; unaligned loads.
        unsafe {
            if E::F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
            } else {
                _mm512_loadu_ps(p.cast())
            }
        }
    }

    /// 8 values at `p` as f32 lanes (f16 converted exactly).
    ///
    /// # Safety
    ///
    /// 8 values are readable at `p`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8<E: Elem>(p: *const E) -> __m256 {
        // SAFETY: (caller) 8 readable values; unaligned loads.
        unsafe {
            if E::F16 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
            } else {
                _mm256_loadu_ps(p.cast())
            }
        }
    }

    pub(super) const AVX512: Impl = Impl {
        name: "avx512",
        f32: panels_avx512::<f32>,
        f16: panels_avx512::<f16>,
    };

    pub(super) const AVX2: Impl = Impl {
        name: "avx2",
        f32: panels_avx2::<f32>,
        f16: panels_avx2::<f16>,
    };

    /// Rows `0..T` of `m` (`[T, r]`) against one panel `pb` (`r × PANEL`) into `y` (row
    /// stride `cols`, the first `w` columns): 4·T accumulators of 16 lanes, each panel row
    /// loaded once for the T rows.
    ///
    /// # Safety
    ///
    /// The panel has `r` rows of `PANEL` values, `m` T rows of `r`, and `w` columns of T
    /// rows from `y` are writable.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block512<E: Elem, const T: usize>(
        pb: *const E,
        r: usize,
        m: *const f32,
        y: *mut f32,
        cols: usize,
        w: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 4]; T];
        for k in 0..r {
            // SAFETY: in bounds as the caller promises.
            let (v, mk) = unsafe {
                let bk = pb.add(k * PANEL);
                let v = [
                    load16(bk),
                    load16(bk.add(16)),
                    load16(bk.add(32)),
                    load16(bk.add(48)),
                ];
                (v, std::array::from_fn::<f32, T, _>(|t| *m.add(t * r + k)))
            };
            for (a, &mk) in acc.iter_mut().zip(&mk) {
                let mk = _mm512_set1_ps(mk);
                for (a, &v) in a.iter_mut().zip(&v) {
                    *a = _mm512_fmadd_ps(mk, v, *a);
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: row t's first `w` columns at `y` are the caller's to write.
            unsafe {
                let yt = y.add(t * cols);
                if w == PANEL {
                    for (j, a) in a.iter().enumerate() {
                        _mm512_storeu_ps(yt.add(16 * j), *a);
                    }
                } else {
                    let mut tmp = [0f32; PANEL];
                    for (j, a) in a.iter().enumerate() {
                        _mm512_storeu_ps(tmp.as_mut_ptr().add(16 * j), *a);
                    }
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), yt, w);
                }
            }
        }
    }

    /// # Safety
    ///
    /// As [`super::PanelFn`], on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn panels_avx512<E: Elem>(
        b: &[E],
        r: usize,
        cols: usize,
        panels: Range<usize>,
        m: &[f32],
        n: usize,
        y: *mut f32,
    ) {
        assert!(panels.end * r * PANEL <= b.len() && m.len() >= n * r);
        for p in panels {
            let c0 = p * PANEL;
            let w = PANEL.min(cols - c0);
            let mut t = 0;
            while t < n {
                // SAFETY: panel p is in `b` and rows t.. in `m` (asserted); the columns of
                // panel p are the caller's to write.
                unsafe {
                    let pb = b.as_ptr().add(p * r * PANEL);
                    let (mt, yt) = (m.as_ptr().add(t * r), y.add(t * cols + c0));
                    match n - t {
                        1 => block512::<E, 1>(pb, r, mt, yt, cols, w),
                        2 => block512::<E, 2>(pb, r, mt, yt, cols, w),
                        3 => block512::<E, 3>(pb, r, mt, yt, cols, w),
                        _ => block512::<E, 4>(pb, r, mt, yt, cols, w),
                    }
                }
                t += 4;
            }
        }
    }

    /// Rows `0..T` of `m` against `8·V` columns of a panel (`pb` at the group's first
    /// column) into `y` (row stride `cols`, the first `min(w, 8·V)` columns): V·T
    /// accumulators of 8 lanes.
    ///
    /// # Safety
    ///
    /// As [`block512`], for `8·V` columns.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block256<E: Elem, const T: usize, const V: usize>(
        pb: *const E,
        r: usize,
        m: *const f32,
        y: *mut f32,
        cols: usize,
        w: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); V]; T];
        for k in 0..r {
            let mut v = [_mm256_setzero_ps(); V];
            let bk = pb.wrapping_add(k * PANEL);
            for (j, v) in v.iter_mut().enumerate() {
                // SAFETY: in bounds as the caller promises.
                *v = unsafe { load8(bk.add(8 * j)) };
            }
            // SAFETY: as above.
            let mk = unsafe { std::array::from_fn::<f32, T, _>(|t| *m.add(t * r + k)) };
            for (a, &mk) in acc.iter_mut().zip(&mk) {
                let mk = _mm256_set1_ps(mk);
                for (a, &v) in a.iter_mut().zip(&v) {
                    *a = _mm256_fmadd_ps(mk, v, *a);
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: row t's first `min(w, 8·V)` columns at `y` are the caller's to write.
            unsafe {
                let yt = y.add(t * cols);
                if w >= 8 * V {
                    for (j, a) in a.iter().enumerate() {
                        _mm256_storeu_ps(yt.add(8 * j), *a);
                    }
                } else {
                    let mut tmp = [0f32; 32];
                    for (j, a) in a.iter().enumerate() {
                        _mm256_storeu_ps(tmp.as_mut_ptr().add(8 * j), *a);
                    }
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), yt, w);
                }
            }
        }
    }

    /// # Safety
    ///
    /// As [`super::PanelFn`], on a CPU with AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn panels_avx2<E: Elem>(
        b: &[E],
        r: usize,
        cols: usize,
        panels: Range<usize>,
        m: &[f32],
        n: usize,
        y: *mut f32,
    ) {
        assert!(panels.end * r * PANEL <= b.len() && m.len() >= n * r);
        for p in panels {
            let c0 = p * PANEL;
            let w = PANEL.min(cols - c0);
            let mut t = 0;
            while t < n {
                // Groups of 32 columns for one or two rows, of 16 for three or four (16
                // registers: accumulators, the panel row's vectors, the broadcast).
                let g = if n - t >= 3 { 16 } else { 32 };
                for c in (0..w).step_by(g) {
                    // SAFETY: panel p is in `b` and rows t.. in `m` (asserted); the columns
                    // of panel p are the caller's to write.
                    unsafe {
                        let pb = b.as_ptr().add(p * r * PANEL + c);
                        let (mt, yt) = (m.as_ptr().add(t * r), y.add(t * cols + c0 + c));
                        let wg = w - c;
                        match n - t {
                            1 => block256::<E, 1, 4>(pb, r, mt, yt, cols, wg),
                            2 => block256::<E, 2, 4>(pb, r, mt, yt, cols, wg),
                            3 => block256::<E, 3, 2>(pb, r, mt, yt, cols, wg),
                            _ => block256::<E, 4, 2>(pb, r, mt, yt, cols, wg),
                        }
                    }
                }
                t += 4;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};

    /// `B · m[t]` straight from `B`'s rows, one `mul_add` chain per output.
    fn reference(b: &[f32], out: usize, r: usize, m: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * out];
        for t in 0..n {
            for o in 0..out {
                let mut acc = 0f32;
                for k in 0..r {
                    acc = m[t * r + k].mul_add(b[o * r + k], acc);
                }
                y[t * out + o] = acc;
            }
        }
        y
    }

    fn bytes(dtype: DType, v: &[f32]) -> Vec<u8> {
        match dtype {
            DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            _ => v
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
        }
    }

    /// Every implementation this CPU runs equals the reference bit for bit, on one thread
    /// and split across a pool, for ranks and widths around the panel and vector sizes and
    /// every row count up to 9 (and one larger), f32 and f16.
    #[test]
    fn implementations_equal_the_reference() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let pools = [ThreadPool::new(1), ThreadPool::new(3)];
        for dtype in [DType::F32, DType::F16] {
            for (out, r) in [
                (1, 1),
                (5, 0),
                (7, 3),
                (16, 8),
                (63, 8),
                (64, 16),
                (65, 1),
                (100, 5),
                (130, 64),
                (576, 8),
                (200, 33),
            ] {
                let b: Vec<f32> = (0..out * r)
                    .map(|_| rng.random_range(-1.0f32..1.0))
                    .collect();
                // What the held values are (f16 rounds).
                let held: Vec<f32> = match dtype {
                    DType::F32 => b.clone(),
                    _ => b.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
                };
                let lr = LowRankB::from_bytes(dtype, out, r, &bytes(dtype, &b));
                assert_eq!((lr.out(), lr.rank(), lr.dtype()), (out, r, dtype));
                for o in 0..out {
                    for k in 0..r {
                        assert_eq!(lr.get(o, k), held[o * r + k]);
                    }
                }
                for n in (0..=9).chain([21]) {
                    let m: Vec<f32> = (0..n * r).map(|_| rng.random_range(-4.0f32..4.0)).collect();
                    let want = reference(&held, out, r, &m, n);
                    for (imp, ok) in all() {
                        if !ok {
                            continue;
                        }
                        for pool in &pools {
                            for min_work in [0, usize::MAX] {
                                let mut y = vec![f32::NAN; n * out];
                                lr.product_with(imp, pool, &m, n, &mut y, min_work);
                                let same =
                                    y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(
                                    same,
                                    "{} {dtype} out={out} r={r} n={n} threads={}",
                                    imp.name,
                                    pool.n_threads()
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Rows computed together equal each row computed alone.
    #[test]
    fn a_row_alone_equals_the_row_in_a_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let (out, r, n) = (300, 16, 7);
        let b: Vec<f32> = (0..out * r).map(|_| rng.random_range(-1.0..1.0)).collect();
        let lr = LowRankB::from_bytes(DType::F16, out, r, &bytes(DType::F16, &b));
        let m: Vec<f32> = (0..n * r).map(|_| rng.random_range(-1.0..1.0)).collect();
        let pool = ThreadPool::new(2);
        let mut all_rows = vec![0f32; n * out];
        lr.product(&pool, &m, n, &mut all_rows, 0);
        for t in 0..n {
            let mut one = vec![0f32; out];
            lr.product(&pool, &m[t * r..(t + 1) * r], 1, &mut one, 0);
            assert_eq!(one, all_rows[t * out..(t + 1) * out], "row {t}");
        }
    }

    #[test]
    #[should_panic(expected = "f32 or f16")]
    fn other_types_are_refused() {
        LowRankB::from_bytes(DType::Q8_0, 32, 1, &[0; 34]);
    }
}
