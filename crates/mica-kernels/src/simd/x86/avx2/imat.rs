//! AVX2 matrix kernels of the i-quants (see [`crate::simd::mat`]), per output bit-identical
//! to their dot products:
//!
//! - the grid types and IQ4_XS ([`GridChunks`]): each weight block is decoded once into its
//!   eight chunks' magnitudes, signs and scales, then reused for a tile of tokens (the grid
//!   lookups cost more than the products); per output the lanes, the FMA per block and the
//!   horizontal sum of `vec_dot_grid`;
//! - IQ4_NL on llama.cpp's repacked path ([`DotPath::RepackGemv`](crate::simd::DotPath)):
//!   eight rows at once, their block sums reduced into one register (lane r: row r) and
//!   accumulated with one FMA per block, `acc = fma(Σ q·a, d_w·d_x, acc)` lane by lane.

use std::arch::x86_64::*;

use super::iquants::{GridChunks, fma_lanes, nl_values, parts_lanes, table16};
use super::{f16x8, hsum_f32, load32i};
use crate::quant::blocks::{BlockIQ4NL, BlockQ8_0, BlockQ8K, QK, QK_K, blocks, f16_to_f32};
use crate::quant::iq_grids::KVALUES_IQ4NL;
use crate::simd::mat::{ActRows, MatOut, WeightRows};

/// Tokens per tile of the grid kernel (their accumulators, and a decoded block reused by all).
const TOKENS: usize = 16;

/// Every output of `w × x` for a [`GridChunks`] type (`vec_dot`'s arithmetic).
#[target_feature(enable = "avx2,fma")]
pub(super) fn mat_grid<G: GridChunks>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    let zero = _mm256_setzero_si256();
    let (mut g, mut s, mut sc) = ([zero; 8], [zero; 8], [zero; 8]);
    let mut t0 = 0;
    while t0 < x.n {
        let tn = (x.n - t0).min(TOKENS);
        let xs: [&[BlockQ8K]; TOKENS] = std::array::from_fn(|i| blocks(x.row(t0 + i.min(tn - 1))));
        for r in 0..w.rows {
            let row: &[G::B] = blocks(w.row(r));
            debug_assert_eq!(row.len() * QK_K, w.n);
            let mut acc = [_mm256_setzero_ps(); TOKENS];
            for (ib, blk) in row.iter().enumerate() {
                for c in 0..QK_K / 32 {
                    // SAFETY: this function runs with AVX2.
                    (g[c], s[c], sc[c]) = unsafe { G::chunk(blk, c) };
                }
                let dw = f16_to_f32(G::d(blk));
                for (acc, xr) in acc.iter_mut().zip(&xs).take(tn) {
                    let b = &xr[ib];
                    let mut sumi = zero;
                    for c in 0..QK_K / 32 {
                        sumi =
                            _mm256_add_epi32(sumi, parts_lanes(g[c], s[c], sc[c], &b.qs[32 * c..]));
                    }
                    *acc = fma_lanes(*acc, dw * b.d(), sumi);
                }
            }
            for (tt, acc) in acc.iter().enumerate().take(tn) {
                out.set(t0 + tt, r, G::MULT * hsum_f32(*acc));
            }
        }
        t0 += tn;
    }
}

/// Eight i32 lanes each summed, lane r of the result = the sum of `v[r]`'s lanes (exact).
#[inline]
#[target_feature(enable = "avx2")]
fn sums8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h4567 = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    let hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    _mm256_add_epi32(lo, hi)
}

/// IQ4_NL on the repacked path: groups of eight rows in the lanes, one token at a time (the
/// group's rows stay in L1 for the tokens); rows past the last whole group by `dot`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mat_iq4nl_repack(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    let tbl = table16(&KVALUES_IQ4NL);
    let ones = _mm256_set1_epi16(1);
    let nb = w.n / QK;
    let groups = w.rows / 8;
    for gi in 0..groups {
        let rows: [&[BlockIQ4NL]; 8] = std::array::from_fn(|i| blocks(w.row(8 * gi + i)));
        for t in 0..x.n {
            let xr: &[BlockQ8_0] = blocks(x.row(t));
            let mut acc = _mm256_setzero_ps();
            for ib in 0..nb {
                let b = &xr[ib];
                let a = load32i(&b.qs);
                let p: [__m256i; 8] = std::array::from_fn(|i| {
                    let v = nl_values(&rows[i][ib].qs, tbl);
                    let m = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(a, v));
                    _mm256_madd_epi16(m, ones)
                });
                let dw = f16x8(std::array::from_fn(|i| u16::from_le_bytes(rows[i][ib].d)));
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(f16_to_f32(b.d)));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums8(&p)), d, acc);
            }
            let mut v = [0f32; 8];
            // SAFETY: 8 writable floats.
            unsafe { _mm256_storeu_ps(v.as_mut_ptr(), acc) };
            for (i, &v) in v.iter().enumerate() {
                out.set(t, 8 * gi + i, v);
            }
        }
    }
    for r in 8 * groups..w.rows {
        for t in 0..x.n {
            out.set(t, r, super::iquants::repack_iq4nl(w.n, w.row(r), x.row(t)));
        }
    }
}
