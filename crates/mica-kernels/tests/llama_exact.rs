//! Pins mica's run-time numerics to llama.cpp's x86 build, bit for bit.
//!
//! llama.cpp (CPU, AVX2/AVX-512 VNNI, GCC with FP contraction) is the reference mica's greedy
//! tokens are held to, and small models amplify single-ulp differences into different
//! tokens. So the SIMD dot products must do llama.cpp's float operations in its order. This
//! file restates that arithmetic as plain scalar code, step by step (eight i32 lanes per
//! block, one FMA per block into eight f32 lanes, the separate min/offset terms, ggml's
//! horizontal sum), independently of the kernels, and requires every SIMD table to match it
//! exactly. It also pins the run-time activation quantizer's rounding rules with hand-made
//! cases, the batch paths (repacked Q4_K, tiled k-quants), and finally quantizer bytes and
//! dot products against values printed by llama.cpp itself (generator at the end).

mod quant_common;

use mica_kernels::DType;
use mica_kernels::quant::blocks::{q3k_scales, scale_min_k4};
use mica_kernels::quant::kquants::{unpack_q2k, unpack_q3k, unpack_q4k, unpack_q5k, unpack_q6k};
use mica_kernels::quant::legacy::{unpack_q4_0, unpack_q4_1, unpack_q5_0, unpack_q5_1};
use mica_kernels::quant::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, BlockQ8_1, BlockQ8K, QK, QK_K, cast_blocks, f16_to_f32, quantize_row,
};
use mica_kernels::simd::{DotPath, Kernels};
use quant_common::*;

// ---------------------------------------------------------------------------------------------
// The scalar model of llama.cpp's x86 kernels.

/// `hsum_float_8`: `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
fn hsum8(v: [f32; 8]) -> f32 {
    ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
}

/// Lane k of a 32-element chunk: `Σ scale(e) · q[e] · a[e]` over elements 4k..4k+3, added
/// into `lanes` (the chunk starts at element `base`).
fn add_chunk_lanes(lanes: &mut [i32; 8], q: &[i32], a: &[i8], scale: impl Fn(usize) -> i32) {
    for (e, (&q, &a)) in q.iter().zip(a).enumerate() {
        lanes[(e % 32) / 4] += scale(e) * q * a as i32;
    }
}

/// `acc[k] = fma(d, lanes[k], acc[k])`.
fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: [i32; 8]) {
    for (a, l) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(l as f32, *a);
    }
}

/// Legacy formats: per block eight lanes of exact products, `acc = fma(d_w·d_x, lanes, acc)`,
/// and for the offset formats `summs = fma(m_w, s_x, summs)`.
fn model_legacy(t: DType, w: &[u8], x: &[u8]) -> f32 {
    // (quants in element order, d_w, m_w) for each weight block.
    let wq: Vec<([i32; QK], f32, Option<f32>)> = match t {
        DType::Q4_0 => blocks::<BlockQ4_0>(w)
            .iter()
            .map(|b| (unpack_q4_0(b).map(i32::from), f16_to_f32(b.d), None))
            .collect(),
        DType::Q4_1 => blocks::<BlockQ4_1>(w)
            .iter()
            .map(|b| {
                let m = Some(f16_to_f32(b.m));
                (unpack_q4_1(b).map(i32::from), f16_to_f32(b.d), m)
            })
            .collect(),
        DType::Q5_0 => blocks::<BlockQ5_0>(w)
            .iter()
            .map(|b| (unpack_q5_0(b).map(i32::from), f16_to_f32(b.d), None))
            .collect(),
        DType::Q5_1 => blocks::<BlockQ5_1>(w)
            .iter()
            .map(|b| {
                let m = Some(f16_to_f32(b.m));
                (unpack_q5_1(b).map(i32::from), f16_to_f32(b.d), m)
            })
            .collect(),
        DType::Q8_0 => blocks::<BlockQ8_0>(w)
            .iter()
            .map(|b| (b.qs.map(i32::from), f16_to_f32(b.d), None))
            .collect(),
        _ => unreachable!(),
    };
    // (quants, d_x, s_x) for each activation block.
    let xq: Vec<([i8; QK], f32, f32)> = if t.vec_dot_type() == DType::Q8_1 {
        blocks::<BlockQ8_1>(x)
            .iter()
            .map(|b| (b.qs, f16_to_f32(b.d), f16_to_f32(b.s)))
            .collect()
    } else {
        blocks::<BlockQ8_0>(x)
            .iter()
            .map(|b| (b.qs, f16_to_f32(b.d), 0.0))
            .collect()
    };
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for ((q, dw, m), (a, dx, s)) in wq.iter().zip(&xq) {
        let mut lanes = [0i32; 8];
        add_chunk_lanes(&mut lanes, q, a, |_| 1);
        fma_lanes(&mut acc, dw * dx, lanes);
        if let Some(m) = m {
            summs = m.mul_add(*s, summs);
        }
    }
    match t {
        DType::Q4_1 | DType::Q5_1 => hsum8(acc) + summs,
        _ => hsum8(acc),
    }
}

