//! AVX2 matrix kernels (see [`crate::simd::mat`]) with `vec_dot`'s arithmetic: the legacy
//! formats and the k-quants four rows at a time, the float formats two rows at a time,
//! against one token per step (the rows stay in L1 while every token of a tile runs over
//! them). The k-quant batch paths have theirs in `paths.rs` and `kprefill.rs`.
//!
//! Per output the arithmetic is exactly `dot.rs`'s and `kquants.rs`': the same per-block
//! lanes (`mul_sum_i8` / `mul_sum_us8` of the same bytes), `acc = fma(d_w·d_x, lanes, acc)`,
//! the scalar `summs = fma(m, s, summs)`, `hsum_f32`; for floats the same four accumulators
//! over 32-element chunks, the 8-element remainder into the first, the scalar tail. What the
//! rows share is every activation load, and their accumulator chains run side by side.

use std::arch::x86_64::*;

use super::kquants::{
    bsums16, chunks_k4, chunks_q2k, chunks_q3k, chunks_q6k, finish_q4k, groups16, hsum_i32x4,
    min_lanes_k4, offset_lanes_q6k, sum_chunks,
};
use super::{
    f16x4, hsum_f32, load32i, mul_sum_i8, mul_sum_us8, nibbles, q4_0_bytes, q5_0_bytes, q5_1_bytes,
    rd16,
};
use crate::DType;
use crate::quant::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, BlockQ8_1, BlockQ8K, QK, blocks,
};
use crate::quant::kquants::scales_mins_k4;
use crate::simd::mat::{ActRows, MatOut, WeightRows, prefetch, prefetch_next4};

/// Tokens per cache tile.
pub(super) const TOK_TILE: usize = 32;

// ---------------------------------------------------------------------------------------------
// Legacy formats.

/// A legacy format: its block lanes (`dot.rs`'s) and scale fields.
///
/// # Safety
/// `lanes` reads one weight block at `w` and one activation block at `x`, nothing else.
pub(super) unsafe trait Legacy {
    const BYTES: usize;
    /// Activation block bytes (Q8_0: 34, Q8_1: 36).
    const XBYTES: usize;
    /// Whether the format has the `m·s` term (Q4_1/Q5_1, byte offset 2; activations' `s`
    /// at byte 2 of Q8_1).
    const MIN: bool;
    /// Bytes of one row's quants (16, Q8_0: 32).
    const PQ: usize;
    /// The packed kernels take Q4_0/Q5_0 quants as unsigned `u = q + 2^SHIFT` and adds
    /// `2^SHIFT · (-Σy)` per lane (the activations' [`crate::simd::mat::BlockAux`] lane sums):
    /// the same exact i32 lanes as the sign trick, in fewer instructions.
    const SHIFT: Option<i32>;
    /// Whether the format has fifth bits (Q5_0, Q5_1).
    const Q5: bool;
    unsafe fn lanes(w: *const u8, x: *const u8) -> __m256i;
}

macro_rules! legacy_format {
    ($name:ident, $W:ty, $X:ty, min: $min:expr, pq: $pq:expr, shift: $shift:expr, q5: $q5:expr,
     |$a:ident, $b:ident| $lanes:expr) => {
        pub(super) struct $name;
        // SAFETY: `$W` and `$X` are the block types (alignment 1, any bit pattern).
        unsafe impl Legacy for $name {
            const BYTES: usize = size_of::<$W>();
            const XBYTES: usize = size_of::<$X>();
            const MIN: bool = $min;
            const PQ: usize = $pq;
            const SHIFT: Option<i32> = $shift;
            const Q5: bool = $q5;
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn lanes(w: *const u8, x: *const u8) -> __m256i {
                // SAFETY: the caller passes whole blocks.
                let ($a, $b) = unsafe { (&*w.cast::<$W>(), &*x.cast::<$X>()) };
                $lanes
            }
        }
    };
}

