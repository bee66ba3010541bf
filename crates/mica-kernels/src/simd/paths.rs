//! llama.cpp's batch matmul paths for the k-quants, whose float arithmetic differs from its
//! `ggml_vec_dot_*` kernels (which the main [`Kernels`] table reproduces).
//!
//! llama.cpp's CPU backend (x86, AVX2 or better) computes a weight × activations product in
//! one of several ways, chosen per tensor and per batch size ([`DotPath::for_token`]):
//!
//! - **Repacked Q4_K** (`ggml-cpu/repack.cpp`): every Q4_K matrix whose row count is a
//!   multiple of 8 is interleaved at load time (`block_q4_Kx8`). Tokens in groups of four go
//!   through `ggml_gemm_q4_K_8x8_q8_K`, the rest (decoding: every token) through
//!   `ggml_gemv_q4_K_8x8_q8_K`. Per output, both keep two f32 accumulators, the products and
//!   the mins, and return their difference; the gemv adds one FMA per super-block
//!   (`acc = fma(Σ sc·q·a, d_w·d_x, acc)`), the gemm one per 64 elements.
//! - **Tiled** (`ggml-cpu/tiled`, AVX-512 VNNI microkernel): the other k-quants when a batch
//!   has at least 8 tokens. Per super-block `r = Σ sc·q·a · d_w` (minus `dmin_w · Σ m·bsum`
//!   by one fused step), then `acc = fma(r, d_x, acc)`.
//!
//! Integer sums are exact, so only the float steps matter; here they are written once as
//! scalar f32 code over per-block integer sums, which the scalar table computes from unpacked
//! quants and the AVX2 table from the same chunk lanes as its dot products. Not modeled
//! (they fall back to the plain dot product): the repacked Q4_0 (`block_q4_0x8`) and, on
//! AVX-512 machines, repacked Q2_K layouts, and the tiled path of formats whose rows are
//! repacked.

use super::{Kernels, VecDotFn};
use crate::DType;
use crate::quant::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, blocks, f16_to_f32,
    q3k_scales,
};
use crate::quant::kquants::{
    scales_mins_k4, unpack_q2k, unpack_q3k, unpack_q4k, unpack_q5k, unpack_q6k,
};

/// Which of llama.cpp's CPU code paths computes an output, which fixes its float arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DotPath {
    /// `ggml_vec_dot_*` (and tinyBLAS for Q8_0/Q5_0/Q4_0 batches, whose per-output
    /// arithmetic is the same): [`Kernels::vec_dot`].
    VecDot,
    /// Repacked Q4_K, a token outside the groups of four: `ggml_gemv_q4_K_8x8_q8_K`.
    RepackGemv,
    /// Repacked Q4_K, a token in a group of four: `ggml_gemm_q4_K_8x8_q8_K`.
    RepackGemm,
    /// k-quants in batches of 8 or more tokens: the tiled matmul.
    Tiled,
}

impl DotPath {
    /// The path llama.cpp (x86, AVX2 or better) takes for token `token` of a batch of
    /// `n_tokens` multiplied with a `rows`-row weight matrix of type `t`.
    pub fn for_token(t: DType, rows: usize, n_tokens: usize, token: usize) -> DotPath {
        let kquant = matches!(
            t,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K
        );
        if t == DType::Q4_K && rows.is_multiple_of(8) {
            if token < n_tokens - n_tokens % 4 {
                DotPath::RepackGemm
            } else {
                DotPath::RepackGemv
            }
        } else if kquant && n_tokens >= 8 {
            DotPath::Tiled
        } else {
            DotPath::VecDot
        }
    }

    /// Index into [`Kernels`]' path tables (`VecDot` has none).
    pub(super) fn slot(self) -> Option<usize> {
        match self {
            DotPath::VecDot => None,
            DotPath::RepackGemv => Some(0),
            DotPath::RepackGemm => Some(1),
            DotPath::Tiled => Some(2),
        }
    }
}

