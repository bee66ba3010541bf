//! The AVX-512 tier (AVX-512 F, BW, VL and VNNI, with the AVX2 set): a copy of the AVX2 table
//! with its hottest kernels replaced. [`install`] lists every kernel it overrides; every other
//! slot keeps the AVX2 tier's kernel. The modules:
//!
//! - `dot.rs`: dot products of the legacy formats (one `vpdpbusd` per block) and of Q4_K and
//!   Q6_K (64 elements per register);
//! - `iquants.rs`: dot products of the grid i-quants and IQ4_XS (two chunks per register),
//!   IQ4_NL and MXFP4 (two blocks per register);
//! - `mat.rs`: matrix kernels of the legacy formats, four rows × up to four tokens, on the
//!   file's rows or the packed layout;
//! - `packed.rs`: that packed layout (four rows interleaved block by block);
//! - `lblock.rs`: the legacy formats' prompt kernel on mica's `DotPath::PerBlock` (sixteen
//!   rows in the lanes, one FMA per block), on the file's rows or the packed layout;
//! - `kunpack.rs`: k-quant super-blocks unpacked into 512-bit registers;
//! - `kpacked.rs`: the packed layout of Q4_K (sixteen rows interleaved super-block by
//!   super-block), read by `kmat.rs`' kernels on every path;
//! - `kmat.rs`: matrix kernels of the k-quants on every llama.cpp path (`vec_dot`, the
//!   repacked Q4_K gemv/gemm, the tiled path), 16 outputs per micro-kernel on the batch
//!   paths.
//!
//! Every result is bit-identical to the AVX2 tier's (integer sums are exact however they are
//! formed, the float steps are the same); `tests/mat_kernels.rs` and `tests/quant_simd.rs`
//! check it. The shared helpers below are the 512-bit ones; the AVX2 tier's serve too.

mod dot;
mod iquants;
mod kgemm;
mod kmat;
mod kpacked;
mod kunpack;
mod lblock;
mod mat;
mod packed;

use std::arch::x86_64::*;

use super::avx2::entry;
use crate::DType;
use crate::simd::{DotPath, Kernels, Packing};

