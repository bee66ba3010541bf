//! The AVX-512 tier's packed layout of the legacy formats: four rows interleaved block by
//! block, so that one load gives the quants of four rows and one conversion their scales
//! (llama.cpp repacks Q4_0 into a similar `block_q4_0x8`; the AVX2 tier has its own,
//! `x86/avx2/packed.rs`). `mat.rs`' kernel reads it (`PACKED`) exactly as it reads the file's
//! rows, so products are bit-identical either way.
//!
//! Per group of four rows and block: the quants of the four rows (16 bytes each, Q8_0: 32),
//! then the four f16 `d`, the four f16 `m` (Q4_1, Q5_1), and the fifth bits as the two 64-bit
//! masks `mat.rs`' `fifth_bits` builds (Q5_0, Q5_1): exactly four blocks' bytes.

use std::arch::x86_64::*;

use super::mat::{Legacy, nibbles4};
use crate::quant::blocks::QK;

/// Bytes of the four rows' quants in a packed group block.
const fn packed_qs<F: Legacy>() -> usize {
    if F::WIDE { 128 } else { 64 }
}

#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
pub(super) unsafe fn packed_quants<F: Legacy>(p: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller passes a packed group block.
    unsafe {
        if F::WIDE {
            let flip = _mm512_set1_epi8(-128);
            (
                _mm512_xor_si512(_mm512_loadu_si512(p.cast()), flip),
                _mm512_xor_si512(_mm512_loadu_si512(p.add(64).cast()), flip),
            )
        } else {
            let (lo, hi) = nibbles4(_mm512_loadu_si512(p.cast()));
            if F::QH.is_some() {
                let k = p.add(packed_qs::<F>() + if F::MIN { 16 } else { 8 });
                let (k_lo, k_hi) = (
                    k.cast::<u64>().read_unaligned(),
                    k.add(8).cast::<u64>().read_unaligned(),
                );
                let sixteen = _mm512_set1_epi8(16);
                (
                    _mm512_mask_add_epi8(lo, k_lo, lo, sixteen),
                    _mm512_mask_add_epi8(hi, k_hi, hi, sixteen),
                )
            } else {
                (lo, hi)
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn packed_scales<F: Legacy>(p: *const u8) -> (__m128, __m128) {
    let q = packed_qs::<F>();
    // SAFETY: the caller passes a packed group block.
    unsafe {
        let d = _mm_cvtph_ps(_mm_loadl_epi64(p.add(q).cast()));
        let m = if F::MIN {
            _mm_cvtph_ps(_mm_loadl_epi64(p.add(q + 8).cast()))
        } else {
            _mm_setzero_ps()
        };
        (d, m)
    }
}

/// Packs `rows` rows of `n` elements (`data`, the file's layout) into groups of four (the
/// last group repeats the last row); each group takes `n / 32 * 4 * BYTES` bytes.
pub(super) fn pack<F: Legacy>(n: usize, rows: usize, data: &[u8]) -> Vec<u8> {
    let nb = n / QK;
    let rb = nb * F::BYTES;
    assert!(nb * QK == n && rows > 0 && data.len() >= rows * rb);
    let gb = 4 * F::BYTES;
    let qs_len = if F::WIDE { 32 } else { 16 };
    let q = packed_qs::<F>();
    let mut out = vec![0u8; rows.div_ceil(4) * nb * gb];
    for (g, group) in out.chunks_exact_mut(nb * gb).enumerate() {
        for (b, o) in group.chunks_exact_mut(gb).enumerate() {
            let src: [&[u8]; 4] = std::array::from_fn(|i| {
                let r = (4 * g + i).min(rows - 1);
                &data[r * rb + b * F::BYTES..][..F::BYTES]
            });
            let (mut k_lo, mut k_hi) = (0u64, 0u64);
            for (i, s) in src.iter().enumerate() {
                o[i * qs_len..(i + 1) * qs_len].copy_from_slice(&s[F::QS..F::QS + qs_len]);
                o[q + 2 * i..q + 2 * i + 2].copy_from_slice(&s[0..2]);
                if F::MIN {
                    o[q + 8 + 2 * i..q + 10 + 2 * i].copy_from_slice(&s[F::M..F::M + 2]);
                }
                if let Some(qh) = F::QH {
                    let h = u32::from_le_bytes(s[qh..qh + 4].try_into().unwrap()) as u64;
                    k_lo |= (h & 0xFFFF) << (16 * i);
                    k_hi |= (h >> 16) << (16 * i);
                }
            }
            if F::QH.is_some() {
                let k = q + if F::MIN { 16 } else { 8 };
                o[k..k + 8].copy_from_slice(&k_lo.to_le_bytes());
                o[k + 8..k + 16].copy_from_slice(&k_hi.to_le_bytes());
            }
        }
    }
    out
}

/// The inverse of [`pack`] for one row: blocks `blocks` of row `r` in the file's layout.
pub(super) fn unpack<F: Legacy>(
    n: usize,
    data: &[u8],
    r: usize,
    blocks: std::ops::Range<usize>,
    out: &mut [u8],
) {
    let nb = n / QK;
    let gb = 4 * F::BYTES;
    let qs_len = if F::WIDE { 32 } else { 16 };
    let q = packed_qs::<F>();
    let (g, i) = (r / 4, r % 4);
    let group = &data[g * nb * gb..][..nb * gb];
    let src = group[blocks.start * gb..blocks.end * gb].chunks_exact(gb);
    for (o, s) in out.chunks_exact_mut(F::BYTES).zip(src) {
        o[F::QS..F::QS + qs_len].copy_from_slice(&s[i * qs_len..(i + 1) * qs_len]);
        o[0..2].copy_from_slice(&s[q + 2 * i..q + 2 * i + 2]);
        if F::MIN {
            o[F::M..F::M + 2].copy_from_slice(&s[q + 8 + 2 * i..q + 10 + 2 * i]);
        }
        if let Some(qh) = F::QH {
            let k = q + if F::MIN { 16 } else { 8 };
            let bits = |at: usize| {
                (u64::from_le_bytes(s[at..at + 8].try_into().unwrap()) >> (16 * i)) & 0xFFFF
            };
            let h = (bits(k) | bits(k + 8) << 16) as u32;
            o[qh..qh + 4].copy_from_slice(&h.to_le_bytes());
        }
    }
}
