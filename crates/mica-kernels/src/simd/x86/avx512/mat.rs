//! AVX-512 VNNI matrix kernels (see [`crate::simd::mat`]) for the legacy formats Q4_0, Q4_1,
//! Q5_0, Q5_1 and Q8_0: four weight rows × up to four tokens per micro-kernel, on the file's
//! rows or on the packed layout of `packed.rs`.
//!
//! Per output the arithmetic is llama.cpp's `ggml_vec_dot_*` (as `x86/avx2/dot.rs` computes
//! it):
//! per block eight exact i32 lanes (lane j = elements 4j..4j+3), `acc = fma(d_w·d_x,
//! f32(lanes), acc)` in block order, the Q4_1/Q5_1 offset `summs = fma(m_w, s_x, summs)`,
//! then `hsum_float_8(acc)` (+ `summs`). What changes is only the register layout:
//!
//! - 4-bit and 5-bit formats: one zmm holds the 16-byte quant vectors of four rows (one
//!   128-bit chunk per row). Low nibbles are elements 0..15 (lanes 0..3 of each row), high
//!   nibbles elements 16..31 (lanes 4..7): two `vpdpbusd` per block give all 32 lanes of four
//!   rows, two FMAs accumulate them, scales broadcast per 128-bit chunk.
//! - Q8_0: two rows per zmm (one 256-bit half each, lanes in order).
//!
//! Weight quants enter `vpdpbusd` as unsigned bytes; the signed formats subtract their offset
//! (8, 16, 128) through the activations' negated lane sums ([`crate::simd::mat::BlockAux`]), which
//! gives the same exact i32 lanes as the sign trick. Each weight block is unpacked once and
//! reused for every token of the micro-kernel; scales of four rows are gathered in a general
//! register and converted by one `vcvtph2ps`.

use std::arch::x86_64::*;

use super::packed::{packed_quants, packed_scales};
use crate::quant::blocks::QK;
use crate::simd::mat::{ActRows, BlockAux, MatOut, WeightRows};
use crate::simd::x86::avx2::{f16x4, rd32};

/// Tokens per cache tile: their activations stay in L2 while every row group runs over them.
const TOK_TILE: usize = 64;

// ---------------------------------------------------------------------------------------------
// Loading four rows' block fields.

/// Block pointers of four weight rows (the same row repeated where fewer remain).
pub(super) type Rows4 = [*const u8; 4];

/// The 16 bytes at `off` of four blocks, one 128-bit chunk each.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn chunks4(p: &Rows4, off: usize) -> __m512i {
    // SAFETY: the caller guarantees 16 readable bytes at each pointer.
    unsafe {
        let ld = |q: *const u8| _mm_loadu_si128(q.add(off).cast());
        let v = _mm512_castsi128_si512(ld(p[0]));
        let v = _mm512_inserti32x4(v, ld(p[1]), 1);
        let v = _mm512_inserti32x4(v, ld(p[2]), 2);
        _mm512_inserti32x4(v, ld(p[3]), 3)
    }
}

/// Low and high nibbles of [`chunks4`]: elements 0..15 and 16..31 of each row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) fn nibbles4(q: __m512i) -> (__m512i, __m512i) {
    let m = _mm512_set1_epi8(0x0F);
    (
        _mm512_and_si512(q, m),
        _mm512_and_si512(_mm512_srli_epi16(q, 4), m),
    )
}

/// Adds 16 to the quants whose fifth bit (the u32 `qh` at `off`) is set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fifth_bits(p: &Rows4, off: usize, lo: __m512i, hi: __m512i) -> (__m512i, __m512i) {
    // SAFETY: the caller guarantees four readable bytes at each field.
    let h = unsafe {
        [
            rd32(p[0].add(off)),
            rd32(p[1].add(off)),
            rd32(p[2].add(off)),
            rd32(p[3].add(off)),
        ]
    }
    .map(u64::from);
    let k_lo =
        (h[0] & 0xFFFF) | (h[1] & 0xFFFF) << 16 | (h[2] & 0xFFFF) << 32 | (h[3] & 0xFFFF) << 48;
    let k_hi = (h[0] >> 16) | (h[1] >> 16) << 16 | (h[2] >> 16) << 32 | (h[3] >> 16) << 48;
    let sixteen = _mm512_set1_epi8(16);
    (
        _mm512_mask_add_epi8(lo, k_lo, lo, sixteen),
        _mm512_mask_add_epi8(hi, k_hi, hi, sixteen),
    )
}

