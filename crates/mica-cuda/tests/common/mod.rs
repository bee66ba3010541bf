#![allow(dead_code)]
pub mod cases;
pub mod emu;
