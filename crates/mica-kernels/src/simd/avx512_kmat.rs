//! AVX-512 matrix kernels (see [`super::mat`]) for the k-quants on every llama.cpp path:
//! the repacked-Q4_K gemv/gemm, the tiled batch path (Q2_K..Q6_K), and `vec_dot` (all but
//! Q3_K, whose llama.cpp lanes fold its offset per element).
//!
//! A weight super-block is unpacked once per row into four registers of 64 unsigned quants
//! (element order) and four registers of i16 sub-block scales; each token then costs four
//! `vpmaddubsw` (u8 × i8 pair sums, exact in i16) and four `vpdpwssd` (× scale, into i32
//! lanes). The offset of Q6_K's quants (-32) enters through the activations' group sums
//! (`bsums`), as do Q4_K's mins.
//!
//! The batch paths' float arithmetic is scalar per output (`paths.rs`: one or four FMAs per
//! super-block on the *total* integer sums), so their micro-kernel computes 16 outputs at once
//! (4 rows × 4 tokens, 8 × 2 or 16 × 1): the i32 lanes of the 16 outputs are reduced together
//! by a transposing add tree, and the FMAs run with one output per f32 lane, each lane doing
//! exactly the scalar sequence. `vec_dot` keeps llama.cpp's eight `sumi` lanes per output
//! (`avx512.rs`), four rows per step.

use std::arch::x86_64::*;

use super::mat::{ActRows, MatOut, WeightRows};
use super::{DotPath, Kernels};
use crate::DType;
use crate::quant::blocks::QK_K;

/// Tokens per cache tile (their activations stay in L2 while the rows run over them).
const TOK_TILE: usize = 64;
/// Bytes of a Q8_K block; its f32 scale, quants and group sums.
const XB: usize = 292;
const XQ: usize = 4;
const XBS: usize = 260;

pub(super) fn install(k: &mut Kernels) {
    // SAFETY (all entries): installed only in the AVX-512 table, after `supported()`.
    k.set_mat(DotPath::Tiled, DType::Q4_K, |w, x, o| unsafe {
        batch::<Q4K, Tiled>(w, x, o)
    });
    k.set_mat(DotPath::Tiled, DType::Q6_K, |w, x, o| unsafe {
        batch::<Q6K, Tiled>(w, x, o)
    });
    k.set_mat(DotPath::RepackGemv, DType::Q4_K, |w, x, o| unsafe {
        batch::<Q4K, Gemv>(w, x, o)
    });
    k.set_mat(DotPath::RepackGemm, DType::Q4_K, |w, x, o| unsafe {
        batch::<Q4K, Gemm>(w, x, o)
    });
    k.set_mat(DotPath::VecDot, DType::Q4_K, |w, x, o| unsafe {
        vec_dot::<Q4K>(w, x, o)
    });
    k.set_mat(DotPath::VecDot, DType::Q6_K, |w, x, o| unsafe {
        vec_dot::<Q6K>(w, x, o)
    });
    k.set_mat(DotPath::VecDot, DType::Q5_K, |w, x, o| unsafe {
        vec_dot::<Q5K>(w, x, o)
    });
    k.set_mat(DotPath::VecDot, DType::Q2_K, |w, x, o| unsafe {
        vec_dot::<Q2K>(w, x, o)
    });
    k.set_mat(DotPath::Tiled, DType::Q5_K, |w, x, o| unsafe {
        batch::<Q5K, Tiled>(w, x, o)
    });
    k.set_mat(DotPath::Tiled, DType::Q2_K, |w, x, o| unsafe {
        batch::<Q2K, Tiled>(w, x, o)
    });
    k.set_mat(DotPath::Tiled, DType::Q3_K, |w, x, o| unsafe {
        batch::<Q3K, Tiled>(w, x, o)
    });
}