// ---------------------------------------------------------------------------------------------
// Formats.

/// A legacy weight format as the micro-kernel sees it.
///
/// # Safety
/// `quants` and `scales` may read `BYTES` bytes at each pointer and nothing else.
pub(super) unsafe trait Legacy {
    /// Bytes per block.
    const BYTES: usize;
    /// The quants are `u - 2^SHIFT` for the unsigned bytes `quants` returns (signed
    /// formats); `None` for the unsigned formats.
    const SHIFT: Option<u32>;
    /// Whether the format has the `m·s` offset term (Q4_1, Q5_1).
    const MIN: bool;
    /// Layout: two rows per register (Q8_0) instead of four.
    const WIDE: bool;
    /// Byte offsets in a block of the quants, the min (`MIN` formats) and the fifth bits
    /// (Q5_0/Q5_1), for packing.
    const QS: usize;
    const M: usize;
    const QH: Option<usize>;
    /// The unsigned quant bytes of one block of four rows (see the module doc for the
    /// layout).
    unsafe fn quants(p: &Rows4) -> (__m512i, __m512i);
    /// `(d, m)` of four rows (m zero without `MIN`).
    unsafe fn scales(p: &Rows4) -> (__m128, __m128);
}

macro_rules! legacy_format {
    ($name:ident, $bytes:expr, shift: $shift:expr, min: $min:expr, wide: $wide:expr,
     fields: ($qs:expr, $m:expr, $qh:expr),
     |$p:ident| quants $quants:block, scales $scales:block) => {
        pub(super) struct $name;
        // SAFETY: every read below is inside the block.
        unsafe impl Legacy for $name {
            const BYTES: usize = $bytes;
            const SHIFT: Option<u32> = $shift;
            const MIN: bool = $min;
            const WIDE: bool = $wide;
            const QS: usize = $qs;
            const M: usize = $m;
            const QH: Option<usize> = $qh;
            #[inline]
            #[target_feature(enable = "avx2,avx512f,avx512bw")]
            unsafe fn quants($p: &Rows4) -> (__m512i, __m512i) {
                unsafe { $quants }
            }
            #[inline]
            #[target_feature(enable = "avx2,f16c")]
            unsafe fn scales($p: &Rows4) -> (__m128, __m128) {
                unsafe { $scales }
            }
        }
    };
}

// Q4_0: d@0, qs@2.
legacy_format!(Q4_0, 18, shift: Some(3), min: false, wide: false, fields: (2, 0, None),
    |p| quants { nibbles4(chunks4(p, 2)) }, scales { (f16x4(p, 0), _mm_setzero_ps()) });
// Q4_1: d@0, m@2, qs@4.
legacy_format!(Q4_1, 20, shift: None, min: true, wide: false, fields: (4, 2, None),
    |p| quants { nibbles4(chunks4(p, 4)) }, scales { (f16x4(p, 0), f16x4(p, 2)) });
// Q5_0: d@0, qh@2, qs@6.
legacy_format!(Q5_0, 22, shift: Some(4), min: false, wide: false, fields: (6, 0, Some(2)),
    |p| quants {
        let (lo, hi) = nibbles4(chunks4(p, 6));
        fifth_bits(p, 2, lo, hi)
    },
    scales { (f16x4(p, 0), _mm_setzero_ps()) });
// Q5_1: d@0, m@2, qh@4, qs@8.
legacy_format!(Q5_1, 24, shift: None, min: true, wide: false, fields: (8, 2, Some(4)),
    |p| quants {
        let (lo, hi) = nibbles4(chunks4(p, 8));
        fifth_bits(p, 4, lo, hi)
    },
    scales { (f16x4(p, 0), f16x4(p, 2)) });
