#![allow(dead_code)]
pub mod cases;
pub mod emu;
pub mod hf;