// ---------------------------------------------------------------------------------------------
// Formats.

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u64 {
    // SAFETY: the caller guarantees two readable bytes.
    unsafe { p.cast::<u16>().read_unaligned() as u64 }
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees four readable bytes.
    unsafe { p.cast::<u32>().read_unaligned() }
}

/// One super-block of one row, unpacked.
#[derive(Clone, Copy)]
struct Unpacked {
    /// Unsigned quants of elements 64k..64k+64.
    q: [__m512i; 4],
    /// i16 scale of each i16 lane of `vpmaddubsw(q[k], a)`.
    sc: [__m512i; 4],
    /// Per group of 16 elements (i16): the min (formats with mins), or the correction
    /// `-offset · scale` of unsigned quants (Q6_K), applied as `Σ g[i] · bsum[i]`.
    groups: __m256i,
}

/// A k-quant weight format as the kernels see it.
///
/// # Safety
/// `unpack` reads only `BYTES` bytes at `p`.
unsafe trait KFormat {
    const BYTES: usize;
    /// Whether `groups` holds mins (a separate sum) rather than a correction of the main sum.
    const MIN: bool;
    /// Byte offsets of the f16 `d` and `dmin` (unused without mins).
    const D: usize;
    const DMIN: usize;
    /// How llama.cpp's `vec_dot` finishes this format (`None`: no `vec_dot` kernel here).
    const VEC: Option<VecKind>;
    unsafe fn unpack(p: *const u8) -> Unpacked;
}

/// The min/offset handling of llama.cpp's AVX2 `vec_dot` per format (`avx2_kquants.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum VecKind {
    /// `acc = fma(-d_x·dmin, lanes(mins·bsums), acc)` before the block's FMA.
    Q2,
    /// A four-lane `acc_m = fma(-d_x·dmin, min lanes, acc_m)`.
    Q4,
    /// A scalar `summs = fma(-d_x·dmin, Σ mins·bsums, summs)`.
    Q5,
    /// `sumi - 32·lanes(scales·bsums)`.
    Q6,
}

/// `[v | v]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn twice(v: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1)
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

struct Q4K;
// SAFETY: reads 144 bytes: d@0, dmin@2, scales@4 (12), qs@16 (128).
unsafe impl KFormat for Q4K {
    const BYTES: usize = 144;
    const MIN: bool = true;
    const D: usize = 0;
    const DMIN: usize = 2;
    const VEC: Option<VecKind> = Some(VecKind::Q4);
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        // SAFETY: scales@4 and qs@16 are inside the block.
        unsafe { unpack_k4(p.add(4), p.add(16), None) }
    }
}

struct Q5K;
// SAFETY: reads 176 bytes: d@0, dmin@2, scales@4 (12), qh@16 (32), qs@48 (128).
unsafe impl KFormat for Q5K {
    const BYTES: usize = 176;
    const MIN: bool = true;
    const D: usize = 0;
    const DMIN: usize = 2;
    const VEC: Option<VecKind> = Some(VecKind::Q5);
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
    let split = halves(0, 4);
    // SAFETY: 32 bytes of fifth bits.
    let hv = qh.map(|h| twice(unsafe { _mm256_loadu_si256(h.cast()) }));
    let q = std::array::from_fn(|k| {
        // SAFETY: qs[32k..32k+32] is inside the block.
        let v = unsafe { _mm256_loadu_si256(qs.add(32 * k).cast()) };
        let q = _mm512_and_si512(_mm512_srlv_epi16(twice(v), split), low4);
        match hv {
            // Elements 64k + l: bit 2k of qh[l]; 64k + 32 + l: bit 2k + 1.
            Some(hv) => {
                let b = _mm512_srlv_epi16(hv, halves(2 * k as i16, 2 * k as i16 + 1));
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

/// i16 lanes: `a` in the first 256 bits, `b` in the rest.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn halves(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4(_mm512_set1_epi16(a), _mm256_set1_epi16(b), 1)
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
        _mm512_and_si512(_mm512_srlv_epi16(v, halves(2 * j, 2 * j + 2)), three)
    })
}

struct Q2K;
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

struct Q3K;
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
            let b = _mm512_srlv_epi16(hm, halves(4 * h + j, 4 * h + j + 1));
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

struct Q6K;
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

// ---------------------------------------------------------------------------------------------
// Integer sums.

/// `Σ sc·q·a` of one super-block as 16 i32 lanes (lane i: elements 4i..4i+3 of each
/// 64-element register, summed over the four).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn lanes16(u: &Unpacked, x: *const u8) -> __m512i {
    let mut s = _mm512_setzero_si512();
    for k in 0..4 {
        // SAFETY: the caller passes a Q8_K block.
        let a = unsafe { _mm512_loadu_si512(x.add(XQ + 64 * k).cast()) };
        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u.q[k], a), u.sc[k]);
    }
    s
}

