//! AVX2 prefill for the k-quants with 16-element scale groups or finer (Q4_K, Q5_K, Q6_K)
//! on llama.cpp's batch paths ([`DotPath`](crate::simd::DotPath): repacked Q4_K's gemm/gemv
//! and the tiled path).
//!
//! The path functions of `paths.rs` compute each output's integer sums per 64 elements from
//! the dot products' chunk lanes, then reduce them horizontally: per (row, token, 64
//! elements) an unpack, the products and a four-step horizontal sum. Here each group of eight
//! rows is decoded once per token tile into an interleaved buffer (as llama.cpp's
//! `block_q4_Kx8`): vector `e` of a super-block holds elements 4e..4e+3 of the eight rows,
//! unsigned. A token's four activations 4e..4e+3, broadcast, meet all eight rows in one
//! `vpmaddubsw`; `vpmaddwd` with the rows' scales (i16, per 16 elements) then leaves row `r`'s
//! exact sum in i32 lane `r`, so the 64-element sums of eight outputs come out side by side
//! with no horizontal work, and their float steps (`simd/paths.rs`' `Acc`) run eight outputs
//! per instruction, lane for lane the scalar sequence.
//!
//! Integer sums stay exact: at most `M` products (Q4_K 8, Q5_K 4, Q6_K 2) are summed in i16
//! (`M · 2 · max|q| · 127 < 2^15`), the rest in i32. The mins (Q4_K, Q5_K) and Q6_K's `-32`
//! offset come from the activations' 16-element sums: `Σ c_g·bsum_g` by `vpmaddwd` over pairs
//! of groups.

use std::arch::x86_64::*;

use crate::quant::blocks::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, blocks, f16_to_f32};
use crate::quant::kquants::scales_mins_k4;
use crate::simd::mat::{ActRows, MatOut, WeightRows};

/// Token batches from this size on take the decoded path.
pub(super) const DECODE_MIN_TOKENS: usize = 8;

/// Tokens per cache tile (their activations stay in L2 while each row group runs over them).
const TOK_TILE: usize = 32;

/// One super-block of eight rows, decoded.
#[repr(C, align(32))]
struct KDec {
    /// `q[e]`: elements 4e..4e+3 of rows 0..8 (unsigned quants).
    q: [[u8; 32]; 64],
    /// `sc[g]`: the scale of 16-element group `g`, twice per row (i16 lanes 2r, 2r+1).
    sc: [[i16; 16]; 16],
    /// `cf[j]`: the coefficients of `bsum[2j]` and `bsum[2j + 1]` per row (mins; Q6_K: 32·sc).
    cf: [[i16; 16]; 8],
    d: [f32; 8],
    dmin: [f32; 8],
}

/// A k-quant for the decoded path.
///
/// # Safety
/// `quants` must be safe to call wherever AVX2 is available.
pub(super) unsafe trait KFormat {
    type B: crate::quant::Block;
    /// Products summed in i16 before `vpmaddwd`.
    const M: usize;
    /// Whether the format has mins (`dmin`); without, `cf` is an offset folded into the sums.
    const MIN: bool;
    /// The 256 unsigned quants as eight 32-element chunks in element order.
    unsafe fn quants(a: &Self::B) -> [__m256i; 8];
    /// Per 16-element group: the scale and the `bsum` coefficient; then `d`, `dmin`.
    fn scales(a: &Self::B) -> ([i16; 16], [i16; 16], f32, f32);
}

pub(super) struct K4;
pub(super) struct K5;
pub(super) struct K6;

/// The 4-bit chunks of a Q4_K/Q5_K `qs` (chunk 2k: low nibbles of bytes 32k.., 2k+1: high).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble_chunks(qs: &[u8; 128]) -> [__m256i; 8] {
    let m = _mm256_set1_epi8(0x0F);
    let mut out = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        // SAFETY: bytes 32k..32k+32 of `qs`.
        let v = unsafe { _mm256_loadu_si256(qs.as_ptr().add(32 * k).cast()) };
        out[2 * k] = _mm256_and_si256(v, m);
        out[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    }
    out
}

