//! IQ2_XS's quantizer: ggml's `quantize_row_iq2_xs_impl` (which needs an importance matrix)
//! and the neighbour tables of `iq2xs_init_impl` it searches, with the float operations in
//! llama.cpp's order so the bytes are its bytes (`tests/weighted_fixtures.rs` against
//! llama.cpp's libggml).
//!
//! IQ2_XS stores each group of 8 magnitudes as an index into a 512-entry grid of points with
//! coordinates in {1, 3, 5} (×scale), plus 7 sign bits (the eighth sign makes the count of
//! negatives even). The search rounds a group to the nearest point of the full 3⁸ lattice;
//! when that point is not in the grid it picks, among the precomputed grid neighbours of
//! that lattice point (the grid points at the two smallest distances), the one with the
//! smallest importance-weighted error.
//!
//! The other grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S) are read but not
//! written: each has its own search of similar size, and IQ2_XS is the one llama.cpp's
//! low-bit file types (IQ2_XS, and IQ2_XXS/IQ1's attention output) rely on most.

use std::sync::OnceLock;

use super::blocks::{BlockIQ2XS, QK_K, f32_to_f16};
use super::iq_grids::IQ2XS_GRID;
use super::kquants::nearest_int;

/// ggml's `GROUP_MAX_EPS`: groups whose largest |x| is below this quantize to zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Lattice points are 8 two-bit levels packed as `Σ l_i << 2i`; with levels 0..=2 the
/// largest is 0xAAAA (ggml's `kmap_size`).
const KMAP_SIZE: usize = 43692;

/// The search tables of one grid (ggml's `iq2_entry_t`).
struct GridTables {
    /// Each grid point's coordinates `2l + 1`.
    points: Vec<[i8; 8]>,
    /// Lattice point → its grid index, or `-(offset + 1)` where `neighbours[offset]` is the
    /// count of its neighbours and the indices follow.
    map: Vec<i32>,
    neighbours: Vec<u16>,
}

/// The grid of IQ2_XS as ggml's `kgrid_2bit_512` levels (its byte values 0x08, 0x19, 0x2b
/// are levels 0, 1, 2).
fn level_of(byte: u8) -> i8 {
    match byte {
        0x08 => 0,
        0x19 => 1,
        _ => 2,
    }
}

impl GridTables {
    /// `iq2xs_init_impl`: the grid, the lattice map and, for every lattice point not on the
    /// grid, the grid points at its `nwant` smallest squared distances, ordered by
    /// (distance, index) as ggml's `qsort` with `iq2_compare_func` orders them.
    fn build(grid: &[u64], nwant: usize) -> GridTables {
        let points: Vec<[i8; 8]> = grid
            .iter()
            .map(|&g| std::array::from_fn(|i| 2 * level_of((g >> (8 * i)) as u8) + 1))
            .collect();
        let mut map = vec![-1i32; KMAP_SIZE];
        for (j, p) in points.iter().enumerate() {
            let u = p
                .iter()
                .enumerate()
                .fold(0usize, |u, (k, &c)| u | (((c - 1) / 2) as usize) << (2 * k));
            map[u] = j as i32;
        }
        let mut neighbours = Vec::new();
        let mut d2 = vec![0i32; points.len()];
        for (i, m) in map.iter_mut().enumerate() {
            if *m >= 0 {
                continue;
            }
            let pos: [i32; 8] = std::array::from_fn(|k| 2 * ((i >> (2 * k)) & 3) as i32 + 1);
            for (d, p) in d2.iter_mut().zip(&points) {
                *d = (0..8).map(|k| (p[k] as i32 - pos[k]).pow(2)).sum();
            }
            // The `nwant` smallest distinct distances.
            let mut levels: Vec<i32> = Vec::with_capacity(nwant + 1);
            for &d in &d2 {
                if !levels.contains(&d) {
                    levels.push(d);
                    levels.sort_unstable();
                    levels.truncate(nwant);
                }
            }
            let start = neighbours.len();
            *m = -(start as i32 + 1);
            neighbours.push(0);
            for &level in &levels {
                neighbours.extend((0..points.len() as u16).filter(|&j| d2[j as usize] == level));
            }
            neighbours[start] = (neighbours.len() - start - 1) as u16;
        }
        GridTables {
            points,
            map,
            neighbours,
        }
    }