/// Exact integer sums of one (weight super-block, Q8_K block) pair, per 64 elements:
/// `part[k] = Σ sc·q·a` and `min[k] = Σ m·bsum` over elements 64k..64k+64.
#[derive(Clone, Copy, Default)]
pub(super) struct KSums {
    pub part: [i32; 4],
    pub min: [i32; 4],
}

/// The float state of one output.
#[derive(Default)]
pub(super) struct Acc {
    acc: f32,
    acc_min: f32,
}

impl Acc {
    /// One super-block of `ggml_gemv_q4_K_8x8_q8_K`.
    #[inline(always)]
    pub fn gemv(&mut self, s: &KSums, dw: f32, dmin: f32, dx: f32) {
        let isum: i32 = s.part.iter().sum();
        let imin: i32 = s.min.iter().sum();
        self.acc = (isum as f32).mul_add(dw * dx, self.acc);
        self.acc_min = (imin as f32).mul_add(dmin * dx, self.acc_min);
    }

    /// One super-block of `ggml_gemm_q4_K_8x8_q8_K`: an FMA per 64 elements.
    #[inline(always)]
    pub fn gemm(&mut self, s: &KSums, dw: f32, dmin: f32, dx: f32) {
        for k in 0..4 {
            self.acc = (s.part[k] as f32).mul_add(dw * dx, self.acc);
            self.acc_min = (s.min[k] as f32).mul_add(dmin * dx, self.acc_min);
        }
    }

    /// The repacked kernels' result.
    #[inline(always)]
    pub fn repack_result(&self) -> f32 {
        self.acc - self.acc_min
    }

    /// One super-block of the tiled microkernel; `dmin` for the formats with mins.
    #[inline(always)]
    pub fn tiled(&mut self, s: &KSums, dw: f32, dmin: Option<f32>, dx: f32) {
        let isum: i32 = s.part.iter().sum();
        let mut r = isum as f32 * dw;
        if let Some(dmin) = dmin {
            let imin: i32 = s.min.iter().sum();
            r = (-dmin).mul_add(imin as f32, r);
        }
        // `buf + r·d_x` in the source; GCC contracts it into one FMA.
        self.acc = r.mul_add(dx, self.acc);
    }

    #[inline(always)]
    pub fn tiled_result(&self) -> f32 {
        self.acc
    }
}

// ---------------------------------------------------------------------------------------------
// Integer sums from unpacked quants (the scalar table).

/// `Σ scale(e)·q[e]·a[e]` per 64 elements.
fn parts(q: &[i8; QK_K], a: &[i8; QK_K], scale: impl Fn(usize) -> i32) -> [i32; 4] {
    let mut out = [0i32; 4];
    for (e, (&q, &a)) in q.iter().zip(a).enumerate() {
        out[e / 64] += scale(e) * q as i32 * a as i32;
    }
    out
}

/// `Σ m(g)·bsum[g]` per 64 elements (four groups of 16).
fn min_parts(b: &BlockQ8K, m: impl Fn(usize) -> i32) -> [i32; 4] {
    std::array::from_fn(|k| (4 * k..4 * k + 4).map(|g| m(g) * b.bsum(g) as i32).sum())
}

fn ksums_q2k(a: &BlockQ2K, b: &BlockQ8K) -> KSums {
    KSums {
        part: parts(&unpack_q2k(a), &b.qs, |e| (a.scales[e / 16] & 0xF) as i32),
        min: min_parts(b, |g| (a.scales[g] >> 4) as i32),
    }
}

fn ksums_q3k(a: &BlockQ3K, b: &BlockQ8K) -> KSums {
    let sc = q3k_scales(&a.scales);
    KSums {
        part: parts(&unpack_q3k(a), &b.qs, |e| sc[e / 16] as i32),
        min: [0; 4],
    }
}

fn ksums_k4(q: &[i8; QK_K], scales: &[u8; 12], b: &BlockQ8K) -> KSums {
    let (sc, mn) = scales_mins_k4(scales);
    KSums {
        part: parts(q, &b.qs, |e| sc[e / 32] as i32),
        min: min_parts(b, |g| mn[g / 2] as i32),
    }
}