// Q8_0: d@0, qs@2; quants + 128 as unsigned bytes.
legacy_format!(Q8_0, 34, shift: Some(7), min: false, wide: true, fields: (2, 0, None),
    |p| quants {
        let ld = |q: *const u8| _mm256_loadu_si256(q.add(2).cast());
        let flip = _mm512_set1_epi8(-128);
        let ab = _mm512_inserti64x4(_mm512_castsi256_si512(ld(p[0])), ld(p[1]), 1);
        let cd = _mm512_inserti64x4(_mm512_castsi256_si512(ld(p[2])), ld(p[3]), 1);
        (_mm512_xor_si512(ab, flip), _mm512_xor_si512(cd, flip))
    },
    scales { (f16x4(p, 0), _mm_setzero_ps()) });

// ---------------------------------------------------------------------------------------------
// The micro-kernel and its driver.

/// `hsum_float_8` of four rows whose lanes 0..3 are the 128-bit chunks of `lo` and lanes
/// 4..7 those of `hi`: `((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))` per row.
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum4(lo: __m512, hi: __m512) -> __m128 {
    let s = _mm512_add_ps(lo, hi);
    let t = _mm512_add_ps(s, _mm512_permute_ps(s, 0xEE));
    let u = _mm512_add_ps(t, _mm512_movehdup_ps(t));
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, u))
}

/// `v` lanes `i` repeated per 128-bit chunk (`[v0 ×4, v1 ×4, v2 ×4, v3 ×4]`) or, `wide`,
/// per 256-bit half of two registers.
#[inline]
#[target_feature(enable = "avx512f")]
fn spread(v: __m128, wide: bool) -> (__m512, __m512) {
    let v = _mm512_castps128_ps512(v);
    if wide {
        let ab = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let cd = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        (_mm512_permutexvar_ps(ab, v), _mm512_permutexvar_ps(cd, v))
    } else {
        let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let d = _mm512_permutexvar_ps(idx, v);
        (d, d)
    }
}

