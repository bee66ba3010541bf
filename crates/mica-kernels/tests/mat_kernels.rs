//! Every table's matrix kernels ([`Kernels::matmul`]: many weight rows × many tokens per
//! call) against that table's per-output dot product on the same path, bit for bit.
//!
//! The matrix kernels only regroup outputs into registers and tiles; the float sequence of
//! each output must stay the one `dot_fn(path, type)` computes (which `llama_exact.rs` pins
//! to llama.cpp). Shapes cover row counts that are not multiples of the kernels' row groups,
//! token counts around their token groups, odd lengths (1, 3, 17, 33, 127 blocks) and the
//! edge-value weight and activation kinds of `quant_common`.

mod quant_common;

use mica_kernels::DType;
use mica_kernels::matmul::QActs;
use mica_kernels::simd::{DotPath, Kernels, MatOut, WeightRows, is_legacy};
use quant_common::*;

/// The paths llama.cpp can take for a type (`VecDot` for all).
fn paths(t: DType) -> Vec<DotPath> {
    match t {
        DType::Q4_K => vec![
            DotPath::VecDot,
            DotPath::RepackGemv,
            DotPath::RepackGemm,
            DotPath::Tiled,
        ],
        DType::Q2_K | DType::Q3_K | DType::Q5_K | DType::Q6_K => {
            vec![DotPath::VecDot, DotPath::Tiled]
        }
        DType::IQ4_NL => vec![DotPath::VecDot, DotPath::RepackGemv],
        t if is_legacy(t) => vec![DotPath::VecDot, DotPath::PerBlock],
        _ => vec![DotPath::VecDot],
    }
}

/// Builds `rows` weight rows of `nblocks` blocks, mixing the weight kinds row by row.
fn weights(t: DType, rows: usize, nblocks: usize, seed: usize, r: &mut Rng) -> Vec<u8> {
    let mut w = Vec::new();
    for i in 0..rows {
        // Mostly realistic rows, with every edge kind present in most matrices.
        let kind = WEIGHT_KINDS[(i + seed) % WEIGHT_KINDS.len()];
        let n_el = nblocks * t.block_size();
        let row = if t.is_quantized() {
            weight_row(t, nblocks, kind, r)
        } else {
            weight_row(t, n_el, kind, r)
        };
        w.extend_from_slice(&row);
    }
    w
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan()
}

/// Checks one (table, type, path, shape) case.
fn check(k: &Kernels, t: DType, path: DotPath, n: usize, rows: usize, toks: usize, r: &mut Rng) {
    let nblocks = n / t.block_size();
    let w = weights(t, rows, nblocks, rows + toks, r);
    let vt = t.vec_dot_type();
    let mut xq = Vec::new();
    for i in 0..toks {
        let x = activations(n, ACT_KINDS[i % ACT_KINDS.len()], r);
        let mut q = vec![0u8; vt.row_bytes(n).unwrap()];
        Kernels::scalar().quantize_act(vt, &x, &mut q);
        xq.extend_from_slice(&q);
    }
    let acts = QActs::from_quantized(vt, n, toks, &xq);
    let wr = WeightRows::new(t, n, rows, &w);
    // A wider output matrix than the rows, to check the stride.
    let stride = rows + 3;
    let mut out = vec![f32::from_bits(0x7fc0_dead); toks * stride];
    k.matmul(
        path,
        &wr,
        &acts.view(),
        &mut MatOut::new(&mut out, stride, rows, toks),
    );
    let dot = k.dot_fn(path, t);
    for tok in 0..toks {
        for row in 0..rows {
            let want = dot(n, wr.row(row), acts.row(tok));
            let got = out[tok * stride + row];
            assert!(
                same(got, want),
                "{} {t} {path:?} n={n} rows={rows} tokens={toks}: out[{tok}, {row}] = {got:e}, dot {want:e}",
                k.isa()
            );
        }
        for pad in rows..stride {
            assert_eq!(
                out[tok * stride + pad].to_bits(),
                0x7fc0_dead,
                "wrote past the rows"
            );
        }
    }
}

#[test]
fn matrix_kernels_equal_per_output_dots_bit_for_bit() {
    let mut r = rng(31);
    let shapes: [(usize, usize); 9] = [
        (1, 1),
        (3, 1),
        (4, 1),
        (9, 1),
        (17, 1),
        (6, 2),
        (5, 3),
        (7, 5),
        (18, 9),
    ];
    for (name, k) in Kernels::all() {
        let Some(k) = k else {
            println!("SKIPPED: {name} (this CPU lacks it)");
            continue;
        };
        for t in DType::WEIGHT_TYPES {
            for path in paths(t) {
                let mut cases = 0;
                for nblocks in [1usize, 3, 17, 33, 127] {
                    let n = if t.is_quantized() {
                        nblocks * t.block_size()
                    } else {
                        nblocks * 33
                    };
                    for &(rows, toks) in &shapes {
                        // Long rows only with small shapes: the scalar table is slow.
                        if nblocks == 127 && rows * toks > 9 {
                            continue;
                        }
                        check(k, t, path, n, rows, toks, &mut r);
                        cases += 1;
                    }
                }
                let kind = if k.has_matmul(path, t) {
                    "kernel"
                } else {
                    "by dots"
                };
                println!(
                    "{:>6} {t:>4} {path:?} ({kind}): {cases} shapes bit-identical",
                    k.isa()
                );
            }
        }
    }
}

