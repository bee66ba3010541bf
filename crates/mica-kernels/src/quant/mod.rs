//! Block formats: their byte layouts, exact dequantization, reference quantizers and scalar
//! reference dot products, all following llama.cpp's ggml (`ggml-common.h` for layouts,
//! `ggml-quants.c` for `dequantize_row_*` and `quantize_row_*_ref`, and
//! `ggml-cpu/quants.c` for the generic `ggml_vec_dot_*` kernels).
//!
//! "Exact" is meant literally: the float operations happen in the order ggml writes them,
//! so dequantized values are bit-identical to llama.cpp's, and activation quantizers write
//! the same bytes llama.cpp writes before each quantized dot product (Q8_0/Q8_1 through the
//! run-time quantizers `legacy::quantize_q8_*_act`, which follow the x86 code rather than
//! the `_ref` ones). The SIMD kernels in [`crate::simd`] are tested against the functions
//! here.
//!
//! Entry points take a [`DType`] and raw little-endian bytes (for instance a row of an
//! mmapped GGUF tensor); typed access is available through [`cast_blocks`].
//!
//! | module | formats |
//! |---|---|
//! | `floats` | F32, F16, BF16 |
//! | `legacy` | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 |
//! | `kquants` | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K (dequant, Q8_K quantizer, dots) |
//! | `kquants_quantize` | reference quantizers for Q2_K ... Q6_K |
//! | `weighted` | quantizers weighted by an importance matrix (Q4_0 ... Q6_K) |
//! | `iquants` | IQ1_S ... IQ4_XS, TQ1_0, TQ2_0, MXFP4 (dequant, unpacking, dots) |
//! | `iquants_quantize` | quantizers for IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4 |
//! | `iq2_quantize` | IQ2_XS's quantizer (needs an importance matrix) and its neighbour tables |
//! | `iq_grids` | the grids and value tables of the i-quants and MXFP4 (ggml's data) |

pub mod blocks;
pub mod floats;
pub mod iq2_quantize;
pub mod iq_grids;
pub mod iquants;
pub mod iquants_quantize;
pub mod kquants;
pub mod kquants_quantize;
pub mod legacy;
pub mod weighted;

pub use blocks::{
    Block, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS,
    BlockIQ4NL, BlockIQ4XS, BlockLenError, BlockMXFP4, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1,
    BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8_1, BlockQ8K, BlockTQ1_0,
    BlockTQ2_0, QK, QK_K, cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16,
};

use crate::DType;
use blocks::{blocks, blocks_mut};

/// Checks (in debug builds) that `bytes` holds exactly `n` elements of `t`.
#[inline(always)]
fn debug_check(t: DType, n: usize, bytes: usize) {
    debug_assert_eq!(
        t.row_bytes(n),
        Some(bytes),
        "{t}: {n} elements need a whole number of blocks and {bytes} bytes"
    );
}

/// Dequantizes one row of `t` (`src`, whole blocks) into `dst` (one f32 per element),
/// producing exactly the values llama.cpp's `dequantize_row_*` produce.
///
/// Panics when `src` is not a whole number of blocks or `dst` has the wrong length.
pub fn dequantize_row(t: DType, src: &[u8], dst: &mut [f32]) {
    assert_eq!(
        t.row_bytes(dst.len()),
        Some(src.len()),
        "dequantize_row {t}: {} bytes for {} elements",
        src.len(),
        dst.len()
    );
    match t {
        DType::F32 => floats::dequantize_f32(src, dst),
        DType::F16 => floats::dequantize_f16(src, dst),
        DType::BF16 => floats::dequantize_bf16(src, dst),
        DType::Q4_0 => legacy::dequantize_q4_0(blocks(src), dst),
        DType::Q4_1 => legacy::dequantize_q4_1(blocks(src), dst),
        DType::Q5_0 => legacy::dequantize_q5_0(blocks(src), dst),
        DType::Q5_1 => legacy::dequantize_q5_1(blocks(src), dst),
        DType::Q8_0 => legacy::dequantize_q8_0(blocks(src), dst),
        DType::Q8_1 => legacy::dequantize_q8_1(blocks(src), dst),
        DType::Q2_K => kquants::dequantize_q2k(blocks(src), dst),
        DType::Q3_K => kquants::dequantize_q3k(blocks(src), dst),
        DType::Q4_K => kquants::dequantize_q4k(blocks(src), dst),
        DType::Q5_K => kquants::dequantize_q5k(blocks(src), dst),
        DType::Q6_K => kquants::dequantize_q6k(blocks(src), dst),
        DType::Q8_K => kquants::dequantize_q8k(blocks(src), dst),
        DType::IQ2_XXS => iquants::dequantize_iq2xxs(blocks(src), dst),
        DType::IQ2_XS => iquants::dequantize_iq2xs(blocks(src), dst),
        DType::IQ2_S => iquants::dequantize_iq2s(blocks(src), dst),
        DType::IQ3_XXS => iquants::dequantize_iq3xxs(blocks(src), dst),
        DType::IQ3_S => iquants::dequantize_iq3s(blocks(src), dst),
        DType::IQ1_S => iquants::dequantize_iq1s(blocks(src), dst),
        DType::IQ1_M => iquants::dequantize_iq1m(blocks(src), dst),
        DType::IQ4_NL => iquants::dequantize_iq4nl(blocks(src), dst),
        DType::IQ4_XS => iquants::dequantize_iq4xs(blocks(src), dst),
        DType::TQ1_0 => iquants::dequantize_tq1_0(blocks(src), dst),
        DType::TQ2_0 => iquants::dequantize_tq2_0(blocks(src), dst),
        DType::MXFP4 => iquants::dequantize_mxfp4(blocks(src), dst),
    }
}

