//! The k-quants' prompt kernel on AVX-512 VNNI: sixteen weight rows interleaved once per
//! token tile, then one `vpdpbusd` per four elements of sixteen rows and one token.
//!
//! `kmat.rs`' batch micro-kernels multiply each row's unpacked super-block with each token's
//! activations in element order (`vpmaddubsw` + `vpdpwssd` per 64 elements) and then reduce
//! the sixteen outputs' lanes with a transposing add tree. Here a token tile's sixteen rows
//! are first rearranged ([`Inter`]): register `q[e]` holds, in lane r, the four unsigned
//! quants of elements 4e..4e+3 of row r. A token's four activation bytes of those elements,
//! broadcast, meet all sixteen rows in one `vpdpbusd`, whose lanes are the outputs
//! themselves: no reduction, and the scales apply per 16- or 32-element group with one
//! `vpmulld` on the group's sums. The weights of a super-block (5.6 KiB) are read from
//! L1/L2 once per four tokens.
//!
//! The integer sums are those of `kmat.rs` (exact; only their order differs), and the float
//! steps per output are the path's own ([`BatchPath::step`], one output per f32 lane), so
//! every output is bit-identical to `kmat.rs`' and to the scalar paths.

use std::arch::x86_64::*;

use super::kmat::{BatchPath, Rows, Scales, XB, XBS, XQ, f16_lanes};
use super::kunpack::{KFormat, Unpacked};
use crate::quant::blocks::QK_K;
use crate::simd::mat::{ActRows, MatOut, WeightRows};
use crate::simd::x86::avx2::rd32;

/// Rows interleaved together (one per i32 lane).
const ROWS: usize = 16;

/// One super-block of sixteen rows, interleaved (lane r: row r).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Inter {
    /// `q[e]`: the unsigned quants of elements 4e..4e+3.
    q: [__m512i; 64],
    /// `sc[g]`: the scale of elements 16g..16g+15, as i32.
    sc: [__m512i; 16],
    /// `groups[i]`: the group values 2i and 2i+1 (`Unpacked::groups`) as two i16.
    groups: [__m512i; 8],
    /// `d` and `dmin` (zero without mins).
    dw: __m512,
    dmin: __m512,
}

/// Staging for [`interleave`]: sixteen rows' unpacked fields in memory, row by row.
#[repr(C, align(64))]
struct Stage {
    q: [[u8; 256]; ROWS],
    sc: [[i16; 128]; ROWS],
    groups: [[i16; 16]; ROWS],
}

/// Interleaves block `b` of the sixteen rows at `rows` (block pointers of block 0; row i's
/// block b at `rows[i] + b·step`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn interleave<F: KFormat>(rows: &[*const u8; ROWS], stage: &mut Stage) -> Inter {
    for (i, &p) in rows.iter().enumerate() {
        // SAFETY: the caller passes whole blocks.
        let u: Unpacked = unsafe { F::unpack(p) };
        for k in 0..4 {
            // SAFETY: 64 writable bytes each.
            unsafe {
                _mm512_storeu_si512(stage.q[i][64 * k..].as_mut_ptr().cast(), u.q[k]);
                _mm512_storeu_si512(stage.sc[i][32 * k..].as_mut_ptr().cast(), u.sc[k]);
            }
        }
        // SAFETY: 32 writable bytes.
        unsafe { _mm256_storeu_si256(stage.groups[i].as_mut_ptr().cast(), u.groups) };
    }
    let lane = |stride: i32| _mm512_mullo_epi32(_mm512_set1_epi32(stride), lane_index());
    let (isc, ig) = (lane(256), lane(32));
    let mut q = [_mm512_setzero_si512(); 64];
    for (k, q) in q.chunks_exact_mut(16).enumerate() {
        // SAFETY: 64 readable bytes per row.
        let rows = std::array::from_fn(|r| unsafe {
            _mm512_loadu_si512(stage.q[r][64 * k..].as_ptr().cast())
        });
        q.copy_from_slice(&transpose16(rows));
    }
    // SAFETY (gathers): lane r reads 4 bytes inside row r's staged fields.
    unsafe {
        // Group g's scale: i16 lane 8·(g % 4) of register g / 4 (low half of the dword).
        let sc = std::array::from_fn(|g| {
            let at = stage.sc[0].as_ptr().add(32 * (g / 4) + 8 * (g % 4));
            let v = _mm512_i32gather_epi32::<1>(isc, at.cast());
            _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16)
        });
        let groups = std::array::from_fn(|i| {
            _mm512_i32gather_epi32::<1>(ig, stage.groups[0].as_ptr().add(2 * i).cast())
        });
        Inter {
            q,
            sc,
            groups,
            dw: f16_lanes(rows, F::D, 1),
            dmin: if F::MIN {
                f16_lanes(rows, F::DMIN, 1)
            } else {
                _mm512_setzero_ps()
            },
        }
    }
}

