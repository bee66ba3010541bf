//! The AVX2 tier's k-quant batch paths ([`DotPath`](crate::simd::DotPath)): their dot
//! products, with the integer sums ([`KSums`]) taken from the same chunk lanes as
//! `kquants.rs`' dot products and `simd/paths.rs`' float steps ([`Acc`]), and matrix kernels
//! with that arithmetic, four rows per step against one token ([`rows4`]); from
//! [`DECODE_MIN_TOKENS`] tokens on, Q4_K, Q5_K and Q6_K take `kprefill.rs`' decoded kernel
//! instead ([`mat_or_decoded`]).

use std::arch::x86_64::*;

use super::hsum_i32;
use super::kprefill::{DECODE_MIN_TOKENS, KFormat, kquant_decoded};
use super::kquants::{
    Chunks, chunks_k4, chunks_q2k, chunks_q3k, chunks_q6k, hsum_i32x4, min_lanes_k4,
    offset_lanes_q6k, sum_chunks,
};
use crate::DType;
use crate::quant::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, blocks, f16_to_f32,
};
use crate::quant::kquants::scales_mins_k4;
use crate::simd::mat::{ActRows, MatOut, WeightRows, prefetch_next4};
use crate::simd::paths::{Acc, KSums, min_parts, repack_fns, tiled_fn};

/// `Σ` of chunks 2k and 2k+1 (elements 64k..64k+64).
#[inline]
#[target_feature(enable = "avx2")]
fn parts_of(c: &Chunks) -> [i32; 4] {
    let mut out = [0i32; 4];
    for (k, o) in out.iter_mut().enumerate() {
        *o = hsum_i32(_mm256_add_epi32(c[2 * k], c[2 * k + 1]));
    }
    out
}

