//! AVX2 prefill for the packed legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): row groups
//! decoded once per token tile.
//!
//! The packed decode kernel ([`super::avx2_mat`]'s `legacy_packed`) unpacks every weight
//! block again for each token: nibbles to bytes, fifth bits, four f16 scales. For a batch of
//! prompt tokens that costs more than the products. Here each group of eight rows (two packed
//! groups) is decoded once per token tile into a small buffer that stays in L1: the 32
//! unsigned quant bytes of each row and block (Q8_0: their magnitudes, with the signed bytes
//! beside them for the sign trick), and the rows' scales as f32. Every token of the tile then
//! streams over it with the fewest instructions a block allows: `vpmaddubsw`, `vpmaddwd`,
//! the lane offset (Q4_0, Q5_0), one conversion and one FMA per row and block.
//!
//! Per output, the arithmetic is `avx2.rs`'s dot product, operation for operation: the same
//! exact i32 lanes per block (lane j = elements 4j..4j+3), `acc = fma(d_w·d_x, lanes, acc)`,
//! `summs = fma(m_w, s_x, summs)` per row, and `hsum_f32(acc) (+ summs)`.

use std::arch::x86_64::*;

use super::avx2::hsum_f32;
use super::avx2_mat::{Legacy, TOK_TILE, fifth_0x10, packed_fifth, packed_nibbles};
use super::mat::{ActRows, BlockAux, MatOut, WeightRows};
use crate::quant::blocks::QK;

/// Token batches from this size on take the decoded path (fewer tokens do not repay the
/// decoding).
pub(super) const DECODE_MIN_TOKENS: usize = 8;

/// One block of a packed group of four rows, decoded: each row's 32 quant bytes as
/// `vpmaddubsw`'s unsigned operand (Q8_0: the magnitudes), its `d` and `m` (Q4_1, Q5_1) as
/// f32.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Decoded {
    q: [__m256i; 4],
    /// Each row's `d` in all eight lanes (one `vmulps` with `d_x` gives the product
    /// broadcast, where a shuffle and a broadcast would be two instructions).
    db: [__m256; 4],
    m: [f32; 4],
}

/// Whether `F` is Q8_0 (signed quants: the sign trick).
const fn signed<F: Legacy>() -> bool {
    F::PQ == 32
}

/// Decodes blocks `0..nb` of `G` packed groups (group `g` at `groups[g]`) into `buf`
/// (`[nb][G]`) and, for Q8_0, the signed quants into `signs`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode<F: Legacy, const G: usize>(
    groups: [*const u8; G],
    nb: usize,
    buf: &mut Vec<Decoded>,
    signs: &mut Vec<[__m256i; 4]>,
) {
    buf.clear();
    signs.clear();
    let q = 4 * F::PQ;
    for b in 0..nb {
        for &g in &groups {
            // SAFETY: block b < nb of the group exists (checked by the driver).
            unsafe {
                let p = g.add(b * 4 * F::BYTES);
                let mut e = Decoded {
                    q: [_mm256_setzero_si256(); 4],
                    db: [_mm256_setzero_ps(); 4],
                    m: [0.0; 4],
                };
                let mut d = [0f32; 4];
                _mm_storeu_ps(
                    d.as_mut_ptr(),
                    _mm_cvtph_ps(_mm_loadl_epi64(p.add(q).cast())),
                );
                e.db = d.map(|v| _mm256_set1_ps(v));
                if F::MIN {
                    _mm_storeu_ps(
                        e.m.as_mut_ptr(),
                        _mm_cvtph_ps(_mm_loadl_epi64(p.add(q + 8).cast())),
                    );
                }
                if signed::<F>() {
                    let s: [__m256i; 4] =
                        std::array::from_fn(|i| _mm256_loadu_si256(p.add(32 * i).cast()));
                    e.q = s.map(|v| _mm256_sign_epi8(v, v));
                    signs.push(s);
                } else {
                    let hi = if F::Q5 {
                        packed_fifth(p, q + if F::MIN { 16 } else { 8 })
                    } else {
                        _mm256_setzero_si256()
                    };
                    e.q = std::array::from_fn(|i| {
                        let u = packed_nibbles(p, i);
                        if F::Q5 {
                            _mm256_or_si256(u, fifth_0x10(hi, i))
                        } else {
                            u
                        }
                    });
                }
                buf.push(e);
            }
        }
    }
}

