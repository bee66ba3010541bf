//! Rounding one element of a block whose scales are already chosen: what lets GPTQ round a
//! block column by column, moving the block's later columns after each one (see
//! [`super::gptq`]). For the types here, element `i`'s values form the grid
//! `a_i · k + b_i` (k an integer code in the type's range) once the block's scales are fixed;
//! [`round_element`] picks the nearest, writes its code into the block's bytes and returns
//! the value, computed as the type's dequantization computes it.

use mica_kernels::DType;
use mica_kernels::quant::blocks::{q3k_scales, scale_min_k4};
use mica_kernels::quant::f16_to_f32;

/// Whether [`round_element`] handles `t`: the legacy formats and the k-quants (the
/// i-quants, the ternary formats and MXFP4 have no per-element linear grid).
pub fn supported(t: DType) -> bool {
    matches!(
        t,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
    )
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32([b[at], b[at + 1]])
}

/// The code nearest to `(w − b) / a` within `lo..=hi` (the middle of the range when `a` is 0).
fn code(w: f32, a: f32, b: f32, lo: i32, hi: i32) -> i32 {
    if a == 0.0 {
        return (lo + hi + 1) / 2;
    }
    (((w - b) / a).round() as i32).clamp(lo, hi)
}

/// Writes the low four bits of element `i` of a 32-element block whose nibbles start at
/// `qs` (element `i < 16` in byte `i`'s low nibble, else byte `i − 16`'s high nibble).
fn set_nibble(block: &mut [u8], qs: usize, i: usize, k: u8) {
    let (byte, high) = if i < 16 {
        (qs + i, false)
    } else {
        (qs + i - 16, true)
    };
    let v = &mut block[byte];
    *v = if high {
        (*v & 0x0F) | ((k & 0xF) << 4)
    } else {
        (*v & 0xF0) | (k & 0xF)
    };
}

/// Sets bit `i` of the little-endian u32 at `qh` to bit 4 of `k`.
fn set_high_bit(block: &mut [u8], qh: usize, i: usize, k: u8) {
    let byte = &mut block[qh + i / 8];
    let bit = 1u8 << (i % 8);
    *byte = if k & 0x10 != 0 {
        *byte | bit
    } else {
        *byte & !bit
    };
}

/// Writes bits `2·(e % 128 / 32)` of byte `qs + 32·(e / 128) + e % 32`: the two-bit field
/// of element `e` in Q2_K's and Q3_K's `qs`.
fn set_2bit(block: &mut [u8], qs: usize, e: usize, k: u8) {
    let shift = 2 * (e % 128 / 32);
    let byte = &mut block[qs + 32 * (e / 128) + e % 32];
    *byte = (*byte & !(3 << shift)) | ((k & 3) << shift);
}

/// Sets bit `bit` of `block[at]` to `on`.
fn set_bit(block: &mut [u8], at: usize, bit: usize, on: bool) {
    let mask = 1u8 << bit;
    block[at] = if on {
        block[at] | mask
    } else {
        block[at] & !mask
    };
}

/// Writes the low four bits of element `i` of a Q4_K/Q5_K block whose nibbles start at
/// `qs`: element `64c + l` is byte `32c + l % 32`, the low nibble for `l < 32`.
fn set_k4_nibble(block: &mut [u8], qs: usize, i: usize, k: u8) {
    let (c, l) = (i / 64, i % 64);
    let byte = &mut block[qs + 32 * c + l % 32];
    *byte = if l < 32 {
        (*byte & 0xF0) | (k & 0xF)
    } else {
        (*byte & 0x0F) | ((k & 0xF) << 4)
    };
}