/// Large-ish products that cross the kernels' token tiles (64) and row groups, and the
/// batch sizes where the legacy formats and the k-quants switch to their decoded prefill
/// paths (8 tokens; 16 for the AVX-512 tier's legacy formats): odd block counts, row counts that are not a multiple of
/// the row groups (4, 8).
#[test]
fn matrix_kernels_cover_token_tiles() {
    let mut r = rng(32);
    let k = mica_kernels::simd::kernels();
    for t in [
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
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ4_XS,
        DType::IQ4_NL,
    ] {
        for path in paths(t) {
            check(k, t, path, 2 * 256, 21, 70, &mut r);
            for (nblocks, rows, toks) in [
                (1, 8, 8),
                (3, 13, 8),
                (17, 7, 11),
                (3, 5, 15),
                (2, 9, 16),
                (33, 9, 135),
            ] {
                check(k, t, path, nblocks * t.block_size(), rows, toks, &mut r);
            }
        }
    }
}

/// Every token count of a speculative verification pass (1..=9 tokens, run through the
/// one-token paths), where the kernels group tokens by four (`vec_dot` of the k-quants, the
/// legacy micro-kernels with their lane offsets shifted once per call) and finish with the
/// remainder: each output equals its per-output dot product, bit for bit, in every table.
#[test]
fn matrix_kernels_cover_every_small_token_count() {
    let mut r = rng(34);
    for (name, k) in Kernels::all() {
        let Some(k) = k else { continue };
        for t in [
            DType::Q4_0,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q2_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
        ] {
            for toks in 1..=9 {
                for (nblocks, rows) in [(1, 1), (3, 7), (2, 13)] {
                    check(
                        k,
                        t,
                        DotPath::VecDot,
                        nblocks * t.block_size(),
                        rows,
                        toks,
                        &mut r,
                    );
                }
            }
            println!("{name:>6} {t:>4}: 1..=9 tokens bit-identical");
        }
    }
}

