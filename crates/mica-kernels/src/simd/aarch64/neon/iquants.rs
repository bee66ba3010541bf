//! NEON dot products of the i-quants, TQ1_0, TQ2_0 and MXFP4, with the float structure of
//! llama.cpp's x86 kernels (see `x86/avx2/iquants.rs` and `tests/iquant_exact.rs`), so they
//! equal the AVX2 and AVX-512 tables bit for bit. Each block is unpacked to integer weight
//! values and group scales by the scalar `quant::iquants::unpack_*`, then multiplied with
//! the activations in the chunk lanes of the parent module.

use super::{Acc, Lanes, chunk_of, pair_lanes, sumi16};
use crate::quant::blocks::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL,
    BlockIQ4XS, BlockMXFP4, BlockQ8_0, BlockQ8K, BlockTQ1_0, BlockTQ2_0, QK, QK_K, blocks,
    e8m0_to_f32_half, f16_to_f32,
};
use crate::quant::iq_grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::quant::iquants::{
    Unpacked, iq1m_scale, unpack_iq1m, unpack_iq1s, unpack_iq2s, unpack_iq2xs, unpack_iq2xxs,
    unpack_iq3s, unpack_iq3xxs, unpack_iq4xs, unpack_nl, unpack_tq1_0, unpack_tq2_0,
};
use std::arch::aarch64::*;

/// The lanes of one unpacked super-block: `Σ sc·q·a` per lane.
#[inline]
#[target_feature(enable = "neon")]
fn block_lanes(u: &Unpacked, a: &[i8; QK_K]) -> Lanes {
    sumi16(&u.q, a, |g| u.sc[g])
}