/// The eight pair sums `g[2i]·bsum[2i] + g[2i+1]·bsum[2i+1]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn group_lanes(u: &Unpacked, x: *const u8) -> __m256i {
    // SAFETY: the caller passes a Q8_K block.
    let bs = unsafe { _mm256_loadu_si256(x.add(XBS).cast()) };
    _mm256_madd_epi16(u.groups, bs)
}

/// 16 → 8 lanes: lane i + lane i + 8.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// Tree level 1 + 2: four vectors → one whose 128-bit chunk j holds, in lane i, the sum of
/// chunk j of input i.
#[inline]
#[target_feature(enable = "avx512f")]
fn quad(v: [__m512i; 4]) -> __m512i {
    let l1 = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let (x, y) = (l1(v[0], v[1]), l1(v[2], v[3]));
    _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
}

/// Adds 128-bit chunks pairwise: `[a0+a1, a2+a3, b0+b1, b2+b3]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn pairs(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i32x4(a, b, 0x88),
        _mm512_shuffle_i32x4(a, b, 0xDD),
    )
}

/// Lane sums of 16 vectors, lane i = Σ lanes of `v[i]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16(v: &[__m512i; 16]) -> __m512i {
    let b: [__m512i; 4] =
        std::array::from_fn(|j| quad([v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]]));
    pairs(pairs(b[0], b[1]), pairs(b[2], b[3]))
}

/// Two sums of 16 vectors whose chunks 0-1 and 2-3 hold two different quantities:
/// `(Σ chunks 0-1, Σ chunks 2-3)` per input lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16x2(v: &[__m512i; 16]) -> (__m512i, __m512i) {
    let b: [__m512i; 4] =
        std::array::from_fn(|j| quad([v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]]));
    // [first(0-3), second(0-3), first(4-7), second(4-7)] and the same for 8-15.
    let (c0, c1) = (pairs(b[0], b[1]), pairs(b[2], b[3]));
    (
        _mm512_shuffle_i32x4(c0, c1, 0x88),
        _mm512_shuffle_i32x4(c0, c1, 0xDD),
    )
}

// ---------------------------------------------------------------------------------------------
// The batch paths: 16 outputs per micro-kernel, one per f32 lane.

/// The float steps of a batch path, lane-wise (`paths.rs`'s `Acc` for 16 outputs).
trait BatchPath {
    /// Whether the path needs the sums per 64 elements (the repacked gemm) or totals.
    const PARTS: bool;
    /// One super-block from totals: `isum`, and `imin` for the formats with mins, as f32.
    fn step(acc: &mut [__m512; 2], isum: __m512, imin: Option<__m512>, d: &Scales);
    fn result(acc: &[__m512; 2]) -> __m512;
}

/// Per-lane f32 scales of a super-block.
struct Scales {
    dw: __m512,
    dmin: __m512,
    dx: __m512,
}