/// A 16 × 16 transpose of i32 elements: lane r of output d is lane d of input r.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(a: [__m512i; 16]) -> [__m512i; 16] {
    // t[2i], t[2i+1]: rows 2i and 2i+1 interleaved (columns 4L, 4L+1 and 4L+2, 4L+3 of
    // each 128-bit chunk L).
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (x, y) = (a[i & !1], a[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(x, y)
        } else {
            _mm512_unpackhi_epi32(x, y)
        }
    });
    // u[4i+j], chunk L: rows 4i..4i+3 at column 4L+j.
    let u: [__m512i; 16] = std::array::from_fn(|n| {
        let (i, j) = (n / 4, n % 4);
        let (x, y) = (t[4 * i + j / 2], t[4 * i + 2 + j / 2]);
        if j % 2 == 0 {
            _mm512_unpacklo_epi64(x, y)
        } else {
            _mm512_unpackhi_epi64(x, y)
        }
    });
    // Output 4L+j gathers chunk L of u[j], u[4+j], u[8+j], u[12+j].
    let mut out = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
        let v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
        let w0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        let w1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
        out[j] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        out[4 + j] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        out[8 + j] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        out[12 + j] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
    out
}

/// `[0, 1, …, 15]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lane_index() -> __m512i {
    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
}

/// Sixteen rows × `C` tokens over all super-blocks (`it`): the path's result per output,
/// `[c]` lane r.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn micro<F: KFormat, P: BatchPath, const C: usize>(
    it: &[Inter],
    x: [*const u8; C],
) -> [__m512; C] {
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); 2]; C];
    for (b, blk) in it.iter().enumerate() {
        // SAFETY: tokens hold `it.len()` Q8_K blocks (checked by the driver).
        let xb = x.map(|p| unsafe { p.add(b * XB) });
        // The broadcast activation dword at byte `off` of token c's block.
        let bc = |c: usize, off: usize| {
            // SAFETY: `off` < XB.
            _mm512_set1_epi32(unsafe { rd32(xb[c].add(off)) } as i32)
        };
        let mut isum = [zero; C];
        let mut imin = [zero; C];
        for k in 0..4 {
            // Σ sc·q·a over elements 64k..64k+64, per scale group.
            let mut part = [zero; C];
            let (groups, per) = if F::SC32 { (2, 8) } else { (4, 4) };
            for j in 0..groups {
                let mut s = [zero; C];
                let e0 = 16 * k + per * j;
                for e in e0..e0 + per {
                    let wv = blk.q[e];
                    for (c, s) in s.iter_mut().enumerate() {
                        *s = _mm512_dpbusd_epi32(*s, wv, bc(c, XQ + 4 * e));
                    }
                }
                let scv = blk.sc[e0 / 4];
                for (p, s) in part.iter_mut().zip(s) {
                    *p = _mm512_add_epi32(*p, _mm512_mullo_epi32(s, scv));
                }
            }
            // Σ groups·bsums over the same elements (groups 4k..4k+4).
            let mut mn = [zero; C];
            for i in 2 * k..2 * k + 2 {
                let gv = blk.groups[i];
                for (c, m) in mn.iter_mut().enumerate() {
                    *m = _mm512_dpwssd_epi32(*m, gv, bc(c, XBS + 4 * i));
                }
            }
            if !F::MIN {
                // A correction of the main sum (offset quants), not a separate one.
                for (p, m) in part.iter_mut().zip(&mut mn) {
                    *p = _mm512_add_epi32(*p, *m);
                    *m = zero;
                }
            }
            for c in 0..C {
                if P::PARTS {
                    let d = scales::<C>(blk, &xb, c);
                    let min = F::MIN.then(|| _mm512_cvtepi32_ps(mn[c]));
                    P::step(&mut acc[c], _mm512_cvtepi32_ps(part[c]), min, &d);
                } else {
                    isum[c] = _mm512_add_epi32(isum[c], part[c]);
                    imin[c] = _mm512_add_epi32(imin[c], mn[c]);
                }
            }
        }
        if !P::PARTS {
            for c in 0..C {
                let d = scales::<C>(blk, &xb, c);
                let min = F::MIN.then(|| _mm512_cvtepi32_ps(imin[c]));
                P::step(&mut acc[c], _mm512_cvtepi32_ps(isum[c]), min, &d);
            }
        }
    }
    acc.map(|a| P::result(&a))
}