fn ksums_q6k(a: &BlockQ6K, b: &BlockQ8K) -> KSums {
    KSums {
        part: parts(&unpack_q6k(a), &b.qs, |e| a.scales[e / 16] as i32),
        min: [0; 4],
    }
}

/// Generates the repacked-Q4_K path functions (gemv, gemm) from a `KSums` provider.
macro_rules! repack_fns {
    ($gemv:ident, $gemm:ident, |$a:ident, $b:ident| $sums:expr $(, $features:literal)?) => {
        $(#[target_feature(enable = $features)])?
        pub(super) fn $gemv(n: usize, w: &[u8], x: &[u8]) -> f32 {
            let (w, x): (&[BlockQ4K], &[BlockQ8K]) = (blocks(w), blocks(x));
            debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
            let mut acc = Acc::default();
            for ($a, $b) in w.iter().zip(x) {
                let s = $sums;
                acc.gemv(&s, f16_to_f32($a.d), f16_to_f32($a.dmin), $b.d());
            }
            acc.repack_result()
        }

        $(#[target_feature(enable = $features)])?
        pub(super) fn $gemm(n: usize, w: &[u8], x: &[u8]) -> f32 {
            let (w, x): (&[BlockQ4K], &[BlockQ8K]) = (blocks(w), blocks(x));
            debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
            let mut acc = Acc::default();
            for ($a, $b) in w.iter().zip(x) {
                let s = $sums;
                acc.gemm(&s, f16_to_f32($a.d), f16_to_f32($a.dmin), $b.d());
            }
            acc.repack_result()
        }
    };
}

/// Generates a tiled-path function from a `KSums` provider; `dmin` is `Some` for the formats
/// with mins.
macro_rules! tiled_fn {
    ($name:ident, $B:ty, |$a:ident, $b:ident| $sums:expr, dmin: $dmin:expr $(, $features:literal)?) => {
        $(#[target_feature(enable = $features)])?
        pub(super) fn $name(n: usize, w: &[u8], x: &[u8]) -> f32 {
            let (w, x): (&[$B], &[BlockQ8K]) = (blocks(w), blocks(x));
            debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
            let mut acc = Acc::default();
            for ($a, $b) in w.iter().zip(x) {
                let s = $sums;
                acc.tiled(&s, f16_to_f32($a.d), $dmin, $b.d());
            }
            acc.tiled_result()
        }
    };
}

mod scalar {
    use super::*;

    repack_fns!(gemv_q4k, gemm_q4k, |a, b| ksums_k4(
        &unpack_q4k(a),
        &a.scales,
        b
    ));
    tiled_fn!(tiled_q2k, BlockQ2K, |a, b| ksums_q2k(a, b), dmin: Some(f16_to_f32(a.dmin)));
    tiled_fn!(tiled_q3k, BlockQ3K, |a, b| ksums_q3k(a, b), dmin: None);
    tiled_fn!(tiled_q4k, BlockQ4K, |a, b| ksums_k4(&unpack_q4k(a), &a.scales, b),
        dmin: Some(f16_to_f32(a.dmin)));
    tiled_fn!(tiled_q5k, BlockQ5K, |a, b| ksums_k4(&unpack_q5k(a), &a.scales, b),
        dmin: Some(f16_to_f32(a.dmin)));
    tiled_fn!(tiled_q6k, BlockQ6K, |a, b| ksums_q6k(a, b), dmin: None);
}

/// Installs the scalar path functions (every table starts from these).
pub(super) fn install_scalar(k: &mut Kernels) {
    use scalar::*;
    k.set_path_dot(DotPath::RepackGemv, DType::Q4_K, gemv_q4k);
    k.set_path_dot(DotPath::RepackGemm, DType::Q4_K, gemm_q4k);
    let tiled: [(DType, VecDotFn); 5] = [
        (DType::Q2_K, tiled_q2k),
        (DType::Q3_K, tiled_q3k),
        (DType::Q4_K, tiled_q4k),
        (DType::Q5_K, tiled_q5k),
        (DType::Q6_K, tiled_q6k),
    ];
    for (t, f) in tiled {
        k.set_path_dot(DotPath::Tiled, t, f);
    }
}

/// The AVX2 path functions: integer sums from the dot products' chunk lanes.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
    use crate::simd::avx2::{entry, hsum_i32};
    use crate::simd::avx2_kprefill::{DECODE_MIN_TOKENS, K4, K5, K6, kquant_decoded};
    use crate::simd::avx2_kquants::{
        Chunks, chunks_k4, chunks_q2k, chunks_q3k, chunks_q6k, hsum_i32x4, min_lanes_k4,
        offset_lanes_q6k, sum_chunks,
    };
    use crate::simd::mat::prefetch_next4;
    use crate::simd::mat::{ActRows, MatOut, WeightRows};
    use std::arch::x86_64::*;

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
    unsafe trait Sums {
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
    fn totals_k4(
        scales: &[u8; 12],
        qs: &[u8; 128],
        qh: Option<&[u8; 32]>,
        b: &BlockQ8K,
    ) -> (i32, i32) {
        let (sc, mn) = scales_mins_k4(scales);
        let part = hsum_i32(sum_chunks(&chunks_k4(&sc, qs, qh, b)));
        (part, hsum_i32x4(min_lanes_k4(&mn, b)))
    }

    macro_rules! sums {
        ($name:ident, $B:ty, |$a:ident| $scales:expr, $f:ident $(, |$ta:ident, $tb:ident| $totals:expr)?) => {
            struct $name;
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

    /// `Acc` steps: 0 = repacked gemv, 1 = repacked gemm, 2 = tiled.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mat<S: Sums, const STEP: u8>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
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

    pub(in crate::simd) fn install(k: &mut Kernels) {
        // SAFETY (the matrix kernels): installed only in tables with AVX2, FMA and F16C.
        k.set_mat(DotPath::RepackGemv, DType::Q4_K, |w, x, o| unsafe {
            mat::<S4, 0>(w, x, o)
        });
        k.set_mat(DotPath::RepackGemm, DType::Q4_K, |w, x, o| unsafe {
            if x.n >= DECODE_MIN_TOKENS {
                kquant_decoded::<K4, 1>(w, x, o)
            } else {
                mat::<S4, 1>(w, x, o)
            }
        });
        k.set_mat(DotPath::Tiled, DType::Q2_K, |w, x, o| unsafe {
            mat::<S2, 2>(w, x, o)
        });
        k.set_mat(DotPath::Tiled, DType::Q3_K, |w, x, o| unsafe {
            mat::<S3, 2>(w, x, o)
        });
        k.set_mat(DotPath::Tiled, DType::Q4_K, |w, x, o| unsafe {
            if x.n >= DECODE_MIN_TOKENS {
                kquant_decoded::<K4, 2>(w, x, o)
            } else {
                mat::<S4, 2>(w, x, o)
            }
        });
        k.set_mat(DotPath::Tiled, DType::Q5_K, |w, x, o| unsafe {
            if x.n >= DECODE_MIN_TOKENS {
                kquant_decoded::<K5, 2>(w, x, o)
            } else {
                mat::<S5, 2>(w, x, o)
            }
        });
        k.set_mat(DotPath::Tiled, DType::Q6_K, |w, x, o| unsafe {
            if x.n >= DECODE_MIN_TOKENS {
                kquant_decoded::<K6, 2>(w, x, o)
            } else {
                mat::<S6, 2>(w, x, o)
            }
        });
        k.set_path_dot(DotPath::RepackGemv, DType::Q4_K, entry!(dot gemv_q4k));
        k.set_path_dot(DotPath::RepackGemm, DType::Q4_K, entry!(dot gemm_q4k));
        k.set_path_dot(DotPath::Tiled, DType::Q2_K, entry!(dot tiled_q2k));
        k.set_path_dot(DotPath::Tiled, DType::Q3_K, entry!(dot tiled_q3k));
        k.set_path_dot(DotPath::Tiled, DType::Q4_K, entry!(dot tiled_q4k));
        k.set_path_dot(DotPath::Tiled, DType::Q5_K, entry!(dot tiled_q5k));
        k.set_path_dot(DotPath::Tiled, DType::Q6_K, entry!(dot tiled_q6k));
    }
}