struct Tiled;
impl BatchPath for Tiled {
    const PARTS: bool = false;
    #[inline(always)]
    fn step(acc: &mut [__m512; 2], isum: __m512, imin: Option<__m512>, d: &Scales) {
        // SAFETY: AVX-512F is enabled in every caller (inlined into target_feature code).
        unsafe {
            let mut r = _mm512_mul_ps(isum, d.dw);
            if let Some(imin) = imin {
                let sign = _mm512_set1_epi32(i32::MIN);
                let neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(d.dmin), sign));
                r = _mm512_fmadd_ps(neg, imin, r);
            }
            acc[0] = _mm512_fmadd_ps(r, d.dx, acc[0]);
        }
    }
    #[inline(always)]
    fn result(acc: &[__m512; 2]) -> __m512 {
        acc[0]
    }
}

struct Gemv;
impl BatchPath for Gemv {
    const PARTS: bool = false;
    #[inline(always)]
    fn step(acc: &mut [__m512; 2], isum: __m512, imin: Option<__m512>, d: &Scales) {
        // SAFETY: as above.
        unsafe {
            acc[0] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d.dw, d.dx), acc[0]);
            if let Some(imin) = imin {
                acc[1] = _mm512_fmadd_ps(imin, _mm512_mul_ps(d.dmin, d.dx), acc[1]);
            }
        }
    }
    #[inline(always)]
    fn result(acc: &[__m512; 2]) -> __m512 {
        // SAFETY: as above.
        unsafe { _mm512_sub_ps(acc[0], acc[1]) }
    }
}

struct Gemm;
impl BatchPath for Gemm {
    const PARTS: bool = true;
    #[inline(always)]
    fn step(acc: &mut [__m512; 2], isum: __m512, imin: Option<__m512>, d: &Scales) {
        // One of the four 64-element parts, in order.
        Gemv::step(acc, isum, imin, d)
    }
    #[inline(always)]
    fn result(acc: &[__m512; 2]) -> __m512 {
        Gemv::result(acc)
    }
}

/// 16 f16 fields (at `off` of each row's block) to f32, lane i from row `i / per`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn f16_lanes<const R: usize>(w: &[*const u8; R], off: usize, per: usize) -> __m512 {
    let mut h = [0u64; 4];
    for (i, w) in w.iter().enumerate() {
        // SAFETY: the caller passes block pointers with the field inside.
        h[i / 4] |= unsafe { rd16(w.add(off)) } << (16 * (i % 4));
    }
    let v = _mm256_setr_epi64x(h[0] as i64, h[1] as i64, h[2] as i64, h[3] as i64);
    let f = _mm512_cvtph_ps(v);
    if per == 1 {
        f
    } else {
        let idx: [i32; 16] = std::array::from_fn(|i| (i / per) as i32);
        // SAFETY: 64 readable bytes.
        _mm512_permutexvar_ps(unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }, f)
    }
}

/// The activation scales of `C` tokens, lane i from token `i % C`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dx_lanes<const C: usize>(x: &[*const u8; C]) -> __m512 {
    // SAFETY: Q8_K blocks start with their f32 scale.
    let d = |c: usize| unsafe { x[c % C].cast::<f32>().read_unaligned() };
    _mm512_broadcast_f32x4(_mm_setr_ps(d(0), d(1), d(2), d(3)))
}

