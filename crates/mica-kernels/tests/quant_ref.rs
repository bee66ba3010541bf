//! Checks of the scalar reference path on its own: `vec_dot_ref` against an f64 sum of
//! dequantized values (this checks the block math of every dot product), the activation
//! quantizers' defining properties (gguf-py has no Q8_1/Q8_K to compare with), and the
//! quantization error of the k-quant reference quantizers.

mod quant_common;

use mica_kernels::DType;
use mica_kernels::quant::{
    BlockQ8_1, BlockQ8K, can_quantize, cast_blocks, dequantize_row, f16_to_f32, f32_to_f16,
    quantize_row, vec_dot_ref,
};
use quant_common::*;

/// `vec_dot_ref` rounds in f32: per block a few products, then one running sum. The bound
/// is `(8 + blocks) * eps * magnitude`, magnitude = sum (|w| + |offset|) |x|.
fn ref_budget(nblocks: usize, mag: f64) -> f64 {
    (8 + nblocks) as f64 * f32::EPSILON as f64 * mag
}

#[test]
fn vec_dot_ref_matches_f64_sum_of_dequantized_values() {
    let mut r = rng(1);
    let mut checked = 0;
    for t in DType::WEIGHT_TYPES {
        for nblocks in [1usize, 3, 17] {
            let n = nblocks * t.block_size().max(32);
            let nblocks = n / t.block_size();
            for wk in WEIGHT_KINDS {
                for ak in ACT_KINDS {
                    let w = weight_row(t, nblocks, wk, &mut r);
                    let xq = quantize_act(t, &activations(n, ak, &mut r));
                    let got = vec_dot_ref(t, n, &w, &xq);
                    let (want, mag) = reference_f64(t, n, &w, &xq);
                    if !want.is_finite() || mag > 1e36 {
                        assert!(!got.is_finite() || mag > 1e36, "{t} {wk:?} {ak:?}: {got}");
                        continue;
                    }
                    let err = (got as f64 - want).abs();
                    assert!(
                        err <= ref_budget(nblocks, mag),
                        "{t} n={n} {wk:?} {ak:?}: ref {got:e}, f64 {want:e}, err {err:e}, mag {mag:e}"
                    );
                    checked += 1;
                }
            }
        }
    }
    println!("{checked} (type, length, weights, activations) cases checked");
}

/// Q8_1 stores `s = f16(d * sum(q))` with `d` the unrounded f32 scale; Q8_0 is Q8_1 minus s.
#[test]
fn q8_1_sum_field_and_q8_0_agree() {
    let mut r = rng(2);
    for ak in ACT_KINDS {
        let x = activations(32 * 9, ak, &mut r);
        let mut q80 = vec![0u8; DType::Q8_0.row_bytes(x.len()).unwrap()];
        let mut q81 = vec![0u8; DType::Q8_1.row_bytes(x.len()).unwrap()];
        quantize_row(DType::Q8_0, &x, &mut q80);
        quantize_row(DType::Q8_1, &x, &mut q81);
        let blocks: &[BlockQ8_1] = cast_blocks(&q81).unwrap();
        for (i, (b, b0)) in blocks.iter().zip(q80.chunks_exact(34)).enumerate() {
            assert_eq!(&b.d, &b0[..2], "block {i} d");
            assert_eq!(b.qs.map(|q| q as u8), b0[2..], "block {i} qs");
            let amax = x[32 * i..32 * i + 32]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
            assert_eq!(b.s, f32_to_f16(sum as f32 * d), "{ak:?} block {i} s");
        }
    }
}

/// Q8_K: the value of largest magnitude maps to -127 (ggml scales by `-127 / max`), `d` is
/// the exact f32 `1 / iscale`, every value is within d/2 of its quantization, bsums add up.
#[test]
fn q8_k_quantizer_properties() {
    let mut r = rng(3);
    for ak in ACT_KINDS {
        let x = activations(256 * 5, ak, &mut r);
        let mut q = vec![0u8; DType::Q8_K.row_bytes(x.len()).unwrap()];
        quantize_row(DType::Q8_K, &x, &mut q);
        let blocks: &[BlockQ8K] = cast_blocks(&q).unwrap();
        for (b, x) in blocks.iter().zip(x.chunks_exact(256)) {
            for g in 0..16 {
                let s: i32 = b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
                assert_eq!(b.bsum(g) as i32, s);
            }
            let imax = (0..256).fold(0, |m, i| if x[i].abs() > x[m].abs() { i } else { m });
            if x[imax] == 0.0 {
                assert_eq!(b.d(), 0.0);
                assert!(b.qs.iter().all(|&q| q == 0));
                continue;
            }
            if !(-127.0 / x[imax]).is_finite() {
                // Subnormal blocks overflow ggml's inverse scale; mica degenerates the same way.
                continue;
            }
            assert_eq!(b.qs[imax], -127, "{ak:?}");
            assert_eq!(b.d(), 1.0 / (-127.0 / x[imax]));
            for (&q, &v) in b.qs.iter().zip(x) {
                assert!(
                    (q as f32 * b.d() - v).abs() <= b.d().abs() * 0.5001,
                    "{ak:?}"
                );
            }
        }
    }
}

/// Relative RMS error of quantize -> dequantize on normal data, with upper bounds a little
/// above what llama.cpp's reference quantizers reach (a broken quantizer lands far above).
#[test]
fn reference_quantizers_round_trip_within_expected_error() {
    let bounds = [
        (DType::Q4_0, 0.13),
        (DType::Q4_1, 0.11),
        (DType::Q5_0, 0.065),
        (DType::Q5_1, 0.055),
        (DType::Q8_0, 0.006),
        (DType::Q8_1, 0.006),
        (DType::Q2_K, 0.40),
        (DType::Q3_K, 0.21),
        (DType::Q4_K, 0.10),
        (DType::Q5_K, 0.05),
        (DType::Q6_K, 0.025),
        (DType::Q8_K, 0.008),
        (DType::F16, 0.001),
        (DType::BF16, 0.004),
    ];
    let mut r = rng(4);
    let x: Vec<f32> = (0..256 * 32).map(|_| normal(&mut r)).collect();
    for (t, bound) in bounds {
        let mut q = vec![0u8; t.row_bytes(x.len()).unwrap()];
        quantize_row(t, &x, &mut q);
        let y = dequant(t, &q, x.len());
        let num: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        let rel = (num / den).sqrt();
        println!("{t}: relative RMS error {rel:.4} (bound {bound})");
        assert!(rel < bound, "{t}: relative RMS error {rel}");
    }
}

/// Zero input quantizes to zero scales for every format and dequantizes to zeros.
#[test]
fn zero_rows_round_trip_to_zero() {
    for t in DType::ALL.into_iter().filter(|&t| can_quantize(t)) {
        let x = vec![0.0f32; 256];
        let mut q = vec![0u8; t.row_bytes(256).unwrap()];
        quantize_row(t, &x, &mut q);
        let mut y = vec![1.0f32; 256];
        dequantize_row(t, &q, &mut y);
        assert!(y.iter().all(|&v| v == 0.0), "{t}");
    }
}

#[test]
fn f16_helpers_round_to_nearest_even() {
    assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), f32_to_f16(1.0));
    assert_eq!(f16_to_f32(f32_to_f16(65504.0)), 65504.0);
    assert_eq!(f16_to_f32([1, 0]), 2f32.powi(-24));
}