#[inline]
#[target_feature(enable = "neon")]
fn grid_dot<B>(
    n: usize,
    w: &[u8],
    x: &[u8],
    d: impl Fn(&B) -> [u8; 2],
    unpack: impl Fn(&B) -> Unpacked,
    mult: f32,
) -> f32
where
    B: crate::quant::Block,
{
    let (w, x): (&[B], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = Acc::zero();
    for (a, b) in w.iter().zip(x) {
        acc = acc.fma(f16_to_f32(d(a)) * b.d(), block_lanes(&unpack(a), &b.qs));
    }
    mult * acc.hsum()
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq2xxs(n: usize, w: &[u8], x: &[u8]) -> f32 {
    grid_dot(n, w, x, |a: &BlockIQ2XXS| a.d, unpack_iq2xxs, 0.125)
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq2xs(n: usize, w: &[u8], x: &[u8]) -> f32 {
    grid_dot(n, w, x, |a: &BlockIQ2XS| a.d, unpack_iq2xs, 0.125)
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq2s(n: usize, w: &[u8], x: &[u8]) -> f32 {
    grid_dot(n, w, x, |a: &BlockIQ2S| a.d, unpack_iq2s, 0.125)
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq3xxs(n: usize, w: &[u8], x: &[u8]) -> f32 {
    grid_dot(n, w, x, |a: &BlockIQ3XXS| a.d, unpack_iq3xxs, 0.25)
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq3s(n: usize, w: &[u8], x: &[u8]) -> f32 {
    grid_dot(n, w, x, |a: &BlockIQ3S| a.d, unpack_iq3s, 1.0)
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq4xs(n: usize, w: &[u8], x: &[u8]) -> f32 {
    grid_dot(n, w, x, |a: &BlockIQ4XS| a.d, unpack_iq4xs, 1.0)
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq1s(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockIQ1S], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = Acc::zero();
    let mut accum1 = 0.0f32;
    for (a, b) in w.iter().zip(x) {
        let (u, delta) = unpack_iq1s(a);
        let d = b.d() * f16_to_f32(a.d);
        acc = acc.fma(d, block_lanes(&u, &b.qs));
        let sumi1: i32 = (0..8)
            .map(|ib| {
                let bs = b.bsum(2 * ib) as i32 + b.bsum(2 * ib + 1) as i32;
                bs * delta[ib] * u.sc[2 * ib]
            })
            .sum();
        accum1 = d.mul_add(sumi1 as f32, accum1);
    }
    acc.hsum() + 0.125 * accum1
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq1m(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x): (&[BlockIQ1M], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let (mut acc1, mut acc2) = (Acc::zero(), Acc::zero());
    for (a, b) in w.iter().zip(x) {
        let (u, delta) = unpack_iq1m(a);
        let d = b.d() * iq1m_scale(a);
        let signs: [i8; QK_K] = std::array::from_fn(|e| delta[e / 8] as i8);
        acc1 = acc1.fma(d, block_lanes(&u, &b.qs));
        acc2 = acc2.fma(d, sumi16(&signs, &b.qs, |g| u.sc[g]));
    }
    acc1.hsum() + 0.125 * acc2.hsum()
}

/// The ternary formats: digit lanes minus the paired group sums, `acc = fma(lanes, d, acc)`.
#[inline]
#[target_feature(enable = "neon")]
fn ternary_dot<B: crate::quant::Block>(
    n: usize,
    w: &[u8],
    x: &[u8],
    f: impl Fn(&B) -> ([i8; QK_K], [u8; 2]),
) -> f32 {
    let (w, x): (&[B], &[BlockQ8K]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK_K == n);
    let mut acc = Acc::zero();
    for (a, b) in w.iter().zip(x) {
        let (t, dw) = f(a);
        let lanes = sumi16(&t, &b.qs, |_| 1).sub(pair_lanes(|g| b.bsum(g) as i32));
        acc = acc.fma(b.d() * f16_to_f32(dw), lanes);
    }
    acc.hsum()
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_tq1_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    ternary_dot(n, w, x, |a: &BlockTQ1_0| (unpack_tq1_0(a), a.d))
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_tq2_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    ternary_dot(n, w, x, |a: &BlockTQ2_0| (unpack_tq2_0(a), a.d))
}

/// IQ4_NL and MXFP4: blocks in pairs into two accumulators, an odd last block in scalar.
#[inline]
#[target_feature(enable = "neon")]
fn nl_dot<B: crate::quant::Block>(
    n: usize,
    w: &[u8],
    x: &[u8],
    table: &[i8; 16],
    qs: impl Fn(&B) -> &[u8; QK / 2],
    d: impl Fn(&B) -> f32,
) -> f32 {
    let (w, x): (&[B], &[BlockQ8_0]) = (blocks(w), blocks(x));
    debug_assert!(w.len() == x.len() && w.len() * QK == n);
    let (mut acc1, mut acc2) = (Acc::zero(), Acc::zero());
    for (a, b) in w.chunks_exact(2).zip(x.chunks_exact(2)) {
        let l0 = chunk_of(&unpack_nl(qs(&a[0]), table), &b[0].qs);
        let l1 = chunk_of(&unpack_nl(qs(&a[1]), table), &b[1].qs);
        acc1 = acc1.fma(f16_to_f32(b[0].d) * d(&a[0]), l0);
        acc2 = acc2.fma(f16_to_f32(b[1].d) * d(&a[1]), l1);
    }
    let both = Acc(vaddq_f32(acc1.0, acc2.0), vaddq_f32(acc1.1, acc2.1));
    let mut sum = both.hsum();
    if w.len() % 2 == 1 {
        let (a, b) = (&w[w.len() - 1], &x[w.len() - 1]);
        let q = unpack_nl(qs(a), table);
        let s: i32 = q
            .iter()
            .zip(&b.qs)
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        sum = (f16_to_f32(b.d) * d(a)).mul_add(s as f32, sum);
    }
    sum
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_iq4nl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    nl_dot(
        n,
        w,
        x,
        &KVALUES_IQ4NL,
        |a: &BlockIQ4NL| &a.qs,
        |a| f16_to_f32(a.d),
    )
}

#[target_feature(enable = "neon")]
pub(super) fn vec_dot_mxfp4(n: usize, w: &[u8], x: &[u8]) -> f32 {
    nl_dot(
        n,
        w,
        x,
        &KVALUES_MXFP4,
        |a: &BlockMXFP4| &a.qs,
        |a| e8m0_to_f32_half(a.e),
    )
}
