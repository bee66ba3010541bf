//! The register-blocked prompt attention kernel ([`tile_fast`]): the plain kernel's
//! arithmetic (`super::tile_body`, its reference), element for element in the same order,
//! with two query rows per key-tile pass, scores and output chunks held in registers, and
//! each cache row converted to f32 once per batch ([`TileScratch::begin_batch`]).
//!
//! Only the x86 tiers dispatch to it (`super::pick_tile_fn`); elsewhere the plain kernel runs
//! and this one is built for its tests.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

#[cfg(target_arch = "x86_64")]
use super::softmax_step_avx512;
use super::{KV_TILE, KvElem, KvHead, ScoreMod, TileScratch, softmax_step};

/// [`super::tile_body`] with the same operations on every element, in the same order, arranged
/// for registers: two query rows share each key-tile load and their 2 × [`KV_TILE`] scores
/// stay in registers across the head dimension (twice the independent FMA chains of one
/// row), and the value accumulation keeps a chunk of the output row in registers across the
/// visible positions instead of loading and storing it for each one. Bit-identical to
/// [`super::tile_body`] (tested).
#[inline(always)]
pub(super) fn tile_fast<T: KvElem, const AVX512: bool>(
    kv: &KvHead<T>,
    q: &[f32],
    pos: &[usize],
    sm: &ScoreMod,
    s: &mut TileScratch,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let rows = pos.len();
    let n_kv = pos.iter().copied().max().map_or(0, |p| p + 1);
    s.prepare(kv, n_kv);
    // Taken out for the duration, so the per-row state can be borrowed mutably beside them.
    let (pk, pv) = (std::mem::take(&mut s.pk), std::mem::take(&mut s.pv));
    s.start_rows(rows, hd);

    let mut ic = 0;
    while ic < n_kv {
        let tile = KV_TILE.min(n_kv - ic);
        // This key tile (transposed) and value tile: `tile_body`'s f32 values, prepared once.
        let kt = &pk[ic * hd..(ic + KV_TILE) * hd];
        let vt = &pv[ic * hd..(ic + KV_TILE) * hd];
        // Rows this tile can contribute to: `lo..visible` (tile-relative) is not empty.
        let range = |r: usize| {
            let visible = (pos[r] + 1).saturating_sub(ic).min(tile);
            let lo = sm.first_visible(pos[r]).saturating_sub(ic).min(tile);
            (lo < visible).then_some(lo..visible)
        };
        let mut r = 0;
        while r < rows {
            let r0 = range(r);
            let r1 = (r + 1 < rows).then(|| range(r + 1)).flatten();
            let (mut s0, mut s1) = ([0f32; KV_TILE], [0f32; KV_TILE]);
            let q0 = &q[r * hd..(r + 1) * hd];
            match (&r0, &r1) {
                (None, None) => {}
                #[cfg(target_arch = "x86_64")]
                (Some(_), Some(_)) if AVX512 => {
                    let q1 = &q[(r + 1) * hd..(r + 2) * hd];
                    // SAFETY: AVX512 is set only in the AVX-512 build of this kernel.
                    unsafe { scores2_avx512(kt, q0, q1, &mut s0, &mut s1) };
                }
                #[cfg(target_arch = "x86_64")]
                (Some(_), Some(_)) => {
                    let q1 = &q[(r + 1) * hd..(r + 2) * hd];
                    // SAFETY: on x86 the build without AVX512 is reached only from the
                    // AVX2 + FMA entry point (`super::tile_avx2`).
                    unsafe { scores2_avx2(kt, q0, q1, &mut s0, &mut s1) };
                }
                #[cfg(not(target_arch = "x86_64"))]
                (Some(_), Some(_)) => {
                    let q1 = &q[(r + 1) * hd..(r + 2) * hd];
                    for d in 0..hd {
                        let kd: &[f32; KV_TILE] =
                            kt[d * KV_TILE..(d + 1) * KV_TILE].try_into().unwrap();
                        let (a, b) = (q0[d], q1[d]);
                        for j in 0..KV_TILE {
                            s0[j] = kd[j].mul_add(a, s0[j]);
                            s1[j] = kd[j].mul_add(b, s1[j]);
                        }
                    }
                }
                (Some(_), None) | (None, Some(_)) => {
                    let (rr, sc) = if r0.is_some() {
                        (r, &mut s0)
                    } else {
                        (r + 1, &mut s1)
                    };
                    let qr = &q[rr * hd..(rr + 1) * hd];
                    for (d, &a) in qr.iter().enumerate() {
                        let kd: &[f32; KV_TILE] =
                            kt[d * KV_TILE..(d + 1) * KV_TILE].try_into().unwrap();
                        for j in 0..KV_TILE {
                            sc[j] = kd[j].mul_add(a, sc[j]);
                        }
                    }
                }
            }
            for (rr, sc, v) in [(r, &mut s0, &r0), (r + 1, &mut s1, &r1)] {
                let Some(v) = v else { continue };
                #[cfg(target_arch = "x86_64")]
                if AVX512 && sm.softcap.is_none() {
                    // SAFETY: AVX512 is set only in the AVX-512 build of this kernel.
                    unsafe { softmax_step_avx512(s, sm.scale, rr, hd, sc, v.clone()) };
                    continue;
                }
                softmax_step(s, sm, rr, hd, sc, v.clone());
            }
            match (r0, r1) {
                #[cfg(target_arch = "x86_64")]
                (Some(v0), Some(v1)) if AVX512 && hd.is_multiple_of(64) => {
                    let acc = &mut s.acc[r * hd..(r + 2) * hd];
                    // SAFETY: AVX512 is set only in the AVX-512 build of this kernel.
                    unsafe {
                        if hd.is_multiple_of(128) {
                            accumulate_pair_avx512::<8>(acc, vt, hd, (&s0, &s1), v0, v1)
                        } else {
                            accumulate_pair_avx512::<4>(acc, vt, hd, (&s0, &s1), v0, v1)
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                (Some(v0), Some(v1)) if !AVX512 && hd.is_multiple_of(32) => {
                    let acc = &mut s.acc[r * hd..(r + 2) * hd];
                    // SAFETY: as for the scores above.
                    unsafe { accumulate_pair_avx2::<4>(acc, vt, hd, (&s0, &s1), v0, v1) }
                }
                (v0, v1) => {
                    if let Some(v) = v0 {
                        accumulate_row(&mut s.acc[r * hd..(r + 1) * hd], vt, hd, &s0, v);
                    }
                    if let Some(v) = v1 {
                        let acc = &mut s.acc[(r + 1) * hd..(r + 2) * hd];
                        accumulate_row(acc, vt, hd, &s1, v);
                    }
                }
            }
            r += 2;
        }
        ic += tile;
    }
    (s.pk, s.pv) = (pk, pv);
    s.finish_rows(hd, out);
}

/// The raw scores of two query rows against a key tile (`kt`, transposed), in 2 × 4 zmm
/// accumulators: per element the FMAs of [`super::tile_body`], in the same order.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scores2_avx512(
    kt: &[f32],
    q0: &[f32],
    q1: &[f32],
    s0: &mut [f32; KV_TILE],
    s1: &mut [f32; KV_TILE],
) {
    use std::arch::x86_64::*;
    const L: usize = KV_TILE / 16;
    let hd = q0.len();
    assert!(q1.len() == hd && kt.len() >= hd * KV_TILE);
    let mut a = [_mm512_setzero_ps(); L];
    let mut b = [_mm512_setzero_ps(); L];
    for d in 0..hd {
        // SAFETY: row d of the transposed tile is in bounds (asserted above).
        unsafe {
            let k = kt.as_ptr().add(d * KV_TILE);
            let (x, y) = (_mm512_set1_ps(q0[d]), _mm512_set1_ps(q1[d]));
            for j in 0..L {
                let kv = _mm512_loadu_ps(k.add(16 * j));
                a[j] = _mm512_fmadd_ps(kv, x, a[j]);
                b[j] = _mm512_fmadd_ps(kv, y, b[j]);
            }
        }
    }
    for j in 0..L {
        // SAFETY: 16 floats at 16·j of 64-float arrays.
        unsafe {
            _mm512_storeu_ps(s0.as_mut_ptr().add(16 * j), a[j]);
            _mm512_storeu_ps(s1.as_mut_ptr().add(16 * j), b[j]);
        }
    }
}

/// [`scores2_avx512`] in ymm registers: the tile in two halves of 32 positions, each in
/// 2 × 4 accumulators (all 64 would not fit in AVX2's sixteen registers).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores2_avx2(
    kt: &[f32],
    q0: &[f32],
    q1: &[f32],
    s0: &mut [f32; KV_TILE],
    s1: &mut [f32; KV_TILE],
) {
    use std::arch::x86_64::*;
    const L: usize = 4;
    let hd = q0.len();
    assert!(q1.len() == hd && kt.len() >= hd * KV_TILE);
    for h in (0..KV_TILE).step_by(8 * L) {
        let mut a = [_mm256_setzero_ps(); L];
        let mut b = [_mm256_setzero_ps(); L];
        for d in 0..hd {
            // SAFETY: row d of the transposed tile is in bounds (asserted above).
            unsafe {
                let k = kt.as_ptr().add(d * KV_TILE + h);
                let (x, y) = (_mm256_set1_ps(q0[d]), _mm256_set1_ps(q1[d]));
                for j in 0..L {
                    let kv = _mm256_loadu_ps(k.add(8 * j));
                    a[j] = _mm256_fmadd_ps(kv, x, a[j]);
                    b[j] = _mm256_fmadd_ps(kv, y, b[j]);
                }
            }
        }
        for j in 0..L {
            // SAFETY: 8 floats at h + 8·j of 64-float arrays.
            unsafe {
                _mm256_storeu_ps(s0.as_mut_ptr().add(h + 8 * j), a[j]);
                _mm256_storeu_ps(s1.as_mut_ptr().add(h + 8 * j), b[j]);
            }
        }
    }
}

/// One row's value accumulation ([`accumulate_values`] in the widest chunk `hd` allows).
#[inline(always)]
fn accumulate_row(
    acc: &mut [f32],
    vt: &[f32],
    hd: usize,
    sc: &[f32; KV_TILE],
    vis: std::ops::Range<usize>,
) {
    if hd.is_multiple_of(128) {
        accumulate_values::<128>(acc, vt, hd, sc, vis);
    } else if hd.is_multiple_of(32) {
        accumulate_values::<32>(acc, vt, hd, sc, vis);
    } else {
        accumulate_values::<1>(acc, vt, hd, sc, vis);
    }
}

/// Generates the value accumulation of two rows (`acc` is `[2][hd]`, weights `sc`, visible
/// ranges `v0`, `v1`) for one register width: `$w` floats per `$V` register, `$w · L`
/// elements of each row in registers at a time, sharing each value row's loads where both
/// rows see it. Per element the FMAs of [`accumulate_values`], in increasing position order:
/// the part only one row sees before the shared range, the shared range, then the part after
/// it. The AVX2 and AVX-512 kernels differ only in the register type and its intrinsics.
macro_rules! accumulate_pair {
    ($(#[$doc:meta])* $name:ident, $features:literal, $V:ty, $w:literal,
     $load:ident, $store:ident, $set1:ident, $fmadd:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name<const L: usize>(
            acc: &mut [f32],
            vt: &[f32],
            hd: usize,
            (sc0, sc1): (&[f32; KV_TILE], &[f32; KV_TILE]),
            v0: std::ops::Range<usize>,
            v1: std::ops::Range<usize>,
        ) {
            use std::arch::x86_64::*;
            let ch = $w * L;
            assert!(acc.len() == 2 * hd && hd.is_multiple_of(ch));
            assert!(v0.end.max(v1.end) <= KV_TILE && vt.len() >= KV_TILE * hd);
            let shared = v0.start.max(v1.start)..v0.end.min(v1.end);
            let a0p = acc.as_mut_ptr();
            // SAFETY: row 1 starts `hd` elements in (asserted above).
            let a1p = unsafe { a0p.add(hd) };
            let vp = vt.as_ptr();
            // SAFETY (all pointer accesses): chunk `c..c + ch` of a row of `hd`, value rows
            // < KV_TILE (asserted above).
            let one = |a: &mut [$V; L],
                       sc: &[f32; KV_TILE],
                       tks: std::ops::Range<usize>,
                       c: usize| {
                for tk in tks {
                    let p = $set1(sc[tk]);
                    for j in 0..L {
                        let v = unsafe { $load(vp.add(tk * hd + c + $w * j)) };
                        a[j] = $fmadd(v, p, a[j]);
                    }
                }
            };
            for c in (0..hd).step_by(ch) {
                let mut a0: [$V; L] =
                    std::array::from_fn(|j| unsafe { $load(a0p.add(c + $w * j)) });
                let mut a1: [$V; L] =
                    std::array::from_fn(|j| unsafe { $load(a1p.add(c + $w * j)) });
                if shared.is_empty() {
                    one(&mut a0, sc0, v0.clone(), c);
                    one(&mut a1, sc1, v1.clone(), c);
                } else {
                    one(&mut a0, sc0, v0.start..shared.start, c);
                    one(&mut a1, sc1, v1.start..shared.start, c);
                    for tk in shared.clone() {
                        let (p0, p1) = ($set1(sc0[tk]), $set1(sc1[tk]));
                        for j in 0..L {
                            let v = unsafe { $load(vp.add(tk * hd + c + $w * j)) };
                            a0[j] = $fmadd(v, p0, a0[j]);
                            a1[j] = $fmadd(v, p1, a1[j]);
                        }
                    }
                    one(&mut a0, sc0, shared.end..v0.end, c);
                    one(&mut a1, sc1, shared.end..v1.end, c);
                }
                for j in 0..L {
                    unsafe {
                        $store(a0p.add(c + $w * j), a0[j]);
                        $store(a1p.add(c + $w * j), a1[j]);
                    }
                }
            }
        }
    };
}

accumulate_pair!(
    /// The two-row value accumulation in zmm registers (`16·L` elements of each row).
    accumulate_pair_avx512, "avx512f", __m512, 16,
    _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps
);

accumulate_pair!(
    /// The two-row value accumulation in ymm registers (`8·L` elements of each row).
    accumulate_pair_avx2, "avx2,fma", __m256, 8,
    _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps
);

/// `acc += Σ_{tk in vis} sc[tk] · vt[tk]`, position by position, `CH` elements of `acc` at a
/// time (held in registers across the positions).
#[inline(always)]
fn accumulate_values<const CH: usize>(
    acc: &mut [f32],
    vt: &[f32],
    hd: usize,
    sc: &[f32; KV_TILE],
    vis: std::ops::Range<usize>,
) {
    for c in (0..hd).step_by(CH) {
        let mut a: [f32; CH] = acc[c..c + CH].try_into().unwrap();
        for tk in vis.clone() {
            let p = sc[tk];
            let v: &[f32; CH] = vt[tk * hd + c..tk * hd + c + CH].try_into().unwrap();
            for j in 0..CH {
                a[j] = v[j].mul_add(p, a[j]);
            }
        }
        acc[c..c + CH].copy_from_slice(&a);
    }
}