/// True when this CPU has AVX-512 F/BW/VL and VNNI (the AVX2 set is checked separately).
pub(in crate::simd) fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Puts every kernel of the AVX-512 tier into `k` (a copy of the AVX2 table).
pub(in crate::simd) fn install(k: &mut Kernels) {
    // Dot products (`vec_dot`).
    k.set_dot(DType::Q4_0, entry!(dot dot::vec_dot_q4_0));
    k.set_dot(DType::Q4_1, entry!(dot dot::vec_dot_q4_1));
    k.set_dot(DType::Q5_0, entry!(dot dot::vec_dot_q5_0));
    k.set_dot(DType::Q5_1, entry!(dot dot::vec_dot_q5_1));
    k.set_dot(DType::Q8_0, entry!(dot dot::vec_dot_q8_0));
    k.set_dot(DType::Q4_K, entry!(dot dot::vec_dot_q4k));
    k.set_dot(DType::Q6_K, entry!(dot dot::vec_dot_q6k));
    {
        use crate::simd::x86::avx2::{IQ2S, IQ2XS, IQ2XXS, IQ3S, IQ3XXS, IQ4XS};
        use iquants::vec_dot_grid;
        k.set_dot(DType::IQ2_XXS, entry!(dot vec_dot_grid::<IQ2XXS>));
        k.set_dot(DType::IQ2_XS, entry!(dot vec_dot_grid::<IQ2XS>));
        k.set_dot(DType::IQ2_S, entry!(dot vec_dot_grid::<IQ2S>));
        k.set_dot(DType::IQ3_XXS, entry!(dot vec_dot_grid::<IQ3XXS>));
        k.set_dot(DType::IQ3_S, entry!(dot vec_dot_grid::<IQ3S>));
        k.set_dot(DType::IQ4_XS, entry!(dot vec_dot_grid::<IQ4XS>));
        k.set_dot(DType::IQ4_NL, entry!(dot iquants::vec_dot_iq4nl));
        k.set_dot(DType::MXFP4, entry!(dot iquants::vec_dot_mxfp4));
    }

    // Legacy formats: the matrix kernel of `vec_dot`, and the packed layout of four rows with
    // the same kernel reading it.
    macro_rules! legacy {
        ($t:ident) => {
            k.set_mat(DotPath::VecDot, DType::$t, entry!(mat mat::legacy::<mat::$t, false>));
            k.set_mat(
                DotPath::PerBlock,
                DType::$t,
                entry!(mat lblock::per_block::<mat::$t, false>),
            );
            k.set_packed(
                DType::$t,
                Packing {
                    group: 4,
                    pack: packed::pack::<mat::$t>,
                    unpack: packed::unpack::<mat::$t>,
                    mat: entry!(mat mat::legacy::<mat::$t, true>),
                    paths: [
                        None,
                        None,
                        None,
                        Some(entry!(mat lblock::per_block::<mat::$t, true>)),
                    ],
                },
            );
        };
    }
    legacy!(Q4_0);
    legacy!(Q4_1);
    legacy!(Q5_0);
    legacy!(Q5_1);
    legacy!(Q8_0);

    // k-quant matrix kernels: `vec_dot` (not Q3_K) and every batch path.
    use kmat::{Gemm, Gemv, Tiled, batch, vec_dot};
    use kunpack::{KFormat, Q2K, Q3K, Q4K, Q5K, Q6K};
    k.set_mat(DotPath::VecDot, DType::Q2_K, entry!(mat vec_dot::<Q2K>));
    k.set_mat(DotPath::VecDot, DType::Q4_K, entry!(mat vec_dot::<Q4K>));
    k.set_mat(DotPath::VecDot, DType::Q5_K, entry!(mat vec_dot::<Q5K>));
    k.set_mat(DotPath::VecDot, DType::Q6_K, entry!(mat vec_dot::<Q6K>));
    k.set_mat(
        DotPath::RepackGemv,
        DType::Q4_K,
        entry!(mat batch::<Q4K, Gemv>),
    );
    k.set_mat(
        DotPath::RepackGemm,
        DType::Q4_K,
        entry!(mat batch::<Q4K, Gemm>),
    );
    k.set_mat(DotPath::Tiled, DType::Q2_K, entry!(mat batch::<Q2K, Tiled>));
    k.set_mat(DotPath::Tiled, DType::Q3_K, entry!(mat batch::<Q3K, Tiled>));
    k.set_mat(DotPath::Tiled, DType::Q4_K, entry!(mat batch::<Q4K, Tiled>));
    k.set_mat(DotPath::Tiled, DType::Q5_K, entry!(mat batch::<Q5K, Tiled>));
    k.set_mat(DotPath::Tiled, DType::Q6_K, entry!(mat batch::<Q6K, Tiled>));

    // Q4_K's packed layout: the same kernels, reading one stream of sixteen rows.
    k.set_packed(
        DType::Q4_K,
        Packing {
            group: kpacked::GROUP,
            pack: kpacked::pack::<{ Q4K::BYTES }>,
            unpack: kpacked::unpack::<{ Q4K::BYTES }>,
            mat: entry!(mat vec_dot::<Q4K>),
            paths: [
                Some(entry!(mat batch::<Q4K, Gemv>)),
                Some(entry!(mat batch::<Q4K, Gemm>)),
                Some(entry!(mat batch::<Q4K, Tiled>)),
                None,
            ],
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the kernels of this tier.

/// `[v | v]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn twice(v: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1)
}

/// i16 lanes: `lo` in the first 256 bits (the first 32 elements of a 64-element register, or
/// a per-half shift count), `hi` in the rest.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn halves16(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi), 1)
}

/// 16 → 8 lanes, lane i + lane i + 8: the eight `sumi` lanes of llama.cpp's AVX2 kernel from
/// 16 lanes over two chunks.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}
