//! `mica inspect --kernels`: the kernel coverage listing of this CPU, with no model.

mod common;

use common::*;

#[test]
fn inspect_kernels_lists_this_cpus_tables() {
    let (ok, out, err) = mica(&["inspect", "--kernels"]);
    assert!(ok, "{err}");
    // The library's listing, as printed.
    let listing = mica::kernels::simd::coverage();
    assert_eq!(out, listing.to_string());
    // The tier mica runs here is marked, in the tier list and the table's header.
    let selected = mica::kernels::simd::kernels().isa();
    let marked = format!("{selected:<8} built; this CPU runs it  <- selected at run time");
    assert!(out.contains(&marked), "{out}");
    let header = out
        .lines()
        .find(|l| l.starts_with("type"))
        .expect("table header");
    assert!(header.contains(&format!("{selected}*")), "{header}");
    // Every weight type's dot product is listed, with the scalar tier's own kernel.
    for t in mica::kernels::DType::WEIGHT_TYPES {
        let line = out
            .lines()
            .find(|l| {
                l.split_whitespace()
                    .take(2)
                    .eq([t.to_string().as_str(), "dot"])
            })
            .unwrap_or_else(|| panic!("no dot line for {t}:\n{out}"));
        assert_eq!(line.split_whitespace().nth(2), Some("own"), "{line}");
    }
}

#[test]
fn inspect_needs_a_model_or_kernels() {
    let (ok, _, err) = mica(&["inspect"]);
    assert!(!ok && err.contains("MODEL"), "{err}");
    let (ok, _, err) = mica(&["inspect", "some-model", "--kernels"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
}