/// The (scale, min) of each 32-element sub-block of a Q4_K/Q5_K block.
fn k4_scales(s: &[u8; 12]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0; 8];
    let mut mn = [0; 8];
    for j in 0..8 {
        let (a, b) = scale_min_k4(j, s);
        (sc[j], mn[j]) = (a as i32, b as i32);
    }
    (sc, mn)
}

/// The `sumi` lanes of a super-block: chunks of 32 in element order, `scale(e)` per element.
fn sumi(q: &[i32; QK_K], a: &[i8; QK_K], scale: impl Fn(usize) -> i32) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for c in 0..QK_K / 32 {
        let r = 32 * c..32 * c + 32;
        add_chunk_lanes(&mut lanes, &q[r.clone()], &a[r], |e| scale(32 * c + e));
    }
    lanes
}

fn model_kquant(t: DType, w: &[u8], x: &[u8]) -> f32 {
    let xs: &[BlockQ8K] = blocks(x);
    let bs = |b: &BlockQ8K, g: usize| b.bsum(g) as i32;
    let mut acc = [0f32; 8];
    match t {
        DType::Q2_K => {
            for (a, b) in blocks::<BlockQ2K>(w).iter().zip(xs) {
                let d = b.d() * f16_to_f32(a.d);
                let dmin = -b.d() * f16_to_f32(a.dmin);
                let m = |g: usize| (a.scales[g] >> 4) as i32;
                let mins: [i32; 8] = std::array::from_fn(|k| {
                    m(2 * k) * bs(b, 2 * k) + m(2 * k + 1) * bs(b, 2 * k + 1)
                });
                fma_lanes(&mut acc, dmin, mins);
                let q = unpack_q2k(a).map(i32::from);
                fma_lanes(
                    &mut acc,
                    d,
                    sumi(&q, &b.qs, |e| (a.scales[e / 16] & 0xF) as i32),
                );
            }
            hsum8(acc)
        }
        DType::Q3_K => {
            for (a, b) in blocks::<BlockQ3K>(w).iter().zip(xs) {
                let d = b.d() * f16_to_f32(a.d);
                let sc = q3k_scales(&a.scales);
                let q = unpack_q3k(a).map(i32::from);
                fma_lanes(&mut acc, d, sumi(&q, &b.qs, |e| sc[e / 16] as i32));
            }
            hsum8(acc)
        }
        DType::Q4_K => {
            let mut acc_m = [0f32; 4];
            for (a, b) in blocks::<BlockQ4K>(w).iter().zip(xs) {
                let d = b.d() * f16_to_f32(a.d);
                let dmin = -b.d() * f16_to_f32(a.dmin);
                let (sc, mn) = k4_scales(&a.scales);
                for (k, m) in acc_m.iter_mut().enumerate() {
                    let pair = |g: usize| bs(b, 2 * g) + bs(b, 2 * g + 1);
                    let lane = mn[2 * k] * pair(2 * k) + mn[2 * k + 1] * pair(2 * k + 1);
                    *m = dmin.mul_add(lane as f32, *m);
                }
                let q = unpack_q4k(a).map(i32::from);
                fma_lanes(&mut acc, d, sumi(&q, &b.qs, |e| sc[e / 32]));
            }
            hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
        }
        DType::Q5_K => {
            let mut summs = 0f32;
            for (a, b) in blocks::<BlockQ5K>(w).iter().zip(xs) {
                let d = b.d() * f16_to_f32(a.d);
                let dmin = -b.d() * f16_to_f32(a.dmin);
                let (sc, mn) = k4_scales(&a.scales);
                let mins: i32 = (0..16).map(|g| mn[g / 2] * bs(b, g)).sum();
                summs = dmin.mul_add(mins as f32, summs);
                let q = unpack_q5k(a).map(i32::from);
                fma_lanes(&mut acc, d, sumi(&q, &b.qs, |e| sc[e / 32]));
            }
            hsum8(acc) + summs
        }
        DType::Q6_K => {
            for (a, b) in blocks::<BlockQ6K>(w).iter().zip(xs) {
                let d = b.d() * f16_to_f32(a.d);
                let sc = |g: usize| a.scales[g] as i32;
                // Unsigned quants (0..64) in the products, the 32 offset by lane afterwards.
                let q = unpack_q6k(a).map(|q| q as i32 + 32);
                let mut lanes = sumi(&q, &b.qs, |e| sc(e / 16));
                for (k, l) in lanes.iter_mut().enumerate() {
                    *l -= 32 * (bs(b, 2 * k) * sc(2 * k) + bs(b, 2 * k + 1) * sc(2 * k + 1));
                }
                fma_lanes(&mut acc, d, lanes);
            }
            hsum8(acc)
        }
        _ => unreachable!(),
    }
}