/// Four rows × `C` tokens over all `nb` blocks. `x[c]` is token c's first activation block
/// (Q8_0 or Q8_1 bytes, `xb` bytes per block, quants at `xq`), `a[c]` its block data; with
/// `PRE`, `o[c]` its lane offsets `-2^SHIFT · Σy` per block, already shifted (signed formats;
/// otherwise they are shifted here, per block). Returns the four results of each token.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<F: Legacy, const PACKED: bool, const C: usize, const PRE: bool>(
    w: &Rows4,
    nb: usize,
    x: [*const u8; C],
    xb: usize,
    xq: usize,
    a: [*const BlockAux; C],
    o: [*const [i32; 8]; C],
) -> [__m128; C] {
    let mut acc0 = [_mm512_setzero_ps(); C];
    let mut acc1 = [_mm512_setzero_ps(); C];
    let mut summs = [_mm_setzero_ps(); C];
    for b in 0..nb {
        // SAFETY: block b < nb of every row and token (checked by the driver).
        unsafe {
            let ((q0, q1), (d4, m4)) = if PACKED {
                let p = w[0].add(b * 4 * F::BYTES);
                (packed_quants::<F>(p), packed_scales::<F>(p))
            } else {
                let wb = w.map(|p| p.add(b * F::BYTES));
                (F::quants(&wb), F::scales(&wb))
            };
            let (dw0, dw1) = spread(d4, F::WIDE);
            for c in 0..C {
                let aux = &*a[c].add(b);
                let y = x[c].add(b * xb + xq);
                let (y0, y1) = if F::WIDE {
                    let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(y.cast()));
                    (v, v)
                } else {
                    (
                        _mm512_broadcast_i32x4(_mm_loadu_si128(y.cast())),
                        _mm512_broadcast_i32x4(_mm_loadu_si128(y.add(16).cast())),
                    )
                };
                // Start the lanes at -2^SHIFT · Σy (the offset of the unsigned quants).
                let (c0, c1) = match F::SHIFT {
                    None => (_mm512_setzero_si512(), _mm512_setzero_si512()),
                    Some(_) if PRE => {
                        let l = o[c].add(b).cast::<i32>();
                        if F::WIDE {
                            let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(l.cast()));
                            (v, v)
                        } else {
                            (
                                _mm512_broadcast_i32x4(_mm_loadu_si128(l.cast())),
                                _mm512_broadcast_i32x4(_mm_loadu_si128(l.add(4).cast())),
                            )
                        }
                    }
                    Some(sh) => {
                        let l = aux.neg_lane_sums.as_ptr();
                        let sh = _mm_cvtsi32_si128(sh as i32);
                        if F::WIDE {
                            let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(l.cast()));
                            let v = _mm512_sll_epi32(v, sh);
                            (v, v)
                        } else {
                            let lo = _mm512_broadcast_i32x4(_mm_loadu_si128(l.cast()));
                            let hi = _mm512_broadcast_i32x4(_mm_loadu_si128(l.add(4).cast()));
                            (_mm512_sll_epi32(lo, sh), _mm512_sll_epi32(hi, sh))
                        }
                    }
                };
                let p0 = _mm512_dpbusd_epi32(c0, q0, y0);
                let p1 = _mm512_dpbusd_epi32(c1, q1, y1);
                let dx = _mm512_set1_ps(aux.d);
                acc0[c] = _mm512_fmadd_ps(_mm512_mul_ps(dw0, dx), _mm512_cvtepi32_ps(p0), acc0[c]);
                acc1[c] = _mm512_fmadd_ps(_mm512_mul_ps(dw1, dx), _mm512_cvtepi32_ps(p1), acc1[c]);
                if F::MIN {
                    summs[c] = _mm_fmadd_ps(m4, _mm_set1_ps(aux.s), summs[c]);
                }
            }
        }
    }
    std::array::from_fn(|c| {
        let (lo, hi) = if F::WIDE {
            (
                _mm512_shuffle_f32x4(acc0[c], acc1[c], 0x88),
                _mm512_shuffle_f32x4(acc0[c], acc1[c], 0xDD),
            )
        } else {
            (acc0[c], acc1[c])
        };
        let h = hsum4(lo, hi);
        if F::MIN { _mm_add_ps(h, summs[c]) } else { h }
    })
}

/// Runs [`tile`] for `C` tokens from `t` and stores the valid rows. `offs`: the shifted
/// lane offsets of the token tile starting at `t0` (`[t1 - t0][nb]`), or empty (shifted in
/// [`tile`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tokens<F: Legacy, const PACKED: bool, const C: usize>(
    w: &Rows4,
    nb: usize,
    x: &ActRows,
    t: usize,
    (offs, t0): (&[[i32; 8]], usize),
    out: &mut MatOut,
    r0: usize,
    nr: usize,
) {
    let xb = x.dtype.type_size();
    let rb = nb * xb;
    let xq = if F::MIN { 4 } else { 2 };
    // SAFETY: tokens t..t+C exist (the driver checks), so these are in bounds.
    let (xp, ap) = unsafe {
        (
            std::array::from_fn(|c| x.data.as_ptr().add((t + c) * rb)),
            std::array::from_fn(|c| x.aux.as_ptr().add((t + c) * nb)),
        )
    };
    let pre = F::SHIFT.is_some() && !offs.is_empty();
    assert!(!pre || offs.len() >= (t + C - t0) * nb, "lane offsets");
    let op = std::array::from_fn(|c| offs.as_ptr().wrapping_add((t + c - t0) * nb));
    // SAFETY: as above; the weight pointers are checked by the driver.
    let res = unsafe {
        if pre {
            tile::<F, PACKED, C, true>(w, nb, xp, xb, xq, ap, op)
        } else {
            tile::<F, PACKED, C, false>(w, nb, xp, xb, xq, ap, op)
        }
    };
    for (c, v) in res.iter().enumerate() {
        let mut lanes = [0f32; 4];
        // SAFETY: four writable floats.
        unsafe { _mm_storeu_ps(lanes.as_mut_ptr(), *v) };
        for (i, &l) in lanes[..nr].iter().enumerate() {
            out.set(t + c, r0 + i, l);
        }
    }
}

