//! llama.cpp's batch matmul paths for the k-quants and IQ4_NL, whose float arithmetic differs from its
//! `ggml_vec_dot_*` kernels (which the main [`Kernels`](super::Kernels) table reproduces).
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
//! - **Repacked IQ4_NL** (`ggml-cpu/repack.cpp`, `block_iq4_nlx8`): every IQ4_NL matrix
//!   whose row count is a multiple of 8, every token (`ggml_gemv/gemm_iq4_nl_8x8_q8_0`,
//!   whose per-output arithmetic is the same): one FMA per 32-element block,
//!   `acc = fma(Σ q·a, d_w·d_x, acc)`. mica computes it as [`DotPath::RepackGemv`].
//! - **Tiled** (`ggml-cpu/tiled`, AVX-512 VNNI microkernel): the other k-quants when a batch
//!   has at least 8 tokens. Per super-block `r = Σ sc·q·a · d_w` (minus `dmin_w · Σ m·bsum`
//!   by one fused step), then `acc = fma(r, d_x, acc)`.
//!
//! Integer sums are exact, so only the float steps matter; here they are written once as
//! scalar f32 code over per-block integer sums ([`KSums`], [`Acc`]; the path functions from
//! them by `repack_fns!` and `tiled_fn!`), which the scalar table (`scalar.rs`) computes from
//! unpacked quants and the AVX2 tier (`x86/avx2/paths.rs`) from the same chunk lanes as its
//! dot products. Not modeled (they fall back to the plain dot product): the repacked Q4_0
//! (`block_q4_0x8`) and, on AVX-512 machines, repacked Q2_K layouts, and the tiled path of
//! formats whose rows are repacked.
//!
//! One path here is not llama.cpp's: [`DotPath::PerBlock`], an opt-in prompt path for the
//! legacy formats with one FMA per block ([`per_block_dot`], [`set_llama_exact`]).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::DType;
use crate::quant::blocks::BlockQ8K;

/// Which of llama.cpp's CPU code paths computes an output, which fixes its float arithmetic
/// (or mica's opt-in [`DotPath::PerBlock`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DotPath {
    /// `ggml_vec_dot_*` (and tinyBLAS for Q8_0/Q5_0/Q4_0 batches, whose per-output
    /// arithmetic is the same): [`Kernels::vec_dot`](super::Kernels::vec_dot).
    VecDot,
    /// Repacked Q4_K, a token outside the groups of four: `ggml_gemv_q4_K_8x8_q8_K`; and
    /// repacked IQ4_NL, every token (`ggml_gemv/gemm_iq4_nl_8x8_q8_0`).
    RepackGemv,
    /// Repacked Q4_K, a token in a group of four: `ggml_gemm_q4_K_8x8_q8_K`.
    RepackGemm,
    /// k-quants in batches of 8 or more tokens: the tiled matmul.
    Tiled,
    /// mica's own prompt path of the legacy formats (not llama.cpp's): per 32-element block
    /// one exact integer sum and `acc = fma(d_w·d_x, f32(Σ q·y), acc)`, then for Q4_1/Q5_1
    /// `acc = fma(m_w, s_x, acc)` ([`per_block_dot`]). It saves the eight conversions and
    /// FMAs per block and row that llama.cpp's eight f32 lanes cost, and differs from
    /// `VecDot` in float rounding only — but enough to move greedy tokens away from
    /// llama.cpp's past its near-ties (`docs/numerics.md`), so it is opt-in: taken by
    /// batches of [`PER_BLOCK_MIN_TOKENS`] or more, where the table has a matrix kernel for
    /// it (the AVX-512 tier), after `set_llama_exact(false)` (the `mica` command: `MICA_PER_BLOCK=1`).
    PerBlock,
}

/// Batches from this many tokens on take [`DotPath::PerBlock`] where it applies (the size
/// from which the legacy matrix kernels decode row groups once per token tile).
pub const PER_BLOCK_MIN_TOKENS: usize = 16;

/// Whether batches of legacy-format weights of type `t` take [`DotPath::PerBlock`]: the
/// process's table has its kernel and llama.cpp's arithmetic is not asked for
/// ([`set_llama_exact`]).
pub fn per_block_enabled(t: DType) -> bool {
    !llama_exact() && super::kernels().has_matmul(DotPath::PerBlock, t)
}