fn k4_scales(scales: &[u8; 12], d: [u8; 2], dmin: [u8; 2]) -> ([i16; 16], [i16; 16], f32, f32) {
    let (sc, mn) = scales_mins_k4(scales);
    (
        std::array::from_fn(|g| sc[g / 2] as i16),
        std::array::from_fn(|g| mn[g / 2] as i16),
        f16_to_f32(d),
        f16_to_f32(dmin),
    )
}

// SAFETY: AVX2 only.
unsafe impl KFormat for K4 {
    type B = BlockQ4K;
    const M: usize = 8;
    const MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn quants(a: &BlockQ4K) -> [__m256i; 8] {
        // SAFETY: AVX2 is enabled here.
        unsafe { nibble_chunks(&a.qs) }
    }
    fn scales(a: &BlockQ4K) -> ([i16; 16], [i16; 16], f32, f32) {
        k4_scales(&a.scales, a.d, a.dmin)
    }
}

// SAFETY: AVX2 only.
unsafe impl KFormat for K5 {
    type B = BlockQ5K;
    const M: usize = 4;
    const MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn quants(a: &BlockQ5K) -> [__m256i; 8] {
        // SAFETY: AVX2 is enabled here; `qh` has 32 bytes.
        let (mut out, qh) = unsafe {
            (
                nibble_chunks(&a.qs),
                _mm256_loadu_si256(a.qh.as_ptr().cast()),
            )
        };
        // Chunk j's fifth bit of element l is bit j of qh[l].
        for (j, o) in out.iter_mut().enumerate() {
            let bit = _mm256_set1_epi8(1 << j);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
            *o = _mm256_or_si256(*o, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
        }
        out
    }
    fn scales(a: &BlockQ5K) -> ([i16; 16], [i16; 16], f32, f32) {
        k4_scales(&a.scales, a.d, a.dmin)
    }
}

// SAFETY: AVX2 only.
unsafe impl KFormat for K6 {
    type B = BlockQ6K;
    const M: usize = 2;
    const MIN: bool = false;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn quants(a: &BlockQ6K) -> [__m256i; 8] {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x30);
        let mut out = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            // SAFETY: bytes 64h..64h+64 of `ql`, 32h..32h+32 of `qh`.
            let (l0, l1, qh) = unsafe {
                (
                    _mm256_loadu_si256(a.ql.as_ptr().add(64 * h).cast()),
                    _mm256_loadu_si256(a.ql.as_ptr().add(64 * h + 32).cast()),
                    _mm256_loadu_si256(a.qh.as_ptr().add(32 * h).cast()),
                )
            };
            // High bits 2k, 2k+1 of qh moved to bits 4, 5.
            let hi = |k: i32| match k {
                0 => _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2),
                1 => _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2),
                2 => _mm256_and_si256(qh, m2),
                _ => _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
            };
            out[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4), hi(0));
            out[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), hi(1));
            out[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), hi(2));
            out[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), hi(3));
        }
        out
    }
    fn scales(a: &BlockQ6K) -> ([i16; 16], [i16; 16], f32, f32) {
        (
            a.scales.map(|s| s as i16),
            a.scales.map(|s| 32 * s as i16),
            f16_to_f32(a.d),
            0.0,
        )
    }
}

/// The 32-bit transpose of eight rows' chunks: `out[e]` = element group `e` of rows 0..8.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // u[4h + k]: element groups k (low lane) and k + 4 (high lane) of rows 4h..4h+4.
    let u: [__m256i; 8] = std::array::from_fn(|i| {
        let (h, k) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + k / 2], t[4 * h + 2 + k / 2]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|e| {
        let k = e % 4;
        if e < 4 {
            _mm256_permute2x128_si256(u[k], u[4 + k], 0x20)
        } else {
            _mm256_permute2x128_si256(u[k], u[4 + k], 0x31)
        }
    })
}