fn blocks<B: mica_kernels::quant::Block>(bytes: &[u8]) -> &[B] {
    cast_blocks(bytes).expect("whole blocks")
}

fn model(t: DType, w: &[u8], x: &[u8]) -> f32 {
    if t.block_size() == QK {
        model_legacy(t, w, x)
    } else {
        model_kquant(t, w, x)
    }
}

/// Exact `(Σ sc·q·a per 64 elements, Σ m·bsum per 64 elements, d_w, dmin_w)` of every
/// super-block of a k-quant row (dmin 0 for the formats without mins).
fn ksums(t: DType, w: &[u8], x: &[u8]) -> Vec<([i32; 4], [i32; 4], f32, f32)> {
    let xs: &[BlockQ8K] = blocks(x);
    let per64 = |q: [i32; QK_K], a: &[i8; QK_K], sc: &dyn Fn(usize) -> i32| -> [i32; 4] {
        std::array::from_fn(|k| {
            (64 * k..64 * k + 64)
                .map(|e| sc(e) * q[e] * a[e] as i32)
                .sum()
        })
    };
    let mins = |b: &BlockQ8K, m: &dyn Fn(usize) -> i32| -> [i32; 4] {
        std::array::from_fn(|k| (4 * k..4 * k + 4).map(|g| m(g) * b.bsum(g) as i32).sum())
    };
    match t {
        DType::Q2_K => blocks::<BlockQ2K>(w)
            .iter()
            .zip(xs)
            .map(|(a, b)| {
                let q = unpack_q2k(a).map(i32::from);
                (
                    per64(q, &b.qs, &|e| (a.scales[e / 16] & 0xF) as i32),
                    mins(b, &|g| (a.scales[g] >> 4) as i32),
                    f16_to_f32(a.d),
                    f16_to_f32(a.dmin),
                )
            })
            .collect(),
        DType::Q3_K => blocks::<BlockQ3K>(w)
            .iter()
            .zip(xs)
            .map(|(a, b)| {
                let sc = q3k_scales(&a.scales);
                let q = unpack_q3k(a).map(i32::from);
                (
                    per64(q, &b.qs, &|e| sc[e / 16] as i32),
                    [0; 4],
                    f16_to_f32(a.d),
                    0.0,
                )
            })
            .collect(),
        DType::Q4_K | DType::Q5_K => {
            // (scales, quants, d, dmin) of each block.
            type K4 = ([u8; 12], [i32; QK_K], [u8; 2], [u8; 2]);
            let rows: Vec<K4> = if t == DType::Q4_K {
                blocks::<BlockQ4K>(w)
                    .iter()
                    .map(|a| (a.scales, unpack_q4k(a).map(i32::from), a.d, a.dmin))
                    .collect()
            } else {
                blocks::<BlockQ5K>(w)
                    .iter()
                    .map(|a| (a.scales, unpack_q5k(a).map(i32::from), a.d, a.dmin))
                    .collect()
            };
            rows.iter()
                .zip(xs)
                .map(|((s, q, d, dmin), b)| {
                    let (sc, mn) = k4_scales(s);
                    (
                        per64(*q, &b.qs, &|e| sc[e / 32]),
                        mins(b, &|g| mn[g / 2]),
                        f16_to_f32(*d),
                        f16_to_f32(*dmin),
                    )
                })
                .collect()
        }
        DType::Q6_K => blocks::<BlockQ6K>(w)
            .iter()
            .zip(xs)
            .map(|(a, b)| {
                let q = unpack_q6k(a).map(i32::from);
                (
                    per64(q, &b.qs, &|e| a.scales[e / 16] as i32),
                    [0; 4],
                    f16_to_f32(a.d),
                    0.0,
                )
            })
            .collect(),
        _ => unreachable!(),
    }
}