/// Whether [`quantize_row`] can write `t`: every type but the grid i-quants (IQ1_S, IQ1_M,
/// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S). IQ2_XS is written only with an importance matrix
/// ([`weighted::quantize_row_weighted`], as llama.cpp requires one); the others are read and
/// computed with only.
pub fn can_quantize(t: DType) -> bool {
    !matches!(
        t,
        DType::IQ1_S
            | DType::IQ1_M
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ2_S
            | DType::IQ3_XXS
            | DType::IQ3_S
    )
}

/// Quantizes `src` (a whole number of blocks) into `dst` with llama.cpp's reference
/// quantizer for `t` (`quantize_row_*_ref`; for Q8_K the one ggml uses for activations;
/// for IQ4_NL and IQ4_XS `quantize_iq4_*` without an importance matrix). Every type
/// [`can_quantize`] accepts is supported, weight and activation formats alike. This is the quantizer for
/// files (it matches gguf-py); activations at run time go through
/// [`crate::simd::Kernels::quantize_act`], whose Q8_0/Q8_1 follow llama.cpp's x86 SIMD
/// quantizer instead ([`legacy::quantize_q8_0_act`]: ties to even, `127 / amax`).
///
/// Panics when the lengths do not match or `t` has no quantizer ([`can_quantize`]).
pub fn quantize_row(t: DType, src: &[f32], dst: &mut [u8]) {
    assert_eq!(
        t.row_bytes(src.len()),
        Some(dst.len()),
        "quantize_row {t}: {} elements into {} bytes",
        src.len(),
        dst.len()
    );
    match t {
        DType::F32 => floats::quantize_f32(src, dst),
        DType::F16 => floats::quantize_f16(src, dst),
        DType::BF16 => floats::quantize_bf16(src, dst),
        DType::Q4_0 => legacy::quantize_q4_0(src, blocks_mut(dst)),
        DType::Q4_1 => legacy::quantize_q4_1(src, blocks_mut(dst)),
        DType::Q5_0 => legacy::quantize_q5_0(src, blocks_mut(dst)),
        DType::Q5_1 => legacy::quantize_q5_1(src, blocks_mut(dst)),
        DType::Q8_0 => legacy::quantize_q8_0(src, blocks_mut(dst)),
        DType::Q8_1 => legacy::quantize_q8_1(src, blocks_mut(dst)),
        DType::Q2_K => kquants_quantize::quantize_q2k(src, blocks_mut(dst)),
        DType::Q3_K => kquants_quantize::quantize_q3k(src, blocks_mut(dst)),
        DType::Q4_K => kquants_quantize::quantize_q4k(src, blocks_mut(dst)),
        DType::Q5_K => kquants_quantize::quantize_q5k(src, blocks_mut(dst)),
        DType::Q6_K => kquants_quantize::quantize_q6k(src, blocks_mut(dst)),
        DType::Q8_K => kquants::quantize_q8k(src, blocks_mut(dst)),
        DType::IQ1_S
        | DType::IQ1_M
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S => panic!("quantize_row: mica has no quantizer for {t}"),
        DType::IQ4_NL => iquants_quantize::quantize_iq4nl(src, None, blocks_mut(dst)),
        DType::IQ4_XS => iquants_quantize::quantize_iq4xs(src, None, blocks_mut(dst)),
        DType::TQ1_0 => iquants_quantize::quantize_tq1_0(src, blocks_mut(dst)),
        DType::TQ2_0 => iquants_quantize::quantize_tq2_0(src, blocks_mut(dst)),
        DType::MXFP4 => iquants_quantize::quantize_mxfp4(src, blocks_mut(dst)),
    }
}

