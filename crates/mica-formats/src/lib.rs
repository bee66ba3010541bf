//! mica-formats: reading model files. GGUF today (safetensors and `.mica` later), each parsed
//! and validated up front, with tensor data left in a read-only memory map and handed out as
//! zero-copy byte slices described by one [`TensorInfo`] type.

pub mod error;
pub mod ggml_types;
pub mod gguf;
pub mod tensor;

pub use error::{FormatError, Result};
pub use gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
pub use tensor::TensorInfo;