/// The batch paths of llama.cpp: `ggml_gemv/gemm_q4_K_8x8_q8_K` (repacked Q4_K) and the
/// tiled microkernel.
fn model_path(path: DotPath, t: DType, w: &[u8], x: &[u8]) -> f32 {
    let dx: Vec<f32> = blocks::<BlockQ8K>(x).iter().map(|b| b.d()).collect();
    let (mut acc, mut acc_min) = (0f32, 0f32);
    let has_min = matches!(t, DType::Q2_K | DType::Q4_K | DType::Q5_K);
    for ((part, min, dw, dmin), dx) in ksums(t, w, x).into_iter().zip(dx) {
        let (isum, imin): (i32, i32) = (part.iter().sum(), min.iter().sum());
        match path {
            DotPath::RepackGemv => {
                acc = (isum as f32).mul_add(dw * dx, acc);
                acc_min = (imin as f32).mul_add(dmin * dx, acc_min);
            }
            DotPath::RepackGemm => {
                for k in 0..4 {
                    acc = (part[k] as f32).mul_add(dw * dx, acc);
                    acc_min = (min[k] as f32).mul_add(dmin * dx, acc_min);
                }
            }
            DotPath::Tiled => {
                let mut r = isum as f32 * dw;
                if has_min {
                    r = (-dmin).mul_add(imin as f32, r);
                }
                acc = r.mul_add(dx, acc);
            }
            DotPath::VecDot | DotPath::PerBlock => unreachable!("not a k-quant batch path"),
        }
    }
    match path {
        DotPath::Tiled => acc,
        _ => acc - acc_min,
    }
}

// ---------------------------------------------------------------------------------------------
// Tests.

const QUANT_TYPES: [DType; 10] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

#[test]
fn simd_dots_are_llama_cpp_arithmetic_bit_for_bit() {
    let tables: Vec<&Kernels> = Kernels::all()
        .into_iter()
        .filter_map(|(name, k)| k.filter(|_| name != "scalar"))
        .collect();
    if tables.is_empty() {
        println!("no SIMD table on this CPU: nothing to check");
        return;
    }
    let mut r = rng(21);
    for t in QUANT_TYPES {
        let mut cases = 0;
        for nblocks in [1usize, 2, 3, 8, 17, 33] {
            let n = nblocks * t.block_size();
            for wk in WEIGHT_KINDS {
                for ak in ACT_KINDS {
                    let w = weight_row(t, nblocks, wk, &mut r);
                    let x = activations(n, ak, &mut r);
                    let mut xq = vec![0u8; t.vec_dot_type().row_bytes(n).unwrap()];
                    Kernels::scalar().quantize_act(t.vec_dot_type(), &x, &mut xq);
                    let want = model(t, &w, &xq);
                    for k in &tables {
                        let got = k.vec_dot(t, n, &w, &xq);
                        assert!(
                            got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                            "{} {t} n={n} {wk:?} {ak:?}: simd {got:e}, model {want:e}",
                            k.isa()
                        );
                    }
                    cases += 1;
                }
            }
        }
        println!("{t}: {cases} rows bit-identical to the llama.cpp model");
    }
}