/// `R` rows × `C` tokens (`R·C = 16`) over all `nb` super-blocks: the path's result per
/// output, lane `r·C + c`. With `DEC`, `up[r]` points at row r's blocks already unpacked
/// (unused otherwise).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<F: KFormat, P: BatchPath, const R: usize, const C: usize, const DEC: bool>(
    w: [*const u8; R],
    x: [*const u8; C],
    nb: usize,
    up: [*const Unpacked; R],
) -> __m512 {
    let mut acc = [_mm512_setzero_ps(); 2];
    for b in 0..nb {
        // SAFETY: every pointer stays inside its row (checked by the driver).
        unsafe {
            let wb = w.map(|p| p.add(b * F::BYTES));
            let xb = x.map(|p| p.add(b * XB));
            let d = Scales {
                dw: f16_lanes(&wb, F::D, C),
                dmin: if F::MIN {
                    f16_lanes(&wb, F::DMIN, C)
                } else {
                    _mm512_setzero_ps()
                },
                dx: dx_lanes(&xb),
            };
            if P::PARTS {
                let (part, min) =
                    parts_tile::<F, R, C, DEC>(&wb, &xb, up.map(|p| p.wrapping_add(b)));
                for k in 0..4 {
                    let min = F::MIN.then(|| _mm512_cvtepi32_ps(min[k]));
                    P::step(&mut acc, _mm512_cvtepi32_ps(part[k]), min, &d);
                }
            } else {
                let mut v = [_mm512_setzero_si512(); 16];
                for r in 0..R {
                    let u = if DEC { *up[r].add(b) } else { F::unpack(wb[r]) };
                    for c in 0..C {
                        let s = lanes16(&u, xb[c]);
                        let g = group_lanes(&u, xb[c]);
                        v[r * C + c] = if F::MIN {
                            _mm512_inserti64x4(_mm512_castsi256_si512(fold(s)), g, 1)
                        } else {
                            _mm512_add_epi32(s, _mm512_castsi256_si512(g))
                        };
                    }
                }
                let (isum, imin) = if F::MIN {
                    reduce16x2(&v)
                } else {
                    (reduce16(&v), _mm512_setzero_si512())
                };
                let imin = F::MIN.then(|| _mm512_cvtepi32_ps(imin));
                P::step(&mut acc, _mm512_cvtepi32_ps(isum), imin, &d);
            }
        }
    }
    P::result(&acc)
}

/// Per 64-element part k (lane = output): `(Σ sc·q·a, Σ min·bsum)` of one super-block.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
unsafe fn parts_tile<F: KFormat, const R: usize, const C: usize, const DEC: bool>(
    wb: &[*const u8; R],
    xb: &[*const u8; C],
    ub: [*const Unpacked; R],
) -> ([__m512i; 4], [__m512i; 4]) {
    let mut p = [_mm512_setzero_si512(); 16];
    let mut m = [_mm512_setzero_si512(); 16];
    for r in 0..R {
        // SAFETY: the caller's pointers hold whole blocks (`ub`: unpacked, with `DEC`).
        let u = unsafe { if DEC { *ub[r] } else { F::unpack(wb[r]) } };
        for c in 0..C {
            let mut s = [_mm512_setzero_si512(); 4];
            for (k, s) in s.iter_mut().enumerate() {
                // SAFETY: as above.
                let a = unsafe { _mm512_loadu_si512(xb[c].add(XQ + 64 * k).cast()) };
                *s = _mm512_dpwssd_epi32(*s, _mm512_maddubs_epi16(u.q[k], a), u.sc[k]);
            }
            // Chunk k: four partial sums of part k.
            p[r * C + c] = pairs(pairs(s[0], s[1]), pairs(s[2], s[3]));
            // Chunk k: [min lane 2k, 0, min lane 2k+1, 0].
            // SAFETY: as above.
            m[r * C + c] = _mm512_cvtepu32_epi64(unsafe { group_lanes(&u, xb[c]) });
        }
    }
    (chunk_sums(&p), chunk_sums(&m))
}

/// For 16 inputs whose chunk k holds four partial sums of quantity k: per k, the vector of
/// the 16 totals (lane = input).
#[inline]
#[target_feature(enable = "avx512f")]
fn chunk_sums(v: &[__m512i; 16]) -> [__m512i; 4] {
    // b[j] chunk k = quantity k of inputs 4j..4j+4.
    let b: [__m512i; 4] =
        std::array::from_fn(|j| quad([v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]]));
    // 4 × 4 transpose of chunks.
    let t0 = _mm512_shuffle_i32x4(b[0], b[1], 0x44); // b0c0 b0c1 b1c0 b1c1
    let t1 = _mm512_shuffle_i32x4(b[0], b[1], 0xEE); // b0c2 b0c3 b1c2 b1c3
    let t2 = _mm512_shuffle_i32x4(b[2], b[3], 0x44);
    let t3 = _mm512_shuffle_i32x4(b[2], b[3], 0xEE);
    [
        _mm512_shuffle_i32x4(t0, t2, 0x88),
        _mm512_shuffle_i32x4(t0, t2, 0xDD),
        _mm512_shuffle_i32x4(t1, t3, 0x88),
        _mm512_shuffle_i32x4(t1, t3, 0xDD),
    ]
}

