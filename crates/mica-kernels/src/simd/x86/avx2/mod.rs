//! The AVX2 tier (AVX2 + FMA + F16C): the table of every x86-64 CPU since Haswell and Zen,
//! and the base the AVX-512 tier extends. [`install`] lists every kernel the tier puts in the
//! table; the modules hold them by kind:
//!
//! - `dot.rs`: dot products of the legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
//!   and of the float types;
//! - `kquants.rs`: dot products of the k-quants (Q2_K ... Q6_K), and the per-chunk integer
//!   lanes the other k-quant kernels build on;
//! - `iquants.rs`: dot products of the i-quants, TQ1_0, TQ2_0 and MXFP4;
//! - `imat.rs`: matrix kernels of the i-quants (grid types and IQ4_XS; repacked IQ4_NL);
//! - `quantize.rs`: the activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16);
//! - `mat.rs`: matrix kernels with `vec_dot`'s arithmetic (legacy formats and k-quants four
//!   rows per step, floats two);
//! - `packed.rs`: the load-time packed layout of the legacy formats (eight rows interleaved,
//!   rows in the SIMD lanes) and its matrix kernel;
//! - `paths.rs`: llama.cpp's k-quant batch paths ([`DotPath`]): their dot products and
//!   four-row matrix kernels;
//! - `kprefill.rs`: the batch paths' prefill kernel for Q4_K, Q5_K and Q6_K (eight rows
//!   decoded once per token tile).
//!
//! This file holds the low-level helpers they share (loads, nibble and fifth-bit unpacking,
//! the u8 × i8 lane sums, ggml's horizontal sums), which the AVX-512 tier reuses.
//!
//! Every kernel does llama.cpp's x86 arithmetic operation by operation (see the module doc of
//! `simd` for why): eight f32 lanes of per-block integer sums accumulated by FMA, ggml's
//! horizontal sum; `127 / amax` and ties-to-even rounding in the quantizers.

mod dot;
mod imat;
mod iquants;
mod kprefill;
mod kquants;
mod mat;
mod packed;
mod paths;
mod quantize;

use std::arch::x86_64::*;

use crate::DType;
use crate::simd::{DotPath, Kernels, Packing};

pub(super) use dot::{legacy_dot, q4_0_bytes, q5_0_bytes, q5_1_bytes};
pub(super) use iquants::{
    GridChunks, IQ2S, IQ2XS, IQ2XXS, IQ3S, IQ3XXS, IQ4XS, nl_values, table16,
};
pub(super) use kquants::{finish_q4k, hsum_i32x4, min_lanes_k4, offset_lanes_q6k};