/// The float scales of one super-block for token c: the rows' `d`, `dmin` per lane and the
/// token's `d`.
#[inline(always)]
fn scales<const C: usize>(blk: &Inter, xb: &[*const u8; C], c: usize) -> Scales {
    // SAFETY: Q8_K blocks start with their f32 scale; AVX-512F is enabled in the caller.
    unsafe {
        Scales {
            dw: blk.dw,
            dmin: blk.dmin,
            dx: _mm512_set1_ps(xb[c].cast::<f32>().read_unaligned()),
        }
    }
}

/// Token tiles from this size on take this kernel (the interleaving is paid once per tile
/// and row group).
pub(super) const MIN_TOKENS: usize = 16;

/// Tokens `t0..t1` (a tile) of the batch path `P`, rows in groups of sixteen, each group
/// interleaved once into `buf`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn tile<F: KFormat, P: BatchPath>(
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
    (t0, t1): (usize, usize),
    buf: &mut Vec<Inter>,
) {
    let nb = w.n / QK_K;
    let rows = Rows::<F>::new(w);
    let mut stage = Box::new(Stage {
        q: [[0; 256]; ROWS],
        sc: [[0; 128]; ROWS],
        groups: [[0; 16]; ROWS],
    });
    let xrow = |t: usize| {
        assert!(t < x.n);
        // SAFETY: token t's blocks are inside the activations (checked by the caller).
        unsafe { x.data.as_ptr().add(t * nb * XB) }
    };
    for r0 in (0..w.rows).step_by(ROWS) {
        let nr = (w.rows - r0).min(ROWS);
        // Missing rows repeat the last.
        let base: [*const u8; ROWS] = std::array::from_fn(|i| rows.at(r0 + i.min(nr - 1)));
        buf.clear();
        for b in 0..nb {
            // SAFETY: block b of each row is inside the weights (checked by the caller).
            let p = base.map(|p| unsafe { p.add(b * rows.step) });
            buf.push(unsafe { interleave::<F>(&p, &mut stage) });
        }
        let mut t = t0;
        let mut store = |t: usize, res: &[__m512]| {
            for (c, v) in res.iter().enumerate() {
                let mut lanes = [0f32; ROWS];
                // SAFETY: 16 writable floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
                for (r, &l) in lanes[..nr].iter().enumerate() {
                    out.set(t + c, r0 + r, l);
                }
            }
        };
        // SAFETY (all calls): tokens t..t+C < t1 <= x.n; `buf` holds all nb blocks.
        unsafe {
            while t1 - t >= 4 {
                let res = micro::<F, P, 4>(buf, std::array::from_fn(|c| xrow(t + c)));
                store(t, &res);
                t += 4;
            }
            match t1 - t {
                3 => store(
                    t,
                    &micro::<F, P, 3>(buf, std::array::from_fn(|c| xrow(t + c))),
                ),
                2 => store(
                    t,
                    &micro::<F, P, 2>(buf, std::array::from_fn(|c| xrow(t + c))),
                ),
                1 => store(t, &micro::<F, P, 1>(buf, [xrow(t)])),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_transposes() {
        if !std::is_x86_feature_detected!("avx512f") {
            println!("SKIPPED: avx512 (this CPU lacks it)");
            return;
        }
        let m: [[i32; 16]; 16] =
            std::array::from_fn(|r| std::array::from_fn(|c| 100 * r as i32 + c as i32));
        // SAFETY: AVX-512F was detected; 64-byte loads and stores of the arrays.
        let out = unsafe {
            let rows = m.map(|r| _mm512_loadu_si512(r.as_ptr().cast()));
            transpose16(rows).map(|v| {
                let mut o = [0i32; 16];
                _mm512_storeu_si512(o.as_mut_ptr().cast(), v);
                o
            })
        };
        for (d, o) in out.iter().enumerate() {
            for (r, &x) in o.iter().enumerate() {
                assert_eq!(x, m[r][d], "output {d} lane {r}");
            }
        }
    }
}