/// Decodes super-blocks `0..nb` of eight rows (`rows[i]`: row i's blocks) into `buf`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn decode<F: KFormat>(rows: [&[F::B]; 8], nb: usize, buf: &mut Vec<KDec>) {
    buf.clear();
    for b in 0..nb {
        // SAFETY: AVX2 is enabled here.
        let q: [[__m256i; 8]; 8] = std::array::from_fn(|r| unsafe { F::quants(&rows[r][b]) });
        let mut e = KDec {
            q: [[0; 32]; 64],
            sc: [[0; 16]; 16],
            cf: [[0; 16]; 8],
            d: [0.0; 8],
            dmin: [0.0; 8],
        };
        for j in 0..8 {
            let t = transpose8(std::array::from_fn(|r| q[r][j]));
            for (k, v) in t.iter().enumerate() {
                // SAFETY: 32 writable bytes.
                unsafe { _mm256_storeu_si256(e.q[8 * j + k].as_mut_ptr().cast(), *v) };
            }
        }
        for (r, row) in rows.iter().enumerate() {
            let (sc, cf, d, dmin) = F::scales(&row[b]);
            for g in 0..16 {
                e.sc[g][2 * r] = sc[g];
                e.sc[g][2 * r + 1] = sc[g];
            }
            for j in 0..8 {
                e.cf[j][2 * r] = cf[2 * j];
                e.cf[j][2 * r + 1] = cf[2 * j + 1];
            }
            e.d[r] = d;
            e.dmin[r] = dmin;
        }
        buf.push(e);
    }
}

#[inline(always)]
unsafe fn ld(p: &[i16; 16]) -> __m256i {
    // SAFETY: 32 readable bytes.
    unsafe { _mm256_loadu_si256(p.as_ptr().cast()) }
}

/// Eight decoded rows × `C` tokens (`x[c]`: token c's Q8_K blocks) over all super-blocks;
/// `STEP` as in `paths.rs`' `rows4` (0 repacked gemv, 1 repacked gemm, 2 tiled). Returns each
/// token's eight results.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<F: KFormat, const STEP: u8, const C: usize>(
    wd: &[KDec],
    x: [&[BlockQ8K]; C],
) -> [__m256; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    let mut acc_min = [_mm256_setzero_ps(); C];
    let chunk = 4 * F::M;
    for (b, e) in wd.iter().enumerate() {
        let xs: [&BlockQ8K; C] = std::array::from_fn(|c| &x[c][b]);
        let dx: [f32; C] = std::array::from_fn(|c| xs[c].d());
        // SAFETY: eight readable floats each.
        let (dw, dmin) = unsafe {
            (
                _mm256_loadu_ps(e.d.as_ptr()),
                _mm256_loadu_ps(e.dmin.as_ptr()),
            )
        };
        let mut isum = [_mm256_setzero_si256(); C];
        let mut imin = [_mm256_setzero_si256(); C];
        for k in 0..4 {
            let mut p = [_mm256_setzero_si256(); C];
            for ch in 0..64 / chunk {
                let e0 = (64 * k + chunk * ch) / 4;
                let mut s = [_mm256_setzero_si256(); C];
                for m in 0..F::M {
                    // SAFETY: group e0 + m < 64 of the decoded block; 4 bytes of each token.
                    unsafe {
                        let w = _mm256_load_si256(e.q.get_unchecked(e0 + m).as_ptr().cast());
                        for c in 0..C {
                            let a = xs[c].qs.as_ptr().add(4 * (e0 + m)).cast::<i32>();
                            let y = _mm256_set1_epi32(a.read_unaligned());
                            s[c] = _mm256_add_epi16(s[c], _mm256_maddubs_epi16(w, y));
                        }
                    }
                }
                // SAFETY: scale group (64k + chunk·ch) / 16 < 16.
                let sc = unsafe { ld(e.sc.get_unchecked((64 * k + chunk * ch) / 16)) };
                for c in 0..C {
                    p[c] = _mm256_add_epi32(p[c], _mm256_madd_epi16(s[c], sc));
                }
            }
            // SAFETY: cf[2k], cf[2k + 1]; bsums bytes 8k..8k+8.
            let (c0, c1) = unsafe { (ld(&e.cf[2 * k]), ld(&e.cf[2 * k + 1])) };
            for c in 0..C {
                // SAFETY: bytes 8k..8k+8 of the 32 bsum bytes.
                let (b0, b1) = unsafe {
                    let bs = xs[c].bsums.as_ptr().cast::<u8>().add(8 * k).cast::<i32>();
                    (bs.read_unaligned(), bs.add(1).read_unaligned())
                };
                let mk = _mm256_add_epi32(
                    _mm256_madd_epi16(c0, _mm256_set1_epi32(b0)),
                    _mm256_madd_epi16(c1, _mm256_set1_epi32(b1)),
                );
                if !F::MIN {
                    p[c] = _mm256_sub_epi32(p[c], mk);
                }
                if STEP == 1 {
                    let dd = _mm256_mul_ps(dw, _mm256_set1_ps(dx[c]));
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[c]), dd, acc[c]);
                    if F::MIN {
                        let dm = _mm256_mul_ps(dmin, _mm256_set1_ps(dx[c]));
                        acc_min[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mk), dm, acc_min[c]);
                    }
                } else {
                    isum[c] = _mm256_add_epi32(isum[c], p[c]);
                    if F::MIN {
                        imin[c] = _mm256_add_epi32(imin[c], mk);
                    }
                }
            }
        }
        for c in 0..C {
            let x = _mm256_set1_ps(dx[c]);
            match STEP {
                0 => {
                    let dd = _mm256_mul_ps(dw, x);
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), dd, acc[c]);
                    let dm = _mm256_mul_ps(dmin, x);
                    acc_min[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[c]), dm, acc_min[c]);
                }
                1 => {}
                _ => {
                    let mut r = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[c]), dw);
                    if F::MIN {
                        let neg = _mm256_sub_ps(_mm256_setzero_ps(), dmin);
                        r = _mm256_fmadd_ps(neg, _mm256_cvtepi32_ps(imin[c]), r);
                    }
                    acc[c] = _mm256_fmadd_ps(r, x, acc[c]);
                }
            }
        }
    }
    std::array::from_fn(|c| {
        if STEP == 2 {
            acc[c]
        } else {
            _mm256_sub_ps(acc[c], acc_min[c])
        }
    })
}