legacy_format!(Q4_0, BlockQ4_0, BlockQ8_0, min: false, pq: 16, shift: Some(3), q5: false,
    |a, b| mul_sum_i8(q4_0_bytes(a), load32i(&b.qs)));
legacy_format!(Q4_1, BlockQ4_1, BlockQ8_1, min: true, pq: 16, shift: None, q5: false,
    |a, b| mul_sum_us8(nibbles(&a.qs), load32i(&b.qs)));
legacy_format!(Q5_0, BlockQ5_0, BlockQ8_0, min: false, pq: 16, shift: Some(4), q5: true,
|a, b| mul_sum_i8(q5_0_bytes(a), load32i(&b.qs)));
legacy_format!(Q5_1, BlockQ5_1, BlockQ8_1, min: true, pq: 16, shift: None, q5: true,
|a, b| mul_sum_us8(q5_1_bytes(a), load32i(&b.qs)));
legacy_format!(Q8_0, BlockQ8_0, BlockQ8_0, min: false, pq: 32, shift: None, q5: false,
    |a, b| mul_sum_i8(load32i(&a.qs), load32i(&b.qs)));

/// Four rows × one token over `nb` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows4<F: Legacy>(w: &[*const u8; 4], x: *const u8, nb: usize, pf: usize) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = [0f32; 4];
    for b in 0..nb {
        // SAFETY: block b of every row and of the token exists (checked by the driver).
        unsafe {
            let wb = w.map(|p| p.add(b * F::BYTES));
            if pf != 0 {
                for p in wb {
                    prefetch(p.wrapping_add(pf), F::BYTES);
                }
            }
            let xb = x.add(b * F::XBYTES);
            let dx = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16(xb) as i32)));
            let mut d = [0f32; 4];
            _mm_storeu_ps(d.as_mut_ptr(), _mm_mul_ps(f16x4(&wb, 0), _mm_set1_ps(dx)));
            for r in 0..4 {
                let l = _mm256_cvtepi32_ps(F::lanes(wb[r], xb));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r]), l, acc[r]);
            }
            if F::MIN {
                let s = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16(xb.add(2)) as i32)));
                let mut m = [0f32; 4];
                _mm_storeu_ps(m.as_mut_ptr(), f16x4(&wb, 2));
                for r in 0..4 {
                    summs[r] = m[r].mul_add(s, summs[r]);
                }
            }
        }
    }
    std::array::from_fn(|r| {
        let h = hsum_f32(acc[r]);
        if F::MIN { h + summs[r] } else { h }
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn legacy<F: Legacy>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    let nb = w.n / QK;
    assert!(nb * QK == w.n && w.rows > 0);
    assert!(
        w.data.len() >= (w.rows - 1) * w.stride + nb * F::BYTES,
        "weight rows"
    );
    assert!(x.data.len() == x.n * nb * F::XBYTES, "activation rows");
    let base = w.data.as_ptr();
    for t0 in (0..x.n).step_by(TOK_TILE) {
        for r0 in (0..w.rows).step_by(4) {
            let nr = (w.rows - r0).min(4);
            // SAFETY: rows r0..r0+nr exist; missing rows repeat the last one.
            let rows =
                std::array::from_fn(|i| unsafe { base.add((r0 + i.min(nr - 1)) * w.stride) });
            for t in t0..(t0 + TOK_TILE).min(x.n) {
                // The same blocks of the next four rows, while the first token reads these.
                let pf = if t == 0 { 4 * w.stride } else { 0 };
                // SAFETY: token t exists.
                let res =
                    unsafe { rows4::<F>(&rows, x.data.as_ptr().add(t * nb * F::XBYTES), nb, pf) };
                for (i, &v) in res[..nr].iter().enumerate() {
                    out.set(t, r0 + i, v);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Float formats (the structure of `dot.rs`'s `float_dot!`).

/// A float element format.
///
/// # Safety
/// `load8` reads `8 * BYTES` bytes at `p`; `one` reads `BYTES`.
pub(super) unsafe trait Float {
    const BYTES: usize;
    unsafe fn load8(p: *const u8) -> __m256;
    fn one(b: &[u8]) -> f32;
}

pub(super) struct F32;
// SAFETY: 32 bytes per eight elements.
unsafe impl Float for F32 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 32 readable bytes.
        unsafe { _mm256_loadu_ps(p.cast()) }
    }
    fn one(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

pub(super) struct F16;
// SAFETY: 16 bytes per eight elements.
unsafe impl Float for F16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    fn one(b: &[u8]) -> f32 {
        half::f16::from_le_bytes([b[0], b[1]]).to_f32()
    }
}

pub(super) struct BF16;
// SAFETY: 16 bytes per eight elements.
unsafe impl Float for BF16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes.
        let v = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
    }
    fn one(b: &[u8]) -> f32 {
        crate::quant::floats::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
    }
}

/// Two rows × one token: `float_dot!`'s sequence per row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows2<F: Float>(w: [&[u8]; 2], x: &[u8], n: usize) -> [f32; 2] {
    let eb = F::BYTES;
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    let n32 = n / 32 * 32;
    let n8 = n / 8 * 8;
    // SAFETY (all loads): every row and `x` hold `n` elements (checked by the caller).
    unsafe {
        for e in (0..n32).step_by(32) {
            for k in 0..4 {
                let xv = F::load8(x.as_ptr().add((e + 8 * k) * eb));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = F::load8(w[r].as_ptr().add((e + 8 * k) * eb));
                    acc[k] = _mm256_fmadd_ps(wv, xv, acc[k]);
                }
            }
        }
        for e in (n32..n8).step_by(8) {
            let xv = F::load8(x.as_ptr().add(e * eb));
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[0] = _mm256_fmadd_ps(F::load8(w[r].as_ptr().add(e * eb)), xv, acc[0]);
            }
        }
    }
    std::array::from_fn(|r| {
        let a = &acc[r];
        let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let tail = w[r][n8 * eb..n * eb]
            .chunks_exact(eb)
            .zip(x[n8 * eb..n * eb].chunks_exact(eb))
            .fold(0.0f32, |s, (a, b)| s + F::one(a) * F::one(b));
        hsum_f32(s) + tail
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn float<F: Float>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    let n = w.n;
    let rb = n * F::BYTES;
    assert!(x.row_bytes() == rb && w.rows > 0);
    for t0 in (0..x.n).step_by(TOK_TILE) {
        for r0 in (0..w.rows).step_by(2) {
            let nr = (w.rows - r0).min(2);
            let rows = [w.row(r0), w.row(r0 + nr - 1)];
            for t in t0..(t0 + TOK_TILE).min(x.n) {
                let xr = x.row(t);
                assert!(rows.iter().all(|r| r.len() == rb) && xr.len() == rb);
                // SAFETY: lengths checked above.
                let res = unsafe { rows2::<F>(rows, xr, n) };
                for (i, &v) in res[..nr].iter().enumerate() {
                    out.set(t, r0 + i, v);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// k-quant `vec_dot`s (`kquants.rs`' float structure), four rows per step.

/// The float state of one k-quant `vec_dot` output.
#[derive(Clone, Copy)]
pub(super) struct KState {
    acc: __m256,
    acc_m: __m128,
    summs: f32,
}

/// One k-quant's `vec_dot`, block by block.
///
/// # Safety
/// `block` must be safe to call wherever AVX2, FMA and F16C are available.
pub(super) unsafe trait KVec {
    type B: crate::quant::Block;
    unsafe fn block(st: &mut KState, a: &Self::B, b: &BlockQ8K);
    unsafe fn finish(st: &KState) -> f32;
}

fn f16(h: [u8; 2]) -> f32 {
    crate::quant::blocks::f16_to_f32(h)
}

macro_rules! kvec {
    ($name:ident, $B:ty, |$st:ident, $a:ident, $b:ident| $block:block, |$fs:ident| $finish:expr) => {
        pub(super) struct $name;
        // SAFETY: the bodies use AVX2/FMA/F16C only.
        unsafe impl KVec for $name {
            type B = $B;
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn block($st: &mut KState, $a: &$B, $b: &BlockQ8K) $block
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn finish($fs: &KState) -> f32 {
                $finish
            }
        }
    };
}

kvec!(
    V2,
    BlockQ2K,
    |st, a, b| {
        let (d, dmin) = (b.d() * f16(a.d), -b.d() * f16(a.dmin));
        let mins = _mm256_madd_epi16(groups16(a.scales.map(|s| s >> 4), false), bsums16(b));
        st.acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins), st.acc);
        let sumi = sum_chunks(&chunks_q2k(a, b));
        st.acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), st.acc);
    },
    |st| hsum_f32(st.acc)
);

kvec!(
    V3,
    BlockQ3K,
    |st, a, b| {
        let d = b.d() * f16(a.d);
        let sumi = sum_chunks(&chunks_q3k(a, b));
        st.acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), st.acc);
    },
    |st| hsum_f32(st.acc)
);

kvec!(
    V4,
    BlockQ4K,
    |st, a, b| {
        let (d, dmin) = (b.d() * f16(a.d), -b.d() * f16(a.dmin));
        let (sc, mn) = scales_mins_k4(&a.scales);
        let mins = _mm_cvtepi32_ps(min_lanes_k4(&mn, b));
        st.acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), mins, st.acc_m);
        let sumi = sum_chunks(&chunks_k4(&sc, &a.qs, None, b));
        st.acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), st.acc);
    },
    |st| finish_q4k(st.acc, st.acc_m)
);

