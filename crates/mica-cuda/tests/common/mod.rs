#![allow(dead_code)]
pub mod cases;
pub mod emu;
pub mod hf;
// The CPU fixture tests' loader and helpers (fixtures/hf), shared rather than copied.
#[path = "../../../mica-models/tests/hf_common/mod.rs"]
pub mod hf_common;
