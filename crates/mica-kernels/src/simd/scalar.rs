//! The scalar tier: the table every machine has and every other tier starts from. Its dot
//! products are ggml's generic reference ones ([`quant::vec_dot_ref`]); its activation
//! quantizers are llama.cpp's x86 run-time Q8_0/Q8_1 ([`quant::legacy::quantize_q8_0_act`])
//! and the reference conversions for every other type, byte-identical to the SIMD tiers'; its
//! batch-path dot products ([`DotPath`]) take their integer sums from unpacked quants and
//! `paths.rs`' float steps, bit-identical to the SIMD tiers'. It has no matrix kernels: its
//! products run one dot per output ([`super::mat::by_dots`]).

use super::paths::{KSums, min_parts, per_block_dot, repack_fns, tiled_fn};
use super::{DotPath, Kernels, QuantizeFn, VecDotFn};
use crate::DType;
use crate::quant;
use crate::quant::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, blocks_mut, f16_to_f32,
    q3k_scales,
};
use crate::quant::kquants::{
    scales_mins_k4, unpack_q2k, unpack_q3k, unpack_q4k, unpack_q5k, unpack_q6k,
};

macro_rules! scalar_dot {
    ($t:ident) => {
        |n, w, x| quant::vec_dot_ref(DType::$t, n, w, x)
    };
}
macro_rules! scalar_quant {
    ($t:ident) => {
        |src, dst| quant::quantize_row(DType::$t, src, dst)
    };
}

/// Puts every kernel of the scalar tier into `k` (an empty table).
pub(super) fn install(k: &mut Kernels) {
    let dots: [(DType, VecDotFn); 25] = [
        (DType::F32, scalar_dot!(F32)),
        (DType::F16, scalar_dot!(F16)),
        (DType::BF16, scalar_dot!(BF16)),
        (DType::Q4_0, scalar_dot!(Q4_0)),
        (DType::Q4_1, scalar_dot!(Q4_1)),
        (DType::Q5_0, scalar_dot!(Q5_0)),
        (DType::Q5_1, scalar_dot!(Q5_1)),
        (DType::Q8_0, scalar_dot!(Q8_0)),
        (DType::Q2_K, scalar_dot!(Q2_K)),
        (DType::Q3_K, scalar_dot!(Q3_K)),
        (DType::Q4_K, scalar_dot!(Q4_K)),
        (DType::Q5_K, scalar_dot!(Q5_K)),
        (DType::Q6_K, scalar_dot!(Q6_K)),
        (DType::IQ2_XXS, scalar_dot!(IQ2_XXS)),
        (DType::IQ2_XS, scalar_dot!(IQ2_XS)),
        (DType::IQ2_S, scalar_dot!(IQ2_S)),
        (DType::IQ3_XXS, scalar_dot!(IQ3_XXS)),
        (DType::IQ3_S, scalar_dot!(IQ3_S)),
        (DType::IQ1_S, scalar_dot!(IQ1_S)),
        (DType::IQ1_M, scalar_dot!(IQ1_M)),
        (DType::IQ4_NL, scalar_dot!(IQ4_NL)),
        (DType::IQ4_XS, scalar_dot!(IQ4_XS)),
        (DType::TQ1_0, scalar_dot!(TQ1_0)),
        (DType::TQ2_0, scalar_dot!(TQ2_0)),
        (DType::MXFP4, scalar_dot!(MXFP4)),
    ];
    for (t, f) in dots {
        k.set_dot(t, f);
    }

    let quants: [(DType, QuantizeFn); 20] = [
        (DType::F32, scalar_quant!(F32)),
        (DType::F16, scalar_quant!(F16)),
        (DType::BF16, scalar_quant!(BF16)),
        (DType::Q4_0, scalar_quant!(Q4_0)),
        (DType::Q4_1, scalar_quant!(Q4_1)),
        (DType::Q5_0, scalar_quant!(Q5_0)),
        (DType::Q5_1, scalar_quant!(Q5_1)),
        (DType::Q8_0, |src, dst| {
            quant::legacy::quantize_q8_0_act(src, blocks_mut(dst))
        }),
        (DType::Q8_1, |src, dst| {
            quant::legacy::quantize_q8_1_act(src, blocks_mut(dst))
        }),
        (DType::Q2_K, scalar_quant!(Q2_K)),
        (DType::Q3_K, scalar_quant!(Q3_K)),
        (DType::Q4_K, scalar_quant!(Q4_K)),
        (DType::Q5_K, scalar_quant!(Q5_K)),
        (DType::Q6_K, scalar_quant!(Q6_K)),
        (DType::Q8_K, scalar_quant!(Q8_K)),
        (DType::IQ4_NL, scalar_quant!(IQ4_NL)),
        (DType::IQ4_XS, scalar_quant!(IQ4_XS)),
        (DType::TQ1_0, scalar_quant!(TQ1_0)),
        (DType::TQ2_0, scalar_quant!(TQ2_0)),
        (DType::MXFP4, scalar_quant!(MXFP4)),
    ];
    for (t, f) in quants {
        k.set_quant(t, f);
    }

    k.set_path_dot(DotPath::RepackGemv, DType::Q4_K, gemv_q4k);
    k.set_path_dot(DotPath::RepackGemv, DType::IQ4_NL, |_, w, x| {
        quant::iquants::dot_iq4nl_repacked(quant::blocks::blocks(w), quant::blocks::blocks(x))
    });
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
    let per_block: [(DType, VecDotFn); 5] = [
        (DType::Q4_0, |n, w, x| per_block_dot(DType::Q4_0, n, w, x)),
        (DType::Q4_1, |n, w, x| per_block_dot(DType::Q4_1, n, w, x)),
        (DType::Q5_0, |n, w, x| per_block_dot(DType::Q5_0, n, w, x)),
        (DType::Q5_1, |n, w, x| per_block_dot(DType::Q5_1, n, w, x)),
        (DType::Q8_0, |n, w, x| per_block_dot(DType::Q8_0, n, w, x)),
    ];
    for (t, f) in per_block {
        k.set_path_dot(DotPath::PerBlock, t, f);
    }
}

// ---------------------------------------------------------------------------------------------
// The batch paths' integer sums, from unpacked quants.

/// `Σ scale(e)·q[e]·a[e]` per 64 elements.
fn parts(q: &[i8; QK_K], a: &[i8; QK_K], scale: impl Fn(usize) -> i32) -> [i32; 4] {
    let mut out = [0i32; 4];
    for (e, (&q, &a)) in q.iter().zip(a).enumerate() {
        out[e / 64] += scale(e) * q as i32 * a as i32;
    }
    out
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