/// `4·G` decoded rows × `C` tokens over all blocks (`x[c]`: token c's activation row, `xb`
/// bytes per block, quants at `xq`; `a[c]`: its block data; `o[c]`: its lane offsets
/// `-2^SHIFT · Σy` per block, Q4_0/Q5_0). Returns `[c][g][row]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<F: Legacy, const G: usize, const C: usize>(
    wd: &[Decoded],
    sg: &[[__m256i; 4]],
    nb: usize,
    x: [*const u8; C],
    xb: usize,
    xq: usize,
    a: [*const BlockAux; C],
    o: [*const [i32; 8]; C],
) -> [[[f32; 4]; G]; C] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[[_mm256_setzero_ps(); 4]; G]; C];
    let mut summs = [[_mm_setzero_ps(); G]; C];
    for b in 0..nb {
        for c in 0..C {
            // SAFETY: block b of every token and of the decoded rows exists (the driver).
            unsafe {
                let aux = &*a[c].add(b);
                let y = _mm256_loadu_si256(x[c].add(b * xb + xq).cast());
                let off = if F::SHIFT.is_some() {
                    _mm256_loadu_si256(o[c].add(b).cast())
                } else {
                    _mm256_setzero_si256()
                };
                let dx = _mm256_set1_ps(aux.d);
                for g in 0..G {
                    let e = wd.get_unchecked(b * G + g);
                    for r in 0..4 {
                        let ys = if signed::<F>() {
                            _mm256_sign_epi8(y, sg.get_unchecked(b * G + g)[r])
                        } else {
                            y
                        };
                        let mut l = _mm256_madd_epi16(_mm256_maddubs_epi16(e.q[r], ys), ones);
                        if F::SHIFT.is_some() {
                            l = _mm256_add_epi32(l, off);
                        }
                        acc[c][g][r] = _mm256_fmadd_ps(
                            _mm256_mul_ps(e.db[r], dx),
                            _mm256_cvtepi32_ps(l),
                            acc[c][g][r],
                        );
                    }
                    if F::MIN {
                        summs[c][g] = _mm_fmadd_ps(
                            _mm_loadu_ps(e.m.as_ptr()),
                            _mm_set1_ps(aux.s),
                            summs[c][g],
                        );
                    }
                }
            }
        }
    }
    std::array::from_fn(|c| {
        std::array::from_fn(|g| {
            let mut s = [0f32; 4];
            // SAFETY: four writable floats.
            unsafe { _mm_storeu_ps(s.as_mut_ptr(), summs[c][g]) };
            std::array::from_fn(|r| {
                let h = hsum_f32(acc[c][g][r]);
                if F::MIN { h + s[r] } else { h }
            })
        })
    })
}

/// Runs [`tile`] for `C` tokens from `t` and stores the `nr` valid rows from `r0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tokens<F: Legacy, const G: usize, const C: usize>(
    wd: &[Decoded],
    sg: &[[__m256i; 4]],
    offs: &[[i32; 8]],
    x: &ActRows,
    t: usize,
    out: &mut MatOut,
    r0: usize,
    nr: usize,
) {
    let nb = wd.len() / G;
    let xb = x.dtype.type_size();
    let rb = nb * xb;
    let xq = if F::MIN { 4 } else { 2 };
    assert!(t + C <= x.n, "tokens");
    // SAFETY: tokens t..t+C exist (asserted), so these are in bounds.
    let (xp, ap) = unsafe {
        (
            std::array::from_fn(|c| x.data.as_ptr().add((t + c) * rb)),
            std::array::from_fn(|c| x.aux.as_ptr().add((t + c) * nb)),
        )
    };
    // `offs` holds the tile's tokens from `t0`; token t's offsets start at (t - t0)·nb.
    let t0 = t - t % TOK_TILE;
    assert!(
        F::SHIFT.is_none() || offs.len() >= (t + C - t0) * nb,
        "lane offsets"
    );
    let op = std::array::from_fn(|c| offs.as_ptr().wrapping_add((t + c - t0) * nb));
    // SAFETY: as above; `wd` and `sg` hold `nb` blocks of `G` groups.
    let res = unsafe { tile::<F, G, C>(wd, sg, nb, xp, xb, xq, ap, op) };
    for (c, res) in res.iter().enumerate() {
        for i in 0..nr {
            out.set(t + c, r0 + i, res[i / 4][i % 4]);
        }
    }
}