/// The decoded-path matrix kernel: token tiles of [`TOK_TILE`], eight rows decoded once per
/// tile, two tokens per pass over them.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn kquant_decoded<F: KFormat, const STEP: u8>(
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
) {
    assert!(w.rows > 0 && !w.packed && w.n.is_multiple_of(QK_K));
    let nb = w.n / QK_K;
    let mut buf: Vec<KDec> = Vec::with_capacity(nb);
    let toks: Vec<&[BlockQ8K]> = (0..x.n).map(|t| blocks(x.row(t))).collect();
    assert!(toks.iter().all(|t| t.len() == nb), "activation rows");
    for t0 in (0..x.n).step_by(TOK_TILE) {
        let t1 = (t0 + TOK_TILE).min(x.n);
        for r0 in (0..w.rows).step_by(8) {
            let nr = (w.rows - r0).min(8);
            // Missing rows repeat the last one.
            let rows: [&[F::B]; 8] = std::array::from_fn(|i| blocks(w.row(r0 + i.min(nr - 1))));
            assert!(rows.iter().all(|r| r.len() == nb), "weight rows");
            // SAFETY (all calls): the features are enabled here; lengths checked above.
            unsafe { decode::<F>(rows, nb, &mut buf) };
            let mut store = |t: usize, v: __m256| {
                let mut l = [0f32; 8];
                // SAFETY: eight writable floats.
                unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
                for (i, &v) in l[..nr].iter().enumerate() {
                    out.set(t, r0 + i, v);
                }
            };
            let mut t = t0;
            while t + 2 <= t1 {
                let res = unsafe { tile::<F, STEP, 2>(&buf, [toks[t], toks[t + 1]]) };
                store(t, res[0]);
                store(t + 1, res[1]);
                t += 2;
            }
            if t < t1 {
                let res = unsafe { tile::<F, STEP, 1>(&buf, [toks[t]]) };
                store(t, res[0]);
            }
        }
    }
}