/// The matrix kernel of a legacy format: row groups of four, tokens in tiles of
/// [`TOK_TILE`] and micro-kernel groups of four. Rows are either the file's (`w.stride`
/// bytes apart) or, `PACKED`, groups of four interleaved by `packed.rs`' `pack` (`w.stride` bytes per
/// group).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn legacy<F: Legacy, const PACKED: bool>(
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
) {
    let nb = w.n / QK;
    assert!(nb * QK == w.n && w.rows > 0 && w.packed == PACKED);
    let need = if PACKED {
        w.rows.div_ceil(4) * w.stride
    } else {
        (w.rows - 1) * w.stride + nb * F::BYTES
    };
    assert!(w.data.len() >= need, "weight rows");
    assert!(
        !PACKED || w.stride == nb * 4 * F::BYTES,
        "packed group size"
    );
    assert!(x.data.len() == x.n * nb * x.dtype.type_size() && x.aux.len() == x.n * nb);
    let base = w.data.as_ptr();
    if !F::WIDE && x.n >= DECODE_MIN_TOKENS {
        // SAFETY: the sizes are checked above.
        return unsafe { legacy_decoded::<F, PACKED>(w, x, out) };
    }
    // With several tokens, each token's lane offsets are shifted once per call (per token
    // tile) rather than once per row group (`offs`, `[t1 - t0][nb]`, as in
    // `legacy_decoded`); one token (decoding) shifts them as it goes.
    let mut offs: Vec<[i32; 8]> = Vec::new();
    for t0 in (0..x.n).step_by(TOK_TILE) {
        let t1 = (t0 + TOK_TILE).min(x.n);
        offs.clear();
        if let Some(sh) = F::SHIFT
            && t1 - t0 >= PRESHIFT_MIN_TOKENS
        {
            let aux = &x.aux[t0 * nb..t1 * nb];
            offs.extend(aux.iter().map(|a| a.neg_lane_sums.map(|v| v << sh)));
        }
        let o = (offs.as_slice(), t0);
        for r0 in (0..w.rows).step_by(4) {
            let nr = (w.rows - r0).min(4);
            // SAFETY: rows r0..r0+nr exist; missing rows repeat the last one (packed: the
            // group's base, its padding rows repeat the last row too).
            let rows: Rows4 = std::array::from_fn(|i| unsafe {
                if PACKED {
                    base.add(r0 / 4 * w.stride)
                } else {
                    base.add((r0 + i.min(nr - 1)) * w.stride)
                }
            });
            let mut t = t0;
            // SAFETY (all calls): tokens t..t+C < t1 <= x.n.
            unsafe {
                while t + 4 <= t1 {
                    tokens::<F, PACKED, 4>(&rows, nb, x, t, o, out, r0, nr);
                    t += 4;
                }
                match t1 - t {
                    3 => tokens::<F, PACKED, 3>(&rows, nb, x, t, o, out, r0, nr),
                    2 => tokens::<F, PACKED, 2>(&rows, nb, x, t, o, out, r0, nr),
                    1 => tokens::<F, PACKED, 1>(&rows, nb, x, t, o, out, r0, nr),
                    _ => {}
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Prefill: row groups decoded once per token tile.
//
// For a batch of prompt tokens, unpacking every weight block again for each group of four
// tokens (nibbles, fifth bits, four f16 scales gathered through general registers) costs
// more than the products themselves. Here each group of eight rows is decoded once per token
// tile into a small buffer (quants as the unsigned bytes `Legacy::quants` gives, scales
// converted and spread), which every group of four tokens of the tile then streams from
// L1/L2. The per-token work shares the activation loads and offsets between the two groups
// of four rows. Per output, the arithmetic is `tile`'s, operation for operation.

/// Token batches from this size on take the decoded path (fewer tokens do not repay the
/// decoding: with 8 and 12 tokens, the four-token micro-kernels ran 10-16% and 5-7% faster
/// than the decoded path on Q5_0 at Qwen2.5-Coder-0.5B's shapes, `examples/verify_kernels.rs`,
/// AMD EPYC, one thread; speculative verification passes have a handful of tokens).
const DECODE_MIN_TOKENS: usize = 16;

/// Token tiles from this size on have their lane offsets shifted once per call.
const PRESHIFT_MIN_TOKENS: usize = 2;

/// One block of eight weight rows, decoded: the quants of rows 0..4 (low, high halves) and
/// of rows 4..8, each group's `d` spread per 128-bit chunk ([`spread`]) and its `m` (Q4_1,
/// Q5_1; zero otherwise).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Decoded {
    q: [__m512i; 4],
    d: [__m512; 2],
    m: __m256,
}

/// Decodes blocks `0..nb` of two groups of four rows into `buf` (`PACKED`: each group's
/// `Rows4` is its packed group, four times).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn decode8<F: Legacy, const PACKED: bool>(
    rows: &[Rows4; 2],
    nb: usize,
    buf: &mut Vec<Decoded>,
) {
    buf.clear();
    for b in 0..nb {
        // SAFETY: block b < nb of every row (checked by the driver).
        let ((qa, da), (qb, db)) = unsafe {
            let g = |r: &Rows4| {
                if PACKED {
                    let p = r[0].add(b * 4 * F::BYTES);
                    (packed_quants::<F>(p), packed_scales::<F>(p))
                } else {
                    let wb = r.map(|p| p.add(b * F::BYTES));
                    (F::quants(&wb), F::scales(&wb))
                }
            };
            (g(&rows[0]), g(&rows[1]))
        };
        buf.push(Decoded {
            q: [qa.0, qa.1, qb.0, qb.1],
            d: [spread(da.0, false).0, spread(db.0, false).0],
            m: _mm256_set_m128(db.1, da.1),
        });
    }
}

/// Eight decoded rows × `C` tokens over all blocks of `wd` (`x`, `xb`, `xq`, `a` as in
/// [`tile`]; `o[c]`: token c's lane offsets `-2^SHIFT · Σy` per block, signed formats).
/// Returns the four results of rows 0..4 and of rows 4..8 for each token.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile8<F: Legacy, const C: usize>(
    wd: &[Decoded],
    x: [*const u8; C],
    xb: usize,
    xq: usize,
    a: [*const BlockAux; C],
    o: [*const [i32; 8]; C],
) -> [[__m128; C]; 2] {
    let mut acc0 = [[_mm512_setzero_ps(); C]; 2];
    let mut acc1 = [[_mm512_setzero_ps(); C]; 2];
    let mut summs = [_mm256_setzero_ps(); C];
    for (b, e) in wd.iter().enumerate() {
        for c in 0..C {
            // SAFETY: block b of every token exists (checked by the driver).
            unsafe {
                let aux = &*a[c].add(b);
                let y = x[c].add(b * xb + xq);
                let y0 = _mm512_broadcast_i32x4(_mm_loadu_si128(y.cast()));
                let y1 = _mm512_broadcast_i32x4(_mm_loadu_si128(y.add(16).cast()));
                // Start the lanes at -2^SHIFT · Σy (the offset of the unsigned quants).
                let (c0, c1) = if F::SHIFT.is_some() {
                    let l = o[c].add(b).cast::<i32>();
                    (
                        _mm512_broadcast_i32x4(_mm_loadu_si128(l.cast())),
                        _mm512_broadcast_i32x4(_mm_loadu_si128(l.add(4).cast())),
                    )
                } else {
                    (_mm512_setzero_si512(), _mm512_setzero_si512())
                };
                let dx = _mm512_set1_ps(aux.d);
                for g in 0..2 {
                    let p0 = _mm512_dpbusd_epi32(c0, e.q[2 * g], y0);
                    let p1 = _mm512_dpbusd_epi32(c1, e.q[2 * g + 1], y1);
                    let d = _mm512_mul_ps(e.d[g], dx);
                    acc0[g][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p0), acc0[g][c]);
                    acc1[g][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p1), acc1[g][c]);
                }
                if F::MIN {
                    summs[c] = _mm256_fmadd_ps(e.m, _mm256_set1_ps(aux.s), summs[c]);
                }
            }
        }
    }
    std::array::from_fn(|g| {
        std::array::from_fn(|c| {
            let h = hsum4(acc0[g][c], acc1[g][c]);
            if F::MIN {
                let s = if g == 0 {
                    _mm256_castps256_ps128(summs[c])
                } else {
                    _mm256_extractf128_ps(summs[c], 1)
                };
                _mm_add_ps(h, s)
            } else {
                h
            }
        })
    })
}