#[inline]
#[target_feature(enable = "avx2")]
fn ksums_k4(
    sc: &[u8; 8],
    mn: &[u8; 8],
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    b: &BlockQ8K,
) -> KSums {
    let mut min = [0i32; 4];
    // SAFETY: 16 writable bytes; unaligned store.
    unsafe { _mm_storeu_si128(min.as_mut_ptr().cast(), min_lanes_k4(mn, b)) };
    KSums {
        part: parts_of(&chunks_k4(sc, qs, qh, b)),
        min,
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn ksums_q4k(a: &BlockQ4K, b: &BlockQ8K) -> KSums {
    let (sc, mn) = scales_mins_k4(&a.scales);
    ksums_k4(&sc, &mn, &a.qs, None, b)
}

#[inline]
#[target_feature(enable = "avx2")]
fn ksums_q5k(a: &BlockQ5K, b: &BlockQ8K) -> KSums {
    let (sc, mn) = scales_mins_k4(&a.scales);
    ksums_k4(&sc, &mn, &a.qs, Some(&a.qh), b)
}

#[inline]
#[target_feature(enable = "avx2")]
fn ksums_q2k(a: &BlockQ2K, b: &BlockQ8K) -> KSums {
    KSums {
        part: parts_of(&chunks_q2k(a, b)),
        min: min_parts(b, |g| (a.scales[g] >> 4) as i32),
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn ksums_q3k(a: &BlockQ3K, b: &BlockQ8K) -> KSums {
    KSums {
        part: parts_of(&chunks_q3k(a, b)),
        min: [0; 4],
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn ksums_q6k(a: &BlockQ6K, b: &BlockQ8K) -> KSums {
    // Unsigned quants in the lanes; the -32 comes back through the group sums.
    let offset = min_parts(b, |g| 32 * a.scales[g] as i32);
    let mut part = parts_of(&chunks_q6k(a, b));
    for (p, o) in part.iter_mut().zip(offset) {
        *p -= o;
    }
    KSums { part, min: [0; 4] }
}

repack_fns!(gemv_q4k, gemm_q4k, |a, b| ksums_q4k(a, b), "avx2,fma,f16c");
tiled_fn!(tiled_q2k, BlockQ2K, |a, b| ksums_q2k(a, b),
    dmin: Some(f16_to_f32(a.dmin)), "avx2,fma,f16c");
tiled_fn!(tiled_q3k, BlockQ3K, |a, b| ksums_q3k(a, b), dmin: None, "avx2,fma,f16c");
tiled_fn!(tiled_q4k, BlockQ4K, |a, b| ksums_q4k(a, b),
    dmin: Some(f16_to_f32(a.dmin)), "avx2,fma,f16c");
tiled_fn!(tiled_q5k, BlockQ5K, |a, b| ksums_q5k(a, b),
    dmin: Some(f16_to_f32(a.dmin)), "avx2,fma,f16c");
tiled_fn!(tiled_q6k, BlockQ6K, |a, b| ksums_q6k(a, b), dmin: None, "avx2,fma,f16c");

// -----------------------------------------------------------------------------------------
// Matrix kernels: four rows per step against one token, the per-output arithmetic above.

/// A k-quant's integer sums and scale fields, for the matrix kernels.
///
/// # Safety
/// `sums` must be safe to call wherever AVX2 is available.
pub(super) unsafe trait Sums {
    type B: crate::quant::Block;
    /// `Some(dmin)` for the formats with mins.
    fn scales(a: &Self::B) -> (f32, Option<f32>);
    unsafe fn sums(a: &Self::B, b: &BlockQ8K) -> KSums;
    /// The super-block totals `(Σ part, Σ min)` alone (what the gemv and tiled steps
    /// use), without the per-64-element horizontal sums of [`Sums::sums`].
    unsafe fn totals(a: &Self::B, b: &BlockQ8K) -> (i32, i32) {
        // SAFETY: the caller's contract is `sums`'.
        let s = unsafe { Self::sums(a, b) };
        (s.part.iter().sum(), s.min.iter().sum())
    }
}

/// Q4_K/Q5_K totals: one horizontal sum of all chunks, one of the min lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn totals_k4(scales: &[u8; 12], qs: &[u8; 128], qh: Option<&[u8; 32]>, b: &BlockQ8K) -> (i32, i32) {
    let (sc, mn) = scales_mins_k4(scales);
    let part = hsum_i32(sum_chunks(&chunks_k4(&sc, qs, qh, b)));
    (part, hsum_i32x4(min_lanes_k4(&mn, b)))
}

macro_rules! sums {
    ($name:ident, $B:ty, |$a:ident| $scales:expr, $f:ident $(, |$ta:ident, $tb:ident| $totals:expr)?) => {
        pub(super) struct $name;
        // SAFETY: `$f` needs only AVX2.
        unsafe impl Sums for $name {
            type B = $B;
            #[inline(always)]
            fn scales($a: &$B) -> (f32, Option<f32>) {
                $scales
            }
            #[inline]
            #[target_feature(enable = "avx2")]
            unsafe fn sums(a: &$B, b: &BlockQ8K) -> KSums {
                $f(a, b)
            }
            $(
            #[inline]
            #[target_feature(enable = "avx2")]
            unsafe fn totals($ta: &$B, $tb: &BlockQ8K) -> (i32, i32) {
                $totals
            }
            )?
        }
    };
}
sums!(
    S2,
    BlockQ2K,
    |a| (f16_to_f32(a.d), Some(f16_to_f32(a.dmin))),
    ksums_q2k
);
sums!(S3, BlockQ3K, |a| (f16_to_f32(a.d), None), ksums_q3k);
sums!(
    S4,
    BlockQ4K,
    |a| (f16_to_f32(a.d), Some(f16_to_f32(a.dmin))),
    ksums_q4k,
    |a, b| totals_k4(&a.scales, &a.qs, None, b)
);
sums!(
    S5,
    BlockQ5K,
    |a| (f16_to_f32(a.d), Some(f16_to_f32(a.dmin))),
    ksums_q5k,
    |a, b| totals_k4(&a.scales, &a.qs, Some(&a.qh), b)
);
sums!(
    S6,
    BlockQ6K,
    |a| (f16_to_f32(a.d), None),
    ksums_q6k,
    |a, b| {
        let sumi = _mm256_sub_epi32(
            sum_chunks(&chunks_q6k(a, b)),
            offset_lanes_q6k(&a.scales, b),
        );
        (hsum_i32(sumi), 0)
    }
);

/// Four rows per step against one token; `Acc` steps: 0 = repacked gemv, 1 = repacked gemm,
/// 2 = tiled.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows4<S: Sums, const STEP: u8>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    assert!(w.rows > 0 && x.dtype == DType::Q8_K && w.n.is_multiple_of(QK_K));
    for r0 in (0..w.rows).step_by(4) {
        let nr = (w.rows - r0).min(4);
        let rows: [&[S::B]; 4] = std::array::from_fn(|i| blocks(w.row(r0 + i.min(nr - 1))));
        for t in 0..x.n {
            let xs: &[BlockQ8K] = blocks(x.row(t));
            let mut acc: [Acc; 4] = std::array::from_fn(|_| Acc::default());
            for (i, b) in xs.iter().enumerate() {
                if t == 0 {
                    prefetch_next4(&rows, i, w.stride);
                }
                for (acc, row) in acc.iter_mut().zip(&rows) {
                    let a = &row[i];
                    // SAFETY: AVX2 is enabled here.
                    let s = unsafe {
                        if STEP == 1 {
                            S::sums(a, b)
                        } else {
                            // Totals in the first slot: the same exact integer sums.
                            let (p, m) = S::totals(a, b);
                            KSums {
                                part: [p, 0, 0, 0],
                                min: [m, 0, 0, 0],
                            }
                        }
                    };
                    let (dw, dmin) = S::scales(a);
                    match STEP {
                        0 => acc.gemv(&s, dw, dmin.unwrap_or(0.0), b.d()),
                        1 => acc.gemm(&s, dw, dmin.unwrap_or(0.0), b.d()),
                        _ => acc.tiled(&s, dw, dmin, b.d()),
                    }
                }
            }
            for (i, acc) in acc[..nr].iter().enumerate() {
                let v = if STEP == 2 {
                    acc.tiled_result()
                } else {
                    acc.repack_result()
                };
                out.set(t, r0 + i, v);
            }
        }
    }
}

/// [`rows4`] below [`DECODE_MIN_TOKENS`] tokens, `kprefill.rs`' decoded kernel from there on
/// (`S` and `K` the same format).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mat_or_decoded<S: Sums, K: KFormat, const STEP: u8>(
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
) {
    // SAFETY: the features are enabled here.
    unsafe {
        if x.n >= DECODE_MIN_TOKENS {
            kquant_decoded::<K, STEP>(w, x, out)
        } else {
            rows4::<S, STEP>(w, x, out)
        }
    }
}