/// Quantizes one block of 32 with a table's run-time Q8_0 quantizer.
fn q8_0(k: &Kernels, x: &[f32; 32]) -> ([u8; 2], [i8; 32]) {
    let mut out = [0u8; 34];
    k.quantize_act(DType::Q8_0, x, &mut out);
    let b: &[BlockQ8_0] = blocks(&out);
    (b[0].d, b[0].qs)
}

#[test]
fn activation_quantizer_rounds_like_llama_cpp_x86() {
    for (name, k) in Kernels::all() {
        let Some(k) = k else { continue };
        // amax = 127 makes the multiplier exactly 1: ties round to even (not away from 0).
        let mut x = [0f32; 32];
        x[0] = 127.0;
        let ties = [0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -126.5];
        x[1..9].copy_from_slice(&ties);
        let (d, q) = q8_0(k, &x);
        assert_eq!(f16_to_f32(d), 1.0, "{name}");
        assert_eq!(&q[..9], &[127, 0, 2, 2, 0, -2, -2, 4, -126], "{name}");

        // The multiplier is 127 / amax, not 1 / (amax / 127): with amax = 11 they differ in
        // the last bit, and for this x, x · (127 / 11) is exactly 1.5 (rounds to 2) while
        // x · (1 / (11 / 127)) is 1.4999999 (1, what the reference quantizer writes).
        let mut x = [0f32; 32];
        x[0] = 11.0;
        x[1] = f32::from_bits(1040517652); // 0.12992126
        assert_eq!(x[1] * (127.0 / 11.0), 1.5);
        let (_, q) = q8_0(k, &x);
        assert_eq!((q[0], q[1]), (127, 2), "{name}");
        let mut reference = [0u8; 34];
        quantize_row(DType::Q8_0, &x, &mut reference);
        assert_eq!(
            blocks::<BlockQ8_0>(&reference)[0].qs[1],
            1,
            "the _ref quantizer"
        );

        // Q8_1: s = f16(d * Σq) with the i32 quants.
        let mut x = [0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 15.25) * 0.37;
        }
        let mut out = [0u8; 36];
        k.quantize_act(DType::Q8_1, &x, &mut out);
        let b: &[BlockQ8_1] = blocks(&out);
        let sum: i32 = b[0].qs.iter().map(|&q| q as i32).sum();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        assert_eq!(
            f16_to_f32(b[0].s),
            half::f16::from_f32(d * sum as f32).to_f32(),
            "{name}"
        );
    }
}

#[test]
fn batch_paths_are_llama_cpp_arithmetic_bit_for_bit() {
    let tables: Vec<&Kernels> = Kernels::all().into_iter().filter_map(|(_, k)| k).collect();
    let mut r = rng(22);
    let cases = [
        (DotPath::RepackGemv, DType::Q4_K),
        (DotPath::RepackGemm, DType::Q4_K),
        (DotPath::Tiled, DType::Q2_K),
        (DotPath::Tiled, DType::Q3_K),
        (DotPath::Tiled, DType::Q4_K),
        (DotPath::Tiled, DType::Q5_K),
        (DotPath::Tiled, DType::Q6_K),
    ];
    for (path, t) in cases {
        for nblocks in [1usize, 2, 3, 8, 17] {
            let n = nblocks * QK_K;
            for wk in WEIGHT_KINDS {
                for ak in ACT_KINDS {
                    let w = weight_row(t, nblocks, wk, &mut r);
                    let mut xq = vec![0u8; DType::Q8_K.row_bytes(n).unwrap()];
                    Kernels::scalar().quantize_act(
                        DType::Q8_K,
                        &activations(n, ak, &mut r),
                        &mut xq,
                    );
                    let want = model_path(path, t, &w, &xq);
                    for k in &tables {
                        let got = k.dot_fn(path, t)(n, &w, &xq);
                        assert!(
                            got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                            "{} {path:?} {t} n={n} {wk:?} {ak:?}: {got:e} vs model {want:e}",
                            k.isa()
                        );
                    }
                }
            }
        }
        println!("{path:?} {t}: every table bit-identical to the model");
    }
}