/// Load-time repacked weights give the same outputs, bit for bit, as the file's layout, in
/// every table that packs (row counts not a multiple of 4, row ranges, many tokens), and
/// through `matmul` with a thread pool.
#[test]
fn packed_weights_equal_row_major_bit_for_bit() {
    use mica_kernels::ThreadPool;
    use mica_kernels::matmul::{QMatrix, matmul_rows};
    let mut r = rng(33);
    let pool = ThreadPool::new(3);
    for (name, k) in Kernels::all() {
        let Some(k) = k else { continue };
        for t in DType::WEIGHT_TYPES {
            let n = 7 * t.block_size();
            let Some(_) = k.pack(t, n, 1, &weights(t, 1, 7, 0, &mut r)) else {
                continue;
            };
            for (rows, toks) in [
                (1, 1),
                (6, 1),
                (13, 5),
                (37, 9),
                (3, 8),
                (5, 8),
                (19, 13),
                (21, 70),
                // Multiples of 8 rows (Q4_K's repacked paths) and of 16 (its packed group).
                (32, 1),
                (16, 6),
                (40, 9),
                // Every remainder of the four-token micro-kernels.
                (7, 2),
                (9, 3),
                (12, 4),
                (11, 6),
                (10, 7),
            ] {
                let w = weights(t, rows, 7, rows, &mut r);
                let packed = k.pack(t, n, rows, &w).unwrap();
                // Unpacking gives back every row's bytes, whole or a block range at a time.
                let rb = t.row_bytes(n).unwrap();
                for row in 0..rows {
                    let mut back = vec![0u8; rb];
                    k.unpack_blocks(t, n, &packed, row, 0..7, &mut back);
                    assert_eq!(
                        back,
                        w[row * rb..(row + 1) * rb],
                        "{name} {t} unpack row {row}"
                    );
                    let ts = t.type_size();
                    let mut part = vec![0u8; 3 * ts];
                    k.unpack_blocks(t, n, &packed, row, 2..5, &mut part);
                    assert_eq!(
                        part,
                        w[row * rb + 2 * ts..row * rb + 5 * ts],
                        "{name} {t} blocks"
                    );
                }
                let vt = t.vec_dot_type();
                let mut xq = Vec::new();
                for i in 0..toks {
                    let x = activations(n, ACT_KINDS[i % ACT_KINDS.len()], &mut r);
                    let mut q = vec![0u8; vt.row_bytes(n).unwrap()];
                    k.quantize_act(vt, &x, &mut q);
                    xq.extend_from_slice(&q);
                }
                let acts = QActs::from_quantized(vt, n, toks, &xq);
                let plain = WeightRows::new(t, n, rows, &w);
                let pk = WeightRows::packed(t, n, rows, k.pack_group(t), &packed);
                // Every path llama.cpp can take for the type (packed Q4_K has a kernel for each).
                let mut wants = Vec::new();
                // mica's `PerBlock` path runs on packed weights only in the tables with its
                // kernel (a table without one never picks it, `DotPath::for_token`).
                let has = |p: DotPath| p != DotPath::PerBlock || k.has_matmul(p, t);
                for path in paths(t).into_iter().filter(|&p| has(p)) {
                    let mut want = vec![0f32; rows * toks];
                    let mut got = vec![1f32; rows * toks];
                    k.matmul(
                        path,
                        &plain,
                        &acts.view(),
                        &mut MatOut::new(&mut want, rows, rows, toks),
                    );
                    k.matmul(
                        path,
                        &pk,
                        &acts.view(),
                        &mut MatOut::new(&mut got, rows, rows, toks),
                    );
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            same(*g, *w),
                            "{name} {t} {path:?} rows={rows} tokens={toks} out {i}: {g:e} vs {w:e}"
                        );
                    }
                    wants.push((path, want));
                }
                // The outputs of the path llama.cpp takes for token `tok`.
                let want_of = |tok: usize| {
                    let path = DotPath::for_token(t, rows, toks, tok);
                    &wants
                        .iter()
                        .find(|(p, _)| *p == path)
                        .expect("a tested path")
                        .1
                };
                // Through matmul_rows on the process's table, rows split across threads.
                if k.isa() == mica_kernels::simd::kernels().isa() && rows >= 8 {
                    let m = QMatrix {
                        dtype: t,
                        rows,
                        cols: n,
                        data: &w,
                        extra_paths: true,
                        packed: Some(&packed),
                    };
                    // Embedding lookups from the packed copy: the file's values.
                    let plain_m = QMatrix { packed: None, ..m };
                    for row in 0..rows {
                        let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
                        plain_m.dequantize_row(row, &mut a);
                        m.dequantize_row(row, &mut b);
                        assert!(a.iter().zip(&b).all(|(x, y)| same(*x, *y)), "{t} row {row}");
                    }
                    for range in [0..rows, 4..rows - 1, 8..rows, 1..rows] {
                        let mut part = vec![0f32; toks * range.len()];
                        matmul_rows(&pool, &m, &acts, &mut part, range.clone());
                        for tok in 0..toks {
                            for (j, row) in range.clone().enumerate() {
                                let (g, w) =
                                    (part[tok * range.len() + j], want_of(tok)[tok * rows + row]);
                                assert!(same(g, w), "{t} matmul_rows {range:?}: {g:e} vs {w:e}");
                            }
                        }
                    }
                }
            }
            println!("{name:>6} {t:>4}: packed = row-major");
        }
    }
}

/// mica's `PerBlock` path computes the same product as llama.cpp's `vec_dot`, in another
/// float order only: on quantized normal weights and activations the two agree to within
/// 1e-5 of `Σ |w|·|x|` (the bound of the rounding of a few dozen f32 additions), and differ
/// somewhere (the test would pass vacuously if `PerBlock` fell back to `vec_dot`).
#[test]
fn per_block_path_is_vec_dots_product_rounded_differently() {
    let mut r = rng(35);
    let k = Kernels::scalar();
    for t in DType::WEIGHT_TYPES.into_iter().filter(|&t| is_legacy(t)) {
        let vt = t.vec_dot_type();
        let mut differ = 0;
        for nblocks in [1usize, 7, 28, 152] {
            let n = nblocks * 32;
            for _ in 0..20 {
                let w = weight_row(t, nblocks, WeightKind::Quantized, &mut r);
                let x = activations(n, ActKind::Normal, &mut r);
                let mut xq = vec![0u8; vt.row_bytes(n).unwrap()];
                k.quantize_act(vt, &x, &mut xq);
                let a = mica_kernels::simd::kernels().dot_fn(DotPath::VecDot, t)(n, &w, &xq);
                let b = k.dot_fn(DotPath::PerBlock, t)(n, &w, &xq);
                // Σ |w|·|x| from the dequantized values.
                let mut wf = vec![0f32; n];
                mica_kernels::quant::dequantize_row(t, &w, &mut wf);
                let mag: f32 = wf.iter().zip(&x).map(|(w, x)| (w * x).abs()).sum();
                assert!(
                    (a - b).abs() <= 1e-5 * mag.max(1e-3),
                    "{t} n={n}: vec_dot {a:e} vs per-block {b:e} (Σ|w·x| {mag:e})"
                );
                differ += usize::from(a.to_bits() != b.to_bits());
            }
        }
        assert!(differ > 0, "{t}: PerBlock equals vec_dot on every row");
        println!("{t}: {differ}/80 rows round differently, all within 1e-5 of Σ|w·x|");
    }
}