/// Rounds `w` to the nearest value element `i` of `block` (one block of `t`, its scales
/// set) can hold, stores the code, and returns the value. `None` for a type
/// [`supported`] rejects.
pub fn round_element(t: DType, block: &mut [u8], i: usize, w: f32) -> Option<f32> {
    Some(match t {
        DType::Q4_0 => {
            let d = f16_at(block, 0);
            let k = code(w, d, 0.0, -8, 7);
            set_nibble(block, 2, i, (k + 8) as u8);
            k as f32 * d
        }
        DType::Q4_1 => {
            let (d, m) = (f16_at(block, 0), f16_at(block, 2));
            let k = code(w, d, m, 0, 15);
            set_nibble(block, 4, i, k as u8);
            k as f32 * d + m
        }
        DType::Q5_0 => {
            let d = f16_at(block, 0);
            let k = code(w, d, 0.0, -16, 15);
            let u = (k + 16) as u8;
            set_nibble(block, 6, i, u);
            set_high_bit(block, 2, i, u);
            k as f32 * d
        }
        DType::Q5_1 => {
            let (d, m) = (f16_at(block, 0), f16_at(block, 2));
            let k = code(w, d, m, 0, 31);
            set_nibble(block, 8, i, k as u8);
            set_high_bit(block, 4, i, k as u8);
            k as f32 * d + m
        }
        DType::Q8_0 => {
            let d = f16_at(block, 0);
            let k = code(w, d, 0.0, -128, 127);
            block[2 + i] = k as i8 as u8;
            k as f32 * d
        }
        DType::Q2_K => {
            // scales[16], qs[64], d, dmin.
            let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
            let s = block[i / 16];
            let (dl, ml) = (d * (s & 0xF) as f32, dmin * (s >> 4) as f32);
            let k = code(w, dl, -ml, 0, 3) as u8;
            set_2bit(block, 16, i, k);
            dl * k as f32 - ml
        }
        DType::Q3_K => {
            // hmask[32], qs[64], scales[12], d; the code is q + 4, its bit 2 in hmask.
            let d = f16_at(block, 108);
            let scales: &[u8; 12] = block[96..108].try_into().ok()?;
            let dl = d * q3k_scales(scales)[i / 16] as f32;
            let k = code(w, dl, 0.0, -4, 3);
            let u = (k + 4) as u8;
            set_2bit(block, 32, i, u);
            set_bit(block, i % 32, i / 32, u & 4 != 0);
            dl * k as f32
        }
        DType::Q4_K | DType::Q5_K => {
            // d, dmin, scales[12], then (Q5_K) qh[32], then qs.
            let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
            let scales: &[u8; 12] = block[4..16].try_into().ok()?;
            let (sc, mn) = scale_min_k4(i / 32, scales);
            let (dl, ml) = (d * sc as f32, dmin * mn as f32);
            let top = if t == DType::Q4_K { 15 } else { 31 };
            let k = code(w, dl, -ml, 0, top) as u8;
            if t == DType::Q4_K {
                set_k4_nibble(block, 16, i, k);
            } else {
                set_k4_nibble(block, 48, i, k);
                // Bit 4 of element 64c + l is bit 2c (+1 for l >= 32) of qh[l % 32].
                let (c, l) = (i / 64, i % 64);
                set_bit(block, 16 + l % 32, 2 * c + l / 32, k & 0x10 != 0);
            }
            dl * k as f32 - ml
        }
        DType::Q6_K => {
            // ql[128], qh[64], scales[16] (i8), d; the code is q + 32.
            let d = f16_at(block, 208);
            let dl = d * (block[192 + i / 16] as i8) as f32;
            let k = code(w, dl, 0.0, -32, 31);
            let u = (k + 32) as u8;
            // Element 128h + 32j + l: low nibble in ql[64h + l + 32·(j & 1)] (high nibble
            // for j >= 2), two high bits at bits 2j of qh[32h + l].
            let (h, j, l) = (i / 128, i % 128 / 32, i % 32);
            let lo = &mut block[64 * h + l + 32 * (j & 1)];
            *lo = if j < 2 {
                (*lo & 0xF0) | (u & 0xF)
            } else {
                (*lo & 0x0F) | ((u & 0xF) << 4)
            };
            let hi = &mut block[128 + 32 * h + l];
            *hi = (*hi & !(3 << (2 * j))) | ((u >> 4) << (2 * j));
            dl * k as f32
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mica_kernels::quant::{dequantize_row, quantize_row};

    /// Rounding every element of a freshly quantized block to its own dequantized value
    /// keeps the block's bytes; rounding other values stores codes that dequantize to what
    /// `round_element` returned, and each is the nearest grid value.
    #[test]
    fn codes_land_where_dequantization_reads_them() {
        let mut seed = 5u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let grid_types = DType::WEIGHT_TYPES.into_iter().filter(|&t| supported(t));
        assert_eq!(
            grid_types.clone().count(),
            10,
            "the legacy formats and the k-quants"
        );
        for t in grid_types {
            let n = t.block_size();
            let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let mut block = vec![0u8; t.row_bytes(n).unwrap()];
            quantize_row(t, &x, &mut block);
            let mut y = vec![0f32; n];
            dequantize_row(t, &block, &mut y);
            let orig = block.clone();
            for (i, &v) in y.iter().enumerate() {
                assert_eq!(
                    round_element(t, &mut block, i, v),
                    Some(v),
                    "{t} element {i}"
                );
            }
            assert_eq!(
                block, orig,
                "{t}: rounding the block's own values changes nothing"
            );
            // New targets, some beyond the range (clamped).
            let targets: Vec<f32> = (0..n).map(|_| 1.5 * rnd()).collect();
            let got: Vec<f32> = targets
                .iter()
                .enumerate()
                .map(|(i, &w)| round_element(t, &mut block, i, w).unwrap())
                .collect();
            dequantize_row(t, &block, &mut y);
            assert_eq!(
                got, y,
                "{t}: stored codes dequantize to the returned values"
            );
            // Nearest: no other value element i's grid already holds (the original
            // dequantized values are on the grid) is closer.
            let mut grid = vec![0f32; n];
            dequantize_row(t, &orig, &mut grid);
            for i in 0..n {
                assert!(
                    (targets[i] - got[i]).abs() <= (targets[i] - grid[i]).abs() + 1e-6,
                    "{t} element {i}: {} is not nearer {} than {}",
                    got[i],
                    targets[i],
                    grid[i]
                );
            }
        }
        assert_eq!(round_element(DType::F16, &mut [0u8; 2], 0, 1.0), None);
    }
}
