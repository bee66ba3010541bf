//! The k-quant super-blocks as the AVX-512 matrix kernels (`kmat.rs`) see them: one row's
//! super-block unpacked into four registers of 64 unsigned quants (element order) and four
//! registers of i16 sub-block scales ([`Unpacked`]), with the per-16-element values that meet
//! the activations' group sums (`bsums`): the mins of Q2_K, Q4_K and Q5_K, or the correction
//! of Q3_K's and Q6_K's offset quants.

use std::arch::x86_64::*;

use super::{halves16, twice};
use crate::simd::x86::avx2::rd32;

/// One super-block of one row, unpacked.
#[derive(Clone, Copy)]
pub(super) struct Unpacked {
    /// Unsigned quants of elements 64k..64k+64.
    pub q: [__m512i; 4],
    /// i16 scale of each i16 lane of `vpmaddubsw(q[k], a)`.
    pub sc: [__m512i; 4],
    /// Per group of 16 elements (i16): the min (formats with mins), or the correction
    /// `-offset · scale` of unsigned quants (Q6_K), applied as `Σ g[i] · bsum[i]`.
    pub groups: __m256i,
}

/// A k-quant weight format as the kernels see it.
///
/// # Safety
/// `unpack` reads only `BYTES` bytes at `p`.
pub(super) unsafe trait KFormat {
    const BYTES: usize;
    /// Whether `groups` holds mins (a separate sum) rather than a correction of the main sum.
    const MIN: bool;
    /// Byte offsets of the f16 `d` and `dmin` (unused without mins).
    const D: usize;
    const DMIN: usize;
    /// How llama.cpp's `vec_dot` finishes this format (`None`: no `vec_dot` kernel here).
    const VEC: Option<VecKind>;
    /// Whether the scales cover 32 elements (two groups of 16 share one): Q4_K, Q5_K.
    const SC32: bool = false;
    unsafe fn unpack(p: *const u8) -> Unpacked;
}

/// The min/offset handling of llama.cpp's AVX2 `vec_dot` per format (`x86/avx2/kquants.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum VecKind {
    /// `acc = fma(-d_x·dmin, lanes(mins·bsums), acc)` before the block's FMA.
    Q2,
    /// A four-lane `acc_m = fma(-d_x·dmin, min lanes, acc_m)`.
    Q4,
    /// A scalar `summs = fma(-d_x·dmin, Σ mins·bsums, summs)`.
    Q5,
    /// `sumi - 32·lanes(scales·bsums)`.
    Q6,
}

/// i16 lanes `[s[a] ×16, s[b] ×16]`-style spreads: `idx` picks an i16 of `s` per lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn pick16(s: __m128i, idx: [i16; 32]) -> __m512i {
    // SAFETY: 64 readable bytes.
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
    _mm512_permutexvar_epi16(idx, _mm512_castsi128_si512(s))
}

/// Lane indices of the i16 lanes of a 64-element register whose scale changes every `per`
/// lanes (16 for 32-element sub-blocks, 8 for 16-element groups), starting at `first`.
const fn scale_idx(first: i16, per: usize) -> [i16; 32] {
    let mut out = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = first + (i / per) as i16;
        i += 1;
    }
    out
}

pub(super) struct Q4K;
// SAFETY: reads 144 bytes: d@0, dmin@2, scales@4 (12), qs@16 (128).
unsafe impl KFormat for Q4K {
    const BYTES: usize = 144;
    const MIN: bool = true;
    const D: usize = 0;
    const DMIN: usize = 2;
    const VEC: Option<VecKind> = Some(VecKind::Q4);
    const SC32: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        // SAFETY: scales@4 and qs@16 are inside the block.
        unsafe { unpack_k4(p.add(4), p.add(16), None) }
    }
}