/// True when this CPU can run the kernels of this tier.
pub(in crate::simd) fn supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Turns a target-feature kernel into a plain `fn` for the table (`dot`: a [`VecDotFn`],
/// `quant`: a [`QuantizeFn`], `mat`: a [`MatFn`]).
///
/// [`VecDotFn`]: crate::simd::VecDotFn
/// [`QuantizeFn`]: crate::simd::QuantizeFn
/// [`MatFn`]: crate::simd::MatFn
macro_rules! entry {
    (dot $f:expr) => {
        // SAFETY: tables reach callers only after their tier's `supported()` confirmed the
        // features (`Kernels::get`).
        |n, w, x| unsafe { $f(n, w, x) }
    };
    (quant $f:expr) => {
        // SAFETY: as above.
        |src, dst| unsafe { $f(src, dst) }
    };
    (mat $f:expr) => {
        // SAFETY: as above.
        |w, x, o| unsafe { $f(w, x, o) }
    };
}
pub(super) use entry;

/// Puts every kernel of the AVX2 tier into `k` (a copy of the scalar table).
pub(in crate::simd) fn install(k: &mut Kernels) {
    // Dot products (`vec_dot`): legacy formats and floats, then the k-quants.
    k.set_dot(DType::F32, entry!(dot dot::vec_dot_f32));
    k.set_dot(DType::F16, entry!(dot dot::vec_dot_f16));
    k.set_dot(DType::BF16, entry!(dot dot::vec_dot_bf16));
    k.set_dot(DType::Q4_0, entry!(dot dot::vec_dot_q4_0));
    k.set_dot(DType::Q4_1, entry!(dot dot::vec_dot_q4_1));
    k.set_dot(DType::Q5_0, entry!(dot dot::vec_dot_q5_0));
    k.set_dot(DType::Q5_1, entry!(dot dot::vec_dot_q5_1));
    k.set_dot(DType::Q8_0, entry!(dot dot::vec_dot_q8_0));
    k.set_dot(DType::Q2_K, entry!(dot kquants::vec_dot_q2k));
    k.set_dot(DType::Q3_K, entry!(dot kquants::vec_dot_q3k));
    k.set_dot(DType::Q4_K, entry!(dot kquants::vec_dot_q4k));
    k.set_dot(DType::Q5_K, entry!(dot kquants::vec_dot_q5k));
    k.set_dot(DType::Q6_K, entry!(dot kquants::vec_dot_q6k));
    {
        use iquants::{IQ2S, IQ2XS, IQ2XXS, IQ3S, IQ3XXS, IQ4XS, vec_dot_grid};
        k.set_dot(DType::IQ2_XXS, entry!(dot vec_dot_grid::<IQ2XXS>));
        k.set_dot(DType::IQ2_XS, entry!(dot vec_dot_grid::<IQ2XS>));
        k.set_dot(DType::IQ2_S, entry!(dot vec_dot_grid::<IQ2S>));
        k.set_dot(DType::IQ3_XXS, entry!(dot vec_dot_grid::<IQ3XXS>));
        k.set_dot(DType::IQ3_S, entry!(dot vec_dot_grid::<IQ3S>));
        k.set_dot(DType::IQ4_XS, entry!(dot vec_dot_grid::<IQ4XS>));
    }
    k.set_dot(DType::IQ1_S, entry!(dot iquants::vec_dot_iq1s));
    k.set_dot(DType::IQ1_M, entry!(dot iquants::vec_dot_iq1m));
    k.set_dot(DType::IQ4_NL, entry!(dot iquants::vec_dot_iq4nl));
    k.set_dot(DType::TQ1_0, entry!(dot iquants::vec_dot_tq1_0));
    k.set_dot(DType::TQ2_0, entry!(dot iquants::vec_dot_tq2_0));
    k.set_dot(DType::MXFP4, entry!(dot iquants::vec_dot_mxfp4));

    // Activation quantizers (byte-identical to the scalar table's).
    k.set_quant(DType::Q8_0, entry!(quant quantize::quantize_q8_0));
    k.set_quant(DType::Q8_1, entry!(quant quantize::quantize_q8_1));
    k.set_quant(DType::Q8_K, entry!(quant quantize::quantize_q8k));
    k.set_quant(DType::F16, entry!(quant quantize::quantize_f16));
    k.set_quant(DType::BF16, entry!(quant quantize::quantize_bf16));

    // Dot products of llama.cpp's k-quant batch paths.
    k.set_path_dot(
        DotPath::RepackGemv,
        DType::Q4_K,
        entry!(dot paths::gemv_q4k),
    );
    k.set_path_dot(
        DotPath::RepackGemm,
        DType::Q4_K,
        entry!(dot paths::gemm_q4k),
    );
    k.set_path_dot(
        DotPath::RepackGemv,
        DType::IQ4_NL,
        entry!(dot iquants::repack_iq4nl),
    );
    k.set_path_dot(DotPath::Tiled, DType::Q2_K, entry!(dot paths::tiled_q2k));
    k.set_path_dot(DotPath::Tiled, DType::Q3_K, entry!(dot paths::tiled_q3k));
    k.set_path_dot(DotPath::Tiled, DType::Q4_K, entry!(dot paths::tiled_q4k));
    k.set_path_dot(DotPath::Tiled, DType::Q5_K, entry!(dot paths::tiled_q5k));
    k.set_path_dot(DotPath::Tiled, DType::Q6_K, entry!(dot paths::tiled_q6k));

    // Matrix kernels of `vec_dot`.
    k.set_mat(
        DotPath::VecDot,
        DType::F32,
        entry!(mat mat::float::<mat::F32>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::F16,
        entry!(mat mat::float::<mat::F16>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::BF16,
        entry!(mat mat::float::<mat::BF16>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q4_0,
        entry!(mat mat::legacy::<mat::Q4_0>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q4_1,
        entry!(mat mat::legacy::<mat::Q4_1>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q5_0,
        entry!(mat mat::legacy::<mat::Q5_0>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q5_1,
        entry!(mat mat::legacy::<mat::Q5_1>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q8_0,
        entry!(mat mat::legacy::<mat::Q8_0>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q2_K,
        entry!(mat mat::kvec::<mat::V2>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q3_K,
        entry!(mat mat::kvec::<mat::V3>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q4_K,
        entry!(mat mat::kvec::<mat::V4>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q5_K,
        entry!(mat mat::kvec::<mat::V5>),
    );
    k.set_mat(
        DotPath::VecDot,
        DType::Q6_K,
        entry!(mat mat::kvec::<mat::V6>),
    );

    // Matrix kernels of the i-quants.
    {
        use imat::{mat_grid, mat_iq4nl_repack};
        use iquants::{IQ2S, IQ2XS, IQ2XXS, IQ3S, IQ3XXS, IQ4XS};
        let v = DotPath::VecDot;
        k.set_mat(v, DType::IQ2_XXS, entry!(mat mat_grid::<IQ2XXS>));
        k.set_mat(v, DType::IQ2_XS, entry!(mat mat_grid::<IQ2XS>));
        k.set_mat(v, DType::IQ2_S, entry!(mat mat_grid::<IQ2S>));
        k.set_mat(v, DType::IQ3_XXS, entry!(mat mat_grid::<IQ3XXS>));
        k.set_mat(v, DType::IQ3_S, entry!(mat mat_grid::<IQ3S>));
        k.set_mat(v, DType::IQ4_XS, entry!(mat mat_grid::<IQ4XS>));
        k.set_mat(
            DotPath::RepackGemv,
            DType::IQ4_NL,
            entry!(mat mat_iq4nl_repack),
        );
    }

    // Matrix kernels of the batch paths: four rows per step, and from
    // `kprefill::DECODE_MIN_TOKENS` tokens on the decoded prefill (Q4_K, Q5_K, Q6_K).
    use kprefill::{K4, K5, K6};
    use paths::{S2, S3, S4, S5, S6, mat_or_decoded, rows4};
    use {DotPath::RepackGemm, DotPath::RepackGemv, DotPath::Tiled};
    k.set_mat(RepackGemv, DType::Q4_K, entry!(mat rows4::<S4, 0>));
    k.set_mat(
        RepackGemm,
        DType::Q4_K,
        entry!(mat mat_or_decoded::<S4, K4, 1>),
    );
    k.set_mat(Tiled, DType::Q2_K, entry!(mat rows4::<S2, 2>));
    k.set_mat(Tiled, DType::Q3_K, entry!(mat rows4::<S3, 2>));
    k.set_mat(Tiled, DType::Q4_K, entry!(mat mat_or_decoded::<S4, K4, 2>));
    k.set_mat(Tiled, DType::Q5_K, entry!(mat mat_or_decoded::<S5, K5, 2>));
    k.set_mat(Tiled, DType::Q6_K, entry!(mat mat_or_decoded::<S6, K6, 2>));

    // The packed layout of the legacy formats: eight rows interleaved.
    macro_rules! packed {
        ($t:ident) => {
            k.set_packed(
                DType::$t,
                Packing {
                    group: packed::GROUP,
                    pack: packed::pack::<mat::$t>,
                    unpack: packed::unpack::<mat::$t>,
                    mat: entry!(mat packed::mat::<mat::$t>),
                    paths: [None; 4],
                },
            );
        };
    }
    packed!(Q4_0);
    packed!(Q4_1);
    packed!(Q5_0);
    packed!(Q5_1);
    packed!(Q8_0);
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the kernels of both x86 tiers.

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32(b: &[u8; 32]) -> __m256i {
    // SAFETY: 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32i(b: &[i8; 32]) -> __m256i {
    // SAFETY: 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load16(b: &[u8; 16]) -> __m128i {
    // SAFETY: 16 readable bytes; unaligned load.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The `k`-th 32-byte piece of a slice, as an array reference (bounds-checked).
#[inline(always)]
pub(super) fn piece<T>(s: &[T], k: usize) -> &[T; 32] {
    s[32 * k..32 * k + 32].try_into().unwrap()
}

/// The little-endian u16 at `p`, zero-extended.
///
/// # Safety
/// Two bytes at `p` must be readable.
#[inline(always)]
pub(super) unsafe fn rd16(p: *const u8) -> u64 {
    // SAFETY: the caller guarantees two readable bytes.
    unsafe { p.cast::<u16>().read_unaligned() as u64 }
}

/// The little-endian u32 at `p`.
///
/// # Safety
/// Four bytes at `p` must be readable.
#[inline(always)]
pub(super) unsafe fn rd32(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees four readable bytes.
    unsafe { p.cast::<u32>().read_unaligned() }
}

/// The f16 at byte `off` of four blocks as f32 lanes: gathered in a general register, then
/// one vector move and one conversion.
///
/// # Safety
/// Two bytes at `off` of each pointer must be readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16x4(p: &[*const u8; 4], off: usize) -> __m128 {
    // SAFETY: the caller guarantees the fields are readable.
    let v = unsafe {
        rd16(p[0].add(off))
            | rd16(p[1].add(off)) << 16
            | rd16(p[2].add(off)) << 32
            | rd16(p[3].add(off)) << 48
    };
    _mm_cvtph_ps(_mm_cvtsi64_si128(v as i64))
}

// Scales are converted eight blocks at a time ([`scales8`]), never one per block with a
// scalar `vcvtph2ps`: LLVM turns that zero-extending insert into a `vpinsrw` merging into a
// free register, which inside a dot product is the FMA accumulator, chaining every block's
// scale conversion to the previous block's FMA (2x slower).

/// Eight f16 values to f32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16x8(h: [u16; 8]) -> __m256 {
    // Built by inserts rather than a store and reload, which would stall store forwarding.
    let v = _mm_set_epi16(
        h[7] as i16,
        h[6] as i16,
        h[5] as i16,
        h[4] as i16,
        h[3] as i16,
        h[2] as i16,
        h[1] as i16,
        h[0] as i16,
    );
    _mm256_cvtph_ps(v)
}

/// Eight f16 fields of a group of blocks (zero for missing blocks).
#[inline(always)]
pub(super) fn gather_f16<B>(bs: &[B], f: impl Fn(&B) -> [u8; 2]) -> [u16; 8] {
    let mut out = [0u16; 8];
    for (o, b) in out.iter_mut().zip(bs) {
        *o = u16::from_le_bytes(f(b));
    }
    out
}

/// The f16 field `f` of up to eight blocks as f32 (zero past the end), converted together.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn scales8<B>(bs: &[B], f: impl Fn(&B) -> [u8; 2]) -> [f32; 8] {
    lanes_f32(f16x8(gather_f16(bs, f)))
}

/// Stores eight f32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn lanes_f32(v: __m256) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: 8 writable floats; unaligned store.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// 32 nibbles: byte j holds the low nibble of `qs[j]` for j < 16, the high nibble of
/// `qs[j - 16]` for j >= 16 (ggml's legacy element order).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn nibbles(qs: &[u8; 16]) -> __m256i {
    let x = load16(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Byte j = 0xFF when bit j of the little-endian `qh` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bits_to_bytes(qh: [u8; 4]) -> __m256i {
    let v = _mm256_set1_epi32(i32::from_le_bytes(qh));
    // Byte j takes source byte j / 8 ...
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let b = _mm256_shuffle_epi8(v, spread);
    // ... and every bit but j % 8 is forced on, so the byte is all-ones iff that bit is set.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(b, others), _mm256_set1_epi64x(-1))
}

/// Pairwise u8 * i8 products summed into eight i32 lanes (exact while every pair sum fits
/// i16: |u| * 127 * 2 <= 32767, true for u <= 128).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mul_sum_us8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Signed i8 * i8 products summed into eight i32 lanes; `y` must avoid -128.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
    mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Sum of eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Sum of eight f32 lanes in ggml's `hsum_float_8` order:
/// `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}