    /// `iq2_find_best_neighbour`: the neighbour of lattice point `u` with the smallest
    /// weighted error at `scale`; writes its levels into `l` and returns its grid index.
    fn best_neighbour(&self, u: usize, xval: &[f32], weight: &[f32], scale: f32, l: &mut [i8]) {
        let off = (-self.map[u] - 1) as usize;
        let n = self.neighbours[off] as usize;
        let mut best_d2 = f32::MAX;
        let mut best = self.neighbours[off + 1] as usize;
        for &j in &self.neighbours[off + 1..off + 1 + n] {
            let p = &self.points[j as usize];
            let mut d2 = 0.0f32;
            for i in 0..8 {
                let diff = scale * p[i] as f32 - xval[i];
                d2 += weight[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                best = j as usize;
            }
        }
        for (li, &c) in l.iter_mut().zip(&self.points[best]) {
            *li = (c - 1) / 2;
        }
    }
}

fn iq2xs_tables() -> &'static GridTables {
    static T: OnceLock<GridTables> = OnceLock::new();
    T.get_or_init(|| GridTables::build(&IQ2XS_GRID, 2))
}

/// Packs 8 levels (0..=2) into a lattice index.
fn lattice(l: &[i8]) -> usize {
    l.iter()
        .enumerate()
        .fold(0usize, |u, (i, &v)| u | (v as usize) << (2 * i))
}