/// Scalar reference dot product of `n` elements: `w` is a row of weight type `t`, `x` the
/// activations already quantized to `t.vec_dot_type()`. Computes what ggml's generic
/// `ggml_vec_dot_<t>_<vec_dot_type>` computes (exact integer sums per block, then scaled and
/// accumulated in f32 in ggml's order). F32, F16 and BF16 accumulate f32 products in f32.
///
/// Panics for the activation-only formats Q8_1 and Q8_K (they are never weights) and, in
/// debug builds, on length mismatches.
pub fn vec_dot_ref(t: DType, n: usize, w: &[u8], x: &[u8]) -> f32 {
    debug_check(t, n, w.len());
    debug_check(t.vec_dot_type(), n, x.len());
    match t {
        DType::F32 => floats::vec_dot_f32(w, x),
        DType::F16 => floats::vec_dot_f16(w, x),
        DType::BF16 => floats::vec_dot_bf16(w, x),
        DType::Q4_0 => legacy::vec_dot_q4_0_q8_0(blocks(w), blocks(x)),
        DType::Q4_1 => legacy::vec_dot_q4_1_q8_1(blocks(w), blocks(x)),
        DType::Q5_0 => legacy::vec_dot_q5_0_q8_0(blocks(w), blocks(x)),
        DType::Q5_1 => legacy::vec_dot_q5_1_q8_1(blocks(w), blocks(x)),
        DType::Q8_0 => legacy::vec_dot_q8_0_q8_0(blocks(w), blocks(x)),
        DType::Q2_K => kquants::vec_dot_q2k_q8k(blocks(w), blocks(x)),
        DType::Q3_K => kquants::vec_dot_q3k_q8k(blocks(w), blocks(x)),
        DType::Q4_K => kquants::vec_dot_q4k_q8k(blocks(w), blocks(x)),
        DType::Q5_K => kquants::vec_dot_q5k_q8k(blocks(w), blocks(x)),
        DType::Q6_K => kquants::vec_dot_q6k_q8k(blocks(w), blocks(x)),
        DType::IQ2_XXS => iquants::vec_dot_iq2xxs_q8k(blocks(w), blocks(x)),
        DType::IQ2_XS => iquants::vec_dot_iq2xs_q8k(blocks(w), blocks(x)),
        DType::IQ2_S => iquants::vec_dot_iq2s_q8k(blocks(w), blocks(x)),
        DType::IQ3_XXS => iquants::vec_dot_iq3xxs_q8k(blocks(w), blocks(x)),
        DType::IQ3_S => iquants::vec_dot_iq3s_q8k(blocks(w), blocks(x)),
        DType::IQ1_S => iquants::vec_dot_iq1s_q8k(blocks(w), blocks(x)),
        DType::IQ1_M => iquants::vec_dot_iq1m_q8k(blocks(w), blocks(x)),
        DType::IQ4_NL => iquants::vec_dot_iq4nl_q8_0(blocks(w), blocks(x)),
        DType::IQ4_XS => iquants::vec_dot_iq4xs_q8k(blocks(w), blocks(x)),
        DType::TQ1_0 => iquants::vec_dot_tq1_0_q8k(blocks(w), blocks(x)),
        DType::TQ2_0 => iquants::vec_dot_tq2_0_q8k(blocks(w), blocks(x)),
        DType::MXFP4 => iquants::vec_dot_mxfp4_q8_0(blocks(w), blocks(x)),
        DType::Q8_1 | DType::Q8_K => {
            panic!("vec_dot_ref: {t} is an activation format, not a weight type")
        }
    }
}
