//! The AVX-512 VNNI prompt kernel of the legacy formats on [`DotPath::PerBlock`]: sixteen
//! weight rows in the sixteen lanes of a register, one exact integer sum per 32-element
//! block and row, one FMA per block.
//!
//! llama.cpp's arithmetic for these formats (`mat.rs`, [`DotPath::VecDot`]) keeps eight f32
//! lanes per row and block: per block and row eight conversions and eight FMAs against four
//! byte products' worth of `vpdpbusd` — two thirds of a prompt product's instructions are
//! those float steps. On `PerBlock` each output is instead
//! `acc = fma(d_w·d_x, f32(Σ q·y), acc)` per block (then `acc = fma(m_w, s_x, acc)` for
//! Q4_1/Q5_1), the sum exact in i32 — the arithmetic of the scalar reference
//! `paths::per_block_dot`, which this kernel reproduces bit for bit.
//!
//! Layout: per token tile ([`TOK_TILE`] tokens) each group of sixteen rows is decoded once
//! into [`Block16`]s: register `q[k]`, lane r = the unsigned quants of elements 4k..4k+3 of
//! row r (`Legacy::quants`' bytes, transposed from four rows per register by
//! [`transpose4x4`]), the rows' `d` and `m` as f32 lanes. A micro-kernel of four tokens then
//! runs eight `vpdpbusd` per block and token (the token's four activation bytes broadcast),
//! started from `-2^SHIFT · Σy` for the signed formats (`Σ (u - 2^SHIFT)·y = Σ u·y -
//! 2^SHIFT·Σ y`, exact), one conversion, one multiply and one FMA for sixteen rows.

use std::arch::x86_64::*;

use super::mat::{Legacy, Rows4};
use super::packed::{packed_quants, packed_scales};
use crate::quant::blocks::QK;
use crate::simd::mat::{ActRows, BlockAux, MatOut, WeightRows};
use crate::simd::x86::avx2::rd32;

#[cfg(doc)]
use crate::simd::DotPath;

/// Tokens per cache tile: their activations stay in L2 while every row group runs over them.
const TOK_TILE: usize = 64;

/// One block of sixteen weight rows, decoded (see the module doc).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block16 {
    q: [__m512i; 8],
    d: __m512,
    m: __m512,
}

/// The quants of four rows' block `b` as `(lo, hi)`, 128-bit chunk i = row i, dword j of `lo`
/// = elements 4j..4j+3 and of `hi` = elements 16+4j..16+4j+3 (unsigned bytes), and the rows'
/// `(d, m)`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn quads<F: Legacy, const PACKED: bool>(
    r: &Rows4,
    b: usize,
) -> ((__m512i, __m512i), (__m128, __m128)) {
    // SAFETY: block b of the rows exists (the caller checks).
    let ((q0, q1), s) = unsafe {
        if PACKED {
            let p = r[0].add(b * 4 * F::BYTES);
            (packed_quants::<F>(p), packed_scales::<F>(p))
        } else {
            let wb = r.map(|p| p.add(b * F::BYTES));
            (F::quants(&wb), F::scales(&wb))
        }
    };
    if F::WIDE {
        // Q8_0: rows 0, 1 in `q0`, rows 2, 3 in `q1`, 32 bytes each.
        let lo = _mm512_shuffle_i64x2(q0, q1, 0b10_00_10_00);
        let hi = _mm512_shuffle_i64x2(q0, q1, 0b11_01_11_01);
        ((lo, hi), s)
    } else {
        ((q0, q1), s)
    }
}

/// Four registers of four rows each (`v[g]`, dword 4i+j = row 4g+i, dword j) to four of
/// sixteen rows: `out[j]` lane 4g+i = `v[g]` dword 4i+j.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose4x4(v: [__m512i; 4]) -> [__m512i; 4] {
    let i01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    let i23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    let ab01 = _mm512_permutex2var_epi32(v[0], i01, v[1]);
    let ab23 = _mm512_permutex2var_epi32(v[0], i23, v[1]);
    let cd01 = _mm512_permutex2var_epi32(v[2], i01, v[3]);
    let cd23 = _mm512_permutex2var_epi32(v[2], i23, v[3]);
    [
        _mm512_shuffle_i64x2(ab01, cd01, 0b01_00_01_00),
        _mm512_shuffle_i64x2(ab01, cd01, 0b11_10_11_10),
        _mm512_shuffle_i64x2(ab23, cd23, 0b01_00_01_00),
        _mm512_shuffle_i64x2(ab23, cd23, 0b11_10_11_10),
    ]
}