#[test]
fn dot_paths_follow_llama_cpp_dispatch() {
    use DotPath::*;
    // Repacked Q4_K (rows % 8 == 0): groups of four tokens through the gemm, the rest gemv.
    let q4k: Vec<DotPath> = (0..13)
        .map(|i| DotPath::for_token(DType::Q4_K, 896, 13, i))
        .collect();
    assert_eq!(&q4k[..12], &[RepackGemm; 12]);
    assert_eq!(q4k[12], RepackGemv);
    assert_eq!(DotPath::for_token(DType::Q4_K, 896, 1, 0), RepackGemv);
    // Not repacked: the tiled path from 8 tokens on, the vec_dot kernel below.
    assert_eq!(DotPath::for_token(DType::Q4_K, 900, 8, 3), Tiled);
    assert_eq!(DotPath::for_token(DType::Q6_K, 896, 8, 0), Tiled);
    assert_eq!(DotPath::for_token(DType::Q6_K, 896, 7, 0), VecDot);
    // Legacy formats: vec_dot (tinyBLAS does the same arithmetic).
    assert_eq!(DotPath::for_token(DType::Q5_0, 896, 64, 0), VecDot);
    // The plain path is the table's vec_dot.
    let k = Kernels::scalar();
    assert_eq!(
        k.dot_fn(VecDot, DType::Q8_0) as usize,
        k.dot_fn(Tiled, DType::Q8_0) as usize
    );
}

// ---------------------------------------------------------------------------------------------
// Pinned to llama.cpp itself: outputs of its CPU backend (commit 0c1e57098, built with
// `-mavx -mavx2 -mfma -mf16c -mbmi2 -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw
// -mavx512vnni -mavx512bf16`, GCC 12, the ISA of the golden machine) for deterministic inputs,
// printed by the C program at the end of this file: per format and input amplitude, the
// FNV-1a hash of the run-time quantized activations and the bits of `vec_dot`.