/// Runs one micro-kernel and stores its valid outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_tile<F: KFormat, P: BatchPath, const R: usize, const C: usize>(
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
    r0: usize,
    t0: usize,
    unpacked: Option<(&[Unpacked], usize)>,
) {
    let nb = w.n / QK_K;
    let nr = (w.rows - r0).min(R);
    let nt = (x.n - t0).min(C);
    // SAFETY: rows r0..r0+nr and tokens t0..t0+nt exist; missing ones repeat the last.
    let (wp, xp) = unsafe {
        (
            std::array::from_fn(|i| w.data.as_ptr().add((r0 + i.min(nr - 1)) * w.stride)),
            std::array::from_fn(|c| x.data.as_ptr().add((t0 + c.min(nt - 1)) * nb * XB)),
        )
    };
    // SAFETY: as above; `unpacked` holds blocks 0..nb of rows `base..` (all of ours).
    let v = unsafe {
        match unpacked {
            Some((buf, base)) => {
                let up = std::array::from_fn(|i| {
                    let r = r0 + i.min(nr - 1) - base;
                    assert!((r + 1) * nb <= buf.len(), "unpacked rows");
                    buf.as_ptr().add(r * nb)
                });
                tile::<F, P, R, C, true>(wp, xp, nb, up)
            }
            None => tile::<F, P, R, C, false>(wp, xp, nb, [std::ptr::null(); R]),
        }
    };
    let mut lanes = [0f32; 16];
    // SAFETY: 16 writable floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
    for r in 0..nr {
        for c in 0..nt {
            out.set(t0 + c, r0 + r, lanes[r * C + c]);
        }
    }
}

/// A batch path's matrix kernel: rows in blocks of 16, tokens in tiles of [`TOK_TILE`] and
/// micro-kernel groups of 4 (4 rows each), 2 (8 rows) or 1 (16 rows).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn batch<F: KFormat, P: BatchPath>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    check::<F>(w, x);
    let nb = w.n / QK_K;
    // Tiles of at least DECODE_MIN_TOKENS tokens unpack each block of their 16 rows once
    // into `buf` (`[16][nb]`) for all their micro-kernels.
    let mut buf: Vec<Unpacked> = Vec::new();
    for t0 in (0..x.n).step_by(TOK_TILE) {
        let t1 = (t0 + TOK_TILE).min(x.n);
        let decode = t1 - t0 >= DECODE_MIN_TOKENS;
        for r0 in (0..w.rows).step_by(16) {
            let r1 = (r0 + 16).min(w.rows);
            let mut t = t0;
            // SAFETY (all calls): r < w.rows, t < x.n; `buf` holds rows r0..r1.
            unsafe {
                if decode {
                    buf.clear();
                    for r in r0..r1 {
                        let row = w.data.as_ptr().add(r * w.stride);
                        buf.extend((0..nb).map(|b| F::unpack(row.add(b * F::BYTES))));
                    }
                }
                let u = decode.then_some((buf.as_slice(), r0));
                while t1 - t >= 3 {
                    for r in (r0..r1).step_by(4) {
                        run_tile::<F, P, 4, 4>(w, x, out, r, t, u);
                    }
                    t += 4.min(t1 - t);
                }
                if t1 - t == 2 {
                    for r in (r0..r1).step_by(8) {
                        run_tile::<F, P, 8, 2>(w, x, out, r, t, u);
                    }
                } else if t1 - t == 1 {
                    run_tile::<F, P, 16, 1>(w, x, out, r0, t, u);
                }
            }
        }
    }
}