/// `[a | b | c | d]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn join4(v: [__m128; 4]) -> __m512 {
    let x = _mm512_castps128_ps512(v[0]);
    let x = _mm512_insertf32x4(x, v[1], 1);
    let x = _mm512_insertf32x4(x, v[2], 2);
    _mm512_insertf32x4(x, v[3], 3)
}

/// Decodes blocks `0..nb` of four groups of four rows into `buf`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn decode16<F: Legacy, const PACKED: bool>(
    rows: &[Rows4; 4],
    nb: usize,
    buf: &mut Vec<Block16>,
) {
    let zero = Block16 {
        q: [_mm512_setzero_si512(); 8],
        d: _mm512_setzero_ps(),
        m: _mm512_setzero_ps(),
    };
    buf.resize(nb, zero);
    for (b, e) in buf.iter_mut().enumerate() {
        // SAFETY: block b < nb of every row (checked by the driver).
        let g = rows.map(|r| unsafe { quads::<F, PACKED>(&r, b) });
        // Stored field by field: building a `Block16` and moving it in costs a 640-byte
        // copy per block.
        let lo = transpose4x4(g.map(|x| x.0.0));
        let hi = transpose4x4(g.map(|x| x.0.1));
        e.q[..4].copy_from_slice(&lo);
        e.q[4..].copy_from_slice(&hi);
        e.d = join4(g.map(|x| x.1.0));
        e.m = join4(g.map(|x| x.1.1));
    }
}

/// Sixteen decoded rows × `C` tokens over all blocks of `wd`: `x[c]` token c's first
/// activation block (`xb` bytes per block, quants at `xq`), `a[c]` its block data, `o[c]` its
/// per-block offsets `-2^SHIFT · Σy` (signed formats). Returns each token's sixteen results.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile16<F: Legacy, const C: usize>(
    wd: &[Block16],
    x: [*const u8; C],
    xb: usize,
    xq: usize,
    a: [*const BlockAux; C],
    o: [*const i32; C],
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    for (b, e) in wd.iter().enumerate() {
        for c in 0..C {
            // SAFETY: block b of every token exists (checked by the driver).
            unsafe {
                let y = x[c].add(b * xb + xq);
                let yk = |k: usize| _mm512_set1_epi32(rd32(y.add(4 * k)) as i32);
                let init = if F::SHIFT.is_some() {
                    _mm512_set1_epi32(*o[c].add(b))
                } else {
                    _mm512_setzero_si512()
                };
                let mut s0 = _mm512_dpbusd_epi32(init, e.q[0], yk(0));
                let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), e.q[1], yk(1));
                s0 = _mm512_dpbusd_epi32(s0, e.q[2], yk(2));
                s1 = _mm512_dpbusd_epi32(s1, e.q[3], yk(3));
                s0 = _mm512_dpbusd_epi32(s0, e.q[4], yk(4));
                s1 = _mm512_dpbusd_epi32(s1, e.q[5], yk(5));
                s0 = _mm512_dpbusd_epi32(s0, e.q[6], yk(6));
                s1 = _mm512_dpbusd_epi32(s1, e.q[7], yk(7));
                let s = _mm512_add_epi32(s0, s1);
                let aux = &*a[c].add(b);
                let d = _mm512_mul_ps(e.d, _mm512_set1_ps(aux.d));
                acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[c]);
                if F::MIN {
                    acc[c] = _mm512_fmadd_ps(e.m, _mm512_set1_ps(aux.s), acc[c]);
                }
            }
        }
    }
    acc
}