kvec!(
    V5,
    BlockQ5K,
    |st, a, b| {
        let (d, dmin) = (b.d() * f16(a.d), -b.d() * f16(a.dmin));
        let (sc, mn) = scales_mins_k4(&a.scales);
        st.summs = dmin.mul_add(hsum_i32x4(min_lanes_k4(&mn, b)) as f32, st.summs);
        let sumi = sum_chunks(&chunks_k4(&sc, &a.qs, Some(&a.qh), b));
        st.acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), st.acc);
    },
    |st| hsum_f32(st.acc) + st.summs
);

kvec!(
    V6,
    BlockQ6K,
    |st, a, b| {
        let d = b.d() * f16(a.d);
        let sumi = sum_chunks(&chunks_q6k(a, b));
        let sumi = _mm256_sub_epi32(sumi, offset_lanes_q6k(&a.scales, b));
        st.acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), st.acc);
    },
    |st| hsum_f32(st.acc)
);

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn kvec<V: KVec>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    assert!(w.rows > 0 && x.dtype == DType::Q8_K);
    for r0 in (0..w.rows).step_by(4) {
        let nr = (w.rows - r0).min(4);
        let rows: [&[V::B]; 4] = std::array::from_fn(|i| blocks(w.row(r0 + i.min(nr - 1))));
        for t in 0..x.n {
            let xs: &[BlockQ8K] = blocks(x.row(t));
            let zero = KState {
                acc: _mm256_setzero_ps(),
                acc_m: _mm_setzero_ps(),
                summs: 0.0,
            };
            let mut st = [zero; 4];
            for (i, b) in xs.iter().enumerate() {
                if t == 0 {
                    prefetch_next4(&rows, i, w.stride);
                }
                for (st, row) in st.iter_mut().zip(&rows) {
                    // SAFETY: the features are enabled here.
                    unsafe { V::block(st, &row[i], b) };
                }
            }
            for (i, st) in st[..nr].iter().enumerate() {
                // SAFETY: as above.
                out.set(t, r0 + i, unsafe { V::finish(st) });
            }
        }
    }
}