pub(super) struct Q5K;
// SAFETY: reads 176 bytes: d@0, dmin@2, scales@4 (12), qh@16 (32), qs@48 (128).
unsafe impl KFormat for Q5K {
    const BYTES: usize = 176;
    const MIN: bool = true;
    const D: usize = 0;
    const DMIN: usize = 2;
    const VEC: Option<VecKind> = Some(VecKind::Q5);
    const SC32: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        // SAFETY: scales@4, qh@16 and qs@48 are inside the block.
        unsafe { unpack_k4(p.add(4), p.add(48), Some(p.add(16))) }
    }
}

/// Q4_K/Q5_K: the six-bit scales and mins at `scales` (unpacked as llama.cpp does, with
/// `kmask1..3`), the nibbles at `qs` and, for Q5_K, the fifth bits at `qh`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn unpack_k4(scales: *const u8, qs: *const u8, qh: Option<*const u8>) -> Unpacked {
    // SAFETY: the caller passes the fields of one block.
    let (u0, u1, u2) = unsafe { (rd32(scales), rd32(scales.add(4)), rd32(scales.add(8))) };
    let (m1, m2, m3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let sc = (u0 & m1) as u64 | (((u2 & m2) | (((u0 >> 6) & m3) << 4)) as u64) << 32;
    let mn = (u1 & m1) as u64 | ((((u2 >> 4) & m2) | (((u1 >> 6) & m3) << 4)) as u64) << 32;
    let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
    let mn8 = _mm_cvtsi64_si128(mn as i64);
    let low4 = _mm512_set1_epi8(0x0F);
    let split = halves16(0, 4);
    // SAFETY: 32 bytes of fifth bits.
    let hv = qh.map(|h| twice(unsafe { _mm256_loadu_si256(h.cast()) }));
    let q = std::array::from_fn(|k| {
        // SAFETY: qs[32k..32k+32] is inside the block.
        let v = unsafe { _mm256_loadu_si256(qs.add(32 * k).cast()) };
        let q = _mm512_and_si512(_mm512_srlv_epi16(twice(v), split), low4);
        match hv {
            // Elements 64k + l: bit 2k of qh[l]; 64k + 32 + l: bit 2k + 1.
            Some(hv) => {
                let b = _mm512_srlv_epi16(hv, halves16(2 * k as i16, 2 * k as i16 + 1));
                let b = _mm512_and_si512(b, _mm512_set1_epi8(1));
                _mm512_or_si512(q, _mm512_slli_epi16(b, 4))
            }
            None => q,
        }
    });
    Unpacked {
        q,
        sc: [
            pick16(sc16, const { scale_idx(0, 16) }),
            pick16(sc16, const { scale_idx(2, 16) }),
            pick16(sc16, const { scale_idx(4, 16) }),
            pick16(sc16, const { scale_idx(6, 16) }),
        ],
        // Each min covers two groups of 16.
        groups: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8)),
    }
}

/// Scales for 16-element groups (i16, one per group) spread over the four registers.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn group_scales(s16: __m256i) -> [__m512i; 4] {
    let lo = _mm256_castsi256_si128(s16);
    let hi = _mm256_extracti128_si256(s16, 1);
    [
        pick16(lo, const { scale_idx(0, 8) }),
        pick16(lo, const { scale_idx(4, 8) }),
        pick16(hi, const { scale_idx(0, 8) }),
        pick16(hi, const { scale_idx(4, 8) }),
    ]
}

/// Q2_K/Q3_K: the two low bits of the quants in register k (elements 64k..64k+64):
/// element `128h + 32j + l` is bits `2j..2j+2` of `qs[32h + l]`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn low2(qs: *const u8) -> [__m512i; 4] {
    let three = _mm512_set1_epi8(3);
    std::array::from_fn(|k| {
        let h = k / 2;
        let j = 2 * (k % 2) as i16;
        // SAFETY: qs[32h..32h+32] is inside the block.
        let v = twice(unsafe { _mm256_loadu_si256(qs.add(32 * h).cast()) });
        _mm512_and_si512(_mm512_srlv_epi16(v, halves16(2 * j, 2 * j + 2)), three)
    })
}

