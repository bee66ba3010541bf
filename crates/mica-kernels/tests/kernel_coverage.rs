//! The kernel coverage listing (`simd::coverage()`): printed, and checked against what the
//! tables do through their public interface.

use mica_kernels::DType;
use mica_kernels::simd::{Cell, DotPath, Kernels, Slot, Tier, coverage, is_legacy, kernels};

#[test]
fn coverage_listing() {
    let c = coverage();
    println!("{c}");

    // The tiers as this build and CPU see them; the selected one is the table mica runs.
    assert_eq!(c.tiers.iter().filter(|s| s.selected).count(), 1);
    assert_eq!(c.selected(), kernels().tier());
    for s in &c.tiers {
        assert_eq!(s.built, s.tier.built(), "{}", s.tier);
        assert_eq!(s.supported, Kernels::get(s.tier).is_some(), "{}", s.tier);
        assert!(s.built || !s.supported, "{}", s.tier);
    }

    // Every weight type has a scalar dot product of its own; the scalar table has no
    // matrix kernels or packed layouts (its products run one dot per output), and its
    // batch-path dots are its own exactly where the path applies.
    for t in DType::WEIGHT_TYPES {
        assert_eq!(c.cell(t, Slot::Dot, Tier::Scalar), Some(Cell::Own), "{t}");
        for p in DotPath::ALL {
            assert_eq!(c.cell(t, Slot::Mat(p), Tier::Scalar), Some(Cell::Empty));
        }
        assert_eq!(c.cell(t, Slot::Packed, Tier::Scalar), Some(Cell::Empty));
        let kquant = matches!(
            t,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K
        );
        let expect = |on: bool| if on { Cell::Own } else { Cell::Empty };
        let tiled = c.cell(t, Slot::PathDot(DotPath::Tiled), Tier::Scalar);
        assert_eq!(tiled, Some(expect(kquant)), "{t}");
        let per_block = c.cell(t, Slot::PathDot(DotPath::PerBlock), Tier::Scalar);
        assert_eq!(per_block, Some(expect(is_legacy(t))), "{t}");
        for p in [DotPath::RepackGemv, DotPath::RepackGemm] {
            let cell = c.cell(t, Slot::PathDot(p), Tier::Scalar);
            let repacked = t == DType::Q4_K || (t == DType::IQ4_NL && p == DotPath::RepackGemv);
            assert_eq!(cell, Some(expect(repacked)), "{t} {p:?}");
        }
    }
    // Activation-only types have no dot product anywhere; every activation type has a
    // quantizer in every built table.
    for t in [DType::Q8_1, DType::Q8_K] {
        let row = c.rows.iter().find(|r| r.dtype == t && r.slot == Slot::Dot);
        let row = row.expect("listed");
        assert!(row.cells.iter().all(|c| !c.has_kernel()), "{t}");
    }
    for t in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q8_K,
    ] {
        for s in c.tiers.iter().filter(|s| s.built) {
            let cell = c.cell(t, Slot::Quantize, s.tier).expect("listed");
            assert!(cell.has_kernel(), "{} quantize {t}", s.tier);
        }
    }

    // A built tier either has its own kernel or names a lower tier it extends.
    for r in &c.rows {
        for (i, &cell) in r.cells.iter().enumerate() {
            let tier = Tier::ALL[i];
            assert_eq!(cell == Cell::NotBuilt, !tier.built(), "{tier}");
            if let Cell::FallsBack(lower) = cell {
                let mut b = tier.base();
                while b.is_some_and(|b| b != lower) {
                    b = b.and_then(Tier::base);
                }
                assert_eq!(b, Some(lower), "{tier} {} {}", r.dtype, r.slot);
            }
        }
    }

    if cfg!(target_arch = "x86_64") {
        // The AVX-512 tier overrides the dot products of the legacy formats, Q4_K, Q6_K, the
        // grid i-quants, IQ4_NL, IQ4_XS and MXFP4, and keeps the AVX2 tier's for the others;
        // it has no quantizers of its own.
        let own = [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q6_K,
            DType::IQ2_XXS,
            DType::IQ2_XS,
            DType::IQ2_S,
            DType::IQ3_XXS,
            DType::IQ3_S,
            DType::IQ4_NL,
            DType::IQ4_XS,
            DType::MXFP4,
        ];
        for t in DType::WEIGHT_TYPES {
            let want = if own.contains(&t) {
                Cell::Own
            } else {
                Cell::FallsBack(Tier::Avx2)
            };
            assert_eq!(c.cell(t, Slot::Dot, Tier::Avx512), Some(want), "{t}");
            assert_eq!(c.cell(t, Slot::Dot, Tier::Avx2), Some(Cell::Own), "{t}");
        }
        for r in c.rows.iter().filter(|r| r.slot == Slot::Quantize) {
            assert!(!matches!(r.cells[Tier::Avx512 as usize], Cell::Own));
        }
        // AVX2 packs eight rows, AVX-512 four: both their own layouts.
        for t in [DType::Q4_0, DType::Q8_0] {
            assert_eq!(c.cell(t, Slot::Packed, Tier::Avx2), Some(Cell::Own));
            assert_eq!(c.cell(t, Slot::Packed, Tier::Avx512), Some(Cell::Own));
        }
        assert_eq!(
            c.cell(DType::Q4_0, Slot::Dot, Tier::Neon),
            Some(Cell::NotBuilt)
        );
    }
    if cfg!(target_arch = "aarch64") {
        for t in DType::WEIGHT_TYPES.into_iter().filter(|t| t.is_quantized()) {
            assert_eq!(c.cell(t, Slot::Dot, Tier::Neon), Some(Cell::Own), "{t}");
        }
        assert_eq!(
            c.cell(DType::Q4_0, Slot::Dot, Tier::Avx2),
            Some(Cell::NotBuilt)
        );
    }

    // The listing agrees with the tables this CPU runs: a matrix kernel or packed layout
    // where it says so, and a kept kernel is the very function of the lower tier.
    for s in c.tiers.iter().filter(|s| s.supported) {
        let k = Kernels::get(s.tier).expect("supported");
        for t in DType::WEIGHT_TYPES {
            for p in DotPath::ALL {
                let cell = c.cell(t, Slot::Mat(p), s.tier).expect("listed");
                assert_eq!(
                    cell.has_kernel(),
                    k.has_matmul(p, t),
                    "{} {t} {p:?}",
                    s.tier
                );
            }
            let packed = c.cell(t, Slot::Packed, s.tier).expect("listed");
            assert_eq!(packed.has_kernel(), k.pack_group(t) > 1, "{} {t}", s.tier);
            for p in DotPath::ALL {
                let slot = match p {
                    DotPath::VecDot => Slot::Dot,
                    p => Slot::PathDot(p),
                };
                let here = k.dot_fn(p, t) as usize;
                match c.cell(t, slot, s.tier).expect("listed") {
                    Cell::FallsBack(lower) => {
                        let lower = Kernels::get(lower).expect("a lower tier runs here too");
                        assert_eq!(here, lower.dot_fn(p, t) as usize, "{} {t} {p:?}", s.tier);
                    }
                    Cell::Own => {
                        if let Some(base) = s.tier.base().and_then(Kernels::get) {
                            assert_ne!(here, base.dot_fn(p, t) as usize, "{} {t} {p:?}", s.tier);
                        }
                    }
                    // A path that does not apply: the plain dot product.
                    Cell::Empty => assert_eq!(here, k.dot_fn(DotPath::VecDot, t) as usize),
                    Cell::NotBuilt => panic!("{} runs here but is not built", s.tier),
                }
            }
        }
    }

    // The printed table names the selected tier and lists each built tier's column.
    let text = c.to_string();
    let sel = format!("{}*", c.selected());
    assert!(text.contains(&sel), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().take(2).eq(["Q4_0", "dot"])),
        "{text}"
    );
}