/// Runs every token of the tile `t0..t1` over the decoded rows `r0..r0 + nr`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_tokens<F: Legacy, const G: usize>(
    wd: &[Decoded],
    sg: &[[__m256i; 4]],
    offs: &[[i32; 8]],
    x: &ActRows,
    (t0, t1): (usize, usize),
    out: &mut MatOut,
    r0: usize,
    nr: usize,
) {
    // SAFETY (all calls): tokens t..t + C <= t1 <= x.n.
    unsafe {
        let mut t = t0;
        if G == 1 {
            while t + 2 <= t1 {
                tokens::<F, G, 2>(wd, sg, offs, x, t, out, r0, nr);
                t += 2;
            }
        }
        while t < t1 {
            tokens::<F, G, 1>(wd, sg, offs, x, t, out, r0, nr);
            t += 1;
        }
    }
}

/// The decoded-path matrix kernel over packed rows: token tiles of [`TOK_TILE`], groups of
/// eight rows (then four) decoded once per tile.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` is packed in `F`'s layout.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn legacy_decoded<F: Legacy>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    let nb = w.n / QK;
    assert!(w.packed && nb * QK == w.n && w.rows > 0 && w.stride == nb * 4 * F::BYTES);
    let groups = w.rows.div_ceil(4);
    assert!(w.data.len() >= groups * w.stride, "packed rows");
    assert!(x.data.len() == x.n * nb * F::XBYTES, "activation rows");
    assert!(x.aux.len() == x.n * nb, "activation block data");
    let base = w.data.as_ptr();
    let mut buf: Vec<Decoded> = Vec::with_capacity(2 * nb);
    let mut signs: Vec<[__m256i; 4]> = Vec::new();
    // `[t1 - t0][nb]` the tile's lane offsets `-2^SHIFT · Σy`, shifted once here rather than
    // once per row group.
    let mut offs: Vec<[i32; 8]> = Vec::new();
    for t0 in (0..x.n).step_by(TOK_TILE) {
        let t1 = (t0 + TOK_TILE).min(x.n);
        offs.clear();
        if let Some(sh) = F::SHIFT {
            let aux = &x.aux[t0 * nb..t1 * nb];
            offs.extend(aux.iter().map(|a| a.neg_lane_sums.map(|v| v << sh)));
        }
        let mut g = 0;
        while g < groups {
            let r0 = 4 * g;
            // SAFETY (all calls): groups g.. exist (asserted above), tokens t0..t1 too.
            unsafe {
                if g + 2 <= groups {
                    let p = [base.add(g * w.stride), base.add((g + 1) * w.stride)];
                    decode::<F, 2>(p, nb, &mut buf, &mut signs);
                    let nr = (w.rows - r0).min(8);
                    tile_tokens::<F, 2>(&buf, &signs, &offs, x, (t0, t1), out, r0, nr);
                    g += 2;
                } else {
                    decode::<F, 1>([base.add(g * w.stride)], nb, &mut buf, &mut signs);
                    let nr = (w.rows - r0).min(4);
                    tile_tokens::<F, 1>(&buf, &signs, &offs, x, (t0, t1), out, r0, nr);
                    g += 1;
                }
            }
        }
    }
}