/// Whether products follow llama.cpp's arithmetic on every path: true (the default) until
/// [`set_llama_exact`]`(false)`. The library reads no environment; the `mica` command line
/// maps `MICA_PER_BLOCK=1` onto this switch.
static LLAMA_EXACT: AtomicBool = AtomicBool::new(true);

/// Whether products follow llama.cpp's arithmetic on every path (no [`DotPath::PerBlock`]):
/// what [`set_llama_exact`] last set, true by default.
pub fn llama_exact() -> bool {
    LLAMA_EXACT.load(Ordering::Relaxed)
}

/// Makes every later product of this process follow llama.cpp's arithmetic (`true`, the
/// default: its logits bit for bit) or take mica's faster prompt path where it applies
/// (`false`; the `mica` command does this under `MICA_PER_BLOCK=1`; see
/// [`DotPath::PerBlock`]).
pub fn set_llama_exact(on: bool) {
    LLAMA_EXACT.store(on, Ordering::Relaxed);
}

impl DotPath {
    /// Every path, `VecDot` first.
    pub const ALL: [DotPath; 5] = [
        DotPath::VecDot,
        DotPath::RepackGemv,
        DotPath::RepackGemm,
        DotPath::Tiled,
        DotPath::PerBlock,
    ];

    /// The path llama.cpp (x86, AVX2 or better) takes for token `token` of a batch of
    /// `n_tokens` multiplied with a `rows`-row weight matrix of type `t` — or, for the
    /// legacy formats in batches of [`PER_BLOCK_MIN_TOKENS`] or more, mica's
    /// [`DotPath::PerBlock`] where [`per_block_enabled`].
    pub fn for_token(t: DType, rows: usize, n_tokens: usize, token: usize) -> DotPath {
        let kquant = matches!(
            t,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K
        );
        if is_legacy(t) && n_tokens >= PER_BLOCK_MIN_TOKENS && per_block_enabled(t) {
            DotPath::PerBlock
        } else if t == DType::IQ4_NL && rows.is_multiple_of(8) {
            DotPath::RepackGemv
        } else if t == DType::Q4_K && rows.is_multiple_of(8) {
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

    /// Index into [`Kernels`](super::Kernels)' path tables (`VecDot` has none).
    pub(super) fn slot(self) -> Option<usize> {
        match self {
            DotPath::VecDot => None,
            DotPath::RepackGemv => Some(0),
            DotPath::RepackGemm => Some(1),
            DotPath::Tiled => Some(2),
            DotPath::PerBlock => Some(3),
        }
    }
}

/// The legacy weight formats (the types [`DotPath::PerBlock`] applies to).
pub fn is_legacy(t: DType) -> bool {
    matches!(
        t,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
    )
}

/// The arithmetic of [`DotPath::PerBlock`] for a legacy weight row `w` (type `t`) against
/// activations `x` (`t.vec_dot_type()`: Q8_0, or Q8_1 for Q4_1/Q5_1): the scalar reference
/// every table's kernels for that path match bit for bit.
pub(super) fn per_block_dot(t: DType, n: usize, w: &[u8], x: &[u8]) -> f32 {
    use crate::quant::blocks::{
        BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK, blocks, f16_to_f32,
    };
    use crate::quant::legacy::{unpack_q4_0, unpack_q4_1, unpack_q5_0, unpack_q5_1};
    fn isum(q: &[i8; QK], y: &[i8; QK]) -> i32 {
        q.iter().zip(y).map(|(&q, &y)| q as i32 * y as i32).sum()
    }
    let nb = n / QK;
    let mut acc = 0f32;
    // One block: the quants, the weight's d (and m), then the step.
    let mut step = |q: [i8; QK], dw: f32, y: &[i8; QK], dx: f32, m: Option<(f32, f32)>| {
        acc = (dw * dx).mul_add(isum(&q, y) as f32, acc);
        if let Some((mw, sx)) = m {
            acc = mw.mul_add(sx, acc);
        }
    };
    match t {
        DType::Q4_1 | DType::Q5_1 => {
            let x: &[BlockQ8_1] = blocks(x);
            for (b, y) in x.iter().enumerate().take(nb) {
                let (q, d, m) = if t == DType::Q4_1 {
                    let w = &blocks::<BlockQ4_1>(w)[b];
                    (unpack_q4_1(w), w.d, w.m)
                } else {
                    let w = &blocks::<BlockQ5_1>(w)[b];
                    (unpack_q5_1(w), w.d, w.m)
                };
                let m = Some((f16_to_f32(m), f16_to_f32(y.s)));
                step(q, f16_to_f32(d), &y.qs, f16_to_f32(y.d), m);
            }
        }
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => {
            let x: &[BlockQ8_0] = blocks(x);
            for (b, y) in x.iter().enumerate().take(nb) {
                let (q, d) = match t {
                    DType::Q4_0 => {
                        let w = &blocks::<BlockQ4_0>(w)[b];
                        (unpack_q4_0(w), w.d)
                    }
                    DType::Q5_0 => {
                        let w = &blocks::<BlockQ5_0>(w)[b];
                        (unpack_q5_0(w), w.d)
                    }
                    _ => {
                        let w = &blocks::<BlockQ8_0>(w)[b];
                        (w.qs, w.d)
                    }
                };
                step(q, f16_to_f32(d), &y.qs, f16_to_f32(y.d), None);
            }
        }
        _ => panic!("DotPath::PerBlock: {t} is not a legacy format"),
    }
    acc
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
// The path functions, from any source of integer sums.

/// `Σ m(g)·bsum[g]` per 64 elements (four groups of 16).
pub(super) fn min_parts(b: &BlockQ8K, m: impl Fn(usize) -> i32) -> [i32; 4] {
    std::array::from_fn(|k| (4 * k..4 * k + 4).map(|g| m(g) * b.bsum(g) as i32).sum())
}

/// Generates the repacked-Q4_K path functions (gemv, gemm) from a `KSums` provider.
macro_rules! repack_fns {
    ($gemv:ident, $gemm:ident, |$a:ident, $b:ident| $sums:expr $(, $features:literal)?) => {
        $(#[target_feature(enable = $features)])?
        pub(super) fn $gemv(n: usize, w: &[u8], x: &[u8]) -> f32 {
            use $crate::quant::blocks::{BlockQ4K, BlockQ8K, QK_K};
            let w: &[BlockQ4K] = $crate::quant::blocks::blocks(w);
            let x: &[BlockQ8K] = $crate::quant::blocks::blocks(x);
            debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
            let mut acc = $crate::simd::paths::Acc::default();
            for ($a, $b) in w.iter().zip(x) {
                let s = $sums;
                let (dw, dmin) = (
                    $crate::quant::blocks::f16_to_f32($a.d),
                    $crate::quant::blocks::f16_to_f32($a.dmin),
                );
                acc.gemv(&s, dw, dmin, $b.d());
            }
            acc.repack_result()
        }

        $(#[target_feature(enable = $features)])?
        pub(super) fn $gemm(n: usize, w: &[u8], x: &[u8]) -> f32 {
            use $crate::quant::blocks::{BlockQ4K, BlockQ8K, QK_K};
            let w: &[BlockQ4K] = $crate::quant::blocks::blocks(w);
            let x: &[BlockQ8K] = $crate::quant::blocks::blocks(x);
            debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
            let mut acc = $crate::simd::paths::Acc::default();
            for ($a, $b) in w.iter().zip(x) {
                let s = $sums;
                let (dw, dmin) = (
                    $crate::quant::blocks::f16_to_f32($a.d),
                    $crate::quant::blocks::f16_to_f32($a.dmin),
                );
                acc.gemm(&s, dw, dmin, $b.d());
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
            use $crate::quant::blocks::{BlockQ8K, QK_K};
            let w: &[$B] = $crate::quant::blocks::blocks(w);
            let x: &[BlockQ8K] = $crate::quant::blocks::blocks(x);
            debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
            let mut acc = $crate::simd::paths::Acc::default();
            for ($a, $b) in w.iter().zip(x) {
                let s = $sums;
                acc.tiled(&s, $crate::quant::blocks::f16_to_f32($a.d), $dmin, $b.d());
            }
            acc.tiled_result()
        }
    };
}
pub(super) use {repack_fns, tiled_fn};