/// Runs [`tile16`] for `C` tokens from `t` and stores the `nr` valid rows from `r0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tokens16<F: Legacy, const C: usize>(
    wd: &[Block16],
    (offs, t0): (&[i32], usize),
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
    assert!(
        F::SHIFT.is_none() || offs.len() >= (t + C - t0) * nb,
        "block offsets"
    );
    // SAFETY: tokens t..t+C exist (the driver checks), so these are in bounds.
    let (xp, ap) = unsafe {
        (
            std::array::from_fn(|c| x.data.as_ptr().add((t + c) * rb)),
            std::array::from_fn(|c| x.aux.as_ptr().add((t + c) * nb)),
        )
    };
    let op = std::array::from_fn(|c| offs.as_ptr().wrapping_add((t + c - t0) * nb));
    // SAFETY: as above.
    let res = unsafe { tile16::<F, C>(wd, xp, xb, xq, ap, op) };
    for (c, v) in res.iter().enumerate() {
        let mut lanes = [0f32; 16];
        // SAFETY: sixteen writable floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
        out.set_run(t + c, r0, &lanes[..nr]);
    }
}

/// The matrix kernel of a legacy format on `PerBlock`: token tiles of [`TOK_TILE`], row groups
/// of sixteen decoded once per tile, micro-kernels of four tokens. Rows are the file's
/// (`w.stride` bytes apart) or, `PACKED`, `packed.rs`' groups of four (`w.stride` bytes per
/// group).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn per_block<F: Legacy, const PACKED: bool>(
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
    let mut buf: Vec<Block16> = Vec::with_capacity(nb);
    // `[t1 - t0][nb]`: each block's offset `-2^SHIFT · Σy`, once per token tile.
    let mut offs: Vec<i32> = Vec::new();
    for t0 in (0..x.n).step_by(TOK_TILE) {
        let t1 = (t0 + TOK_TILE).min(x.n);
        offs.clear();
        if let Some(sh) = F::SHIFT {
            let aux = &x.aux[t0 * nb..t1 * nb];
            offs.extend(
                aux.iter()
                    .map(|a| a.neg_lane_sums.iter().sum::<i32>() << sh),
            );
        }
        let o = (offs.as_slice(), t0);
        for r0 in (0..w.rows).step_by(16) {
            let nr = (w.rows - r0).min(16);
            // SAFETY: rows r0..r0+nr exist (checked above); missing rows repeat the last one
            // (packed: missing groups repeat the last group, whose padding rows repeat the
            // last row).
            let rows: [Rows4; 4] = std::array::from_fn(|g| {
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
                decode16::<F, PACKED>(&rows, nb, &mut buf);
                let mut t = t0;
                while t + 4 <= t1 {
                    tokens16::<F, 4>(&buf, o, x, t, out, r0, nr);
                    t += 4;
                }
                match t1 - t {
                    3 => tokens16::<F, 3>(&buf, o, x, t, out, r0, nr),
                    2 => tokens16::<F, 2>(&buf, o, x, t, out, r0, nr),
                    1 => tokens16::<F, 1>(&buf, o, x, t, out, r0, nr),
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose4x4_puts_row_r_dword_j_in_lane_r_of_register_j() {
        if !super::super::supported() {
            eprintln!("SKIPPED: no AVX-512 on this CPU");
            return;
        }
        // v[g] dword 4i+j = 100·(4g+i) + j.
        let v: [__m512i; 4] = std::array::from_fn(|g| {
            let d: [i32; 16] =
                std::array::from_fn(|p| 100 * (4 * g + p / 4) as i32 + (p % 4) as i32);
            // SAFETY: 64 readable bytes.
            unsafe { _mm512_loadu_si512(d.as_ptr().cast()) }
        });
        // SAFETY: AVX-512 F checked above.
        let t = unsafe { transpose4x4(v) };
        for (j, r) in t.iter().enumerate() {
            let mut d = [0i32; 16];
            // SAFETY: 64 writable bytes.
            unsafe { _mm512_storeu_si512(d.as_mut_ptr().cast(), *r) };
            let want: [i32; 16] = std::array::from_fn(|r| 100 * r as i32 + j as i32);
            assert_eq!(d, want, "register {j}");
        }
    }
}