/// `(weight type, amplitude index, FNV-1a 64 of the quantized activations, f32 bits)`.
const LLAMA_CPP: [(DType, u32, u64, u32); 30] = [
    (DType::Q4_0, 0, 0xa7ecd49253593336, 0xbf173800), // -0.590698
    (DType::Q4_0, 1, 0x0c9332694fb427d4, 0xc2f8bb0a), // -124.365
    (DType::Q4_0, 2, 0xde38cb45bb0fc89b, 0xbcee427f), // -0.0290844
    (DType::Q4_1, 0, 0xf6d702f19e85a1bb, 0x41089d7e), // 8.53845
    (DType::Q4_1, 1, 0x5efcfb29099c82fb, 0xc1b6cc3a), // -22.8497
    (DType::Q4_1, 2, 0x52c0d23b6594ccb1, 0xbcb23fe6), // -0.021759
    (DType::Q5_0, 0, 0x8dd280ce88be7aef, 0xc1356f12), // -11.3396
    (DType::Q5_0, 1, 0x6bf1974cf6baf362, 0x43bfe5ad), // 383.794
    (DType::Q5_0, 2, 0x82569fa56acedd83, 0x3d678c58), // 0.0565303
    (DType::Q5_1, 0, 0x069c687d60a15432, 0xc0c853bd), // -6.26022
    (DType::Q5_1, 1, 0x78bd598b9d90c985, 0x42b27074), // 89.2196
    (DType::Q5_1, 2, 0x5547070e907239a6, 0x3db8b4fb), // 0.0901889
    (DType::Q8_0, 0, 0x3d09a7228c9fc847, 0xc1d42dd7), // -26.5224
    (DType::Q8_0, 1, 0xab5a66a4f47b0276, 0x45057ec4), // 2135.92
    (DType::Q8_0, 2, 0xa12a7b37f717d3ea, 0x3e2d74a6), // 0.16939
    (DType::Q2_K, 0, 0x6e9653fed1fa2116, 0xc0ebc900), // -7.36829
    (DType::Q2_K, 1, 0xe898741982a89591, 0xc37ee37d), // -254.889
    (DType::Q2_K, 2, 0xe1dc0d372df5ed49, 0x3d91f472), // 0.071267
    (DType::Q3_K, 0, 0x7be6eb24a6d10a2e, 0x410c8fe9), // 8.78513
    (DType::Q3_K, 1, 0x33e7f27013c19f85, 0x44502b72), // 832.679
    (DType::Q3_K, 2, 0x234a953d935fc336, 0x3eb8a788), // 0.360653
    (DType::Q4_K, 0, 0x53db80513651c70d, 0x428f0042), // 71.5005
    (DType::Q4_K, 1, 0x51e04a8e76a7b6d0, 0xc454f6aa), // -851.854
    (DType::Q4_K, 2, 0xd72a3befab9a8097, 0xbffdae97), // -1.98189
    (DType::Q5_K, 0, 0xd80aea7da4a0caed, 0xc34723d1), // -199.14
    (DType::Q5_K, 1, 0xc88e8328c51aca20, 0x45f60ad2), // 7873.35
    (DType::Q5_K, 2, 0xfbc4f3317aca0596, 0x40224e67), // 2.53604
    (DType::Q6_K, 0, 0x7fb4e92af6459186, 0x43ae2077), // 348.254
    (DType::Q6_K, 1, 0x68934c5f9bd9bd8e, 0xc58369c8), // -4205.22
    (DType::Q6_K, 2, 0x35bd70545763b7d6, 0x40b96ef3), // 5.79479
];