/// `quantize_iq2_xs`: `x` is a whole number of 256-element super-blocks, `imp` one
/// importance per element of a row (`[x.len()]`, ggml's `quant_weights`).
pub fn quantize_iq2xs(x: &[f32], imp: &[f32], y: &mut [BlockIQ2XS]) {
    let t = iq2xs_tables();
    const KMAXQ: i32 = 3;
    for ((xbl, qwbl), b) in x.chunks_exact(QK_K).zip(imp.chunks_exact(QK_K)).zip(y) {
        b.d = f32_to_f16(0.0);
        b.scales = [0; QK_K / 32];
        let mut q2 = [0u16; QK_K / 8];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut sumx2 = 0.0f32;
        for &v in xbl {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / QK_K as f32;
        for ib in 0..QK_K / 16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let qw = &qwbl[16 * ib..16 * ib + 16];
            let weight: [f32; 16] =
                std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt());
            let waux: [f32; 16] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0.0f32; 16];
            let mut block_signs = [0u8; 2];
            for k in 0..2 {
                let mut nflip = 0;
                let mut s = 0u8;
                for i in 0..8 {
                    let v = xb[8 * k + i];
                    if v >= 0.0 {
                        xval[8 * k + i] = v;
                    } else {
                        xval[8 * k + i] = -v;
                        nflip += 1;
                        s |= 1 << i;
                    }
                }
                if nflip % 2 == 1 {
                    let wx2 = |i: usize| weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                    let (mut imin, mut min) = (0, wx2(0));
                    for i in 1..8 {
                        if wx2(i) < min {
                            min = wx2(i);
                            imin = i;
                        }
                    }
                    xval[8 * k + imin] = -xval[8 * k + imin];
                    s ^= 1 << imin;
                }
                block_signs[k] = s & 127;
            }
            let max = xval[1..]
                .iter()
                .fold(xval[0], |m, &v| if m > v { m } else { v });
            let mut l = [0i8; 16];
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let mut best = 0.0f32;
            let mut scale = max / (2 * KMAXQ - 1) as f32;
            let mut on_grid = [true; 2];
            let mut laux = [0i8; 16];
            for is in -9..=9 {
                let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.1) / max;
                let this_scale = 1.0 / id;
                let mut on_grid_aux = [true; 2];
                for k in 0..2 {
                    let la = &mut laux[8 * k..8 * k + 8];
                    for i in 0..8 {
                        let q = nearest_int(0.5 * (id * xval[8 * k + i] - 1.0));
                        la[i] = q.clamp(0, KMAXQ - 1) as i8;
                    }
                    let u = lattice(la);
                    if t.map[u] < 0 {
                        on_grid_aux[k] = false;
                        let (xv, w) = (&xval[8 * k..8 * k + 8], &waux[8 * k..8 * k + 8]);
                        t.best_neighbour(u, xv, w, this_scale, la);
                    }
                }
                let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
                for i in 0..16 {
                    let w = weight[i];
                    let q = (2 * laux[i] + 1) as f32;
                    sumqx += w * xval[i] * q;
                    sumq2 += w * q * q;
                }
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    scale = sumqx / sumq2;
                    best = scale * sumqx;
                    l = laux;
                    on_grid = on_grid_aux;
                }
            }
            if on_grid.contains(&false) && scale > 0.0 {
                let id = 1.0 / scale;
                for k in 0..2 {
                    if on_grid[k] {
                        continue;
                    }
                    let lk = &mut l[8 * k..8 * k + 8];
                    for i in 0..8 {
                        let q = nearest_int(0.5 * (id * xval[8 * k + i] - 1.0));
                        lk[i] = q.clamp(0, KMAXQ - 1) as i8;
                    }
                    let u = lattice(lk);
                    if t.map[u] < 0 {
                        let (xv, w) = (&xval[8 * k..8 * k + 8], &waux[8 * k..8 * k + 8]);
                        t.best_neighbour(u, xv, w, scale, lk);
                    }
                }
                let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
                for i in 0..16 {
                    let w = weight[i];
                    let q = (2 * l[i] + 1) as f32;
                    sumqx += w * xval[i] * q;
                    sumq2 += w * q * q;
                }
                if sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..2 {
                let g = t.map[lattice(&l[8 * k..8 * k + 8])];
                // Every level vector chosen above is a grid point (a neighbour or on the grid).
                debug_assert!(g >= 0, "IQ2_XS: a group left off the grid");
                q2[2 * ib + k] = g as u16 | (block_signs[k] as u16) << 9;
            }
            scales[ib] = scale;
            max_scale = if max_scale > scale { max_scale } else { scale };
        }
        if max_scale == 0.0 {
            b.qs = [0; QK_K / 4];
            continue;
        }
        let d = max_scale / 31.0;
        b.d = f32_to_f16(d);
        let id = 1.0 / d;
        for (ib, &s) in scales.iter().enumerate() {
            let l = nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15) as u8;
            if ib % 2 == 0 {
                b.scales[ib / 2] = l;
            } else {
                b.scales[ib / 2] |= l << 4;
            }
        }
        for (dst, q) in b.qs.chunks_exact_mut(2).zip(q2) {
            dst.copy_from_slice(&q.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_follow_ggml() {
        let t = iq2xs_tables();
        // Every grid point maps back to itself.
        for (j, p) in t.points.iter().enumerate() {
            let l: Vec<i8> = p.iter().map(|c| (c - 1) / 2).collect();
            assert_eq!(t.map[lattice(&l)], j as i32);
        }
        // Every lattice point off the grid has neighbours, nearest first, and they are grid
        // points at one of two distances.
        let dist = |u: usize, j: u16| -> i32 {
            (0..8)
                .map(|k| {
                    (t.points[j as usize][k] as i32 - (2 * ((u >> (2 * k)) & 3) as i32 + 1)).pow(2)
                })
                .sum()
        };
        let mut off_grid = 0;
        for u in 0..KMAP_SIZE {
            if t.map[u] >= 0 {
                continue;
            }
            off_grid += 1;
            let off = (-t.map[u] - 1) as usize;
            let list = &t.neighbours[off + 1..off + 1 + t.neighbours[off] as usize];
            assert!(!list.is_empty());
            let d: Vec<i32> = list.iter().map(|&j| dist(u, j)).collect();
            assert!(d.windows(2).all(|w| w[0] <= w[1]), "{u}: {d:?}");
            let mut levels = d.clone();
            levels.dedup();
            assert!(levels.len() <= 2);
            let nearest = (0..512u16).map(|j| dist(u, j)).min().unwrap();
            assert_eq!(d[0], nearest);
        }
        assert_eq!(off_grid, KMAP_SIZE - 512);
    }
}
