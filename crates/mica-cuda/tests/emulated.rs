//! Every kernel's logic on the CPU emulator (`tests/emu`), through the same ops a GPU runs,
//! against scalar references (`common/cases.rs`).

mod common;
use common::{cases, emu::emu};

#[test]
fn the_sources_define_exactly_the_kernels_the_modules_list() {
    let mut got = emu().kernel_names();
    let mut want = mica_cuda::kernels::all_kernels();
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn matvec() {
    cases::matvec(emu());
}

#[test]
fn get_rows() {
    cases::get_rows(emu());
}

#[test]
fn rms_norm() {
    cases::rms_norm(emu());
}

#[test]
fn rope() {
    cases::rope(emu());
}

#[test]
fn glu() {
    cases::glu(emu());
}

#[test]
fn axpy_and_scale() {
    cases::axpy_and_scale(emu());
}

#[test]
fn attention() {
    cases::attention(emu());
}

#[test]
fn copy() {
    cases::copy(emu());
}

#[test]
fn refusals() {
    cases::refusals(emu());
}