/// The C program's xorshift32.
struct XorShift(u32);
impl XorShift {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    /// Uniform in [-1, 1), exact in f32.
    fn unif(&mut self) -> f32 {
        (self.next() >> 8) as f32 * (1.0 / 8388608.0) - 1.0
    }
    /// A normal f16 in [2^-8, 2^-4), optionally of random sign.
    fn scale16(&mut self, allow_negative: bool) -> u16 {
        let mut h = (0x1c00 + self.next() % 0x1000) as u16;
        if allow_negative && self.next() & 1 == 1 {
            h |= 0x8000;
        }
        h
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

#[test]
fn quantizers_and_dots_equal_llama_cpp_outputs() {
    const N: usize = 1024;
    let tables: Vec<&Kernels> = Kernels::all().into_iter().filter_map(|(_, k)| k).collect();
    for (i, &(t, rep, want_hash, want_bits)) in LLAMA_CPP.iter().enumerate() {
        let ti = QUANT_TYPES.iter().position(|&q| q == t).unwrap() as u32;
        assert_eq!(ti as usize, i / 3, "table order");
        let mut rng = XorShift(0x9e3779b9 ^ (ti * 977 + rep * 131 + 1));
        let wb = t.row_bytes(N).unwrap();
        let mut w: Vec<u8> = (0..wb).map(|_| rng.next() as u8).collect();
        let (a, b) = match t {
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => (0, Some(2)),
            DType::Q2_K => (80, Some(82)),
            DType::Q3_K => (108, None),
            DType::Q6_K => (208, None),
            _ => (0, None),
        };
        for blk in w.chunks_exact_mut(t.type_size()) {
            blk[a..a + 2].copy_from_slice(&rng.scale16(false).to_le_bytes());
            if let Some(b) = b {
                let neg = matches!(t, DType::Q4_1 | DType::Q5_1);
                blk[b..b + 2].copy_from_slice(&rng.scale16(neg).to_le_bytes());
            }
        }
        let amp = [1.0f32, 37.0, 0.01][rep as usize];
        let x: Vec<f32> = (0..N).map(|_| rng.unif() * amp).collect();
        let vt = t.vec_dot_type();
        for k in &tables {
            let mut xq = vec![0u8; vt.row_bytes(N).unwrap()];
            k.quantize_act(vt, &x, &mut xq);
            assert_eq!(
                fnv1a(&xq),
                want_hash,
                "{} {t} #{rep}: quantized activations",
                k.isa()
            );
            if k.isa() != "scalar" {
                let got = k.vec_dot(t, N, &w, &xq);
                assert_eq!(
                    got.to_bits(),
                    want_bits,
                    "{} {t} #{rep}: {got:e} vs llama.cpp {:e}",
                    k.isa(),
                    f32::from_bits(want_bits)
                );
            }
        }
    }
}

/* The generator (compile against llama.cpp's ggml: gcc -O2 gen.c -I ggml/include
   -L build/bin -lggml-cpu -lggml-base), whose output is the table above:

// Prints llama.cpp's run-time quantizer bytes (FNV-1a 64) and vec_dot results (f32 bits) for
// deterministic inputs; see crates/mica-kernels/tests/llama_exact.rs.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ctype.h>
#include "ggml.h"
#include "ggml-cpu.h"

static uint32_t st;
static uint32_t next(void) { st ^= st << 13; st ^= st >> 17; st ^= st << 5; return st; }
// Uniform in [-1, 1), exact in f32.
static float unif(void) { return (float)(next() >> 8) * (1.0f / 8388608.0f) - 1.0f; }
static uint64_t fnv(const uint8_t * p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ull; }
    return h;
}
// A positive normal f16 in [2^-8, 2^-4), or its negative.
static uint16_t scale16(int allow_negative) {
    uint16_t h = (uint16_t)(0x1c00 + (next() % 0x1000));
    if (allow_negative && (next() & 1)) h |= 0x8000;
    return h;
}

int main(void) {
    ggml_cpu_init();
    const int types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                          GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };
    // Byte offsets of each block's f16 fields: (first, second or -1, second may be negative).
    const int f16a[] = { 0, 0, 0, 0, 0, 80, 108, 0, 0, 208 };
    const int f16b[] = { -1, 2, -1, 2, -1, 82, -1, 2, 2, -1 };
    const int n = 1024;
    static float x[1024];
    static uint8_t w[4096], xq[4096];
    for (int ti = 0; ti < 10; ti++) {
        for (int rep = 0; rep < 3; rep++) {
            const enum ggml_type t = (enum ggml_type) types[ti];
            st = 0x9e3779b9u ^ (uint32_t)(ti * 977 + rep * 131 + 1);
            const size_t wb = ggml_row_size(t, n);
            for (size_t i = 0; i < wb; i++) w[i] = (uint8_t) next();
            const size_t bs = ggml_type_size(t);
            for (size_t b = 0; b < wb / bs; b++) {
                uint16_t h = scale16(0);
                memcpy(w + b * bs + f16a[ti], &h, 2);
                if (f16b[ti] >= 0) { h = scale16(ti == 1 || ti == 3); memcpy(w + b * bs + f16b[ti], &h, 2); }
            }
            const float amp = rep == 0 ? 1.0f : rep == 1 ? 37.0f : 0.01f;
            for (int i = 0; i < n; i++) x[i] = unif() * amp;
            const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(t);
            const enum ggml_type vt = tr->vec_dot_type;
            ggml_get_type_traits_cpu(vt)->from_float(x, xq, n);
            float s = 0.0f;
            tr->vec_dot(n, &s, 0, w, 0, xq, 0, 1);
            uint32_t bits; memcpy(&bits, &s, 4);
            char name[8] = {0};
            for (int i = 0; i < 7 && ggml_type_name(t)[i]; i++) name[i] = (char) toupper(ggml_type_name(t)[i]);
            printf("    (DType::%s, %d, 0x%016llx, 0x%08x), // %g\n", name, rep,
                   (unsigned long long) fnv(xq, ggml_row_size(vt, n)), bits, s);
        }
    }
    return 0;
}

*/