pub(super) struct Q2K;
// SAFETY: reads 84 bytes: scales@0 (16), qs@16 (64), d@80, dmin@82.
unsafe impl KFormat for Q2K {
    const BYTES: usize = 84;
    const MIN: bool = true;
    const D: usize = 80;
    const DMIN: usize = 82;
    const VEC: Option<VecKind> = Some(VecKind::Q2);
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        // SAFETY: the fields are inside the block.
        let s = unsafe { _mm_loadu_si128(p.cast()) };
        let low = _mm_and_si128(s, _mm_set1_epi8(0x0F));
        let high = _mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0F));
        Unpacked {
            // SAFETY: as above.
            q: unsafe { low2(p.add(16)) },
            sc: group_scales(_mm256_cvtepu8_epi16(low)),
            groups: _mm256_cvtepu8_epi16(high),
        }
    }
}

pub(super) struct Q3K;
// SAFETY: reads 110 bytes: hmask@0 (32), qs@32 (64), scales@96 (12), d@108.
unsafe impl KFormat for Q3K {
    const BYTES: usize = 110;
    const MIN: bool = false;
    const D: usize = 108;
    const DMIN: usize = 108;
    // llama.cpp folds the -4 into its lanes, which the group sums cannot reproduce per lane.
    const VEC: Option<VecKind> = None;
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        // SAFETY: the fields are inside the block.
        let (mut q, hm, sc) = unsafe {
            let sc: [u8; 12] = p.add(96).cast::<[u8; 12]>().read_unaligned();
            (
                low2(p.add(32)),
                twice(_mm256_loadu_si256(p.cast())),
                crate::quant::blocks::q3k_scales(&sc),
            )
        };
        // u = low2 + 4·hbit (0..8); the quant is u - 4. Element 128h + 32j + l has its
        // high bit at bit 4h + j of hmask[l].
        for (k, q) in q.iter_mut().enumerate() {
            let (h, j) = ((k / 2) as i16, 2 * (k % 2) as i16);
            let b = _mm512_srlv_epi16(hm, halves16(4 * h + j, 4 * h + j + 1));
            let b = _mm512_and_si512(b, _mm512_set1_epi8(1));
            *q = _mm512_or_si512(*q, _mm512_slli_epi16(b, 2));
        }
        // SAFETY: 16 readable bytes.
        let s16 = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(sc.as_ptr().cast()) });
        Unpacked {
            q,
            sc: group_scales(s16),
            groups: _mm256_mullo_epi16(s16, _mm256_set1_epi16(-4)),
        }
    }
}

pub(super) struct Q6K;
// SAFETY: reads 210 bytes: ql@0 (128), qh@128 (64), scales@192 (16), d@208.
unsafe impl KFormat for Q6K {
    const BYTES: usize = 210;
    const MIN: bool = false;
    const D: usize = 208;
    const DMIN: usize = 208;
    const VEC: Option<VecKind> = Some(VecKind::Q6);
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        let low4 = _mm512_set1_epi8(0x0F);
        let three = _mm512_set1_epi8(3);
        let sh = |a: i16, b: i16| _mm512_inserti64x4(_mm512_set1_epi16(a), _mm256_set1_epi16(b), 1);
        let (sh_a, sh_b) = (sh(0, 2), sh(4, 6));
        let mut q = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            // SAFETY: ql[64h..64h+64] and qh[32h..32h+32] are inside the block.
            let (ql, qh) = unsafe {
                (
                    _mm512_loadu_si512(p.add(64 * h).cast()),
                    twice(_mm256_loadu_si256(p.add(128 + 32 * h).cast())),
                )
            };
            let hi_a = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_a), three), 4);
            let hi_b = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_b), three), 4);
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), hi_a);
            q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi_b);
        }
        // SAFETY: scales[0..16] is inside the block.
        let s8 = unsafe { _mm_loadu_si128(p.add(192).cast()) };
        let s16 = _mm256_cvtepi8_epi16(s8);
        Unpacked {
            q,
            sc: group_scales(s16),
            // The quants are stored +32: subtract 32 · scale per group.
            groups: _mm256_mullo_epi16(s16, _mm256_set1_epi16(-32)),
        }
    }
}