/// Runs [`tile8`] for `C` tokens from `t` and stores the `nr` valid rows from `r0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tokens8<F: Legacy, const C: usize>(
    wd: &[Decoded],
    offs: &[[i32; 8]],
    x: &ActRows,
    t: usize,
    out: &mut MatOut,
    r0: usize,
    nr: usize,
) {
    let nb = wd.len();
    let xb = x.dtype.type_size();
    let rb = nb * xb;
    let xq = if F::MIN { 4 } else { 2 };
    // SAFETY: tokens t..t+C exist (the driver checks), so these are in bounds.
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
    // SAFETY: as above.
    let res = unsafe { tile8::<F, C>(wd, xp, xb, xq, ap, op) };
    for c in 0..C {
        let mut lanes = [0f32; 8];
        // SAFETY: eight writable floats.
        unsafe {
            _mm_storeu_ps(lanes.as_mut_ptr(), res[0][c]);
            _mm_storeu_ps(lanes.as_mut_ptr().add(4), res[1][c]);
        }
        for (i, &l) in lanes[..nr].iter().enumerate() {
            out.set(t + c, r0 + i, l);
        }
    }
}

/// The decoded-path driver of [`legacy`] (4- and 5-bit formats, the file's layout or
/// packed): token tiles of [`TOK_TILE`], row groups of eight decoded once per tile,
/// micro-kernels of four tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn legacy_decoded<F: Legacy, const PACKED: bool>(
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
) {
    let nb = w.n / QK;
    let base = w.data.as_ptr();
    let mut buf: Vec<Decoded> = Vec::with_capacity(nb);
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
        for r0 in (0..w.rows).step_by(8) {
            let nr = (w.rows - r0).min(8);
            // SAFETY: rows r0..r0+nr exist (checked by `legacy`); missing rows repeat the
            // last one (packed: a missing second group repeats the first, whose padding rows
            // repeat the last row).
            let rows: [Rows4; 2] = std::array::from_fn(|g| {
                std::array::from_fn(|i| unsafe {
                    if PACKED {
                        let last = (w.rows - 1) / 4;
                        base.add((r0 / 4 + g).min(last) * w.stride)
                    } else {
                        base.add((r0 + (4 * g + i).min(nr - 1)) * w.stride)
                    }
                })
            });
            // SAFETY (all calls): blocks 0..nb of the rows; tokens t..t+C < t1 <= x.n.
            unsafe {
                decode8::<F, PACKED>(&rows, nb, &mut buf);
                let mut t = t0;
                while t + 4 <= t1 {
                    tokens8::<F, 4>(&buf, &offs, x, t, out, r0, nr);
                    t += 4;
                }
                match t1 - t {
                    3 => tokens8::<F, 3>(&buf, &offs, x, t, out, r0, nr),
                    2 => tokens8::<F, 2>(&buf, &offs, x, t, out, r0, nr),
                    1 => tokens8::<F, 1>(&buf, &offs, x, t, out, r0, nr),
                    _ => {}
                }
            }
        }
    }
}
