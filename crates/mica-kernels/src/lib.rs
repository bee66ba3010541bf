//! mica-kernels: the numeric floor of mica. Element and block types, exact dequantization,
//! activation quantizers, dot products, matrix products and the low-rank (LoRA) product (a
//! scalar reference for each, SIMD versions chosen at run time), element-wise ops (norms,
//! RoPE, softmax), and the compute thread pool. This crate knows nothing about models or
//! files.

pub mod attention;
pub mod dtype;
pub mod gelu;
mod log_softmax;
pub mod lowrank;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;
pub mod simd;

pub use dtype::DType;
pub use matmul::{QActs, QMatrix, matmul};
pub use pool::ThreadPool;