/// Token tiles from this size on unpack their rows once (fewer tokens do not repay the
/// stores).
const DECODE_MIN_TOKENS: usize = 8;

/// Checks the sizes every kernel here relies on.
fn check<F: KFormat>(w: &WeightRows, x: &ActRows) {
    let nb = w.n / QK_K;
    assert!(nb * QK_K == w.n && w.rows > 0 && x.dtype == DType::Q8_K);
    assert!(
        w.data.len() >= (w.rows - 1) * w.stride + nb * F::BYTES,
        "weight rows"
    );
    assert!(x.data.len() == x.n * nb * XB, "activation rows");
}

// ---------------------------------------------------------------------------------------------
// vec_dot: llama.cpp's eight `sumi` lanes per output, four rows per step.

/// Four rows × one token: llama.cpp's `vec_dot` per row ([`VecKind`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vec_dot_rows<F: KFormat>(w: [*const u8; 4], x: *const u8, nb: usize) -> [f32; 4] {
    let kind = F::VEC.expect("a vec_dot kind");
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc_m = [_mm_setzero_ps(); 4];
    let mut summs = [0f32; 4];
    let f16 = |p: *const u8| {
        // SAFETY: the caller passes a readable f16 field.
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(unsafe { rd16(p) } as i32)))
    };
    for b in 0..nb {
        // SAFETY: every pointer stays inside its row (checked by the driver).
        unsafe {
            let xb = x.add(b * XB);
            let dx = xb.cast::<f32>().read_unaligned();
            for r in 0..4 {
                let wb = w[r].add(b * F::BYTES);
                let u = F::unpack(wb);
                let d = dx * f16(wb.add(F::D));
                let s = fold(lanes16(&u, xb));
                let g = group_lanes(&u, xb);
                // -d_x·dmin, as llama.cpp forms it.
                let dmin = || -dx * f16(wb.add(F::DMIN));
                let sumi = match kind {
                    VecKind::Q2 => {
                        let m = _mm256_cvtepi32_ps(g);
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin()), m, acc[r]);
                        s
                    }
                    VecKind::Q4 => {
                        let lo = _mm256_castsi256_si128(g);
                        let mins = _mm_hadd_epi32(lo, _mm256_extracti128_si256(g, 1));
                        let m = _mm_cvtepi32_ps(mins);
                        acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin()), m, acc_m[r]);
                        s
                    }
                    VecKind::Q5 => {
                        let t = _mm_add_epi32(
                            _mm256_castsi256_si128(g),
                            _mm256_extracti128_si256(g, 1),
                        );
                        let t = super::avx2_kquants::hsum_i32x4(t);
                        summs[r] = dmin().mul_add(t as f32, summs[r]);
                        s
                    }
                    VecKind::Q6 => _mm256_add_epi32(s, g),
                };
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
    }
    std::array::from_fn(|r| match kind {
        VecKind::Q4 => super::avx2_kquants::finish_q4k(acc[r], acc_m[r]),
        VecKind::Q5 => super::avx2::hsum_f32(acc[r]) + summs[r],
        VecKind::Q2 | VecKind::Q6 => super::avx2::hsum_f32(acc[r]),
    })
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vec_dot<F: KFormat>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    check::<F>(w, x);
    let nb = w.n / QK_K;
    for t in 0..x.n {
        for r0 in (0..w.rows).step_by(4) {
            let nr = (w.rows - r0).min(4);
            // SAFETY: rows r0..r0+nr and token t exist.
            let res = unsafe {
                let wp =
                    std::array::from_fn(|i| w.data.as_ptr().add((r0 + i.min(nr - 1)) * w.stride));
                vec_dot_rows::<F>(wp, x.data.as_ptr().add(t * nb * XB), nb)
            };
            for (i, &v) in res[..nr].iter().enumerate() {
                out.set(t, r0 + i, v);
            }
        }
    }
}
